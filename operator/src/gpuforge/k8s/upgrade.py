"""The upgrade engine's shell: read a snapshot for `gpuforge.upgrade.plan`, then apply the plan it returns.

Thin on purpose: every decision is the pure planner's. Applying a transition is one merge patch of the
Node (labels, annotations and cordon together, so a crash never leaves half a step), then its evictions
(eviction API: PodDisruptionBudgets hold; a 429 just means "again next pass") and operand pod deletes,
then one Event on the Node when its state changed. Every action is safe to repeat: the next pass plans
again from what the cluster then shows. A failure on one node is logged and does not stop the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuforge import compat as compat_data
from gpuforge.api.gpustack import GpuStack, Mode
from gpuforge.constants import STACK_LABEL
from gpuforge.k8s.cache import NODE, POD, Cached, ClusterCache
from gpuforge.k8s.client import ApiError, Kube, Obj
from gpuforge.upgrade.convert import ConversionMemo, snapshot_from_objects
from gpuforge.upgrade.model import (
    FAILURE_ANNOTATION,
    IN_FLIGHT_STATES,
    DeletePods,
    Desired,
    DraDriverSupport,
    EvictPods,
    NodeState,
    Plan,
    Policy,
    Snapshot,
    Transition,
)
from gpuforge.upgrade.planner import advance
from gpuforge.upgrade.planner import plan as plan_upgrade

log = logging.getLogger(__name__)

EVENT_REASON_STEP = "UpgradeStep"
EVENT_REASON_FAILED = "UpgradeFailed"


@dataclass(frozen=True)
class ClusterView:
    """The raw objects one pass reads once and shares between placement, planning and status."""

    nodes: list[Obj]
    pods: list[Obj]
    slices: list[Obj]
    claims: list[Obj]
    served: frozenset[str]
    changed_at: Mapping[str, float] = field(default_factory=dict)  # see gpuforge.k8s.cache.Cached


def read_cluster(
    kube: Kube, dra_api: str | None, served: frozenset[str], cache: ClusterCache | None = None
) -> ClusterView:
    """From the watch-fed cache where it has synced, else by listing."""
    cached = cache.read(dra_api) if cache is not None else Cached(None, None, None, None)
    return ClusterView(
        nodes=cached.nodes if cached.nodes is not None else kube.list_node_objects(),
        pods=cached.pods if cached.pods is not None else kube.list_pods(),
        slices=cached.slices if cached.slices is not None else kube.list_gpu_slices(dra_api),
        claims=cached.claims if cached.claims is not None else kube.list_resource_claims(dra_api),
        served=served,
        changed_at=cached.changed_at,
    )


def dra_support(compat: compat_data.Compat) -> tuple[DraDriverSupport, ...]:
    """Which kubelet minors (1.x) each known DRA driver release can talk to, from compat.yaml."""
    minors = sorted(compat.kubelets)
    out = []
    for release in compat.dra_releases:
        serving = frozenset(
            minor[1] for minor in minors if release.version in compat.dra_releases_serving([minor])
        )
        out.append(DraDriverSupport(release.version, serving))
    return tuple(out)


def desired_of(stack: GpuStack, selected: Iterable[str], compat: compat_data.Compat) -> Desired:
    spec = stack.spec
    return Desired(
        mode=spec.mode,
        versions={Mode.DEVICE_PLUGIN: spec.device_plugin.version, Mode.DRA: spec.dra.version},
        selected=frozenset(selected),
        dra_support=dra_support(compat),
        stack=stack.name,
    )


def snapshot_of(view: ClusterView, stack: str, selected: Iterable[str], now: datetime) -> Snapshot:
    """The planner's input: the selected nodes plus every node still labelled as the stack's."""
    names = set(selected) | {
        n["metadata"]["name"]
        for n in view.nodes
        if (n["metadata"].get("labels") or {}).get(STACK_LABEL) == stack
    }
    return snapshot_from_objects(
        view.nodes,
        view.pods,
        view.slices,
        now=now,
        claims=view.claims,
        served_resource_versions=view.served,
        names=names,
        memo=_MEMO,
    )


_MEMO = ConversionMemo()  # objects from the watch-fed cache are converted once per resourceVersion


@dataclass(frozen=True)
class StepContext:
    """What a whole pass worked out that quick steps reuse until the next whole pass: the target, the
    policy, the nodes the stack selects and the resource.k8s.io version in use."""

    desired: Desired
    policy: Policy
    dra_api: str | None
    served: frozenset[str]
    waiting: bool  # some selected node waits for a slot (upgrade-required)


_QUICK_MEMO = ConversionMemo()  # quick steps convert a few nodes: their own memo keeps the pass's intact


def quick_steps(
    kube: Kube,
    context: StepContext,
    names: Iterable[str],
    cache: ClusterCache,
    woken_at: float | None,
    now: datetime,
) -> Applied | None:
    """The next step of each node among `names` that is in flight (`gpuforge.upgrade.advance`), from the
    cache alone, applied at once: a node whose old plugin just went away gets the new one without waiting
    for a pass over the whole cluster. When a node finishes, the slot it frees is filled at once
    (`admit_into_freed_slots`). None when the cache has not synced."""
    view = _cached_view(cache, context)
    if view is None:
        return None
    wanted = set(names) & context.desired.selected
    if not wanted:
        return NOTHING
    snapshot = snapshot_from_objects(
        [n for n in view.nodes if n["metadata"]["name"] in wanted],
        view.pods,
        view.slices,
        now=now,
        claims=view.claims,
        served_resource_versions=view.served,
        names=wanted,
        memo=_QUICK_MEMO,
    )
    steps = advance(snapshot, context.desired, context.policy)
    if not steps:
        return NOTHING
    applied = apply_plan(kube, Plan(steps), snapshot, cache, woken_at, view.changed_at)
    if context.waiting and any(t.ends for t in steps):
        freed = freed_at(steps, view.changed_at, woken_at)
        applied = applied + admit_into_freed_slots(kube, context, cache, freed, now)
    return applied


def _cached_view(cache: ClusterCache, context: StepContext) -> ClusterView | None:
    """Everything a plan reads, from the cache alone; None when some kind has not synced."""
    cached = cache.read(context.dra_api)
    if cached.nodes is None or cached.pods is None or cached.slices is None or cached.claims is None:
        return None
    return ClusterView(
        cached.nodes, cached.pods, cached.slices, cached.claims, context.served, cached.changed_at
    )


def freed_at(
    transitions: Iterable[Transition], changed_at: Mapping[str, float], woken_at: float | None
) -> float | None:
    """When the slots that finishing nodes free became free-able: the earliest of the changes that let
    those nodes finish (the cause of the admissions that fill them). None in a timer's pass."""
    if woken_at is None:
        return None
    return min((changed_at.get(t.node, woken_at) for t in transitions if t.ends), default=woken_at)


