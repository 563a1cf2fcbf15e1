"""The planner's two halves, table by table: each node's class on its own, then slot admission."""

from __future__ import annotations

import pytest
from builders import DRA, VERSIONS, desired, gpu_pod, node, snapshot

from gpuforge.constants import MAINTENANCE_ANNOTATION, UPGRADE_SKIP_LABEL
from gpuforge.upgrade.model import (
    FAILED_TARGET_ANNOTATION,
    GpuNode,
    HoldReason,
    IntOrPercent,
    NodeState,
    Policy,
    RefusalReason,
)
from gpuforge.upgrade.planner import (
    AdmissionCounts,
    Classified,
    NodeClass,
    PlanContext,
    Slots,
    Weight,
    admission_order,
    admit,
    classify_node,
    count_weights,
    start_hold,
    weight_of,
)

S = NodeState
POLICY = Policy(max_unavailable=IntOrPercent(1), max_parallel=0)
TARGET = f"{DRA}@{VERSIONS[DRA]}"
SKIP = {UPGRADE_SKIP_LABEL: "true"}
UNDER_MAINTENANCE = {MAINTENANCE_ANNOTATION: "true"}


def classify(n: GpuNode, *, selected: bool = True, served: tuple[str, ...] = ("v1",)) -> Classified:
    ctx = PlanContext(snapshot(n, served=served), desired(names=[n.name] if selected else []), POLICY)
    return classify_node(ctx, n)


@pytest.mark.parametrize(
    ("n", "selected", "kind", "hold"),
    [
        pytest.param(node(mode=None), False, NodeClass.OTHERS, None, id="unselected-unmarked"),
        pytest.param(node(), False, NodeClass.RELEASE, None, id="unselected-with-our-deploy-label"),
        pytest.param(
            node(annotations=UNDER_MAINTENANCE), False, NodeClass.OTHERS, None, id="unselected-maintenance"
        ),
        pytest.param(
            node(annotations=UNDER_MAINTENANCE), True, NodeClass.MAINTENANCE, None, id="maintenance"
        ),
        pytest.param(
            node(state=S.DRAIN_REQUIRED, held=False, annotations=UNDER_MAINTENANCE),
            True,
            NodeClass.MAINTENANCE,
            None,
            id="maintenance-wins-over-in-flight",
        ),
        pytest.param(
            node(state=S.DRAIN_REQUIRED, held=False), True, NodeClass.IN_FLIGHT, None, id="in-flight"
        ),
        pytest.param(
            node(state=S.UPGRADE_FAILED, annotations={FAILED_TARGET_ANNOTATION: TARGET}),
            True,
            NodeClass.FAILED,
            None,
            id="failed-on-this-target",
        ),
        pytest.param(
            node(state=S.UPGRADE_FAILED, annotations={FAILED_TARGET_ANNOTATION: "dra@v0.0.1"}),
            True,
            NodeClass.CANDIDATE,
            None,
            id="failed-on-another-target-tries-again",
        ),
        pytest.param(node(mode=DRA), True, NodeClass.IN_SYNC, None, id="in-sync"),
        pytest.param(node(mode=None), True, NodeClass.INSTALL, None, id="new-node"),
        pytest.param(
            node(mode=None, ready=False),
            True,
            NodeClass.INSTALL,
            HoldReason.NOT_READY,
            id="new-node-not-ready",
        ),
        pytest.param(
            node(mode=None, labels=SKIP), True, NodeClass.INSTALL, HoldReason.SKIPPED, id="new-node-skipped"
        ),
        pytest.param(
            node(mode=None, held=False), True, NodeClass.CANDIDATE, None, id="new-node-we-hold-takes-a-slot"
        ),
        pytest.param(node(), True, NodeClass.CANDIDATE, None, id="mode-change"),
        pytest.param(
            node(ready=False), True, NodeClass.CANDIDATE, HoldReason.NOT_READY, id="candidate-not-ready"
        ),
        pytest.param(
            node(ready=False, labels=SKIP),
            True,
            NodeClass.CANDIDATE,
            HoldReason.SKIPPED,
            id="skip-before-not-ready",
        ),
    ],
)
def test_classify_node(n: GpuNode, selected: bool, kind: NodeClass, hold: HoldReason | None) -> None:
    got = classify(n, selected=selected)
    assert got.kind is kind
    assert (got.hold[0] if got.hold else None) is hold
    assert got.refusal is None


