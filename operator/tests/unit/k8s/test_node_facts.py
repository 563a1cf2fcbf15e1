"""Node and pod objects to the facts placement decides on (gpuforge.k8s.client, no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpuforge.constants import COMPONENT_LABEL, RELEASED_ANNOTATION, STACK_LABEL
from gpuforge.k8s.client import node_facts, plugin_nodes


def node_object(allocatable: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": {}, "annotations": annotations or {}},
        "status": {"capacity": {**allocatable, "nvidia.com/gpu": "8"}, "allocatable": allocatable},
    }


@pytest.mark.parametrize(
    ("allocatable", "offered"),
    [
        ({"nvidia.com/gpu": "8", "cpu": "64"}, {"nvidia.com/gpu": 8}),
        ({"nvidia.com/gpu": "0"}, {}),  # a stopped plugin: capacity kept, nothing offered
        ({"nvidia.com/gpu.shared": "32"}, {"nvidia.com/gpu.shared": 32}),
        ({"nvidia.com/mig-1g.10gb": "7", "example.com/fpga": "1"}, {"nvidia.com/mig-1g.10gb": 7}),
    ],
)
def test_what_a_node_offers_is_its_gpu_allocatable(
    allocatable: dict[str, str], offered: dict[str, int]
) -> None:
    facts = node_facts(node_object(allocatable), {})
    assert dict(facts.gpu_allocatable) == offered and facts.gpu_capacity >= 8


@pytest.mark.parametrize(
    ("value", "released"),
    [
        ("2026-08-01T12:00:00Z", datetime(2026, 8, 1, 12, 0, tzinfo=UTC)),
        ("yesterday", None),
        (None, None),
    ],
)
def test_release_mark(value: str | None, released: datetime | None) -> None:
    annotations = {RELEASED_ANNOTATION: value} if value is not None else {}
    assert node_facts(node_object({}, annotations), {}).released_at == released


def test_nodes_with_a_plugin_pod_of_any_stack() -> None:
    def pod(node: str, labels: dict[str, str], deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": f"p-{node}", "labels": labels}
        if deleting:
            meta["deletionTimestamp"] = "2026-08-01T12:00:00Z"
        return {"metadata": meta, "spec": {"nodeName": node}}

    pods = [
        pod("a", {STACK_LABEL: "s1", COMPONENT_LABEL: "device-plugin"}),
        pod("b", {STACK_LABEL: "s2", COMPONENT_LABEL: "dra-kubelet-plugin"}, deleting=True),
        pod("c", {STACK_LABEL: "s1", COMPONENT_LABEL: "dra-controller"}),  # not a plugin
        pod("d", {COMPONENT_LABEL: "device-plugin"}),  # not a GpuStack's
    ]
    assert plugin_nodes(pods) == {"a", "b"}
    assert node_facts({"metadata": {"name": "b"}}, {}, plugin_nodes(pods)).gpuforge_plugin


def test_a_pass_converts_again_only_the_nodes_that_changed_or_whose_slices_or_plugin_did() -> None:
    from gpuforge.k8s.stack import _facts
    from gpuforge.upgrade.convert import ConversionMemo

    memo = ConversionMemo()
    node = node_object({"nvidia.com/gpu": "8"})
    node["metadata"]["resourceVersion"] = "1"
    first = _facts(memo, node, {}, frozenset())
    assert _facts(memo, node, {}, frozenset()) is first  # unchanged: the same facts
    assert _facts(memo, node, {"n1": 1}, frozenset()).dra_slices == 1  # a slice appeared
    assert _facts(memo, node, {"n1": 1}, {"n1"}).gpuforge_plugin  # its plugin pod came
    changed = {**node, "metadata": {**node["metadata"], "resourceVersion": "2", "labels": {"a": "b"}}}
    assert _facts(memo, changed, {}, frozenset()).labels == {"a": "b"}
