"""Table-driven tests of the upgrade planner: one rule per test, inputs built from scratch."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import DP, DRA, NOW, VERSIONS, ago, desired, gpu_pod, node, snapshot

from gpuforge.constants import (
    DEPLOY_DEVICE_PLUGIN_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    MAINTENANCE_ANNOTATION,
    NODE_STATE_LABEL,
    RELEASED_ANNOTATION,
    STACK_LABEL,
    UPGRADE_SKIP_LABEL,
)
from gpuforge.upgrade import advance, plan
from gpuforge.upgrade.labelselector import LabelSelector
from gpuforge.upgrade.model import (
    DEPLOY_LABELS,
    FAILED_TARGET_ANNOTATION,
    FAILURE_ANNOTATION,
    FROM_ANNOTATION,
    IN_FLIGHT_STATES,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    STATE_SINCE_ANNOTATION,
    Cordon,
    DeletePods,
    DraDriverSupport,
    Drain,
    EvictPods,
    GpuNode,
    HoldReason,
    IntOrPercent,
    NodeState,
    OnFailure,
    Plan,
    PodDeletion,
    PodRef,
    Policy,
    Refusal,
    RefusalReason,
    SetAnnotations,
    SetLabels,
    Transition,
    Uncordon,
    WaitForCompletion,
    WorkloadPod,
)
from gpuforge.upgrade.planner import weighs_on_admission

S = NodeState
DRA_FROM_DP = f"devicePlugin@{VERSIONS[DP]}"
POLICY = Policy(max_unavailable=IntOrPercent(1), max_parallel=0)


def only(result: Plan) -> Transition:
    assert len(result.transitions) == 1, result.transitions
    return result.transitions[0]


def labels_of(transition: Transition) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for action in transition.actions:
        if isinstance(action, SetLabels):
            out.update(action.values)
    return out


def annotations_of(transition: Transition) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for action in transition.actions:
        if isinstance(action, SetAnnotations):
            out.update(action.values)
    return out


def has(transition: Transition, kind: type) -> bool:
    return any(isinstance(a, kind) for a in transition.actions)


def step(n: GpuNode, policy: Policy = POLICY, **kwargs: object) -> Plan:
    want = desired(names=[n.name], **kwargs)
    return plan(snapshot(n), want, policy)


def admitted(result: Plan) -> list[Transition]:
    """Transitions that start work on a node (it enters an in-flight state from outside)."""
    return [
        t
        for t in result.transitions
        if t.from_state not in IN_FLIGHT_STATES and t.to_state in IN_FLIGHT_STATES
    ]


def hold_nodes(result: Plan, reason: HoldReason) -> tuple[str, ...]:
    return next((h.nodes for h in result.holds if h.reason is reason), ())


# --- first sight ----------------------------------------------------------------------------------


def test_node_in_sync_is_marked_done_without_cordon() -> None:
    t = only(step(node(mode=DRA)))
    assert t.to_state is S.UPGRADE_DONE
    assert labels_of(t)[NODE_STATE_LABEL] == "upgrade-done"
    assert not has(t, Cordon)


def test_node_in_sync_and_labelled_done_needs_nothing() -> None:
    assert step(node(mode=DRA, state=S.UPGRADE_DONE)).transitions == ()


def test_new_node_gets_the_target_stack_at_once_without_a_slot() -> None:
    busy = node("busy", mode=DP, unschedulable=True)  # budget used up
    fresh = node("fresh", mode=None)
    result = plan(snapshot(busy, fresh), desired(names=["busy", "fresh"]), POLICY)
    t = next(t for t in result.transitions if t.node == "fresh")
    assert t.to_state is S.VALIDATION_REQUIRED
    assert labels_of(t)[DEPLOY_DRA_KUBELET_PLUGIN_LABEL] == "true"
    assert not has(t, Cordon)


def test_stack_label_is_written_on_nodes_we_hold() -> None:
    t = only(step(node(mode=DRA), stack="gpus"))
    assert labels_of(t)[STACK_LABEL] == "gpus"


def test_unknown_state_value_is_derived_again() -> None:
    t = only(step(node(mode=DRA, labels={NODE_STATE_LABEL: "banana"})))
    assert t.from_state is None and t.to_state is S.UPGRADE_DONE


# --- admission: maxUnavailable, maxParallel, paused, skip, NotReady, maintenance ------------------


WAIT_FOR_TRAINING = Policy(
    max_unavailable=IntOrPercent(1),
    max_parallel=0,
    wait_for_completion=WaitForCompletion(LabelSelector.parse("app=train"), timeout_seconds=600),
)


def test_admission_records_origin_and_cordons() -> None:
    t = only(step(node(mode=DP), WAIT_FOR_TRAINING))
    assert t.to_state is S.WAIT_FOR_JOBS_REQUIRED
    assert has(t, Cordon)
    assert annotations_of(t)[INITIAL_UNSCHEDULABLE_ANNOTATION] == "false"
    assert annotations_of(t)[FROM_ANNOTATION] == DRA_FROM_DP
    assert t.node_patch() == {
        "metadata": {
            "labels": {NODE_STATE_LABEL: "wait-for-jobs-required"},
            "annotations": {
                INITIAL_UNSCHEDULABLE_ANNOTATION: "false",
                FROM_ANNOTATION: DRA_FROM_DP,
                STATE_SINCE_ANNOTATION: ago(0),
            },
        },
        "spec": {"unschedulable": True},
    }


@pytest.mark.parametrize(
    ("pods", "policy", "state"),
    [
        ([], POLICY, S.WAIT_OLD_GONE),  # nothing to wait for: cordon and old stack off in one patch
        ([gpu_pod("j")], POLICY, S.WAIT_FOR_JOBS_REQUIRED),  # a GPU pod must leave: after the cordon
        ([], WAIT_FOR_TRAINING, S.WAIT_FOR_JOBS_REQUIRED),  # jobs are looked for after the cordon
        ([], replace(POLICY, drain=Drain(enable=True)), S.WAIT_FOR_JOBS_REQUIRED),  # drain: likewise
    ],
)
def test_admission_goes_on_at_once_only_when_no_pod_must_finish_or_leave(
    pods: list[WorkloadPod], policy: Policy, state: NodeState
) -> None:
    t = only(step(node(mode=DP, pods=pods), policy))
    assert t.to_state is state and has(t, Cordon)
    assert annotations_of(t)[FROM_ANNOTATION] == DRA_FROM_DP
    if state is S.WAIT_OLD_GONE:
        assert labels_of(t)[DEPLOY_LABELS[DP]] is None  # the old stack is off in the same patch
        assert t.node_patch()["spec"] == {"unschedulable": True}


def test_node_cordoned_by_someone_else_is_admitted_free_and_remembered() -> None:
    busy = node("a", mode=DP, unschedulable=True)
    other = node("b", mode=DP, unschedulable=True)
    result = plan(snapshot(busy, other), desired(names=["a", "b"]), POLICY)  # 2 unavailable > max 1
    assert {t.node for t in result.transitions} == {"a", "b"}
    for t in result.transitions:
        assert not has(t, Cordon)
        assert annotations_of(t)[INITIAL_UNSCHEDULABLE_ANNOTATION] == "true"


@pytest.mark.parametrize(
    ("max_unavailable", "nodes", "down", "expected"),
    [
        (IntOrPercent(2), 5, 0, 2),
        (IntOrPercent(2), 5, 1, 1),  # a NotReady node counts against the budget
        (IntOrPercent(25, percent=True), 10, 0, 3),  # rounds up
        (IntOrPercent(10, percent=True), 5, 0, 1),  # at least one
        (IntOrPercent(0), 5, 0, 0),
        (IntOrPercent(100, percent=True), 5, 0, 5),
    ],
)
def test_max_unavailable(max_unavailable: IntOrPercent, nodes: int, down: int, expected: int) -> None:
    all_nodes = [node(f"n{i}", mode=DP, ready=i >= down) for i in range(nodes)]
    policy = Policy(max_unavailable=max_unavailable, max_parallel=0)
    result = plan(snapshot(*all_nodes), desired(names=[n.name for n in all_nodes]), policy)
    assert len(admitted(result)) == expected
    if expected < nodes - down:
        assert len(hold_nodes(result, HoldReason.MAX_UNAVAILABLE)) == nodes - down - expected
    if down:
        assert hold_nodes(result, HoldReason.NOT_READY) == ("n0",)


def test_max_parallel_counts_nodes_in_flight() -> None:
    flying = node(
        "a", mode=DP, state=S.WAIT_FOR_JOBS_REQUIRED, held=True, origin=DRA_FROM_DP, unschedulable=True
    )
    waiting = node("b", mode=DP, unschedulable=True)
    policy = Policy(max_unavailable=IntOrPercent(10), max_parallel=1)
    result = plan(snapshot(flying, waiting), desired(names=["a", "b"]), policy)
    assert hold_nodes(result, HoldReason.MAX_PARALLEL) == ("b",)


def test_paused_starts_nothing() -> None:
    result = step(node(mode=DP), Policy(paused=True))
    assert hold_nodes(result, HoldReason.PAUSED) == ("n1",)
    assert all(t.to_state is S.UPGRADE_REQUIRED for t in result.transitions)


def test_paused_lets_nodes_in_flight_finish() -> None:
    n = node(mode=DRA, state=S.VALIDATION_REQUIRED, held=False, origin=DRA_FROM_DP, unschedulable=True)
    t = only(step(n, Policy(paused=True)))
    assert t.to_state is S.UPGRADE_DONE and has(t, Uncordon)


def test_skip_label_leaves_the_node_alone() -> None:
    result = step(node(mode=DP, labels={UPGRADE_SKIP_LABEL: "true"}))
    assert hold_nodes(result, HoldReason.SKIPPED) == ("n1",)
    assert not any(has(t, Cordon) for t in result.transitions)


def test_maintenance_means_no_transition_at_all_even_in_flight() -> None:
    n = node(
        mode=DP,
        state=S.DRAIN_REQUIRED,
        held=False,
        origin=DRA_FROM_DP,
        unschedulable=True,
        pods=[gpu_pod("job")],
        annotations={MAINTENANCE_ANNOTATION: "driver-upgrade"},
    )
    result = step(n)
    assert result.transitions == ()
    assert hold_nodes(result, HoldReason.MAINTENANCE) == ("n1",)


def test_nodes_with_fewer_gpu_pods_and_already_cordoned_go_first() -> None:
    busy = node("a", mode=DP, pods=[gpu_pod("j1"), gpu_pod("j2")])
    idle = node("b", mode=DP)
    cordoned = node("c", mode=DP, unschedulable=True)
    policy = Policy(max_unavailable=IntOrPercent(2), max_parallel=2)
    result = plan(snapshot(busy, idle, cordoned), desired(names=["a", "b", "c"]), policy)
    assert [t.node for t in admitted(result)] == ["c", "b"]
    assert result.admitted == ("c", "b") and result.queue == ("c", "b", "a")


def test_the_queue_holds_only_nodes_a_slot_holds_back() -> None:
    skipped = node("a", mode=DP, labels={UPGRADE_SKIP_LABEL: "true"})
    down = node("b", mode=DP, ready=False)
    waiting = [node(name, mode=DP) for name in ("c", "d", "e")]
    policy = Policy(max_unavailable=IntOrPercent(2), max_parallel=0)
    result = plan(snapshot(skipped, down, *waiting), desired(names=["a", "b", "c", "d", "e"]), policy)
    assert result.admitted == ("c",) and result.queue == ("c", "d", "e")  # NotReady b uses a slot
    assert [n.name for n in (skipped, down, *waiting) if weighs_on_admission(n)] == ["b"]


def test_a_percentage_is_of_every_node_the_stack_selects_even_those_not_in_the_snapshot() -> None:
    """Freed slots are filled from a snapshot of a few nodes: maxUnavailable must not shrink with it."""
    names = [f"n{i}" for i in range(10)]
    policy = Policy(max_unavailable=IntOrPercent(20, percent=True), max_parallel=0)
    result = plan(snapshot(*(node(n, mode=DP) for n in names[:3])), desired(names=names), policy)
    assert result.admitted == ("n0", "n1")  # 20% of 10, not of the 3 planned


# --- waiting for jobs and draining ----------------------------------------------------------------


def in_flight(state: NodeState, **kwargs: object) -> GpuNode:
    defaults: dict[str, object] = {"mode": DP, "held": False, "origin": DRA_FROM_DP, "unschedulable": True}
    defaults.update(kwargs)
    return node(state=state, **defaults)  # type: ignore[arg-type]


WAIT = Policy(
    max_unavailable=IntOrPercent(1),
    wait_for_completion=WaitForCompletion(LabelSelector.parse("app=train"), timeout_seconds=600),
)


def test_waits_for_selected_jobs() -> None:
    n = in_flight(S.WAIT_FOR_JOBS_REQUIRED, since=100, pods=[gpu_pod("t", labels={"app": "train"})])
    assert step(n, WAIT).transitions == ()


def test_wait_for_jobs_timeout_goes_on_to_eviction() -> None:
    n = in_flight(S.WAIT_FOR_JOBS_REQUIRED, since=601, pods=[gpu_pod("t", labels={"app": "train"})])
    t = only(step(n, WAIT))
    assert t.to_state is S.DRAIN_REQUIRED
    assert EvictPods((PodRef("jobs", "t"),)) in t.actions


def test_unselected_gpu_pods_are_evicted_without_waiting() -> None:
    n = in_flight(S.WAIT_FOR_JOBS_REQUIRED, pods=[gpu_pod("web", labels={"app": "web"})])
    t = only(step(n, WAIT))
    assert t.to_state is S.DRAIN_REQUIRED
    assert EvictPods((PodRef("jobs", "web"),)) in t.actions


@pytest.mark.parametrize(
    ("pod", "policy", "evicted"),
    [
        (gpu_pod("p"), POLICY, True),
        (gpu_pod("p", controlled=False), POLICY, False),  # bare pod: needs force
        (gpu_pod("p", controlled=False), Policy(pod_deletion=PodDeletion(force=True)), True),
        (gpu_pod("p", empty_dir=True), POLICY, False),
        (gpu_pod("p", empty_dir=True), Policy(pod_deletion=PodDeletion(delete_empty_dir=True)), True),
        (gpu_pod("p", deleting=True), POLICY, False),  # already terminating
        (gpu_pod("p", daemonset=True), POLICY, False),  # DaemonSet pods are never evicted
        (gpu_pod("p"), Policy(pod_deletion=PodDeletion(enable=False)), False),  # only wait
    ],
)
def test_which_pods_are_evicted(pod: object, policy: Policy, evicted: bool) -> None:
    n = in_flight(S.DRAIN_REQUIRED, pods=[pod])
    result = step(n, policy)
    evictions = [a for t in result.transitions for a in t.actions if isinstance(a, EvictPods)]
    assert bool(evictions) == evicted


def test_drain_enabled_evicts_all_pods_even_for_a_version_upgrade() -> None:
    cpu = gpu_pod("cpu-job", labels={"tier": "batch"})
    cpu = type(cpu)(cpu.ref, labels=cpu.labels, uses_gpu=False)
    n = node(
        mode=DRA,
        version="v25.8.0",
        state=S.DRAIN_REQUIRED,
        held=False,
        origin="dra@v25.8.0",
        unschedulable=True,
        pods=[cpu],
    )
    policy = Policy(drain=Drain(enable=True))
    t = only(step(n, policy))
    assert EvictPods((PodRef("jobs", "cpu-job"),)) in t.actions


def test_drain_timeout_before_any_change_fails_and_gives_the_node_back() -> None:
    n = in_flight(S.DRAIN_REQUIRED, since=301, pods=[gpu_pod("stuck")])
    t = only(step(n))
    assert t.to_state is S.UPGRADE_FAILED
    assert has(t, Uncordon)  # it still serves on the device plugin
    assert t.failure is not None and "jobs/stuck" in t.failure
    ann = annotations_of(t)
    assert ann[FAILED_TARGET_ANNOTATION] == f"dra@{VERSIONS[DRA]}"
    assert ann[INITIAL_UNSCHEDULABLE_ANNOTATION] is None


@pytest.mark.parametrize(
    ("since", "pod", "refused"),
    [
        (0, gpu_pod("guarded"), False),  # entered just now: its eviction was only just sent
        (5, gpu_pod("guarded"), True),  # still there, not terminating, a pass later: refused (429)
        (5, gpu_pod("guarded", deleting=True), False),  # accepted: terminating
        (5, gpu_pod("bare", controlled=False), False),  # never sent (needs force): not a refusal
    ],
)
def test_a_refused_eviction_holds_the_node_naming_the_disruption_budget(
    since: int, pod: WorkloadPod, refused: bool
) -> None:
    n = in_flight(S.DRAIN_REQUIRED, since=since, pods=[pod])
    result = step(n)
    holds = {h.reason: h for h in result.holds}
    assert (HoldReason.EVICTION_BLOCKED in holds) == refused
    if refused:
        assert holds[HoldReason.EVICTION_BLOCKED].nodes == ("n1",)
        assert "PodDisruptionBudget" in holds[HoldReason.EVICTION_BLOCKED].message
        t = only(result)
        assert t.to_state is S.DRAIN_REQUIRED and not t.changes_state
        assert EvictPods((pod.ref,)) in t.actions  # tried again on every pass
        assert "jobs/guarded" in t.message


def test_drain_timeout_names_the_pod_a_disruption_budget_kept() -> None:
    n = in_flight(S.DRAIN_REQUIRED, since=301, pods=[gpu_pod("guarded"), gpu_pod("going", deleting=True)])
    t = only(step(n))
    assert t.to_state is S.UPGRADE_FAILED and t.failure is not None
    assert "jobs/guarded (eviction refused: a PodDisruptionBudget" in t.failure
    assert "jobs/going," in t.failure or t.failure.endswith("jobs/going")  # terminating: no reason given


def test_no_pods_left_turns_the_old_stack_off() -> None:
    t = only(step(in_flight(S.DRAIN_REQUIRED)))
    assert t.to_state is S.WAIT_OLD_GONE
    assert labels_of(t)[DEPLOY_DEVICE_PLUGIN_LABEL] is None
    assert DEPLOY_DRA_KUBELET_PLUGIN_LABEL not in labels_of(t)


def test_an_idle_node_goes_from_wait_for_jobs_to_old_stack_off_in_one_plan() -> None:
    t = only(step(in_flight(S.WAIT_FOR_JOBS_REQUIRED)))
    assert t.to_state is S.WAIT_OLD_GONE
    assert labels_of(t)[DEPLOY_DEVICE_PLUGIN_LABEL] is None


# --- switching stacks -----------------------------------------------------------------------------


def switching(**kwargs: object) -> GpuNode:
    """A node in wait-old-gone: device-plugin label already off."""
    defaults: dict[str, object] = {"mode": DP, "held": False, "origin": DRA_FROM_DP, "unschedulable": True}
    defaults.update(kwargs)
    n = node(state=S.WAIT_OLD_GONE, **defaults)  # type: ignore[arg-type]
    labels = {k: v for k, v in n.labels.items() if k != DEPLOY_DEVICE_PLUGIN_LABEL}
    return _replace(n, labels=labels)


def _replace(n: GpuNode, **changes: object) -> GpuNode:
    return replace(n, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("case", "kwargs", "waits_for"),
    [
        ("old pod still there", {"operand_deleting": True}, "pod"),
        ("old pod gone, allocatable not yet 0", {"operand": False}, "advertising"),
    ],
)
def test_new_stack_waits_until_the_old_one_is_gone(
    case: str, kwargs: dict[str, object], waits_for: str
) -> None:
    result = step(switching(**kwargs))
    assert all(DEPLOY_DRA_KUBELET_PLUGIN_LABEL not in labels_of(t) for t in result.transitions)


def test_new_stack_starts_once_the_old_is_gone() -> None:
    t = only(step(switching(operand=False, advertising=False)))
    assert t.to_state is S.VALIDATION_REQUIRED
    assert labels_of(t)[DEPLOY_DRA_KUBELET_PLUGIN_LABEL] == "true"


def test_a_stopped_plugins_capacity_kept_by_kubelet_does_not_hold_the_switch() -> None:
    # kubelet keeps the devices of a plugin that went away in capacity for five minutes, allocatable 0
    lingering = _replace(switching(operand=False, advertising=False), gpu_capacity=8)
    t = only(step(lingering))
    assert t.to_state is S.VALIDATION_REQUIRED


def test_gpu_pod_that_slipped_in_is_evicted_before_the_new_stack_starts() -> None:
    t = only(step(switching(operand=False, advertising=False, pods=[gpu_pod("late")])))
    assert t.to_state is S.DRAIN_REQUIRED
    assert EvictPods((PodRef("jobs", "late"),)) in t.actions
    assert DEPLOY_DRA_KUBELET_PLUGIN_LABEL not in labels_of(t)


def test_old_label_turned_back_on_by_someone_is_turned_off_again() -> None:
    n = node(mode=DP, state=S.WAIT_OLD_GONE, held=False, origin=DRA_FROM_DP, unschedulable=True)
    t = only(step(n))
    assert labels_of(t)[DEPLOY_DEVICE_PLUGIN_LABEL] is None


def test_both_labels_on_is_repaired_by_turning_the_old_one_off() -> None:
    n = node(
        mode=DP,
        labels={DEPLOY_DRA_KUBELET_PLUGIN_LABEL: "true"},
        state=S.DRAIN_REQUIRED,
        held=False,
        origin=DRA_FROM_DP,
        unschedulable=True,
    )
    t = only(step(n))
    assert labels_of(t) == {DEPLOY_DEVICE_PLUGIN_LABEL: None, NODE_STATE_LABEL: "wait-old-gone"}


def test_wait_old_gone_timeout_fails_and_stays_cordoned_with_halt() -> None:
    t = only(step(switching(operand_deleting=True, since=601)))
    assert t.to_state is S.UPGRADE_FAILED
    assert not has(t, Uncordon)
    assert annotations_of(t)[FAILURE_ANNOTATION].startswith("waiting for pod(s)")


# --- validation and finishing ---------------------------------------------------------------------


def validating(**kwargs: object) -> GpuNode:
    defaults: dict[str, object] = {"mode": DRA, "held": False, "origin": DRA_FROM_DP, "unschedulable": True}
    defaults.update(kwargs)
    return node(state=S.VALIDATION_REQUIRED, **defaults)  # type: ignore[arg-type]


def test_validation_waits_for_ready_plugin() -> None:
    assert step(validating(operand_ready=False, advertising=False)).transitions == ()


def test_validation_waits_until_all_gpus_are_advertised() -> None:
    n = _replace(validating(), slices={"gpu.nvidia.com": (1, 2)})  # 2 of 4
    assert step(n).transitions == ()


def test_done_uncordons_only_a_node_we_cordoned() -> None:
    t = only(step(validating()))
    assert t.to_state is S.UPGRADE_DONE and has(t, Uncordon)
    assert annotations_of(t)[INITIAL_UNSCHEDULABLE_ANNOTATION] is None
    assert annotations_of(t)[FROM_ANNOTATION] is None


def test_done_keeps_a_cordon_someone_else_set() -> None:
    t = only(step(validating(held=True)))
    assert t.to_state is S.UPGRADE_DONE and not has(t, Uncordon)


def test_validation_timeout_fails() -> None:
    t = only(step(validating(operand_ready=False, advertising=False, since=600)))
    assert t.to_state is S.UPGRADE_FAILED
    assert "not Ready" in (t.failure or "")


def test_lost_timer_is_restarted() -> None:
    t = only(step(validating(operand_ready=False, advertising=False, since=None)))
    assert annotations_of(t) == {STATE_SINCE_ANNOTATION: ago(0)}


# --- version upgrades (OnDelete) ------------------------------------------------------------------


def test_outdated_plugin_pod_makes_the_node_upgrade_required() -> None:
    t = only(
        step(node(mode=DRA, version="v25.8.0", state=S.UPGRADE_DONE), Policy(max_unavailable=IntOrPercent(0)))
    )
    assert t.to_state is S.UPGRADE_REQUIRED


def test_version_upgrade_deletes_the_outdated_pod_without_evicting_gpu_pods() -> None:
    n = node(
        mode=DRA,
        version="v25.8.0",
        state=S.WAIT_FOR_JOBS_REQUIRED,
        held=False,
        origin="dra@v25.8.0",
        unschedulable=True,
        pods=[gpu_pod("job", holds_claim=True)],
    )
    t = only(step(n))
    assert t.to_state is S.OPERAND_RESTART_REQUIRED
    assert t.pod_actions == (DeletePods((PodRef("gpuforge", "dra-n1"),)),)


def test_revision_change_counts_as_outdated() -> None:
    n = node(mode=DRA, state=S.UPGRADE_DONE)
    result = step(n, POLICY, revisions={DRA: "abc"})
    assert (
        result.transitions == () or only(result).to_state is not S.UPGRADE_REQUIRED
    )  # unknown hash: in sync
    pod = n.operands[0]
    n2 = _replace(n, operands=(type(pod)(pod.ref, pod.mode, pod.version, revision="old", ready=True),))
    t = only(step(n2, POLICY, revisions={DRA: "abc"}))
    assert t.to_state is S.OPERAND_RESTART_REQUIRED and has(t, Cordon)  # nothing to wait for: at once


def test_restarted_pod_at_new_version_goes_to_validation_and_done() -> None:
    n = node(mode=DRA, state=S.OPERAND_RESTART_REQUIRED, held=False, origin="dra@v25.8.0", unschedulable=True)
    t = only(step(n))
    assert t.to_state is S.UPGRADE_DONE and has(t, Uncordon)


# --- failures: halt, rollback, retry --------------------------------------------------------------


def test_rollback_of_a_mode_change_turns_the_new_stack_off() -> None:
    n = validating(operand_ready=False, advertising=False, since=600)
    t = only(step(n, Policy(on_failure=OnFailure.ROLLBACK)))
    assert t.to_state is S.ROLLBACK_REQUIRED
    assert labels_of(t)[DEPLOY_DRA_KUBELET_PLUGIN_LABEL] is None


def test_rollback_turns_the_old_stack_on_once_the_failed_one_is_gone() -> None:
    n = node(mode=None, state=S.ROLLBACK_REQUIRED, held=False, origin=DRA_FROM_DP, unschedulable=True)
    t = only(step(n, Policy(on_failure=OnFailure.ROLLBACK)))
    assert t.to_state is S.ROLLBACK_VALIDATION_REQUIRED
    assert labels_of(t)[DEPLOY_DEVICE_PLUGIN_LABEL] == "true"


def test_rollback_of_a_version_pins_the_previous_release() -> None:
    n = node(mode=None, state=S.ROLLBACK_REQUIRED, held=False, origin="dra@v25.8.0", unschedulable=True)
    t = only(step(n, Policy(on_failure=OnFailure.ROLLBACK)))
    assert labels_of(t)[DEPLOY_DRA_KUBELET_PLUGIN_LABEL] == "v25.8.0"


def test_rolled_back_node_is_uncordoned_and_keeps_its_failure() -> None:
    n = node(
        mode=DP,
        state=S.ROLLBACK_VALIDATION_REQUIRED,
        held=False,
        origin=DRA_FROM_DP,
        unschedulable=True,
        annotations={FAILED_TARGET_ANNOTATION: f"dra@{VERSIONS[DRA]}"},
    )
    t = only(step(n, Policy(on_failure=OnFailure.ROLLBACK)))
    assert t.to_state is S.ROLLED_BACK and has(t, Uncordon)
    assert FAILED_TARGET_ANNOTATION not in annotations_of(t)


def failed(name: str, target: str = f"dra@{VERSIONS[DRA]}", state: NodeState = S.UPGRADE_FAILED) -> GpuNode:
    return node(
        name, mode=None, state=state, annotations={FAILED_TARGET_ANNOTATION: target}, advertising=False
    )


def test_max_failures_halts_new_starts_and_names_the_failed_nodes() -> None:
    result = plan(snapshot(failed("bad"), node("ok", mode=DP)), desired(names=["bad", "ok"]), Policy())
    assert result.failed == ("bad",)
    halted = next(h for h in result.holds if h.reason is HoldReason.HALTED)
    assert halted.nodes == ("ok",) and "bad" in halted.message


def test_max_failures_zero_never_halts() -> None:
    policy = Policy(max_failures=0, max_unavailable=IntOrPercent(1))
    result = plan(snapshot(failed("bad"), node("ok", mode=DP)), desired(names=["bad", "ok"]), policy)
    assert [t.node for t in admitted(result)] == ["ok"]


def test_failed_node_is_not_retried_for_the_same_target() -> None:
    assert step(failed("n1")).transitions == ()


def test_failed_node_is_retried_when_the_target_changes() -> None:
    n = node(mode=DP, state=S.UPGRADE_FAILED, annotations={FAILED_TARGET_ANNOTATION: "dra@v25.8.0"})
    assert [t.node for t in admitted(step(n))] == ["n1"]
    assert only(step(failed("n1", target="dra@v25.8.0"))).to_state is S.VALIDATION_REQUIRED  # runs nothing


def test_failed_node_recovers_when_it_serves_after_all() -> None:
    n = node(
        mode=DRA,
        state=S.UPGRADE_FAILED,
        held=False,
        unschedulable=True,
        annotations={FAILED_TARGET_ANNOTATION: f"dra@{VERSIONS[DRA]}"},
    )
    t = only(step(n))
    assert t.to_state is S.UPGRADE_DONE and has(t, Uncordon)
    assert annotations_of(t)[FAILED_TARGET_ANNOTATION] is None


def test_a_retry_keeps_the_first_attempts_cordon_record() -> None:
    n = node(
        mode=None,
        state=S.UPGRADE_REQUIRED,
        held=False,
        origin=DRA_FROM_DP,
        unschedulable=True,
        advertising=False,
        annotations={FAILED_TARGET_ANNOTATION: f"dra@{VERSIONS[DRA]}"},
    )
    t = only(step(n))
    assert INITIAL_UNSCHEDULABLE_ANNOTATION not in annotations_of(t)
    assert annotations_of(t)[FAILED_TARGET_ANNOTATION] is None


# --- Kubernetes versions --------------------------------------------------------------------------


SUPPORT = (
    DraDriverSupport("v25.3.0", frozenset({32, 33})),
    DraDriverSupport("v25.8.0", frozenset({32, 33, 34, 35, 36, 37})),
    DraDriverSupport("v25.12.0", frozenset({34, 35, 36, 37})),
)


def test_kubelet_the_dra_driver_cannot_talk_to_is_refused_with_the_nodes_named() -> None:
    old = node("old", mode=DP, kubelet="v1.31.4")
    new = node("new", mode=DP)
    result = plan(snapshot(old, new), desired(names=["old", "new"], dra_support=SUPPORT), POLICY)
    refusal = only_refusal(result)
    assert refusal.reason is RefusalReason.KUBELET_UNSUPPORTED and refusal.nodes == ("old",)
    assert "1.31" in refusal.message and "device plugin" in refusal.message
    assert [t.node for t in admitted(result)] == ["new"]


def test_refusal_names_a_release_that_serves_the_kubelet() -> None:
    n = node(mode=DP, kubelet="v1.33.1")
    result = plan(snapshot(n, served=("v1", "v1beta1")), desired(dra_support=SUPPORT), POLICY)
    assert "v25.8.0" in only_refusal(result).message


def test_dra_without_a_served_api_is_refused() -> None:
    result = plan(snapshot(node(mode=DP), served=()), desired(), POLICY)
    assert only_refusal(result).reason is RefusalReason.NO_DRA_API
    assert not any(has(t, Cordon) for t in result.transitions)


def test_kubelet_133_needs_v1beta1_served() -> None:
    result = plan(snapshot(node(mode=DP, kubelet="v1.33.1")), desired(), POLICY)
    assert only_refusal(result).reason is RefusalReason.KUBELET_NEEDS_V1BETA1


def test_planned_kubelet_upgrade_is_held_naming_a_driver_that_serves_both() -> None:
    n = node(mode=DRA, version="v25.3.0", kubelet="v1.33.1", state=S.UPGRADE_DONE)
    want = desired(versions={DP: "v0.17.0", DRA: "v25.3.0"}, dra_support=SUPPORT, kubelet_upgrade_minor=34)
    result = plan(snapshot(n, served=("v1", "v1beta1")), want, POLICY)
    hold = next(h for h in result.holds if h.reason is HoldReason.KUBELET_UPGRADE)
    assert hold.nodes == ("n1",) and "v25.8.0" in hold.message


def only_refusal(result: Plan) -> Refusal:
    assert len(result.refusals) == 1, result.refusals
    return result.refusals[0]


# --- release --------------------------------------------------------------------------------------


def test_unselected_node_is_released_and_uncordoned_if_ours() -> None:
    n = node(
        mode=DP,
        state=S.WAIT_FOR_JOBS_REQUIRED,
        held=False,
        origin=DRA_FROM_DP,
        unschedulable=True,
        labels={STACK_LABEL: "gpus"},
    )
    t = only(plan(snapshot(n), desired(names=[], stack="gpus"), POLICY))
    assert t.to_state is None and has(t, Uncordon)
    assert labels_of(t) == {NODE_STATE_LABEL: None, DEPLOY_DEVICE_PLUGIN_LABEL: None, STACK_LABEL: None}
    # the moment of the release, so the next stack does not take the lingering advertisement for another's
    assert annotations_of(t)[RELEASED_ANNOTATION] == ago(0)


def test_released_node_keeps_the_dra_plugin_while_pods_hold_claims() -> None:
    n = node(
        mode=DRA, state=S.UPGRADE_DONE, labels={STACK_LABEL: "gpus"}, pods=[gpu_pod("j", holds_claim=True)]
    )
    result = plan(snapshot(n), desired(names=[], stack="gpus"), POLICY)
    assert DEPLOY_DRA_KUBELET_PLUGIN_LABEL not in labels_of(only(result))
    assert hold_nodes(result, HoldReason.CLAIMS_HELD) == ("n1",)
    assert RELEASED_ANNOTATION not in annotations_of(only(result))  # still the stack's


def test_another_stacks_node_is_not_touched() -> None:
    n = node(mode=DRA, state=S.UPGRADE_DONE, labels={STACK_LABEL: "other"})
    assert plan(snapshot(n), desired(names=[], stack="gpus"), POLICY).transitions == ()


# --- determinism ----------------------------------------------------------------------------------


def test_same_snapshot_same_plan_whatever_the_node_order() -> None:
    nodes = [node(f"n{i}", mode=DP, pods=[gpu_pod(f"j{i}")] * (i % 3)) for i in range(20)]
    want = desired(names=[n.name for n in nodes])
    policy = Policy(max_unavailable=IntOrPercent(5), max_parallel=3)
    first = plan(snapshot(*nodes), want, policy)
    assert plan(snapshot(*reversed(nodes)), want, policy) == first
    assert first.transitions and first.states
    assert NOW  # the clock comes only from the snapshot


# --- advance: one node's next step between whole plans ---------------------------------------------


def test_advance_moves_nodes_in_flight_and_never_starts_one() -> None:
    flying = in_flight(S.WAIT_FOR_JOBS_REQUIRED, name="a")  # nothing to wait for: old stack off now
    waiting = node("b", mode=DP)  # a free slot, but starting a node is the whole plan's decision
    resting = in_flight(
        S.DRAIN_REQUIRED, name="c", pods=[gpu_pod("job")], annotations={MAINTENANCE_ANNOTATION: "x"}
    )
    unselected = in_flight(S.WAIT_FOR_JOBS_REQUIRED, name="d")
    want = desired(names=["a", "b", "c"])
    policy = Policy(max_unavailable=IntOrPercent(3), max_parallel=0)
    steps = advance(snapshot(flying, waiting, resting, unselected), want, policy)
    assert [(t.node, t.to_state) for t in steps] == [("a", S.WAIT_OLD_GONE)]
    whole = plan(snapshot(flying, waiting, resting, unselected), want, policy)
    assert next(t for t in whole.transitions if t.node == "a") == steps[0]
    assert "b" in [t.node for t in admitted(whole)]


def test_what_a_transition_means_for_slots_and_for_the_order_of_writes() -> None:
    waiting = node("w", mode=DP, state=S.UPGRADE_DONE)  # a new target: it waits for a slot
    result = plan(
        snapshot(node("a", mode=DP), waiting),
        desired(names=["a", "w"]),
        Policy(max_unavailable=IntOrPercent(1), max_parallel=0),
    )
    by_node = {t.node: t for t in result.transitions}
    assert by_node["a"].starts and not by_node["a"].ends and not by_node["a"].records_waiting
    assert by_node["w"].records_waiting and not by_node["w"].starts  # only its state label and timer
    finishing = only(step(in_flight(S.VALIDATION_REQUIRED, mode=DRA, held=False)))
    assert finishing.ends and finishing.to_state is S.UPGRADE_DONE


def test_no_rollback_onto_a_checkpoint_the_older_release_cannot_read() -> None:
    # v0.4.0 writes a checkpoint with a boot ID that v25.x reads as corrupted: the node stays failed,
    # named with why, instead of being handed to a plugin that cannot unprepare its claims.
    n = validating(operand_ready=False, advertising=False, since=600, origin="dra@v25.12.0", version="v0.4.0")
    t = only(step(n, Policy(on_failure=OnFailure.ROLLBACK), versions={DP: "v0.17.0", DRA: "v0.4.0"}))
    assert t.to_state is S.UPGRADE_FAILED
    assert "not rolled back" in t.message and "forward-only" in t.message


def test_rollback_between_releases_of_one_checkpoint_format() -> None:
    n = validating(operand_ready=False, advertising=False, since=600, origin="dra@v25.8.0")
    t = only(step(n, Policy(on_failure=OnFailure.ROLLBACK)))
    assert t.to_state is S.ROLLBACK_REQUIRED


# --- forward-only moves, said before they start ----------------------------------------------------

V04 = {DP: "v0.17.0", DRA: "v0.4.0"}


@pytest.mark.parametrize(
    ("n", "versions", "origin"),
    [
        # waiting for a slot: on v25.12.0, the target v0.4.0 writes a checkpoint v25.x cannot read
        (node("n1", DRA, "v25.12.0"), V04, "dra@v25.12.0"),
        (node("n1", DRA, "v25.3.2"), V04, "dra@v25.3.2"),
        # under way: the origin annotation says where it came from
        (
            node(
                "n1",
                DRA,
                "v0.4.0",
                state=S.VALIDATION_REQUIRED,
                held=False,
                origin="dra@v25.12.0",
                operand_ready=False,
            ),
            V04,
            "dra@v25.12.0",
        ),
        (
            node("n1", DRA, "v25.12.0", state=S.OPERAND_RESTART_REQUIRED, held=False, origin="dra@v25.12.0"),
            V04,
            "dra@v25.12.0",
        ),
    ],
)
def test_a_forward_only_move_is_said_before_it_starts(n: GpuNode, versions: object, origin: str) -> None:
    result = step(n, Policy(on_failure=OnFailure.ROLLBACK, paused=True), versions=versions)
    (warning,) = result.forward_only
    assert (warning.origin, warning.nodes) == (origin, ("n1",))
    assert "forward-only" in warning.message and "checkpoint" in warning.message
    assert "Rollback to" in warning.message and "refused" in warning.message


@pytest.mark.parametrize(
    ("n", "versions", "mode"),
    [
        # the same checkpoint format: v25.3.2 -> v25.12.0 can go back
        (node("n1", DRA, "v25.3.2"), VERSIONS, DRA),
        # already there
        (node("n1", DRA, "v0.4.0"), V04, DRA),
        (node("n1", DRA, "v0.4.0", state=S.UPGRADE_DONE), V04, DRA),
        # the device plugin has no checkpoint to lose; a move from it to DRA is not a DRA downgrade
        (node("n1", DP, "v0.17.0"), V04, DRA),
        (node("n1", DRA, "v25.12.0"), V04, DP),
        # a new node: nothing to go back to
        (node("n1", None, operand=False, advertising=False), V04, DRA),
        # failed on the target already: the warning was given; the failure says the rest
        (
            node("n1", DRA, "v0.4.0", state=S.UPGRADE_FAILED, origin="dra@v25.12.0", operand_ready=False),
            V04,
            DRA,
        ),
    ],
)
def test_moves_that_can_be_undone_carry_no_warning(n: GpuNode, versions: object, mode: object) -> None:
    assert step(n, POLICY, versions=versions, mode=mode).forward_only == ()


def test_forward_only_nodes_are_grouped_by_the_release_they_leave() -> None:
    nodes = [node("a", DRA, "v25.12.0"), node("b", DRA, "v25.12.0"), node("c", DRA, "v25.8.0"), node("d", DP)]
    result = plan(snapshot(*nodes), desired(names=["a", "b", "c", "d"], versions=V04), POLICY)
    assert [(w.origin, w.nodes) for w in result.forward_only] == [
        ("dra@v25.12.0", ("a", "b")),
        ("dra@v25.8.0", ("c",)),
    ]
