"""GpuStack status from a placement."""

from __future__ import annotations

from gpuforge.api import conditions as c
from gpuforge.api.convert import to_dict
from gpuforge.api.gpustack import (
    ELSEWHERE_LISTED,
    Condition,
    ElsewhereNode,
    GpuStack,
    GpuStackSpec,
    Mode,
    Phase,
)
from gpuforge.render.placement import NodeState, NodeStep, Placement, Problem
from gpuforge.render.status import compute_status

STACK = GpuStack("s", GpuStackSpec(), generation=4)
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def placement(
    *states: NodeState, problems: tuple[Problem, ...] = (), mode: Mode = Mode.DEVICE_PLUGIN
) -> Placement:
    steps = tuple(NodeStep(f"n{i}", s, detail="waiting for the plugin") for i, s in enumerate(states))
    return Placement(steps, (), problems, "v1", frozenset({mode}))


def conditions(status: object) -> dict[str, tuple[str, str]]:
    return {x.type: (x.status, x.reason) for x in status.conditions}  # type: ignore[attr-defined]


def test_all_ready() -> None:
    status = compute_status(STACK, placement(NodeState.READY, NodeState.READY), (), T0)
    assert conditions(status) == {
        c.READY: ("True", c.ALL_NODES_READY),
        c.PROGRESSING: ("False", c.RECONCILED),
        c.DEGRADED: ("False", c.AS_EXPECTED),
    }
    assert (status.phase, status.nodes_ready, status.observed_generation) == (Phase.READY, "2/2", 4)
    assert (
        status.operands.device_plugin == STACK.spec.device_plugin.version
        and status.operands.dra_driver is None
    )


def test_pending_nodes_are_progress() -> None:
    status = compute_status(STACK, placement(NodeState.READY, NodeState.PENDING), (), T0)
    assert conditions(status)[c.READY] == ("False", c.NODES_PENDING)
    assert conditions(status)[c.PROGRESSING] == ("True", c.NODES_PENDING)
    assert status.phase is Phase.PROGRESSING
    progressing = next(x for x in status.conditions if x.type == c.PROGRESSING)
    assert "n1 (waiting for the plugin)" in progressing.message


def test_a_node_the_upgrade_failed_is_not_progress_but_degraded() -> None:
    """Halted on a release whose plugin never becomes Ready: the node waits for a person, not for time."""
    problem = Problem(c.UPGRADE_FAILED, "1 node(s) failed on devicePlugin@v0.20.0: n1", ("n1",))
    status = compute_status(STACK, placement(NodeState.READY, NodeState.PENDING, problems=(problem,)), (), T0)
    assert conditions(status) == {
        c.READY: ("False", c.NODES_PENDING),
        c.PROGRESSING: ("False", c.RECONCILED),
        c.DEGRADED: ("True", c.UPGRADE_FAILED),
    }
    assert status.phase is Phase.DEGRADED and status.nodes_ready == "1/2"
    # another node still waiting for its plugin is progress, and only it is named
    status = compute_status(
        STACK, placement(NodeState.PENDING, NodeState.PENDING, problems=(problem,)), (), T0
    )
    progressing = next(x for x in status.conditions if x.type == c.PROGRESSING)
    assert progressing.status == "True" and "n0" in progressing.message and "n1" not in progressing.message


def test_conflict_degrades_but_served_nodes_are_ready() -> None:
    problem = Problem(c.NODE_CONFLICT, "older GpuStack old also selects nodes n1", ("n1",))
    status = compute_status(
        STACK, placement(NodeState.READY, NodeState.CONFLICT, problems=(problem,)), (), T0
    )
    assert conditions(status)[c.READY] == ("True", c.ALL_NODES_READY)
    degraded = next(x for x in status.conditions if x.type == c.DEGRADED)
    assert (degraded.status, degraded.reason) == ("True", c.NODE_CONFLICT) and "old" in degraded.message
    assert status.phase is Phase.DEGRADED and status.nodes.conflict == 1 and status.nodes_ready == "1/2"


