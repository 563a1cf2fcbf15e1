"""The upgrade engine's shell: read a snapshot for `gpuforge.upgrade.plan`, then carry out what it returns.

Thin on purpose: every decision is the pure planner's. Carrying out a transition is one merge patch of
the Node (labels, annotations and cordon together, so a crash never leaves half a step), then its
evictions (eviction API: PodDisruptionBudgets hold; a 429 just means "again next pass") and operand pod
deletes, then one Event on the Node when its state changed. Every action is safe to repeat: the next pass
plans again from what the cluster then shows. A failure on one node is logged and does not stop the
others.

In the operator, transitions are carried out in the background by a `Writer` and whoever planned them
goes on at once; a `Stepper` acts on each node's changes between whole passes and fills freed slots.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpuforge import compat as compat_data
from gpuforge.api.gpustack import GpuStack, Mode
from gpuforge.constants import STACK_LABEL
from gpuforge.k8s.cache import NODE, POD, Cached, ClusterCache
from gpuforge.k8s.client import ApiError, Kube, Obj
from gpuforge.upgrade.convert import ConversionMemo, admission_weight, snapshot_from_objects
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
from gpuforge.upgrade.planner import advance, count_weights
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


def snapshot_of(
    view: ClusterView, stack: str, selected: Iterable[str], now: datetime, memo: ConversionMemo
) -> Snapshot:
    """The planner's input: the selected nodes plus every node still labelled as the stack's."""
    names = set(selected) | {
        n["metadata"]["name"]
        for n in view.nodes
        if (n["metadata"].get("labels") or {}).get(STACK_LABEL) == stack
    }
    return _snapshot(view, names, memo, now)


def _snapshot(
    view: ClusterView,
    names: Collection[str],
    memo: ConversionMemo,
    now: datetime,
    nodes: Sequence[Obj] | None = None,
) -> Snapshot:
    """The planner's input for `names` from a view (its Nodes replaced by `nodes`, when given)."""
    return snapshot_from_objects(
        view.nodes if nodes is None else nodes,
        view.pods,
        view.slices,
        now=now,
        claims=view.claims,
        served_resource_versions=view.served,
        names=names,
        memo=memo,
    )


@dataclass(frozen=True)
class StepContext:
    """What a whole pass worked out that quick steps and slot filling reuse until the next whole pass: the
    target, the policy, the nodes the stack selects, the resource.k8s.io version in use, and the nodes
    waiting for a slot in the order they get one (`Plan.queue`)."""

    desired: Desired
    policy: Policy
    dra_api: str | None
    served: frozenset[str]
    waiting: bool  # some selected node waits for a slot, or starts in this pass (Plan.queue)
    queue: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, plan: Plan, desired: Desired, policy: Policy, dra_api: str | None, served: frozenset[str]
    ) -> StepContext:
        return cls(desired, policy, dra_api, served, bool(plan.queue), plan.queue)


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


# Nodes are independent: their transitions are carried out side by side (one at a time per node).
APPLY_WORKERS = 32
# Events change no decision: they are posted in the background, after the node patch they tell about.
EVENT_WORKERS = 4

Cause = Callable[[Transition], float | None]  # when what allowed a step reached us (time.monotonic)
Report = Callable[[Transition, Applied, float | None], None]  # one transition carried out, and its cause
Retry = Callable[[str], None]  # a node whose step was left out because our own write to it was newer


@dataclass(frozen=True)
class Mark:
    """Taken before a view is read: the number of our writes landed so far, and the writes in flight."""

    landed: int
    in_flight: Mapping[str, Transition]


