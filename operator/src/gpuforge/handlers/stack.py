"""kopf handlers for GpuStack: a few lines each, the work is in `gpuforge.k8s.stack`.

Level-based: one daemon per GpuStack reconciles from a snapshot of the cluster, then sleeps until
something the planner reads changes (the watch-fed `ClusterCache` says so; a burst of changes is
debounced into one pass) or a spec changes, with a slow resync as a safety net (30 s when settled).
While nodes are in flight, the daemon runs two lanes side by side: quick steps act on each node's change
as it arrives (`gpuforge.k8s.upgrade.Stepper`: what the whole plan would do for that node, queued without
waiting for earlier patches; slots are filled as soon as finishing nodes' patches land), and whole passes,
which also write the status and the operands and catch anything else, come every few seconds.
Create/update/resume only wake the daemon, so a restarted operator simply starts reconciling again from
what is in the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

import kopf

from gpuforge.api.convert import to_dict
from gpuforge.api.gpustack import PLURAL
from gpuforge.constants import FINALIZER, GROUP, VERSION
from gpuforge.handlers import metrics
from gpuforge.handlers.pacing import in_flight_interval
from gpuforge.heap import Heap
from gpuforge.k8s.cache import ClusterCache
from gpuforge.k8s.client import Kube
from gpuforge.k8s.memory import StackMemory
from gpuforge.k8s.stack import Outcome, cleanup, reconcile
from gpuforge.k8s.upgrade import Stepper, Writer

log = logging.getLogger("gpuforge.operator")

IDLE_RESYNC = 30.0  # level-based resync of a settled stack (drift, served API versions)
ERROR_INTERVAL = 5.0
DEBOUNCE = 0.2  # after a change, wait this long for the rest of its burst (a batch of 100 node updates)
QUICK_DEBOUNCE = 0.005  # while nodes are in flight: a node's change is acted on this soon, for that node
SYNC_TIMEOUT = 30.0  # the first pass waits this long for the cache, then lists whatever is not synced
# The heap is settled after every pass (gpuforge.heap) and thawed, which collects everything in one
# pause (about a second with 5,000 nodes cached), every 10 minutes when no node is in flight, at least
# hourly.
HEAP_THAW_EVERY = 600.0
HEAP_THAW_AT_MOST = 3600.0


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
    """One daemon's alarms, set from the event loop: `changed` by any change that matters, `nodes` with
    the nodes those were about (for quick steps), `whole_changed` when the GpuStack itself changed (a
    whole pass at once; `on_whole` stops quick steps on the old spec meanwhile). Remembers when a change
    first came since the last take, to measure how long changes wait."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.whole_changed = asyncio.Event()
        self.nodes_changed = asyncio.Event()
        self.since: float | None = None
        self.nodes_since: float | None = None
        self.nodes: set[str] = set()
        self.on_whole: Callable[[], None] | None = None

    def ring(self, node: str | None = None, *, whole: bool = False) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
        if node is not None:
            if self.nodes_since is None:
                self.nodes_since = now
            self.nodes.add(node)
            self.nodes_changed.set()
        if whole:
            if self.on_whole is not None:
                self.on_whole()
            self.whole_changed.set()
        self.changed.set()

    def take_pass(self) -> tuple[float | None, bool]:
        """For a whole pass: the moment of the first change since the last take, and whether the
        GpuStack changed."""
        taken = (self.since, self.whole_changed.is_set())
        self.since = None
        self.changed.clear()
        self.whole_changed.clear()
        return taken

    def take_nodes(self) -> tuple[float | None, set[str]]:
        """For quick steps: the moment of the first node change since the last take, and the nodes."""
        taken = (self.nodes_since, self.nodes)
        self.nodes_since, self.nodes = None, set()
        self.nodes_changed.clear()
        return taken


def _wakes(memo: kopf.Memo) -> set[Wake]:
    """Every daemon's alarm. The set is made at startup, before any GpuStack is seen: kopf gives each
    object a shallow copy of the operator's memo when it first sees it, so a set made later in either
    memo would not be shared (node changes would then wake no daemon, and only timers would run passes)."""
    wakes: set[Wake] = memo["wakes"]
    return wakes


