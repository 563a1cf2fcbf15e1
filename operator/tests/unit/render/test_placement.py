"""Node placement of a GpuStack: selection, overlap, refusals, and the safe order of a mode switch."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest

from gpuforge import compat
from gpuforge.api import conditions as c
from gpuforge.api.cluster import NodeFacts, OperandPod
from gpuforge.api.gpustack import (
    DEVICE_CLASS_GPU,
    DEVICE_CLASS_VFIO,
    GpuStack,
    GpuStackSpec,
    Mode,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    SelectorOperator,
)
from gpuforge.constants import (
    COMPONENT_DEVICE_PLUGIN,
    COMPONENT_DRA_KUBELET_PLUGIN,
    STACK_LABEL,
)
from gpuforge.constants import (
    DEPLOY_DEVICE_PLUGIN_LABEL as DP_LABEL,
)
from gpuforge.constants import (
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL as DRA_LABEL,
)
from gpuforge.render.placement import NodeState, needs_claim_check, observe, place, release, selects

C = compat.load()
ALL_APIS = frozenset({"v1", "v1beta1", "v1beta2"})
GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}


def req(key: str, op: str, *values: str) -> NodeSelectorRequirement:
    return NodeSelectorRequirement(key, SelectorOperator(op), tuple(values))


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"feature.node.kubernetes.io/pci-10de.present": "true"}, True),
        ({"feature.node.kubernetes.io/pci-0302_10de.present": "true"}, True),
        ({"nvidia.com/gpu.present": "true"}, True),
        ({"feature.node.kubernetes.io/pci-10de.present": "false"}, False),
        ({}, False),
    ],
)
def test_default_selector_any_nfd_variant(labels: Mapping[str, str], expected: bool) -> None:
    assert selects(GpuStackSpec().node_selector, labels) is expected


@pytest.mark.parametrize(
    ("requirement", "labels", "expected"),
    [
        (req("pool", "In", "a", "b"), {"pool": "b"}, True),
        (req("pool", "NotIn", "a"), {}, True),
        (req("pool", "NotIn", "a"), {"pool": "a"}, False),
        (req("pool", "Exists"), {"pool": ""}, True),
        (req("pool", "DoesNotExist"), {"pool": "x"}, False),
        (req("mem", "Gt", "40000"), {"mem": "81920"}, True),
        (req("mem", "Lt", "40000"), {"mem": "81920"}, False),
        (req("mem", "Gt", "1"), {"mem": "lots"}, False),
    ],
)
def test_selector_operators(
    requirement: NodeSelectorRequirement, labels: dict[str, str], expected: bool
) -> None:
    assert selects(NodeSelector((NodeSelectorTerm((requirement,)),)), labels) is expected


# --- one node: the safe order of a switch ------------------------------------------------------------
def node(
    name: str = "n1",
    *,
    labels: Mapping[str, str] | None = None,
    kubelet: str = "v1.36.5",
    gpu: int = 0,
    slices: int = 0,
    claims: int | None = None,
) -> NodeFacts:
    return NodeFacts(
        name,
        {**GPU, **(labels or {})},
        kubelet,
        gpu_capacity=gpu,
        gpu_allocatable={"nvidia.com/gpu": gpu} if gpu else {},
        dra_slices=slices,
        claim_pods=claims,
    )


MINE = {STACK_LABEL: "s"}


@pytest.mark.parametrize(
    ("facts", "mode", "ready", "state"),
    [
        # fresh node: the upgrade engine has not set the deploy label yet
        (node(), Mode.DEVICE_PLUGIN, False, NodeState.PENDING),
        (node(labels={**MINE, DP_LABEL: "true"}), Mode.DEVICE_PLUGIN, False, NodeState.PENDING),
        (node(labels={**MINE, DP_LABEL: "true"}, gpu=8), Mode.DEVICE_PLUGIN, True, NodeState.READY),
        # pinned to a release (rolled back) and serving: ready
        (node(labels={**MINE, DP_LABEL: "v0.17.0"}, gpu=8), Mode.DEVICE_PLUGIN, True, NodeState.READY),
        # plugin Ready but nothing advertised yet: still pending
        (node(labels={**MINE, DP_LABEL: "true"}), Mode.DEVICE_PLUGIN, True, NodeState.PENDING),
        # device plugin -> DRA: old label or old advertisement still there
        (node(labels={**MINE, DP_LABEL: "true"}, gpu=8), Mode.DRA, False, NodeState.SWITCHING),
        (node(labels=MINE, gpu=8), Mode.DRA, False, NodeState.SWITCHING),
        (node(labels=MINE), Mode.DRA, False, NodeState.PENDING),
        (node(labels={**MINE, DRA_LABEL: "true"}, slices=1), Mode.DRA, True, NodeState.READY),
        (node(labels={**MINE, DRA_LABEL: "true"}), Mode.DEVICE_PLUGIN, False, NodeState.SWITCHING),
        (node(labels=MINE, slices=1), Mode.DEVICE_PLUGIN, False, NodeState.SWITCHING),
    ],
)
def test_observe(facts: NodeFacts, mode: Mode, ready: bool, state: NodeState) -> None:
    step = observe(facts, mode, ready)
    assert step.state is state and step.labels == {}


@pytest.mark.parametrize(
    ("labels", "claims", "patch"),
    [
        ({**MINE, DP_LABEL: "true"}, None, {DP_LABEL: None, STACK_LABEL: None}),
        ({**MINE, DRA_LABEL: "true"}, 1, {}),
        ({**MINE, DRA_LABEL: "true"}, 0, {DRA_LABEL: None, STACK_LABEL: None}),
    ],
)
def test_release(labels: dict[str, str], claims: int | None, patch: dict[str, str | None]) -> None:
    assert dict(release(node(labels=labels, claims=claims)).labels) == patch


# --- the whole stack ---------------------------------------------------------------------------------------
def stack(
    name: str = "s",
    mode: Mode = Mode.DEVICE_PLUGIN,
    created: str = "2026-01-01T00:00:00Z",
    selector: NodeSelector | None = None,
    version: str | None = None,
) -> GpuStack:
    spec = GpuStackSpec(mode=mode)
    if selector is not None:
        spec = GpuStackSpec(mode=mode, node_selector=selector)
    if version is not None:
        from dataclasses import replace

        spec = replace(spec, dra=replace(spec.dra, version=version))
    return GpuStack(name, spec, creation_timestamp=created)


def test_fresh_nodes_are_labelled_and_others_left_alone() -> None:
    nodes = [node("g1"), node("g2"), NodeFacts("cpu", {}, "v1.36.0")]
    placement = place(stack(), nodes, [stack()], [], ALL_APIS, C)
    assert [s.node for s in placement.steps] == ["g1", "g2"]
    assert all(s.labels == {} and s.state is NodeState.PENDING for s in placement.steps)
    assert placement.planned == frozenset({"g1", "g2"})  # the upgrade engine labels them
    assert placement.problems == () and placement.releases == ()


def test_a_stopped_plugins_lingering_capacity_is_not_an_advertisement() -> None:
    # kubelet keeps a stopped device plugin's devices in capacity for five minutes, allocatable 0
    lingering = dataclasses.replace(node("g1", labels={**MINE, DRA_LABEL: "true"}, slices=1), gpu_capacity=8)
    assert observe(lingering, Mode.DRA, True).state is NodeState.READY


def test_ready_needs_the_stacks_own_plugin_pod() -> None:
    facts = node("g1", labels={**MINE, DP_LABEL: "true"}, gpu=8)
    other_pod = OperandPod("p", "g1", "other", COMPONENT_DEVICE_PLUGIN, True)
    own_pod = OperandPod("p", "g1", "s", COMPONENT_DEVICE_PLUGIN, True)
    assert place(stack(), [facts], [stack()], [other_pod], ALL_APIS, C).steps[0].state is NodeState.PENDING
    assert place(stack(), [facts], [stack()], [own_pod], ALL_APIS, C).steps[0].state is NodeState.READY


def test_younger_stack_is_refused_on_shared_nodes() -> None:
    old, young = stack("old"), stack("young", created="2026-03-01T00:00:00Z")
    nodes = [node("g1", labels={STACK_LABEL: "young", DP_LABEL: "true"}), node("g2")]
    placement = place(young, nodes, [old, young], [], ALL_APIS, C)
    assert {s.state for s in placement.steps} == {NodeState.CONFLICT}
    (problem,) = placement.problems
    assert problem.reason == c.NODE_CONFLICT and "old" in problem.message and "g1, g2" in problem.message
    # it lets go of the node it held
    assert [(r.node, dict(r.labels)) for r in placement.releases] == [
        ("g1", {DP_LABEL: None, STACK_LABEL: None})
    ]
    # the older one waits for the younger to let go, then takes the node
    older = place(old, nodes, [old, young], [], ALL_APIS, C)
    assert [(s.node, s.state) for s in older.steps] == [("g1", NodeState.PENDING), ("g2", NodeState.PENDING)]
    assert older.steps[0].labels == {} and "young" in older.steps[0].detail
    assert older.planned == frozenset({"g2"}) and placement.planned == frozenset()


def test_unselected_node_is_released() -> None:
    pool_b = NodeSelector((NodeSelectorTerm((req("pool", "In", "b"),)),))
    facts = node("g1", labels={**MINE, "pool": "a", DP_LABEL: "true"})
    placement = place(stack(selector=pool_b), [facts], [stack()], [], ALL_APIS, C)
    assert placement.steps == ()
    assert dict(placement.releases[0].labels) == {DP_LABEL: None, STACK_LABEL: None}
    assert placement.operands == frozenset({Mode.DEVICE_PLUGIN})


@pytest.mark.parametrize(
    ("kubelet", "served", "reason", "text"),
    [
        ("v1.31.4", ALL_APIS, c.INCOMPATIBLE_KUBELET, "needs Kubernetes 1.32"),
        ("v1.33.1", frozenset({"v1"}), c.INCOMPATIBLE_KUBELET, "resource.k8s.io/v1beta1"),
        ("v1.36.5", frozenset(), c.DRA_API_NOT_SERVED, "serves no usable resource.k8s.io version"),
    ],
)
def test_dra_refusals_name_the_nodes(kubelet: str, served: frozenset[str], reason: str, text: str) -> None:
    nodes = [node("old-1", kubelet=kubelet), node("old-2", kubelet=kubelet)]
    placement = place(stack(mode=Mode.DRA), nodes, [stack(mode=Mode.DRA)], [], served, C)
    assert {s.state for s in placement.steps} == {NodeState.REFUSED}
    assert all(s.labels == {} for s in placement.steps)
    (problem,) = placement.problems
    assert problem.reason == reason and text in problem.message
    assert problem.nodes == ("old-1", "old-2") and "old-1, old-2" in problem.message


def test_refused_node_already_running_is_left_running() -> None:
    facts = node("g1", labels={**MINE, DRA_LABEL: "true"}, kubelet="v1.31.0", slices=1)
    placement = place(stack(mode=Mode.DRA), [facts], [stack(mode=Mode.DRA)], [], ALL_APIS, C)
    assert placement.steps[0].labels == {} and placement.steps[0].state is not NodeState.REFUSED


def test_unknown_release_is_reported_once() -> None:
    s = stack(mode=Mode.DRA, version="v3.0.0")
    placement = place(s, [node("g1"), node("g2")], [s], [], ALL_APIS, C)
    assert [p.reason for p in placement.problems] == [c.UNKNOWN_RELEASE]


def test_switching_keeps_the_old_operand_until_no_node_runs_it() -> None:
    nodes = [
        node("g1", labels={**MINE, DP_LABEL: "true"}, gpu=8),
        node("g2", labels={**MINE, DRA_LABEL: "true"}),
    ]
    placement = place(stack(mode=Mode.DRA), nodes, [stack(mode=Mode.DRA)], [], ALL_APIS, C)
    assert placement.operands == frozenset({Mode.DRA, Mode.DEVICE_PLUGIN})
    after = [node("g1", labels=MINE), node("g2", labels={**MINE, DRA_LABEL: "true"})]
    assert place(stack(mode=Mode.DRA), after, [stack(mode=Mode.DRA)], [], ALL_APIS, C).operands == {Mode.DRA}


def test_claim_checks_only_where_the_dra_plugin_may_leave() -> None:
    nodes = [node("stay", labels={**MINE, DRA_LABEL: "true"}), node("fresh")]
    assert needs_claim_check(stack(mode=Mode.DRA), nodes, [stack(mode=Mode.DRA)]) == []
    assert needs_claim_check(stack(mode=Mode.DEVICE_PLUGIN), nodes, [stack()]) == ["stay"]


def test_dra_pods_count_for_dra_nodes() -> None:
    facts = node("g1", labels={**MINE, DRA_LABEL: "true"}, slices=2)
    pod = OperandPod("p", "g1", "s", COMPONENT_DRA_KUBELET_PLUGIN, True)
    placement = place(stack(mode=Mode.DRA), [facts], [stack(mode=Mode.DRA)], [pod], ALL_APIS, C)
    assert placement.steps[0].state is NodeState.READY
    assert placement.dra_api_version == "v1"


def test_pinned_releases_keep_their_daemonsets() -> None:
    nodes = [
        node("g1", labels={**MINE, DP_LABEL: "v0.17.0"}, gpu=8),
        node("g2", labels={**MINE, DP_LABEL: "true"}, gpu=8),
        node("g3", labels={STACK_LABEL: "other", DRA_LABEL: "v25.8.0"}),
    ]
    placement = place(stack(), nodes, [stack()], [], ALL_APIS, C)
    assert placement.operands == frozenset({Mode.DEVICE_PLUGIN})
    assert placement.pinned == frozenset({(Mode.DEVICE_PLUGIN, "v0.17.0")})


def test_dra_refused_nodes_stay_with_the_upgrade_engine() -> None:
    """A 1.31 node on the device plugin is refused for DRA but stays planned, so it keeps serving."""
    facts = node("old-0", labels={**MINE, DP_LABEL: "true"}, kubelet="v1.31.4", gpu=8)
    placement = place(stack(mode=Mode.DRA), [facts], [stack(mode=Mode.DRA)], [], ALL_APIS, C)
    assert placement.steps[0].state is NodeState.REFUSED and placement.planned == frozenset({"old-0"})


@pytest.mark.parametrize("label", ["nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.dra-driver"])
@pytest.mark.parametrize("mode", [Mode.DEVICE_PLUGIN, Mode.DRA])
def test_nodes_the_gpu_operator_serves_are_left_to_it(label: str, mode: Mode) -> None:
    nodes = [
        node("g1", labels={label: "true"}),
        # held before the GPU Operator came: released, so only one plugin advertises its GPUs
        node("g2", labels={label: "true", **MINE, DP_LABEL: "true"}, gpu=8),
        # its driver upgrade holds its plugin off the node for a while: still its node
        node("g5", labels={label: "paused-for-driver-upgrade"}),
        # the GPU Operator does not deploy its plugin here: ours to serve
        node("g3", labels={label: "false"}),
        node("g4"),
    ]
    placement = place(stack(mode=mode), nodes, [stack(mode=mode)], [], ALL_APIS, C)
    states = {s.node: s.state for s in placement.steps}
    assert states["g1"] is states["g2"] is states["g5"] is NodeState.ELSEWHERE
    assert NodeState.ELSEWHERE not in (states["g3"], states["g4"])
    assert placement.planned == frozenset({"g3", "g4"})
    assert [r.node for r in placement.releases] == ["g2"]
    true, paused = sorted(placement.problems, key=lambda p: p.nodes)
    assert true.reason == paused.reason == c.SERVED_ELSEWHERE
    assert (true.nodes, paused.nodes) == (("g1", "g2"), ("g5",))
    assert "GPU Operator" in true.message and f"{label}=true" in true.message and "g1, g2" in true.message


NODE_STATE = "gpuforge.io/upgrade-state"
GPUS = {"nvidia.com/gpu": 8}
NOW = datetime(2026, 8, 1, 12, 0, tzinfo=UTC)


def advertising(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    allocatable: Mapping[str, int] | None = None,
    capacity: int = 0,
    slices: int = 0,
    plugin: bool = False,
    released: int | None = None,  # seconds before NOW
) -> NodeFacts:
    return NodeFacts(
        name,
        {**GPU, **(labels or {})},
        "v1.36.5",
        gpu_capacity=capacity,
        gpu_allocatable=allocatable or {},
        dra_slices=slices,
        gpuforge_plugin=plugin,
        released_at=None if released is None else NOW - timedelta(seconds=released),
    )


@pytest.mark.parametrize("mode", [Mode.DEVICE_PLUGIN, Mode.DRA])
@pytest.mark.parametrize(
    ("facts", "why"),
    [
        # another device plugin (a Helm install, a GPU Operator without its labels) offers the GPUs
        (advertising("n", allocatable=GPUS, capacity=8), "advertises nvidia.com/gpu"),
        (advertising("n", allocatable={"nvidia.com/gpu.shared": 32}), "advertises nvidia.com/gpu.shared"),
        (
            advertising("n", allocatable={"nvidia.com/mig-1g.10gb": 7, "nvidia.com/mig-3g.40gb": 2}),
            "advertises nvidia.com/mig-1g.10gb, nvidia.com/mig-3g.40gb",
        ),
        # another DRA driver publishes the node's GPUs
        (advertising("n", slices=1), "publishes ResourceSlices of gpu.nvidia.com"),
        # nothing advertised: ours to serve
        (advertising("n"), None),
        # capacity alone is what kubelet keeps of a stopped plugin for its grace period: nobody offers GPUs
        (advertising("n", capacity=8), None),
        # gpuforge's own: the advertisement is its plugin's
        (advertising("n", labels=MINE, allocatable=GPUS, capacity=8), None),
        (advertising("n", labels={DP_LABEL: "true"}, allocatable=GPUS), None),
        (advertising("n", labels={DRA_LABEL: "v25.12.0"}, slices=1), None),
        # mid-migration: the old advertisement lingers while the node carries the engine's labels
        (advertising("n", labels={**MINE, NODE_STATE: "wait-old-gone"}, allocatable=GPUS), None),
        (advertising("n", labels={**MINE, NODE_STATE: "wait-old-gone", DRA_LABEL: "true"}, slices=1), None),
        # a plugin pod of some GpuStack is bound there (labels not written yet, or being released)
        (advertising("n", allocatable=GPUS, plugin=True), None),
        (advertising("n", slices=1, plugin=True), None),
        # just released, pod gone: kubelet has not withdrawn the departed plugin's advertisement yet
        (advertising("n", slices=1, released=30), None),
        (advertising("n", allocatable=GPUS, released=89), None),
        # released long ago: what advertises now is someone else's
        (advertising("n", slices=1, released=90), "publishes ResourceSlices of gpu.nvidia.com"),
        (advertising("n", allocatable=GPUS, released=3600), "advertises nvidia.com/gpu"),
        # an upgrade-state label alone is what a deleted GpuStack left behind, not a mark
        (
            advertising("n", labels={NODE_STATE: "upgrade-done"}, allocatable=GPUS),
            "advertises nvidia.com/gpu",
        ),
        # a deploy label turned off is no plugin
        (advertising("n", labels={DP_LABEL: "false"}, allocatable=GPUS), "advertises nvidia.com/gpu"),
    ],
)
def test_nodes_advertising_through_another_installation_are_left_to_it(
    facts: NodeFacts, why: str | None, mode: Mode
) -> None:
    placement = place(stack(mode=mode), [facts], [stack(mode=mode)], [], ALL_APIS, C, NOW)
    step = placement.steps[0]
    if why is None:
        assert step.state is not NodeState.ELSEWHERE
        assert not [p for p in placement.problems if p.reason == c.SERVED_ELSEWHERE]
        return
    assert step.state is NodeState.ELSEWHERE and why in step.detail
    assert placement.planned == frozenset() and placement.releases == ()
    (problem,) = placement.problems
    assert problem.reason == c.SERVED_ELSEWHERE and problem.nodes == ("n",)
    assert why in problem.message and "gpuforge leaves nodes n to it" in problem.message


def test_a_node_another_gpustack_is_releasing_waits_for_it() -> None:
    """Held by another GpuStack (still advertising through its plugin): not another installation's."""
    facts = advertising("n", labels={STACK_LABEL: "other", DP_LABEL: "true"}, allocatable=GPUS, plugin=True)
    stacks = [stack(), stack("other", created="2026-02-01T00:00:00Z")]
    placement = place(stack(), [facts], stacks, [], ALL_APIS, C)
    assert placement.steps[0].state is NodeState.PENDING and not placement.problems