def test_a_node_the_target_cannot_serve_is_refused_not_held() -> None:
    got = classify(node(), served=())
    assert got.kind is NodeClass.REFUSED
    assert got.refusal is not None and got.refusal[0] is RefusalReason.NO_DRA_API


@pytest.mark.parametrize(
    ("n", "policy", "hold"),
    [
        (node(), POLICY, None),
        (node(ready=False), POLICY, HoldReason.NOT_READY),
        (node(labels=SKIP), POLICY, HoldReason.SKIPPED),
        (node(labels={UPGRADE_SKIP_LABEL: "false"}), POLICY, None),
        (node(labels={"mine/skip": "true"}), Policy(skip_label="mine/skip"), HoldReason.SKIPPED),
        (node(labels=SKIP), Policy(skip_label=""), None),
    ],
)
def test_start_hold(n: GpuNode, policy: Policy, hold: HoldReason | None) -> None:
    got = start_hold(n, policy)
    assert (got[0] if got else None) is hold


def candidate(name: str, *, hold: HoldReason | None = None, **kwargs: object) -> Classified:
    return Classified(
        node(name, **kwargs),  # type: ignore[arg-type]
        NodeClass.CANDIDATE,
        hold=(hold, "held") if hold is not None else None,
    )


def slots(max_unavailable: int = 1, unavailable: int = 0, in_progress: int = 0, failed: int = 0) -> Slots:
    return Slots(max_unavailable, unavailable, in_progress, tuple(f"f{i}" for i in range(failed)))


THREE = [candidate("a"), candidate("b"), candidate("c")]


@pytest.mark.parametrize(
    ("policy", "free", "candidates", "expected"),
    [
        pytest.param(POLICY, slots(), THREE, ["a", "MaxUnavailable", "MaxUnavailable"], id="one-slot"),
        pytest.param(POLICY, slots(max_unavailable=2), THREE, ["a", "b", "MaxUnavailable"], id="two-slots"),
        pytest.param(POLICY, slots(unavailable=1), THREE, ["MaxUnavailable"] * 3, id="slot-taken"),
        pytest.param(
            POLICY,
            slots(unavailable=1),
            [candidate("a"), candidate("z", unschedulable=True)],
            ["z", "MaxUnavailable"],
            id="cordoned-costs-no-slot",
        ),
        pytest.param(
            Policy(max_unavailable=IntOrPercent(5), max_parallel=1),
            slots(max_unavailable=5, in_progress=1),
            THREE,
            ["MaxParallel"] * 3,
            id="max-parallel-counts-in-flight",
        ),
        pytest.param(
            Policy(max_unavailable=IntOrPercent(5), max_parallel=2),
            slots(max_unavailable=5),
            THREE,
            ["a", "b", "MaxParallel"],
            id="max-parallel-counts-admitted",
        ),
        pytest.param(Policy(paused=True), slots(max_unavailable=5), THREE, ["Paused"] * 3, id="paused"),
        pytest.param(
            Policy(max_failures=2), slots(max_unavailable=5, failed=2), THREE, ["Halted"] * 3, id="halted"
        ),
        pytest.param(
            Policy(max_failures=0), slots(max_unavailable=5, failed=9), THREE[:1], ["a"], id="never-halts"
        ),
        pytest.param(
            POLICY,
            slots(),
            [candidate("a", hold=HoldReason.NOT_READY), candidate("b")],
            ["NodeNotReady", "b"],
            id="node-hold-takes-no-slot",
        ),
        pytest.param(
            Policy(paused=True),
            slots(),
            [candidate("a", hold=HoldReason.SKIPPED)],
            ["Skipped"],
            id="node-hold-before-pause",
        ),
    ],
)
def test_admit(policy: Policy, free: Slots, candidates: list[Classified], expected: list[str]) -> None:
    got = admit(policy, TARGET, free, candidates)
    assert [a.hold[0].value if a.hold else a.node.name for a in got] == expected


@pytest.mark.parametrize(
    ("hold", "queued"),
    [
        (HoldReason.MAX_UNAVAILABLE, True),
        (HoldReason.MAX_PARALLEL, True),
        (HoldReason.PAUSED, False),
        (HoldReason.HALTED, False),
        (HoldReason.SKIPPED, False),
    ],
)
def test_only_slots_queue_a_node(hold: HoldReason, queued: bool) -> None:
    policies = {
        HoldReason.MAX_UNAVAILABLE: (POLICY, slots(unavailable=1)),
        HoldReason.MAX_PARALLEL: (Policy(max_parallel=1), slots(in_progress=1)),
        HoldReason.PAUSED: (Policy(paused=True), slots()),
        HoldReason.HALTED: (Policy(max_failures=1), slots(failed=1)),
        HoldReason.SKIPPED: (POLICY, slots()),
    }
    policy, free = policies[hold]
    item = candidate("a", hold=hold if hold is HoldReason.SKIPPED else None)
    (got,) = admit(policy, TARGET, free, [item])
    assert got.hold is not None and got.hold[0] is hold
    assert got.queued is queued