def admit_into_freed_slots(
    kube: Kube, context: StepContext, cache: ClusterCache, woken_at: float | None, now: datetime
) -> Applied:
    """Start the nodes the whole plan starts now, from a fresh read of the cache (which holds our own
    writes): right after nodes finished, rather than at the next whole pass. Only admissions are applied;
    maxUnavailable and maxParallel are weighed over every node, as in any plan."""
    view = _cached_view(cache, context)
    if view is None:
        return NOTHING
    snapshot = snapshot_of(view, context.desired.stack, context.desired.selected, now)
    starts = tuple(t for t in plan_upgrade(snapshot, context.desired, context.policy).transitions if t.starts)
    if not starts:
        return NOTHING
    return apply_plan(kube, Plan(starts), snapshot, cache, woken_at, view.changed_at)


@dataclass(frozen=True)
class StateChange:
    node: str
    from_state: str
    to_state: str
    seconds_in_previous: float | None  # how long the node stayed in the state it left, if known


@dataclass(frozen=True)
class Applied:
    transitions: int
    changes: tuple[StateChange, ...]
    evicted: int
    eviction_refused: int
    deleted: int
    errors: tuple[str, ...]
    # Per state change: the state entered and the seconds from its cause reaching us to the patch landing.
    reactions: tuple[tuple[str, float], ...] = ()

    def __add__(self, other: Applied) -> Applied:
        return Applied(
            self.transitions + other.transitions,
            self.changes + other.changes,
            self.evicted + other.evicted,
            self.eviction_refused + other.eviction_refused,
            self.deleted + other.deleted,
            self.errors + other.errors,
            self.reactions + other.reactions,
        )


