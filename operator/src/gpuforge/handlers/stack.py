"""kopf handlers for GpuStack: a few lines each, the work is in `gpuforge.k8s.stack`.

Level-based: one daemon per GpuStack reconciles, then waits (2 s while nodes are moving, 30 s when
settled) or until a spec change wakes it. Create/update/resume only wake the daemon, so a restarted
operator simply starts reconciling again from what is in the cluster.
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
from gpuforge.k8s.client import Kube
from gpuforge.k8s.stack import Outcome, cleanup, reconcile

log = logging.getLogger("gpuforge.operator")

BUSY_INTERVAL = 1.0  # seconds between passes while nodes are being moved
IDLE_INTERVAL = 30.0  # level-based resync of a settled stack (drift, new nodes)
ERROR_INTERVAL = 5.0


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


def _wake(memo: kopf.Memo) -> asyncio.Event:
    if "wake" not in memo:
        memo["wake"] = asyncio.Event()
    event: asyncio.Event = memo["wake"]
    return event


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def changed(memo: kopf.Memo, **_: Any) -> None:
    _wake(memo).set()


def _pass(kube: Kube, name: str) -> Outcome | None:
    started = time.monotonic()
    try:
        outcome = reconcile(kube, name)
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


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_timeout=30)
async def reconcile_daemon(name: str, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any) -> None:
    kube: Kube = memo["kube"]
    wake = _wake(memo)
    while not stopped:
        wake.clear()
        try:
            outcome = await asyncio.to_thread(_pass, kube, name)
            interval = IDLE_INTERVAL if outcome is None or outcome.settled else BUSY_INTERVAL
        except Exception as err:  # any failure: log, back off, try again; the daemon must not die
            log.exception("reconcile of GpuStack %s failed: %s", name, err)
            interval = ERROR_INTERVAL
        deadline = time.monotonic() + interval
        while not stopped and not wake.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def deleted(name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    result = cleanup(memo["kube"], body)
    if not result.done:
        raise kopf.TemporaryError(result.waiting, delay=10)
    metrics.forget(name)
    log.info("GpuStack %s cleaned up", name, extra={"stack": name})