def test_elsewhere_nodes_are_grouped_by_why() -> None:
    nodes = [
        advertising("a", allocatable=GPUS),
        advertising("b", allocatable=GPUS),
        advertising("c", slices=2),
        advertising("d", labels={"nvidia.com/gpu.deploy.device-plugin": "true"}, allocatable=GPUS),
        advertising("e"),
    ]
    placement = place(stack(), nodes, [stack()], [], ALL_APIS, C)
    assert sorted(p.nodes for p in placement.problems) == [("a", "b"), ("c",), ("d",)]
    assert placement.planned == frozenset({"e"})


def test_without_the_time_a_release_mark_counts_for_nothing() -> None:
    facts = advertising("n", allocatable=GPUS, released=0)
    assert place(stack(), [facts], [stack()], [], ALL_APIS, C).steps[0].state is NodeState.ELSEWHERE


def _vfio_stack(version: str) -> GpuStack:
    s = stack(mode=Mode.DRA, version=version)
    classes = (DEVICE_CLASS_GPU, DEVICE_CLASS_VFIO)
    return dataclasses.replace(
        s, spec=dataclasses.replace(s.spec, dra=dataclasses.replace(s.spec.dra, device_classes=classes))
    )


@pytest.mark.parametrize(
    ("version", "refused"),
    [("v25.3.2", True), ("v25.8.0", True), ("v25.8.1", True), ("v25.12.0", False), ("v0.4.0", False)],
)
def test_vfio_class_is_refused_where_the_release_has_no_passthrough(version: str, refused: bool) -> None:
    s = _vfio_stack(version)
    placement = place(s, [node("g1"), node("g2")], [s], [], ALL_APIS, C)
    if not refused:
        assert not placement.problems
        assert {st.state for st in placement.steps} != {NodeState.REFUSED}
        return
    (problem,) = placement.problems
    assert problem.reason == c.UNSUPPORTED_DEVICE_CLASS
    assert "spec.dra.deviceClasses" in problem.message and DEVICE_CLASS_VFIO in problem.message
    assert f"release {version}" in problem.message and "from v25.12.0" in problem.message
    assert {st.state for st in placement.steps} == {NodeState.REFUSED}
    assert all(st.labels == {} for st in placement.steps)
