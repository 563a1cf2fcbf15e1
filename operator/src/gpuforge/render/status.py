"""The GpuStack status from a placement: node counts, Ready/Progressing/Degraded, versions. No I/O.

A condition keeps its lastTransitionTime while its status stays the same, so repeated resyncs do not
churn the object.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

from gpuforge.api import conditions as c
from gpuforge.api.gpustack import (
    ELSEWHERE_LISTED,
    Condition,
    ElsewhereNode,
    GpuStack,
    GpuStackStatus,
    Mode,
    NodeCounts,
    OperandVersions,
    Phase,
)
from gpuforge.render.placement import NodeState, Placement


def _condition(
    type_: str, ok: bool, reason: str, message: str, previous: Sequence[Condition], now: str, generation: int
) -> Condition:
    status = "True" if ok else "False"
    before = next((p for p in previous if p.type == type_), None)
    since = before.last_transition_time if before is not None and before.status == status else now
    return Condition(type_, status, reason, message, since, generation)


def compute_status(
    stack: GpuStack,
    placement: Placement,
    previous: Sequence[Condition],
    now: str,
    apply_error: str | None = None,
    upgrading: str = "",
) -> GpuStackStatus:
    """`now`: RFC 3339 timestamp; `apply_error`: why applying manifests or labels failed, if it did;
    `upgrading`: what the upgrade engine is doing, if it is moving nodes."""
    states = Counter(step.state for step in placement.steps)
    counts = NodeCounts(
        total=len(placement.steps),
        ready=states[NodeState.READY],
        pending=states[NodeState.PENDING],
        switching=states[NodeState.SWITCHING],
        refused=states[NodeState.REFUSED] + states[NodeState.ELSEWHERE],  # both: not served by this stack
        conflict=states[NodeState.CONFLICT],
    )
    served = counts.ready + counts.pending + counts.switching
    gen = stack.generation

    problems = [(p.reason, p.message) for p in placement.problems]
    if apply_error:
        problems.insert(0, (c.RECONCILE_FAILED, apply_error))
    degraded = _condition(
        c.DEGRADED,
        bool(problems),
        problems[0][0] if problems else c.AS_EXPECTED,
        "; ".join(message for _, message in problems),
        previous, now, gen,
    )  # fmt: skip

    # A node the upgrade engine failed (halted on it, for a person to look at) waits for nothing that will
    # come by itself: it is not progress, it is what Degraded says.
    failed = {n for p in placement.problems if p.reason == c.UPGRADE_FAILED for n in p.nodes}
    live = Counter(step.state for step in placement.steps if step.node not in failed)
    pending, switching = live[NodeState.PENDING], live[NodeState.SWITCHING]
    moving = pending + switching + len(placement.releases) + (1 if upgrading else 0)
    if upgrading:
        progress_reason, progress_message = c.UPGRADING, upgrading
    elif switching or placement.releases:
        progress_reason, progress_message = c.MODE_SWITCH, _waiting(placement, failed)
    elif pending:
        progress_reason, progress_message = c.NODES_PENDING, _waiting(placement, failed)
    else:
        progress_reason, progress_message = c.RECONCILED, ""
    progressing = _condition(c.PROGRESSING, moving > 0, progress_reason, progress_message, previous, now, gen)

    if counts.total == 0:
        ready = _condition(
            c.READY, True, c.NO_NODES_SELECTED, "the node selector matches no node", previous, now, gen
        )
    elif served == 0:
        reason = problems[0][0] if problems else c.NODES_PENDING
        ready = _condition(c.READY, False, reason, "no selected node can be served", previous, now, gen)
    elif counts.pending or counts.switching or apply_error:
        message = f"{counts.ready} of {served} nodes ready"
        ready = _condition(c.READY, False, c.NODES_PENDING, message, previous, now, gen)
    else:
        ready = _condition(c.READY, True, c.ALL_NODES_READY, f"{served} nodes ready", previous, now, gen)

    if progressing.status == "True":
        phase = Phase.PROGRESSING
    elif degraded.status == "True":
        phase = Phase.DEGRADED
    elif ready.status == "True":
        phase = Phase.READY
    else:
        phase = Phase.PENDING

    spec = stack.spec
    return GpuStackStatus(
        observed_generation=gen,
        phase=phase,
        conditions=(ready, progressing, degraded),
        nodes=counts,
        nodes_ready=f"{counts.ready}/{counts.total}",
        version=spec.operand_version,
        operands=OperandVersions(
            device_plugin=spec.device_plugin.version if Mode.DEVICE_PLUGIN in placement.operands else None,
            dra_driver=spec.dra.version if Mode.DRA in placement.operands else None,
        ),
        dra_api_version=(
            f"resource.k8s.io/{placement.dra_api_version}"
            if Mode.DRA in placement.operands and placement.dra_api_version
            else None
        ),
        served_elsewhere=tuple(
            ElsewhereNode(step.node, step.detail)
            for step in sorted(placement.steps, key=lambda s: s.node)
            if step.state is NodeState.ELSEWHERE
        )[:ELSEWHERE_LISTED],
    )


def _waiting(placement: Placement, failed: Collection[str] = (), limit: int = 5) -> str:
    waiting = [s for s in (*placement.steps, *placement.releases)
               if s.state in (NodeState.PENDING, NodeState.SWITCHING) and s.node not in failed]  # fmt: skip
    shown = ", ".join(f"{s.node} ({s.detail})" if s.detail else s.node for s in waiting[:limit])
    more = f" and {len(waiting) - limit} more" if len(waiting) > limit else ""
    return f"waiting for {shown}{more}"
