"""kopf handlers for GpuStack: a few lines each, the work is in `gpuforge.k8s.stack`.

Level-based: one daemon per GpuStack reconciles from a snapshot of the cluster, then sleeps until
something the planner reads changes (the watch-fed `ClusterCache` says so; a burst of changes is
debounced into one pass) or a spec changes, with a slow resync as a safety net (5 s while nodes are
moving, 30 s when settled). Create/update/resume only wake the daemon, so a restarted operator simply
starts reconciling again from what is in the cluster.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kopf

from gpuforge.api.convert import to_dict
from gpuforge.api.gpustack import PLURAL
from gpuforge.constants import FINALIZER, GROUP, VERSION
from gpuforge.handlers import metrics
from gpuforge.k8s.cache import ClusterCache
from gpuforge.k8s.client import Kube
from gpuforge.k8s.stack import Outcome, cleanup, reconcile

log = logging.getLogger("gpuforge.operator")

BUSY_RESYNC = 5.0  # a moving rollout is looked at this often even when nothing seems to change (timers)
IDLE_RESYNC = 30.0  # level-based resync of a settled stack (drift, served API versions)
ERROR_INTERVAL = 5.0
DEBOUNCE = 0.2  # after a change, wait this long for the rest of its burst (a batch of 100 node updates)
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
    since the last pass, to measure how long a change waited for the pass that saw it."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.since: float | None = None

    def set(self) -> None:
        if self.since is None:
            self.since = time.monotonic()
        self.event.set()

    def take(self) -> float | None:
        """Clear; the moment of the first change since the last take, if any."""
        since, self.since = self.since, None
        self.event.clear()
        return since


def _wakes(memo: kopf.Memo) -> set[Wake]:
    if "wakes" not in memo:
        memo["wakes"] = set()
    wakes: set[Wake] = memo["wakes"]
    return wakes


def _wake_all(memo: kopf.Memo) -> None:
    for wake in _wakes(memo):
        wake.set()


@kopf.on.startup()
async def start_cache(memo: kopf.Memo, **_: Any) -> None:
    """The watch-fed cache of nodes, pods, slices and claims, shared by every GpuStack's passes."""
    cache = ClusterCache(memo["kube"], lambda: _wake_all(memo))
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
    _wake_all(memo)


def _pass(kube: Kube, name: str, cache: ClusterCache | None) -> Outcome | None:
    started = time.monotonic()
    try:
        outcome = reconcile(kube, name, cache)
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


async def _sleep(wake: Wake, stopped: kopf.DaemonStopped, seconds: float) -> None:
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
        await asyncio.sleep(DEBOUNCE)


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_timeout=30)
async def reconcile_daemon(name: str, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any) -> None:
    kube: Kube = memo["kube"]
    cache: ClusterCache | None = memo.get("cache")
    wake = Wake()
    _wakes(memo).add(wake)
    try:
        if cache is not None and not await cache.wait_synced(SYNC_TIMEOUT):
            log.warning("cluster cache not synced after %.0fs; listing what is missing", SYNC_TIMEOUT)
        last_end = time.monotonic()
        while not stopped:
            since = wake.take()
            started = time.monotonic()
            if since is not None:  # the time a change waited, not counting a pass that was running
                metrics.WAKE_DELAY_SECONDS.labels(name).observe(started - max(since, last_end))
            try:
                outcome = await asyncio.to_thread(_pass, kube, name, cache)
                interval = IDLE_RESYNC if outcome is None or outcome.settled else BUSY_RESYNC
            except Exception as err:  # any failure: log, back off, try again; the daemon must not die
                log.exception("reconcile of GpuStack %s failed: %s", name, err)
                interval = ERROR_INTERVAL
            last_end = time.monotonic()
            await _sleep(wake, stopped, interval)
    finally:
        _wakes(memo).discard(wake)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def deleted(name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    result = cleanup(memo["kube"], body)
    if not result.done:
        raise kopf.TemporaryError(result.waiting, delay=10)
    metrics.forget(name)
    log.info("GpuStack %s cleaned up", name, extra={"stack": name})