def _heap(memo: kopf.Memo) -> Heap:
    """The process's heap, settled after every pass; made at startup, like the wakes."""
    heap: Heap = memo["heap"]
    return heap


def _memory(memo: kopf.Memo) -> StackMemory:
    """What every GpuStack's passes remember (gpuforge.k8s.memory); made at startup, like the wakes, so
    that every object's copy of the memo shares it."""
    memory: StackMemory = memo["memory"]
    return memory


def _wake_all(memo: kopf.Memo, node: str | None = None, *, whole: bool = False) -> None:
    for wake in _wakes(memo):
        wake.ring(node, whole=whole)


@kopf.on.startup()
async def start_cache(memo: kopf.Memo, **_: Any) -> None:
    """The watch-fed cache of nodes, pods, slices and claims, shared by every GpuStack's passes, and what
    those passes remember between them (see `_memory`)."""
    memo["wakes"] = set()  # first: see _wakes
    memo["memory"] = StackMemory()
    memo["heap"] = Heap(HEAP_THAW_EVERY, HEAP_THAW_AT_MOST)
    metrics.GC_PAUSES.install()
    cache = ClusterCache(memo["kube"], lambda node: _wake_all(memo, node))
    await cache.start()
    memo["cache"] = cache
    memo["writer"] = Writer(memo["kube"], cache)  # one for every GpuStack: a node is written once at a time


@kopf.on.cleanup()
async def stop_cache(memo: kopf.Memo, **_: Any) -> None:
    writer: Writer | None = memo.get("writer")
    if writer is not None:  # the writes in flight land (and are seen by the cache) before it stops
        await asyncio.to_thread(writer.close)
    cache: ClusterCache | None = memo.get("cache")
    if cache is not None:
        await cache.stop()


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def changed(memo: kopf.Memo, **_: Any) -> None:
    _wake_all(memo, whole=True)


def _pass(
    kube: Kube,
    name: str,
    memory: StackMemory,
    cache: ClusterCache | None,
    woken_at: float | None,
    stepper: Stepper | None,
) -> Outcome | None:
    started = time.monotonic()
    try:
        outcome = reconcile(kube, name, memory, cache, woken_at, stepper)
    except Exception:
        metrics.RECONCILES.labels(name, "error").inc()
        raise
    metrics.RECONCILE_SECONDS.labels(name).observe(time.monotonic() - started)
    metrics.RECONCILES.labels(name, "ok").inc()
    if outcome is not None:
        metrics.record_nodes(name, to_dict(outcome.status.nodes), outcome.status.phase.value == "Ready")
        metrics.record_upgrade(name, outcome)
        log.info(
            "reconciled GpuStack %s: %s, nodes %s, applied %d, pruned %d, labelled %d (%s)",
            name,
            outcome.status.phase.value,
            outcome.status.nodes_ready,
            outcome.applied,
            outcome.pruned,
            outcome.labelled,
            ", ".join(f"{phase} {seconds:.2f}s" for phase, seconds in outcome.phases.items()),
            extra={"stack": name, "phase": outcome.status.phase.value},
        )
    return outcome


def _quick(name: str, stepper: Stepper, nodes: set[str], woken_at: float | None) -> None:
    """Quick steps for the nodes that changed (queued, not waited for)."""
    started = time.monotonic()
    queued = stepper.quick(nodes, woken_at, datetime.now(UTC))
    metrics.QUICK_STEP_SECONDS.labels(name).observe(time.monotonic() - started)
    if queued:
        log.debug("GpuStack %s: quick steps on %d of %d changed node(s)", name, queued, len(nodes))


async def _until(event: asyncio.Event, stopped: kopf.DaemonStopped, seconds: float) -> bool:
    """Wait until `event` is set (True), or `stopped`, or `seconds` have passed (False)."""
    deadline = time.monotonic() + seconds
    while not stopped and not event.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:  # short slices: `stopped` is polled
            await asyncio.wait_for(event.wait(), timeout=min(left, 0.5))
        except TimeoutError:
            continue
    return event.is_set() and not stopped


