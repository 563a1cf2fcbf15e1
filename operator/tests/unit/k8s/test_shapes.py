"""List pages decoded into `gpuforge.k8s.shapes` give the readers the same facts as whole objects.

The objects are a Node, a DRA kubelet plugin pod and a ResourceSlice as the local control plane's API
server sent them (tests/golden/objects, managedFields and all), and variants of them for what those do
not show: a cordoned node mid-upgrade, a device plugin pod being deleted, workload pods that use GPUs
in each way the planner tells apart, finished and mirror pods, and ResourceClaims.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuforge.constants import COMPONENT_LABEL, DRA_DRIVER_GPU, STACK_LABEL
from gpuforge.k8s import shapes
from gpuforge.k8s.client import node_facts, plugin_nodes, slices_per_node
from gpuforge.render.placement import served_elsewhere
from gpuforge.upgrade.convert import snapshot_from_objects

RECORDED = json.loads((Path(__file__).parents[2] / "golden/objects/local-control-plane.json").read_text())
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _variant(obj: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """A changed copy, with a uid of its own (conversions are remembered by uid and resourceVersion)."""
    out = copy.deepcopy(obj)
    change(out)
    out["metadata"]["uid"] = f"{out['metadata'].get('uid', '')}-{out['metadata']['name']}"
    return out


def _cordoned(node: dict[str, Any]) -> None:
    node["metadata"]["name"] = "gpu-cordoned"
    node["metadata"]["labels"][STACK_LABEL] = "gpus"
    node["metadata"]["annotations"]["gpuforge.io/upgrade-state"] = "wait-old-gone"
    node["metadata"]["annotations"]["gpuforge.io/released-at"] = "2026-11-29T11:00:00Z"
    node["spec"]["unschedulable"] = True
    node["spec"]["taints"] = [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]
    node["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]


def _device_plugin_leaving(pod: dict[str, Any]) -> None:
    meta = pod["metadata"]
    meta["name"] = "gpus-device-plugin-x1"
    meta["labels"][COMPONENT_LABEL] = "device-plugin"
    meta["labels"].pop("app.kubernetes.io/version")
    meta["deletionTimestamp"] = "2026-11-29T11:59:00Z"
    pod["spec"]["nodeName"] = "gpu-cordoned"
    pod["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]


def _workload(name: str, uid: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": uid,
            "resourceVersion": "9",
            "labels": {"app": name},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "controller": True}],
            "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"nodeName": "gpu-0", "containers": [{"name": "main", "image": "train:1"}], **spec},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


NODES = [RECORDED["node"], _variant(RECORDED["node"], _cordoned)]
PODS = [
    RECORDED["pod"],
    _variant(RECORDED["pod"], _device_plugin_leaving),
    _workload("limits", "u1", containers=[{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
    _workload(
        "init", "u2", initContainers=[{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]
    ),
    _workload("scratch", "u3", volumes=[{"name": "s", "emptyDir": {}}, {"name": "c", "configMap": {}}]),
    _workload("claimer", "u4"),
    _variant(_workload("done", "u5"), lambda p: p["status"].update(phase="Succeeded")),
    _variant(
        _workload("static", "u6"),
        lambda p: p["metadata"].update(
            annotations={"kubernetes.io/config.mirror": "x"}, ownerReferences=[{"kind": "Node"}]
        ),
    ),
]
SLICES = [RECORDED["slice"], _variant(RECORDED["slice"], lambda s: s["spec"].update(driver="other.example"))]
CLAIMS = [
    {
        "metadata": {"name": "c", "namespace": "ml", "uid": "c1", "resourceVersion": "3"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
        "status": {
            "allocation": {
                "devices": {"results": [{"driver": DRA_DRIVER_GPU, "pool": "p", "device": "gpu-0"}]}
            },
            "reservedFor": [{"resource": "pods", "name": "claimer", "uid": "u4"}],
        },
    },
    {"metadata": {"name": "pending", "namespace": "ml"}, "status": {}},
]


def _page(items: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"kind": "List", "metadata": {"resourceVersion": "1"}, "items": items})


def _both(collection: str, items: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    page = _page(items)
    return orjson.loads(page)["items"], shapes.OF_COLLECTIONS[collection](page)["items"]


def test_the_planners_snapshot_is_the_same() -> None:
    (nodes, shaped_nodes), (pods, shaped_pods) = _both("nodes", NODES), _both("pods", PODS)
    (slices, shaped_slices), (claims, shaped_claims) = _both("slices", SLICES), _both("claims", CLAIMS)
    whole = snapshot_from_objects(nodes, pods, slices, now=NOW, claims=claims)
    shaped = snapshot_from_objects(shaped_nodes, shaped_pods, shaped_slices, now=NOW, claims=shaped_claims)
    assert shaped == whole
    # The variants reach what they are for.
    cordoned = next(n for n in whole.nodes if n.name == "gpu-cordoned")
    assert cordoned.unschedulable and not cordoned.ready and cordoned.operands[0].deleting
    workloads = {p.ref.name: p for n in whole.nodes for p in n.pods}
    assert set(workloads) == {"limits", "init", "scratch", "claimer", "static"}
    assert (
        workloads["claimer"].holds_claim and workloads["scratch"].empty_dir and workloads["static"].daemonset
    )
    assert next(n for n in whole.nodes if n.name == "gpu-0").slices


def test_node_facts_and_what_is_served_elsewhere_are_the_same() -> None:
    (nodes, shaped_nodes), (pods, shaped_pods) = _both("nodes", NODES), _both("pods", PODS)
    (slices, shaped_slices) = _both("slices", SLICES)
    assert plugin_nodes(shaped_pods) == plugin_nodes(pods)
    assert slices_per_node(shaped_slices) == slices_per_node(slices)
    per_node, with_plugin = slices_per_node(slices), plugin_nodes(pods)
    for whole, shaped in zip(nodes, shaped_nodes, strict=True):
        facts = node_facts(whole, per_node, with_plugin)
        assert node_facts(shaped, per_node, with_plugin) == facts
        assert served_elsewhere(node_facts(shaped, per_node, with_plugin), NOW) == served_elsewhere(
            facts, NOW
        )


def test_what_is_left_out() -> None:
    (node,) = shapes.OF_COLLECTIONS["nodes"](_page([RECORDED["node"]]))["items"]
    assert "managedFields" not in node["metadata"] and "addresses" not in node["status"]
    (pod,) = shapes.OF_COLLECTIONS["pods"](_page([RECORDED["pod"]]))["items"]
    assert set(pod["spec"]) <= {"nodeName", "containers", "initContainers", "volumes"}
    (item,) = shapes.OF_COLLECTIONS["slices"](_page([RECORDED["slice"]]))["items"]
    assert all(device == {} for device in item["spec"]["devices"])


def test_a_continue_token_is_kept() -> None:
    page = orjson.dumps({"metadata": {"continue": "abc", "resourceVersion": "5"}, "items": None})
    assert shapes.OF_COLLECTIONS["nodes"](page) == {
        "metadata": {"continue": "abc", "resourceVersion": "5"},
        "items": None,
    }


@pytest.mark.parametrize("collection", sorted(shapes.OF_COLLECTIONS))
def test_a_field_of_the_wrong_kind_is_an_error(collection: str) -> None:
    with pytest.raises(ValueError, match="metadata"):
        shapes.OF_COLLECTIONS[collection](b'{"items": [{"metadata": 5}]}')