def test_nodes_another_stack_serves_are_named_and_the_rest_is_ready() -> None:
    message = "NVIDIA's GPU Operator deploys its plugin here (...): gpuforge leaves nodes n1 to it"
    problem = Problem(c.SERVED_ELSEWHERE, message, ("n1",))
    status = compute_status(
        STACK, placement(NodeState.READY, NodeState.ELSEWHERE, problems=(problem,)), (), T0
    )
    assert conditions(status)[c.READY] == ("True", c.ALL_NODES_READY)
    degraded = next(x for x in status.conditions if x.type == c.DEGRADED)
    assert (degraded.status, degraded.reason) == ("True", c.SERVED_ELSEWHERE) and "n1" in degraded.message
    assert status.nodes.refused == 1 and status.nodes_ready == "1/2"
    assert status.served_elsewhere == (ElsewhereNode("n1", "waiting for the plugin"),)
    assert to_dict(status)["servedElsewhere"] == [{"node": "n1", "reason": "waiting for the plugin"}]


def test_served_elsewhere_lists_each_node_with_why_sorted_and_bounded() -> None:
    why = "a device plugin gpuforge did not deploy advertises nvidia.com/gpu"
    steps = tuple(NodeStep(f"g{i:03}", NodeState.ELSEWHERE, detail=why) for i in reversed(range(60)))
    steps += (NodeStep("a-ready", NodeState.READY),)
    problem = Problem(c.SERVED_ELSEWHERE, f"{why}: gpuforge leaves nodes ...", tuple(s.node for s in steps))
    status = compute_status(
        STACK, Placement(steps, (), (problem,), "v1", frozenset({Mode.DEVICE_PLUGIN})), (), T0
    )
    assert len(status.served_elsewhere) == ELSEWHERE_LISTED
    assert [e.node for e in status.served_elsewhere[:2]] == ["g000", "g001"]
    assert {e.reason for e in status.served_elsewhere} == {why}
    assert conditions(status)[c.READY] == ("True", c.ALL_NODES_READY)
    # none left: the list is written empty, so the merge patch clears it
    status = compute_status(STACK, placement(NodeState.READY), (), T0)
    assert to_dict(status)["servedElsewhere"] == []


def test_everything_refused_is_not_ready() -> None:
    problem = Problem(c.DRA_API_NOT_SERVED, "no API", ("n0",))
    status = compute_status(STACK, placement(NodeState.REFUSED, problems=(problem,)), (), T0)
    assert conditions(status)[c.READY] == ("False", c.DRA_API_NOT_SERVED)


def test_no_nodes_is_ready() -> None:
    assert conditions(compute_status(STACK, placement(), (), T0))[c.READY] == ("True", c.NO_NODES_SELECTED)


def test_apply_error_degrades() -> None:
    status = compute_status(STACK, placement(NodeState.READY), (), T0, apply_error="403 forbidden")
    assert conditions(status)[c.DEGRADED] == ("True", c.RECONCILE_FAILED)


def test_transition_time_kept_while_status_unchanged() -> None:
    first = compute_status(STACK, placement(NodeState.READY), (), T0)
    again = compute_status(STACK, placement(NodeState.READY), first.conditions, T1)
    assert {x.last_transition_time for x in again.conditions} == {T0}
    flipped = compute_status(STACK, placement(NodeState.PENDING), first.conditions, T1)
    ready = next(x for x in flipped.conditions if x.type == c.READY)
    assert ready.last_transition_time == T1


def test_dra_api_version_reported_in_dra_mode() -> None:
    stack = GpuStack("s", GpuStackSpec(mode=Mode.DRA))
    status = compute_status(stack, placement(NodeState.READY, mode=Mode.DRA), (), T0)
    assert status.dra_api_version == "resource.k8s.io/v1"
    assert status.version == stack.spec.dra.version


def test_previous_condition_type_is_matched() -> None:
    previous = (Condition(c.READY, "True", c.ALL_NODES_READY, "", T0, 1),)
    status = compute_status(STACK, placement(NodeState.READY), previous, T1)
    assert next(x for x in status.conditions if x.type == c.READY).last_transition_time == T0