NOTHING = Applied(0, (), 0, 0, 0, ())


# Nodes are independent: their transitions are applied side by side (each node's own steps in order).
APPLY_WORKERS = 16
# Events change no decision: they are posted in the background, so a pass does not wait for them.
_EVENTS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpuforge-events")


@dataclass(frozen=True)
class _NodeResult:
    change: StateChange | None = None
    evicted: int = 0
    refused: int = 0
    deleted: int = 0
    error: str | None = None
    reaction: tuple[str, float] | None = None


def apply_plan(
    kube: Kube,
    plan: Plan,
    snapshot: Snapshot,
    cache: ClusterCache | None = None,
    woken_at: float | None = None,
    changed_at: Mapping[str, float] | None = None,
) -> Applied:
    """Carry out `plan.transitions`; per node: one patch, then its pod actions, then one event. What the
    server answers (the patched Node, a deleted pod) goes to the cache, so the next pass starts from it.

    In a pass woken by changes (`woken_at`, time.monotonic, the first of them), each state change also
    reports how long the operator took to act (`Applied.reactions`): from the latest change about that
    node before the snapshot (`changed_at`), or for a node just admitted (whose cause is elsewhere: a
    freed slot, a new target) from `woken_at`."""
    since = {n.name: n.state_since for n in snapshot.nodes}
    changed_at = changed_at or {}

    def cause(transition: Transition) -> float | None:
        if woken_at is None:
            return None  # a timer's pass: timeouts are not reactions
        if transition.from_state in IN_FLIGHT_STATES:
            return changed_at.get(transition.node, woken_at)
        return woken_at

    def written(kind: str, obj: Obj | None) -> None:
        if cache is not None:
            cache.offer(kind, obj)

    def one(transition: Transition) -> _NodeResult:
        evicted = refused = deleted = 0
        try:
            patch = transition.node_patch()
            if patch:
                written(NODE, kube.patch_node(transition.node, patch))
            for action in transition.pod_actions:
                if isinstance(action, EvictPods):
                    for ref in action.pods:
                        if kube.evict_pod(ref.namespace, ref.name):
                            evicted += 1
                        else:
                            refused += 1
                elif isinstance(action, DeletePods):
                    for ref in action.pods:
                        written(POD, kube.delete_pod(ref.namespace, ref.name))
                        deleted += 1
        except ApiError as err:
            log.warning("upgrade step on node %s failed: %s", transition.node, err)
            return _NodeResult(error=f"{transition.node}: {err}")
        change = reaction = None
        if transition.changes_state:
            change = _change(transition, since.get(transition.node), snapshot.now)
            caused = None if transition.records_waiting else cause(transition)
            if caused is not None:
                entered = transition.to_state.value if transition.to_state else "released"
                reaction = (entered, max(0.0, time.monotonic() - caused))
            _EVENTS.submit(_event, kube, transition)
        return _NodeResult(change, evicted, refused, deleted, reaction=reaction)

    # "upgrade-required" records change nothing on their nodes: they are written in the background, so a
    # new target on 1000 nodes does not hold up its first batch (a node whose record is still being
    # written is left out until it is; the next plan asks again for any that failed).
    transitions = []
    with _RECORDING_LOCK:
        for transition in plan.transitions:
            if transition.records_waiting:
                continue
            record = _RECORDING.get(transition.node)
            # A step for a node whose record has not been sent yet replaces it (it writes the state label
            # itself); one being written is waited for by leaving the node to the next plan.
            if record is None or record.cancel():
                _RECORDING.pop(transition.node, None)
                transitions.append(transition)
    if len(transitions) <= 1:
        results = [one(t) for t in transitions]
    else:
        with ThreadPoolExecutor(max_workers=min(APPLY_WORKERS, len(transitions))) as pool:
            results = list(pool.map(one, transitions))
    with _RECORDING_LOCK:  # after the steps that move nodes, so as not to compete with them
        for transition in plan.transitions:
            if transition.records_waiting and transition.node not in _RECORDING:
                _RECORDING[transition.node] = _RECORDS.submit(_record, one, transition)
    return Applied(
        transitions=len(transitions),
        changes=tuple(r.change for r in results if r.change is not None),
        evicted=sum(r.evicted for r in results),
        eviction_refused=sum(r.refused for r in results),
        deleted=sum(r.deleted for r in results),
        errors=tuple(r.error for r in results if r.error),
        reactions=tuple(r.reaction for r in results if r.reaction is not None),
    )