class Writer:
    """Carries out transitions in the background and reports each as it lands (`Report`), so whoever
    planned them goes on at once: a quick step does not wait for its patches before the next change.

    Per node, one write at a time, never on a stale view: a transition for a node that has a write in
    flight is left out (and `retry` is called for the node when that write lands), and so is one planned
    from a view read (`mark()` before reading) before our latest write to its node landed (`retry` at once:
    look again from a newer view). A landed write is offered to the cache before it counts as landed, so
    a view read after `mark()` holds every write the mark counts. Per transition: one node patch, then its
    pod actions, then an event (in the background); "upgrade-required" records go to a single background
    writer behind the steps that move nodes, and a step for a node replaces its record if not yet sent.
    """

    def __init__(self, kube: Kube, cache: ClusterCache | None = None, workers: int = APPLY_WORKERS) -> None:
        self._kube = kube
        self._cache = cache
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpuforge-writes")
        self._events = ThreadPoolExecutor(max_workers=EVENT_WORKERS, thread_name_prefix="gpuforge-events")
        # "upgrade-required" records change nothing on their nodes: one writer, behind the steps that move
        # nodes.
        self._record_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuforge-records")
        self._lock = threading.Lock()
        self._landed = 0
        self._landed_at: dict[str, int] = {}  # node -> the count when our latest write to it landed
        self._in_flight: dict[str, Transition] = {}
        self._retries: dict[str, list[Retry]] = {}  # node -> who to tell when its write in flight lands
        # node -> its upgrade-required record, queued or being written
        self._records: dict[str, Future[Applied]] = {}
        self._closed = False

    def mark(self) -> Mark:
        with self._lock:
            return Mark(self._landed, dict(self._in_flight))

    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def after(self, node: str, retry: Retry) -> None:
        """Call `retry` when our write to `node` in flight lands; at once if there is none."""
        with self._lock:
            if node in self._in_flight:
                self._retries.setdefault(node, []).append(retry)
                return
        retry(node)

    def submit(
        self,
        transitions: Iterable[Transition],
        snapshot: Snapshot,
        mark: Mark | None,
        cause: Cause,
        report: Report | None = None,
        retry: Retry | None = None,
    ) -> dict[str, Future[Applied]]:
        """Queue `transitions` (planned on `snapshot`, from a view read after `mark`; None: no check);
        the futures of those queued by node, records aside."""
        since = {n.name: n.state_since for n in snapshot.nodes}
        queued: dict[str, Future[Applied]] = {}
        stale: list[str] = []
        records: list[Transition] = []
        with self._lock:
            if self._closed:  # stopping: no new step starts, the next operator plans again from the cluster
                return queued
            for transition in transitions:
                node = transition.node
                if node in self._in_flight:
                    if retry is not None:
                        self._retries.setdefault(node, []).append(retry)
                    continue
                if mark is not None and self._landed_at.get(node, 0) > mark.landed:
                    stale.append(node)
                    continue
                record = self._records.get(node)
                if transition.records_waiting:
                    if record is None:
                        records.append(transition)
                    continue
                if record is not None and not record.cancel():
                    # Being written: this step waits for it (it was planned without it anyway).
                    if retry is not None:
                        self._retries.setdefault(node, []).append(retry)
                    continue
                self._records.pop(node, None)
                self._in_flight[node] = transition
                args = (transition, since.get(node), snapshot.now, cause(transition), report)
                queued[node] = self._pool.submit(self._carry_out, *args)
            for transition in records:  # after the steps that move nodes, so as not to compete with them
                args = (transition, since.get(transition.node), snapshot.now, None, report)
                self._records[transition.node] = self._record_writer.submit(self._carry_out, *args)
        if retry is not None:
            for node in stale:
                retry(node)
        return queued

    def _carry_out(
        self,
        transition: Transition,
        since: datetime | None,
        now: datetime,
        caused: float | None,
        report: Report | None,
    ) -> Applied:
        evicted = refused = deleted = 0
        error = None
        try:
            patch = transition.node_patch()
            if patch:
                self._written(NODE, self._kube.patch_node(transition.node, patch))
            for action in transition.pod_actions:
                if isinstance(action, EvictPods):
                    for ref in action.pods:
                        if self._kube.evict_pod(ref.namespace, ref.name):
                            evicted += 1
                        else:
                            refused += 1
                elif isinstance(action, DeletePods):
                    for ref in action.pods:
                        self._written(POD, self._kube.delete_pod(ref.namespace, ref.name))
                        deleted += 1
        except ApiError as err:
            log.warning("upgrade step on node %s failed: %s", transition.node, err)
            error = f"{transition.node}: {err}"
        except Exception as err:  # a worker must always let its node go
            log.exception("upgrade step on node %s failed", transition.node)
            error = f"{transition.node}: {err}"
        with self._lock:
            self._landed += 1
            self._landed_at[transition.node] = self._landed
            if self._in_flight.get(transition.node) is transition:
                del self._in_flight[transition.node]
            if transition.records_waiting and self._records.get(transition.node) is not None:
                del self._records[transition.node]
            retries = self._retries.pop(transition.node, [])
        if error is not None:
            applied = Applied(1, (), evicted, refused, deleted, (error,))
        else:
            change, reaction = None, None
            if transition.changes_state:
                change = _change(transition, since, now)
                if caused is not None:
                    entered = transition.to_state.value if transition.to_state else "released"
                    reaction = (entered, max(0.0, time.monotonic() - caused))
                self._events.submit(_event, self._kube, transition)
            applied = Applied(
                1,
                (change,) if change else (),
                evicted,
                refused,
                deleted,
                (),
                (reaction,) if reaction else (),
            )
        for callback in (report,):
            if callback is not None:
                try:
                    callback(transition, applied, caused)
                except Exception:
                    log.exception("reporting the step on node %s failed", transition.node)
        for again in dict.fromkeys(retries):
            try:
                again(transition.node)
            except Exception:
                log.exception("looking again at node %s failed", transition.node)
        return applied

    def _written(self, kind: str, obj: Obj | None) -> None:
        if self._cache is not None:
            self._cache.offer(kind, obj)

    def close(self, background: bool = True) -> None:
        """Wait for the node writes in flight; `background`: also for queued events and records (else
        they are still sent, by threads that end when their queue is empty)."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)
        self._events.shutdown(wait=background)
        self._record_writer.shutdown(wait=background)


def apply_plan(
    kube: Kube,
    plan: Plan,
    snapshot: Snapshot,
    cache: ClusterCache | None = None,
    woken_at: float | None = None,
    changed_at: Mapping[str, float] | None = None,
) -> Applied:
    """Carry out `plan.transitions` and wait for them (upgrade-required records excepted, which are
    written in the background); per node: one patch, then its pod actions, then one event. What the
    server answers (the patched Node, a deleted pod) goes to the cache, so the next pass starts from it.
    For callers without a `Stepper` (a one-off reconcile); the operator's passes do not wait.

    In a pass woken by changes (`woken_at`, time.monotonic, the first of them), each state change also
    reports how long the operator took to act (`Applied.reactions`): see `causes`."""
    writer = Writer(kube, cache)
    try:
        futures = writer.submit(plan.transitions, snapshot, None, causes(woken_at, changed_at or {}))
        return sum((f.result() for f in futures.values()), NOTHING)
    finally:
        writer.close(background=False)


def causes(woken_at: float | None, changed_at: Mapping[str, float]) -> Cause:
    """When the cause of each step reached us: for a node in flight, the latest change about it before
    the snapshot (`changed_at`); for a node just admitted (whose cause is elsewhere: a freed slot, a new
    target), `woken_at`. None in a timer's pass (timeouts are not reactions)."""

    def cause(transition: Transition) -> float | None:
        if woken_at is None:
            return None
        if transition.from_state in IN_FLIGHT_STATES:
            return changed_at.get(transition.node, woken_at)
        return woken_at

    return cause


