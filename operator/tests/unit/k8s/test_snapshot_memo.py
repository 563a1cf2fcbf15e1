"""Snapshots built every pass from the watch-fed cache reuse conversions of unchanged objects; a change
of resourceVersion converts again, and the snapshot is the same as without the memo."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuforge.upgrade.convert import ConversionMemo, snapshot_from_objects

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def node(name: str, rv: str, gpus: str = "4", state: str = "upgrade-done") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": {"nvidia.com/gpu.count": "4", "gpuforge.io/upgrade-state": state},
        },
        "spec": {},
        "status": {
            "capacity": {"nvidia.com/gpu": gpus},
            "allocatable": {"nvidia.com/gpu": gpus},
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kubeletVersion": "v1.34.2"},
        },
    }


def pod(name: str, node_name: str, rv: str, ready: str = "True") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "gpuforge",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": {"gpuforge.io/component": "device-plugin", "app.kubernetes.io/version": "v0.18.0"},
        },
        "spec": {
            "nodeName": node_name,
            "containers": [{"image": "nvcr.io/nvidia/k8s-device-plugin:v0.18.0"}],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]},
    }


def test_memo_gives_the_same_snapshot_and_follows_changes() -> None:
    memo = ConversionMemo()
    nodes = [node("a", "1"), node("b", "2")]
    pods = [pod("pa", "a", "3"), pod("pb", "b", "4", ready="False")]
    first = snapshot_from_objects(nodes, pods, now=NOW, memo=memo)
    assert first == snapshot_from_objects(nodes, pods, now=NOW)
    again = snapshot_from_objects(nodes, pods, now=NOW, memo=memo)
    assert again == first
    assert again.nodes[0].operands[0] is first.nodes[0].operands[0]  # reused, not converted again

    changed_nodes = [node("a", "5", gpus="0", state="validation-required"), nodes[1]]
    changed_pods = [pods[0], pod("pb", "b", "6", ready="True")]
    after = snapshot_from_objects(changed_nodes, changed_pods, now=NOW, memo=memo)
    assert after == snapshot_from_objects(changed_nodes, changed_pods, now=NOW)
    by_name = {n.name: n for n in after.nodes}
    assert by_name["a"].gpu_capacity == 0
    assert by_name["b"].operands[0].ready


def test_memo_keeps_only_what_recent_snapshots_used() -> None:
    memo = ConversionMemo()
    for rv in range(10):
        snapshot_from_objects([node("a", str(rv))], [pod("pa", "a", str(100 + rv))], now=NOW, memo=memo)
    assert len(memo) == 4  # node and pod of the last two snapshots
