"""Leader election of the usage controller: one replica at a time writes recomputed usage.

The replicas race for a coordination.k8s.io/v1 Lease with resourceVersion preconditions; the pure
state machine (gpuforge.quota.leader) says what to do with each read. A leader counts itself leader
only until `renew_deadline` after its last successful renewal began, which is shorter than the Lease
duration after which another replica may take over: a leader that cannot reach the API server stops
writing before anyone else starts. On clean shutdown the leader releases the Lease, so failover is
immediate; after a crash it takes the Lease duration plus one retry period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from gpuforge.k8s.quota import ApiError, Conflict, QuotaApi
from gpuforge.quota.leader import Action, decide, lease_record, released_spec
from gpuforge.webhook import metrics
from gpuforge.webhook.admission import Clock, utc_now

log = logging.getLogger(__name__)

_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_identity() -> str:
    """Pod name (the hostname in a pod) and pid: unique per process, readable in the Lease."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"


def default_namespace() -> str:
    """The webhook's own namespace in a pod; `default` outside the cluster."""
    with contextlib.suppress(OSError):
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    return os.environ.get("POD_NAMESPACE") or "default"


@dataclass
class LeaderElector:
    api: QuotaApi
    namespace: str
    name: str
    identity: str = field(default_factory=default_identity)
    clock: Clock = utc_now
    duration: timedelta = timedelta(seconds=15)
    renew_seconds: float = 5.0  # a leader renews this often
    retry_seconds: float = 2.0  # a follower reads the Lease this often
    renew_deadline: timedelta = timedelta(seconds=10)  # < duration: stop writing before others may start
    on_change: Callable[[bool], None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    _leading_until: float = 0.0  # loop time until which this replica may write
    _leading: bool = False
    _holder: str = ""
    _seen_version: str = ""
    _observed_at: datetime | None = None
    _last: dict[str, Any] | None = None

    def is_leader(self) -> bool:
        return self._leading and asyncio.get_running_loop().time() < self._leading_until

    async def wait_leading(self) -> None:
        while not self.is_leader():
            self.changed.clear()
            await self.changed.wait()

    def _set_leading(self, leading: bool) -> None:
        if leading != self._leading:
            self._leading = leading
            metrics.CONTROLLER_LEADER.set(1.0 if leading else 0.0)
            log.info(
                "usage controller %s leadership (Lease %s/%s, identity %s)",
                "took" if leading else "lost",
                self.namespace,
                self.name,
                self.identity,
            )
            self.changed.set()
            if self.on_change is not None:
                self.on_change(leading)

    def _note_holder(self, holder: str) -> None:
        if holder != self._holder:
            self._holder = holder
            log.info("usage controller Lease %s/%s held by %s", self.namespace, self.name, holder or "nobody")

    async def step(self) -> None:
        """One read-decide-write round."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        raw = await self.api.get_lease(self.namespace, self.name)
        record = lease_record(raw)
        now = self.clock()
        version = record.resource_version if record is not None else ""
        if version != self._seen_version or self._observed_at is None:
            self._seen_version, self._observed_at = version, now
        decision = decide(
            record,
            me=self.identity,
            now=now,
            observed_at=self._observed_at,
            duration=self.duration,
            leading=self.is_leader(),
        )
        if decision.action in (Action.WAIT, Action.LOST):
            self._note_holder(decision.holder)
            self._set_leading(False)
            return
        assert decision.spec is not None
        try:
            if decision.action is Action.CREATE:
                written = await self.api.create_lease(self.namespace, self.name, decision.spec)
            else:
                assert record is not None
                written = await self.api.replace_lease(self.namespace, self.name, version, decision.spec)
        except Conflict:  # another replica wrote first: read again next round
            self._set_leading(False)
            return
        self._last = written
        self._seen_version = str((written.get("metadata") or {}).get("resourceVersion") or "")
        self._observed_at = now
        self._leading_until = started + self.renew_deadline.total_seconds()
        self._note_holder(self.identity)
        self._set_leading(True)

    async def run(self) -> None:
        """Campaign and renew until cancelled; then release the Lease if held."""
        try:
            while True:
                try:
                    await self.step()
                except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as error:
                    log.warning("usage controller Lease %s/%s: %s", self.namespace, self.name, error)
                if self._leading and not self.is_leader():  # could not renew in time
                    self._set_leading(False)
                await asyncio.sleep(self.renew_seconds if self._leading else self.retry_seconds)
        finally:
            await asyncio.shield(self._release())

    async def _release(self) -> None:
        was_leading = self._leading
        self._set_leading(False)
        record = lease_record(self._last)
        if not was_leading or record is None or record.holder != self.identity:
            return
        try:
            await asyncio.wait_for(
                self.api.replace_lease(
                    self.namespace, self.name, record.resource_version, released_spec(record, self.clock())
                ),
                timeout=3.0,
            )
            log.info("usage controller released Lease %s/%s", self.namespace, self.name)
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, error)
