"""kopf handlers for GpuStack: a few lines each, the work is in `gpuforge.k8s.stack`.

Level-based: one daemon per GpuStack reconciles from a snapshot of the cluster, then sleeps until
something the planner reads changes (the watch-fed `ClusterCache` says so; a burst of changes is
debounced into one pass) or a spec changes, with a slow resync as a safety net (5 s while nodes are
moving, 30 s when settled). While nodes are in flight, a change about one node is acted on at once by a
quick step for that node alone (`gpuforge.upgrade.advance`: what the whole plan would do for it, never
starting a node), and whole passes, which also admit nodes and write the status, come every few seconds.
Create/update/resume only wake the daemon, so a restarted operator simply starts reconciling again from
what is in the cluster.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

import kopf

from gpuforge.api.convert import to_dict
from gpuforge.api.gpustack import PLURAL
from gpuforge.constants import FINALIZER, GROUP, VERSION
from gpuforge.handlers import metrics
from gpuforge.k8s.cache import ClusterCache
from gpuforge.k8s.client import Kube
from gpuforge.k8s.stack import Outcome, cleanup, reconcile
from gpuforge.k8s.upgrade import StepContext, quick_steps

log = logging.getLogger("gpuforge.operator")

BUSY_RESYNC = 5.0  # a moving rollout is looked at this often even when nothing seems to change (timers)
IDLE_RESYNC = 30.0  # level-based resync of a settled stack (drift, served API versions)
ERROR_INTERVAL = 5.0
DEBOUNCE = 0.2  # after a change, wait this long for the rest of its burst (a batch of 100 node updates)
QUICK_DEBOUNCE = 0.02  # while nodes are in flight: a node's change is acted on this soon, for that node
# While nodes are in flight: a whole pass follows the previous one's end after at most this long when
# something changed. Quick steps move nodes and fill freed slots in between; whole passes refresh the
# status and the operands and catch anything else, and must not crowd the quick steps out.
WHOLE_PASS_EVERY = 5.0
SYNC_TIMEOUT = 30.0  # the first pass waits this long for the cache, then lists whatever is not synced


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    # Keep kopf's bookkeeping in annotations under our group, not in status (which the schema owns).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.scanning.disabled = True  # GpuStack's CRD is installed before us: no CRD/namespace watching
    settings.posting.level = logging.WARNING  # our own events say what happens; kopf's would repeat it
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf uses the same credentials as gpuforge.k8s (the kubeconfig given to `gpuforge operator run`)."""
    kube: Kube = memo["kube"]
    return kopf.ConnectionInfo(**kube.connection_info())


class Wake:
    """One daemon's alarm: set by changes, cleared when a pass starts; remembers when it was first set
    since the last pass (to measure how long a change waited for the pass that saw it), which nodes the
    changes were about (for quick steps), and whether the GpuStack itself changed (a whole pass, then)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.since: float | None = None
        self.nodes: set[str] = set()
        self.whole = False

    def ring(self, node: str | None = None, *, whole: bool = False) -> None:
        if self.since is None:
            self.since = time.monotonic()
        if node is not None:
            self.nodes.add(node)
        self.whole = self.whole or whole
        self.event.set()

    def take(self) -> tuple[float | None, set[str], bool]:
        """Clear; the moment of the first change since the last take, the nodes changed, whether
        something other than a node changed."""
        taken = (self.since, self.nodes, self.whole)
        self.since, self.nodes, self.whole = None, set(), False
        self.event.clear()
        return taken


def _wakes(memo: kopf.Memo) -> set[Wake]:
    """Every daemon's alarm. The set is made at startup, before any GpuStack is seen: kopf gives each
    object a shallow copy of the operator's memo when it first sees it, so a set made later in either
    memo would not be shared (node changes would then wake no daemon, and only timers would run passes)."""
    wakes: set[Wake] = memo["wakes"]
    return wakes


def _wake_all(memo: kopf.Memo, node: str | None = None, *, whole: bool = False) -> None:
    for wake in _wakes(memo):
        wake.ring(node, whole=whole)


@kopf.on.startup()
async def start_cache(memo: kopf.Memo, **_: Any) -> None:
    """The watch-fed cache of nodes, pods, slices and claims, shared by every GpuStack's passes."""
    memo["wakes"] = set()  # first: see _wakes
    cache = ClusterCache(memo["kube"], lambda node: _wake_all(memo, node))
    await cache.start()
    memo["cache"] = cache


@kopf.on.cleanup()
async def stop_cache(memo: kopf.Memo, **_: Any) -> None:
    cache: ClusterCache | None = memo.get("cache")
    if cache is not None:
        await cache.stop()


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def changed(memo: kopf.Memo, **_: Any) -> None:
    _wake_all(memo, whole=True)