def test_admission_order_puts_cordoned_then_fewer_gpu_pods_first() -> None:
    items = [
        candidate("a", pods=[gpu_pod("p1"), gpu_pod("p2")]),
        candidate("b", pods=[gpu_pod("p3")]),
        candidate("c", pods=[gpu_pod("p4"), gpu_pod("p5")], unschedulable=True),
        candidate("d"),
    ]
    assert [c.node.name for c in admission_order(items)] == ["c", "d", "b", "a"]


def test_halt_message_names_the_failed_nodes_and_the_target() -> None:
    (got,) = admit(Policy(max_failures=1), TARGET, slots(failed=1), [candidate("a")])
    assert got.hold is not None
    assert (
        got.hold[1]
        == f"1 node(s) failed on {TARGET}: f0; fix or relabel them (state upgrade-required) to go on"
    )


FAILED_HERE = {FAILED_TARGET_ANNOTATION: TARGET}


@pytest.mark.parametrize(
    ("n", "weight"),
    [
        pytest.param(node(), None, id="schedulable-ready-not-held"),
        pytest.param(node(state=S.UPGRADE_DONE), None, id="done"),
        pytest.param(node(unschedulable=True), Weight(True, False, ""), id="someone-elses-cordon"),
        pytest.param(node(ready=False), Weight(True, False, ""), id="not-ready"),
        pytest.param(
            node(state=S.DRAIN_REQUIRED, held=False, unschedulable=True),
            Weight(True, True, ""),
            id="in-flight-cordoned",
        ),
        pytest.param(
            node(state=S.VALIDATION_REQUIRED, held=True, unschedulable=True),
            Weight(True, True, ""),
            id="in-flight-was-cordoned",
        ),
        pytest.param(
            node(state=S.UPGRADE_FAILED, held=False, unschedulable=True, annotations=FAILED_HERE),
            Weight(True, False, TARGET),
            id="failed-held",
        ),
        pytest.param(
            node(state=S.UPGRADE_FAILED, annotations=FAILED_HERE), Weight(False, False, TARGET), id="failed"
        ),
    ],
)
def test_weight_of(n: GpuNode, weight: Weight | None) -> None:
    assert weight_of(n) == weight


@pytest.mark.parametrize(
    ("weights", "selected", "counts"),
    [
        pytest.param([], {"a"}, AdmissionCounts(), id="nothing-weighs"),
        pytest.param(
            [("a", Weight(True, True, "")), ("b", Weight(True, False, "")), ("c", Weight(False, False, "t"))],
            {"a", "b", "c"},
            AdmissionCounts(unavailable=2, in_progress=1, failed=(("t", "c"),)),
            id="each-kind",
        ),
        pytest.param(
            [("a", Weight(True, True, "")), ("x", Weight(True, False, "t"))],
            {"a"},
            AdmissionCounts(unavailable=1, in_progress=1),
            id="unselected-nodes-not-counted",
        ),
        pytest.param(
            [
                ("b", Weight(False, False, "t2")),
                ("a", Weight(False, False, "t1")),
                ("c", Weight(True, False, "t1")),
            ],
            {"a", "b", "c"},
            AdmissionCounts(unavailable=1, failed=(("t1", "a"), ("t1", "c"), ("t2", "b"))),
            id="failures-by-target-sorted",
        ),
    ],
)
def test_count_weights(
    weights: list[tuple[str, Weight]], selected: set[str], counts: AdmissionCounts
) -> None:
    assert count_weights(weights, selected) == counts


def test_slots_of_counts_take_the_failures_on_this_target_only() -> None:
    ctx = PlanContext(
        snapshot(node("a")), desired(names=["a", "b", "c"]), Policy(max_unavailable=IntOrPercent(2))
    )
    counts = AdmissionCounts(1, 1, (("old-target", "b"), (ctx.fingerprint, "c")))
    assert Slots.of_counts(ctx, counts) == Slots(2, 1, 1, ("c",))