async def _quick_lane(name: str, stepper: Stepper, wake: Wake, stopped: kopf.DaemonStopped) -> None:
    """While nodes are in flight (the stepper has a context), act on each node's change at once."""
    while not stopped:
        if not await _until(wake.nodes_changed, stopped, 3600):
            continue
        await asyncio.sleep(QUICK_DEBOUNCE)  # the rest of the burst
        since, nodes = wake.take_nodes()
        if stepper.context is None:
            continue  # nothing in flight: whole passes look at these changes
        try:
            await asyncio.to_thread(_quick, name, stepper, nodes, since)
        except Exception as err:  # the lane must not die; whole passes catch up
            log.exception("quick steps of GpuStack %s failed: %s", name, err)


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_timeout=30)
async def reconcile_daemon(name: str, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any) -> None:
    """Whole passes on changes (debounced), on spec changes at once, and on timers; while nodes are in
    flight, every WHOLE_PASS_EVERY seconds or more (`in_flight_interval`), with quick steps on each node's
    change in a lane of their own."""
    kube: Kube = memo["kube"]
    cache: ClusterCache | None = memo.get("cache")
    memory = _memory(memo)
    heap = _heap(memo)
    loop = asyncio.get_running_loop()
    wake = Wake()

    def look_again(node: str) -> None:  # from the writer's threads
        with contextlib.suppress(RuntimeError):  # the loop is closed: the operator is stopping
            loop.call_soon_threadsafe(wake.ring, node)

    stepper: Stepper | None = None
    quick: asyncio.Task[None] | None = None
    if cache is not None:
        stepper = Stepper(
            kube,
            cache,
            memo["writer"],
            report=lambda applied: metrics.record_applied(name, applied),
            look_again=look_again,
        )
        wake.on_whole = partial(stepper.use, None)  # a new spec: nothing more on the old one
        quick = asyncio.create_task(_quick_lane(name, stepper, wake, stopped), name=f"gpuforge-quick-{name}")
    _wakes(memo).add(wake)
    try:
        if cache is not None and not await cache.wait_synced(SYNC_TIMEOUT):
            log.warning("cluster cache not synced after %.0fs; listing what is missing", SYNC_TIMEOUT)
        last_end = time.monotonic()
        interval = 0.0
        woken = False
        while not stopped:
            since, _whole = wake.take_pass()
            if woken and since is not None:  # how long the change that woke this pass waited for it
                metrics.WAKE_DELAY_SECONDS.labels(name).observe(time.monotonic() - max(since, last_end))
            try:
                outcome = await asyncio.to_thread(_pass, kube, name, memory, cache, since, stepper)
                if outcome is None or outcome.settled:
                    settled, interval = True, IDLE_RESYNC
                else:
                    settled, interval = False, in_flight_interval(outcome.phases)
            except Exception as err:  # any failure: log, back off, try again; the daemon must not die
                log.exception("reconcile of GpuStack %s failed: %s", name, err)
                if stepper is not None:
                    stepper.use(None)
                interval = ERROR_INTERVAL
                settled = False
            # What the pass and the watches made since the last settle is collected, the rest frozen.
            heap.settle(quiet=settled and (stepper is None or stepper.writer.in_flight() == 0))
            last_end = time.monotonic()
            if stepper is not None and stepper.context is not None:
                # Nodes in flight: quick steps follow their changes; the next whole pass comes on time,
                # or at once if the GpuStack changes.
                woken = await _until(wake.whole_changed, stopped, interval)
            else:
                woken = await _until(wake.changed, stopped, interval)
            if woken:
                await asyncio.sleep(DEBOUNCE)
    finally:
        _wakes(memo).discard(wake)
        if quick is not None:
            quick.cancel()


@kopf.on.delete(GROUP, VERSION, PLURAL)
def deleted(name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    result = cleanup(memo["kube"], body, _memory(memo))
    if not result.done:
        raise kopf.TemporaryError(result.waiting, delay=10)
    metrics.forget(name)
    log.info("GpuStack %s cleaned up", name, extra={"stack": name})
