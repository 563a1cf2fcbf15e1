"""Prometheus metrics of the GpuStack operator (served by `gpuforge operator run --metrics-port`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import Counter, Gauge, Histogram

from gpuforge.heap import GcPauses
from gpuforge.k8s.stack import Outcome
from gpuforge.k8s.upgrade import Applied
from gpuforge.upgrade.model import NodeState

RECONCILES = Counter("gpuforge_reconciles_total", "GpuStack reconcile passes.", ["stack", "result"])
RECONCILE_SECONDS = Histogram(
    "gpuforge_reconcile_duration_seconds",
    "Wall time of one GpuStack reconcile pass.",
    ["stack"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
WAKE_DELAY_SECONDS = Histogram(
    "gpuforge_reconcile_wake_delay_seconds",
    "Time from the first change a pass was woken by (or the end of the previous pass, if later) to its"
    " start: the debounce and any sleep the operator adds on top of its passes. Timers' passes (every few"
    " seconds while nodes are in flight, whose changes quick steps act on) are not counted.",
    ["stack"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
PHASE_SECONDS = Histogram(
    "gpuforge_reconcile_phase_seconds",
    "Wall time of each part of a reconcile pass: read (stack, cache, placement), plan (snapshot and"
    " planner), nodes (node patches and pod actions), operands (render, apply, prune), status.",
    ["stack", "phase"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
QUICK_STEP_SECONDS = Histogram(
    "gpuforge_quick_step_seconds",
    "Wall time of quick steps: the next step of just the nodes that changed, between whole passes, planned"
    " and queued (their node patches are carried out in the background).",
    ["stack"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
STEP_REACTION_SECONDS = Histogram(
    "gpuforge_upgrade_step_reaction_seconds",
    "Time the operator adds to a node's upgrade, per step: from the latest change about the node (its"
    " Node, pods or ResourceSlices; for an admission, the change that woke the pass) reaching the operator"
    " to the step's node patch landing (step: the state entered). Debounce, waiting for a running pass"
    " and the pass itself are included.",
    ["stack", "step"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
)
STACK_NODES = Gauge("gpuforge_stack_nodes", "Selected nodes per state.", ["stack", "state"])
STACK_READY = Gauge("gpuforge_stack_ready", "1 when the GpuStack's Ready condition is True.", ["stack"])
API_REQUESTS = Counter("gpuforge_api_requests_total", "Kubernetes API requests made.", ["verb", "resource"])
API_REQUEST_SECONDS = Histogram(
    "gpuforge_api_request_duration_seconds",
    "Time from sending a request to the API server to having read its answer (watches and the cache's"
    " lists aside): how much of the operator's reaction is the API server's.",
    ["verb", "resource"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
UPGRADE_NODES = Gauge("gpuforge_upgrade_nodes", "Selected nodes per upgrade state.", ["stack", "state"])
UPGRADE_TRANSITIONS = Counter(
    "gpuforge_upgrade_transitions_total", "Node upgrade state changes.", ["stack", "from_state", "to_state"]
)
UPGRADE_STEP_SECONDS = Histogram(
    "gpuforge_upgrade_step_seconds",
    "Time a node spent in an upgrade state before leaving it (a batch's time, step by step).",
    ["stack", "state"],
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)
UPGRADE_FAILED = Gauge("gpuforge_upgrade_failed_nodes", "Nodes failed on the current target.", ["stack"])
GC_PAUSE = Histogram(
    "gpuforge_gc_pause_seconds",
    "Pauses of Python's cyclic garbage collector, by generation (2: a full collection; the operator"
    " settles its heap after each pass, see gpuforge.heap). The whole process, steps in flight included,"
    " waits for them.",
    ["generation"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
GC_PAUSES = GcPauses(lambda generation, seconds: GC_PAUSE.labels(str(generation)).observe(seconds))


def record_upgrade(stack: str, outcome: Outcome) -> None:
    for phase, seconds in outcome.phases.items():
        PHASE_SECONDS.labels(stack, phase).observe(seconds)
    if outcome.plan is None:
        return
    counts = outcome.plan.counts()
    for state in NodeState:
        UPGRADE_NODES.labels(stack, state.value).set(counts.get(state, 0))
    UPGRADE_FAILED.labels(stack).set(len(outcome.plan.failed))
    if outcome.upgrade is not None:
        record_applied(stack, outcome.upgrade)


def record_applied(stack: str, applied: Applied) -> None:
    """State changes made, by a whole pass or by quick steps."""
    for step, seconds in applied.reactions:
        STEP_REACTION_SECONDS.labels(stack, step).observe(seconds)
    for change in applied.changes:
        UPGRADE_TRANSITIONS.labels(stack, change.from_state or "none", change.to_state or "none").inc()
        if change.from_state and change.seconds_in_previous is not None:
            UPGRADE_STEP_SECONDS.labels(stack, change.from_state).observe(change.seconds_in_previous)


def count_request(verb: str, resource: str) -> None:
    API_REQUESTS.labels(verb, resource).inc()


def time_request(verb: str, resource: str, seconds: float) -> None:
    API_REQUEST_SECONDS.labels(verb, resource).observe(seconds)


def record_nodes(stack: str, counts: Mapping[str, int], ready: bool) -> None:
    for state, value in counts.items():
        if state != "total":
            STACK_NODES.labels(stack, state).set(value)
    STACK_READY.labels(stack).set(1 if ready else 0)


def forget(stack: str) -> None:
    """Drop a deleted stack's series."""
    for state in ("ready", "pending", "switching", "refused", "conflict"):
        with contextlib.suppress(KeyError):
            STACK_NODES.remove(stack, state)
    with contextlib.suppress(KeyError):
        STACK_READY.remove(stack)
    for state in NodeState:
        with contextlib.suppress(KeyError):
            UPGRADE_NODES.remove(stack, state.value)
    with contextlib.suppress(KeyError):
        UPGRADE_FAILED.remove(stack)