class Stepper:
    """One GpuStack's upgrade engine between whole passes (which set its `StepContext`).

    `quick(names)`: the next step of each in-flight node among `names` (`gpuforge.upgrade.advance`), from
    the cache alone, queued at once: a node whose old plugin just went away gets the new one without a
    pass over the whole cluster. `fill()`: when nodes finish, their slots are filled as soon as their last
    patch lands, by the plan's admissions over the head of the last whole plan's queue, with the slots
    counted from the weights the cache's index keeps of the nodes that weigh on admission (cordoned,
    NotReady, in flight, failed; `planner.weight_of`): what the whole plan would admit, planning only a
    few waiting nodes however many are out. maxUnavailable and maxParallel hold as in any
    plan: our admissions still in flight count as landed, our uncordons only once they have landed.
    Slot filling runs one round at a time; rounds asked for meanwhile are merged into one.
    """

    # Waiting nodes planned besides the free slots, in case some of the queue's head cannot start now.
    QUEUE_MARGIN = 4

    def __init__(
        self,
        kube: Kube,
        cache: ClusterCache,
        writer: Writer,
        report: Callable[[Applied], None],
        look_again: Callable[[str], None],
    ) -> None:
        self._kube = kube
        self._cache = cache
        self.writer = writer
        self._report = report
        self._look_again = look_again
        self.context: StepContext | None = None  # None: no quick step (nothing in flight, or a new spec)
        self._quick_memo = ConversionMemo()  # each path its own memo: they run side by side
        self._fill_memo = ConversionMemo()
        self._fill_lock = threading.Lock()
        self._filling = False
        self._fill_causes: list[float | None] = []
        # Nodes admitted by slot filling that the last whole plan's queue may still list: None while the
        # admission is in flight, else the writer's count when it had landed (see `use`).
        self._started: dict[str, int | None] = {}

    def use(self, context: StepContext | None, seen: Mark | None = None) -> None:
        """A whole pass's context (None: no quick step, no slot filling), from a view read after `seen`.
        Its queue no longer lists the nodes admitted before that view."""
        with self._fill_lock:
            if context is None or seen is None:
                self._started.clear()
            else:
                self._started = {
                    n: landed for n, landed in self._started.items() if landed is None or landed > seen.landed
                }
            self.context = context

    def _landed(self, transition: Transition, applied: Applied, _caused: float | None) -> None:
        self._report(applied)
        if transition.starts:
            with self._fill_lock:
                if applied.errors:
                    self._started.pop(transition.node, None)  # not started: it waits again
                elif transition.node in self._started:
                    self._started[transition.node] = self.writer.mark().landed
        if transition.ends and not applied.errors:
            # The slot is free from now: the admission that takes it is timed from here, not from the
            # change that let this node finish (that wait is this step's own reaction).
            self.fill(time.monotonic())

    def quick(self, names: Iterable[str], woken_at: float | None, now: datetime) -> int | None:
        """Queue the next step of each node among `names` that is in flight; how many were queued, None
        when the cache has not synced."""
        context = self.context
        if context is None:
            return 0
        mark = self.writer.mark()  # first: see Writer
        wanted = set(names) & context.desired.selected
        for name in [n for n in wanted if n in mark.in_flight]:
            wanted.discard(name)  # a change about a node whose write is in flight: seen once it lands
            self.writer.after(name, self._look_again)
        view = _cached_view(self._cache, context, wanted)
        if view is None:
            return None
        if not wanted:
            return 0
        snapshot = _snapshot(view, wanted, self._quick_memo, now)
        steps = advance(snapshot, context.desired, context.policy)
        if steps:
            self.writer.submit(
                steps, snapshot, mark, causes(woken_at, view.changed_at), self._landed, self._look_again
            )
        return len(steps)

    def fill(self, caused: float | None) -> None:
        """Start the nodes the plan starts now (see the class); merged with rounds asked for meanwhile,
        whose earliest cause is the round's."""
        with self._fill_lock:
            self._fill_causes.append(caused)
            if self._filling:
                return
            self._filling = True
        while True:
            with self._fill_lock:
                asked, self._fill_causes = self._fill_causes, []
                if not asked:
                    self._filling = False
                    return
            known = [c for c in asked if c is not None]
            try:
                self._fill_round(min(known) if known else None)
            except Exception:
                log.exception("filling freed slots failed; the next whole pass will")

    def _fill_round(self, caused: float | None) -> None:
        context = self.context
        if context is None or not context.waiting:
            return
        mark = self.writer.mark()  # first: every write it counts as landed is in what is read next
        desired, policy = context.desired, context.policy
        stored = self._cache.weights()
        in_flight = self._cache.nodes_named(list(mark.in_flight))
        if stored is None or in_flight is None:
            return
        # What weighs: the cache's index, except our writes in flight, which count as landed (see overlaid).
        weights = [(name, w) for name, w in stored if name not in mark.in_flight]
        for obj in overlaid(in_flight, mark.in_flight):
            weight = admission_weight(obj)
            if weight is not None:
                weights.append((obj["metadata"]["name"], weight))
        counts = count_weights(weights, desired.selected)
        free = policy.max_unavailable.resolve(len(desired.selected)) - counts.unavailable
        taken = {name for name, w in weights if w.in_progress or w.failed_on}  # started, or failed
        with self._fill_lock:
            taken |= set(self._started)
        # Only as far into the queue as the head takes: a round per finishing node must not walk the whole
        # queue (thousands of waiting nodes).
        head = (n for n in context.queue if n not in taken and n not in mark.in_flight)
        names = set(itertools.islice(head, max(0, free) + self.QUEUE_MARGIN))
        if not names:
            return
        view = _cached_view(self._cache, context, names)  # these nodes, their pods and slices
        if view is None:
            return
        snapshot = _snapshot(
            view, names, self._fill_memo, datetime.now(UTC), nodes=overlaid(view.nodes, mark.in_flight)
        )
        # The slots from the counts: only the head of the queue is planned, however many nodes are out.
        plan = plan_upgrade(snapshot, desired, policy, counts)
        starts = [t for t in plan.transitions if t.node in plan.admitted]
        if starts:
            with self._fill_lock:  # before any can land
                self._started.update(dict.fromkeys((t.node for t in starts), None))
            queued = self.writer.submit(
                starts, snapshot, mark, lambda _: caused, self._landed, lambda _: self.fill(caused)
            )
            with self._fill_lock:
                for t in starts:
                    if t.node not in queued and self._started.get(t.node, 0) is None:
                        del self._started[t.node]  # left out (looked at again in another round)

    def whole_pass(
        self,
        plan: Plan,
        snapshot: Snapshot,
        mark: Mark,
        woken_at: float | None,
        changed_at: Mapping[str, float],
    ) -> None:
        """A whole pass's plan: its steps queued, its admissions made by a slot-filling round (from a view
        that holds every write since the pass's, so rounds never admit the same slot twice)."""
        admitted = set(plan.admitted)
        self.writer.submit(
            (t for t in plan.transitions if t.node not in admitted),
            snapshot,
            mark,
            causes(woken_at, changed_at),
            self._landed,
            self._look_again,
        )
        if admitted:
            self.fill(woken_at)