_RECORDS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuforge-records")
_RECORDING: dict[str, Future[None]] = {}  # node -> its upgrade-required record, queued or being written
_RECORDING_LOCK = threading.Lock()


def _record(one: Callable[[Transition], _NodeResult], transition: Transition) -> None:
    try:
        one(transition)
    finally:
        with _RECORDING_LOCK:
            _RECORDING.pop(transition.node, None)


def _change(transition: Transition, since: datetime | None, now: datetime) -> StateChange:
    return StateChange(
        transition.node,
        transition.from_state.value if transition.from_state else "",
        transition.to_state.value if transition.to_state else "",
        (now - since).total_seconds() if since is not None else None,
    )


def _event(kube: Kube, transition: Transition) -> None:
    before = transition.from_state.value if transition.from_state else "none"
    after = transition.to_state.value if transition.to_state else "none"
    message = f"{before} -> {after}: {transition.message}"
    if transition.failure:
        kube.emit_node_event(
            transition.node, "Warning", EVENT_REASON_FAILED, f"{message} ({transition.failure})"
        )
    else:
        kube.emit_node_event(transition.node, "Normal", EVENT_REASON_STEP, message)


# --- what the plan means for the rest of the pass (no I/O) ------------------------------------------


def labels_after(view_nodes: Sequence[Obj], plan: Plan) -> dict[str, dict[str, str]]:
    """Every node's labels once the plan's patches are applied (to render the DaemonSets they need)."""
    out = {n["metadata"]["name"]: dict(n["metadata"].get("labels") or {}) for n in view_nodes}
    for transition in plan.transitions:
        patch = transition.node_patch() or {}
        changed: Mapping[str, str | None] = (patch.get("metadata") or {}).get("labels") or {}
        labels = out.setdefault(transition.node, {})
        for key, value in changed.items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
    return out


def failures(plan: Plan, snapshot: Snapshot) -> dict[str, str]:
    """Failed nodes of the current target and why (from this plan's transitions or the node annotation)."""
    reasons = {t.node: t.failure for t in plan.transitions if t.failure}
    by_name = {n.name: n for n in snapshot.nodes}
    return {
        name: reasons.get(name)
        or (by_name[name].annotations.get(FAILURE_ANNOTATION, "") if name in by_name else "")
        for name in plan.failed
    }


def upgrade_status(plan: Plan, failed: Mapping[str, str], limit: int = 20) -> dict[str, Any]:
    """GpuStack `status.upgrade` as a merge patch: counts per state (absent states null), failing nodes,
    holds and refusals with their nodes (the first `limit` names; `nodeCount` says how many)."""
    counts = plan.counts()
    return {
        "target": plan.target,
        "complete": plan.complete,
        "nodes": {state.value: counts.get(state) or None for state in NodeState},
        "failed": [{"node": name, "reason": reason} for name, reason in sorted(failed.items())[:limit]],
        "holds": [
            {
                "reason": h.reason.value,
                "nodes": list(h.nodes[:limit]),
                "nodeCount": len(h.nodes),
                "message": h.message,
            }
            for h in plan.holds
        ],
        "refusals": [
            {
                "reason": r.reason.value,
                "nodes": list(r.nodes[:limit]),
                "nodeCount": len(r.nodes),
                "message": r.message,
            }
            for r in plan.refusals
        ],
    }


def in_flight(plan: Plan) -> list[str]:
    return sorted(name for name, state in plan.states.items() if state in IN_FLIGHT_STATES)


__all__ = [
    "NOTHING",
    "Applied",
    "ClusterView",
    "StateChange",
    "StepContext",
    "admit_into_freed_slots",
    "apply_plan",
    "desired_of",
    "failures",
    "freed_at",
    "in_flight",
    "labels_after",
    "quick_steps",
    "read_cluster",
    "snapshot_of",
    "upgrade_status",
]