def _pass(kube: Kube, name: str, cache: ClusterCache | None, woken_at: float | None) -> Outcome | None:
    started = time.monotonic()
    try:
        outcome = reconcile(kube, name, cache, woken_at)
    except Exception:
        metrics.RECONCILES.labels(name, "error").inc()
        raise
    metrics.RECONCILE_SECONDS.labels(name).observe(time.monotonic() - started)
    metrics.RECONCILES.labels(name, "ok").inc()
    if outcome is not None:
        metrics.record_nodes(name, to_dict(outcome.status.nodes), outcome.status.phase.value == "Ready")
        metrics.record_upgrade(name, outcome)
        log.info(
            "reconciled GpuStack %s: %s, nodes %s, applied %d, pruned %d, labelled %d",
            name,
            outcome.status.phase.value,
            outcome.status.nodes_ready,
            outcome.applied,
            outcome.pruned,
            outcome.labelled,
            extra={"stack": name, "phase": outcome.status.phase.value},
        )
    return outcome


def _quick(
    kube: Kube,
    name: str,
    context: StepContext,
    nodes: set[str],
    cache: ClusterCache,
    woken_at: float | None,
) -> bool:
    """Quick steps for the nodes that changed; False when they cannot be made (cache not synced)."""
    started = time.monotonic()
    applied = quick_steps(kube, context, nodes, cache, woken_at, datetime.now(UTC))
    metrics.QUICK_STEP_SECONDS.labels(name).observe(time.monotonic() - started)
    if applied is None:
        return False
    if applied.transitions:
        metrics.record_applied(name, applied)
        log.info(
            "GpuStack %s: quick steps on %d of %d changed node(s)",
            name,
            applied.transitions,
            len(nodes),
            extra={"stack": name},
        )
    return True


async def _sleep(wake: Wake, stopped: kopf.DaemonStopped, seconds: float, debounce: float) -> None:
    """Until woken (then a short debounce), stopped, or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while not stopped and not wake.event.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:  # short slices: `stopped` is polled
            await asyncio.wait_for(wake.event.wait(), timeout=min(left, 0.5))
        except TimeoutError:
            continue
    if wake.event.is_set() and not stopped:
        await asyncio.sleep(debounce)


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_timeout=30)
async def reconcile_daemon(name: str, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any) -> None:
    """Whole passes on changes (debounced), on spec changes at once, and on timers. While nodes are in
    flight, a change about a node is acted on at once by a quick step for that node alone, and whole
    passes (which also admit nodes and write the status) come every WHOLE_PASS_EVERY seconds."""
    kube: Kube = memo["kube"]
    cache: ClusterCache | None = memo.get("cache")
    wake = Wake()
    _wakes(memo).add(wake)
    try:
        if cache is not None and not await cache.wait_synced(SYNC_TIMEOUT):
            log.warning("cluster cache not synced after %.0fs; listing what is missing", SYNC_TIMEOUT)
        steps: StepContext | None = None  # from the last whole pass while nodes are in flight
        last_end = last_whole = time.monotonic()
        interval = 0.0
        pending: float | None = None  # the first change since the last whole pass began
        while not stopped:
            since, nodes, whole = wake.take()
            started = time.monotonic()
            if since is not None:  # the time a change waited, not counting a pass that was running
                metrics.WAKE_DELAY_SECONDS.labels(name).observe(started - max(since, last_end))
                pending = since if pending is None else pending
            try:
                if (
                    steps is not None
                    and nodes
                    and cache is not None
                    and not whole  # the stack changed: its old target must not move nodes any more
                    and not await asyncio.to_thread(_quick, kube, name, steps, nodes, cache, since)
                ):
                    steps = None  # the cache cannot answer: whole passes only
                now = time.monotonic()
                due = (  # the first time round, `steps` is None
                    whole
                    or steps is None
                    or now - last_whole >= interval
                    or (pending is not None and now - last_whole >= WHOLE_PASS_EVERY)
                )
                if due:
                    woken_at, pending = pending, None
                    outcome = await asyncio.to_thread(_pass, kube, name, cache, woken_at)
                    steps = outcome.steps if outcome is not None else None
                    interval = IDLE_RESYNC if outcome is None or outcome.settled else BUSY_RESYNC
                    last_whole = time.monotonic()  # the next whole pass is timed from this one's end
            except Exception as err:  # any failure: log, back off, try again; the daemon must not die
                log.exception("reconcile of GpuStack %s failed: %s", name, err)
                steps, interval, last_whole = None, ERROR_INTERVAL, time.monotonic()
            last_end = time.monotonic()
            left = max(0.0, interval - (last_end - last_whole))
            if steps is None:
                await _sleep(wake, stopped, left, DEBOUNCE)
            else:
                if pending is not None:  # changes not yet seen by a whole pass
                    left = min(left, max(0.0, WHOLE_PASS_EVERY - (last_end - last_whole)))
                await _sleep(wake, stopped, left, QUICK_DEBOUNCE)
    finally:
        _wakes(memo).discard(wake)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def deleted(name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    result = cleanup(memo["kube"], body)
    if not result.done:
        raise kopf.TemporaryError(result.waiting, delay=10)
    metrics.forget(name)
    log.info("GpuStack %s cleaned up", name, extra={"stack": name})