def overlaid(nodes: Sequence[Obj], in_flight: Mapping[str, Transition]) -> list[Obj]:
    """The Nodes as they will be once our writes in flight have landed, except writes that end a node's
    upgrade: until its uncordon has landed a node still counts as out of service."""
    if not in_flight:
        return list(nodes)
    out = []
    for node in nodes:
        transition = in_flight.get(node["metadata"]["name"])
        patch = transition.node_patch() if transition is not None and not transition.ends else None
        out.append(_merge_patch(node, patch) if patch else node)
    return out


def _merge_patch(obj: Obj, patch: Mapping[str, Any]) -> Obj:
    """A JSON merge patch (RFC 7386) applied to a copy; without a resourceVersion, so no memo mistakes
    the result for the stored object."""
    out: Obj = _merged(obj, patch)
    out["metadata"] = {k: v for k, v in out.get("metadata", {}).items() if k != "resourceVersion"}
    return out


def _merged(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return patch
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merged(out.get(key), value)
    return out


def _cached_view(
    cache: ClusterCache, context: StepContext, nodes: Collection[str] | None = None
) -> ClusterView | None:
    """Everything a plan reads (about `nodes` only, if given), from the cache alone; None when some kind
    has not synced."""
    cached = cache.read(context.dra_api, nodes)
    if cached.nodes is None or cached.pods is None or cached.slices is None or cached.claims is None:
        return None
    return ClusterView(
        cached.nodes, cached.pods, cached.slices, cached.claims, context.served, cached.changed_at
    )


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


def _named_nodes(head: dict[str, str], nodes: Sequence[str], message: str, limit: int) -> dict[str, Any]:
    """A hold, refusal or forward-only move in the status: its first `limit` nodes and how many there are."""
    return {**head, "nodes": list(nodes[:limit]), "nodeCount": len(nodes), "message": message}


def upgrade_status(plan: Plan, failed: Mapping[str, str], limit: int = 20) -> dict[str, Any]:
    """GpuStack `status.upgrade` as a merge patch: counts per state (absent states null), failing nodes,
    holds and refusals with their nodes (the first `limit` names; `nodeCount` says how many)."""
    counts = plan.counts()
    return {
        "target": plan.target,
        "complete": plan.complete,
        "nodes": {state.value: counts.get(state) or None for state in NodeState},
        "failed": [{"node": name, "reason": reason} for name, reason in sorted(failed.items())[:limit]],
        "holds": [_named_nodes({"reason": h.reason.value}, h.nodes, h.message, limit) for h in plan.holds],
        "refusals": [
            _named_nodes({"reason": r.reason.value}, r.nodes, r.message, limit) for r in plan.refusals
        ],
        "forwardOnly": [
            _named_nodes({"from": f.origin}, f.nodes, f.message, limit) for f in plan.forward_only
        ],
    }


def in_flight(plan: Plan) -> list[str]:
    return sorted(name for name, state in plan.states.items() if state in IN_FLIGHT_STATES)


__all__ = [
    "NOTHING",
    "Applied",
    "ClusterView",
    "Mark",
    "StateChange",
    "StepContext",
    "Stepper",
    "Writer",
    "apply_plan",
    "causes",
    "desired_of",
    "failures",
    "in_flight",
    "labels_after",
    "overlaid",
    "read_cluster",
    "snapshot_of",
    "upgrade_status",
]
