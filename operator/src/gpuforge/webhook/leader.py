"""Leader election: one replica at a time admits (from its in-memory ledger) and writes usage.

The replicas race for a coordination.k8s.io/v1 Lease with resourceVersion preconditions; the pure
state machine (gpuforge.quota.leader) says what to do with each read. A leader counts itself leader
only until `renew_deadline` after its last successful renewal began, which is shorter than the Lease
duration after which another replica may take over: a leader that cannot reach the API server stops
admitting and writing before anyone else starts. The holder publishes where it serves in an annotation
of the Lease; followers read it every `retry_seconds` and forward admission requests there.

On clean shutdown the leader releases the Lease once everything it admitted is written (`release_ok`),
so the next one may admit at once; after a crash the Lease expires first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp

from gpuforge.k8s.quota import ApiError, Conflict, QuotaApi
from gpuforge.quota.leader import (
    LEADER_ENDPOINT_ANNOTATION,
    LEADER_ROUTED_ANNOTATION,
    Action,
    Takeover,
    decide,
    lease_record,
    released_spec,
    takeover,
)
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
    endpoint: str = ""  # where this replica serves, published while it leads
    # Whether this replica has made itself the only endpoint of the webhook's address (webhook.routing);
    # published while it leads, so followers stop taking calls.
    routed: Callable[[], bool] = lambda: False
    clock: Clock = utc_now
    duration: timedelta = timedelta(seconds=15)
    renew_seconds: float = 5.0  # a leader renews this often
    retry_seconds: float = 2.0  # a follower reads the Lease this often
    renew_deadline: timedelta = timedelta(seconds=10)  # < duration: stop before others may start
    # Called with how this replica leads (every renewal too) and the loop time its term ends, and on loss.
    on_lead: Callable[[Takeover, float], None] | None = None
    on_lose: Callable[[], None] | None = None
    # Set by the shutdown once everything admitted is written: only then is the Lease released.
    release_ok: bool = False
    # Monotonic seconds (default: the event loop's clock): the Lease's expiry and this replica's renew
    # deadline are measured with it, never with the wall clock.
    monotonic: Callable[[], float] | None = None
    _leading_until: float = 0.0  # loop time until which this replica may admit and write
    _leading: bool = False
    _holder: str = ""
    _leader_endpoint: str = ""
    _holder_routed: bool = False
    _seen_version: str = ""
    _seen_at: float | None = None  # loop time this replica first saw the Lease at _seen_version
    _last: dict[str, Any] | None = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        if self.renew_deadline >= self.duration:
            raise ValueError("the renew deadline must be shorter than the Lease duration")

    def _now(self) -> float:
        return self.monotonic() if self.monotonic is not None else asyncio.get_running_loop().time()

    def is_leader(self) -> bool:
        return self._leading and self._now() < self._leading_until

    @property
    def holder(self) -> str:
        return self._holder

    @property
    def leader_endpoint(self) -> str:
        """Where the holder serves, as last read (empty: no holder, or it published none)."""
        return self._leader_endpoint

    @property
    def holder_routed(self) -> bool:
        """Whether the holder, as last read, takes the API server's calls itself."""
        return self._holder_routed

    def poke(self) -> None:
        """Read the Lease again soon (a forwarded request found no leader where the last read said)."""
        self._wake.set()

    def _set_leading(self, leading: bool, how: Takeover | None = None) -> None:
        if leading != self._leading:
            self._leading = leading
            metrics.LEADER.set(1.0 if leading else 0.0)
            log.info(
                "%s leadership (Lease %s/%s, identity %s)",
                "took" if leading else "lost",
                self.namespace,
                self.name,
                self.identity,
            )
            if not leading and self.on_lose is not None:
                self.on_lose()
        if leading and how is not None and self.on_lead is not None:
            self.on_lead(how, self._leading_until)

    def _note_holder(self, holder: str, endpoint: str, routed: bool) -> None:
        if holder != self._holder:
            log.info("Lease %s/%s held by %s", self.namespace, self.name, holder or "nobody")
        self._holder, self._leader_endpoint, self._holder_routed = holder, endpoint, bool(holder) and routed

    def _annotations(self) -> dict[str, str]:
        annotations = {LEADER_ENDPOINT_ANNOTATION: self.endpoint} if self.endpoint else {}
        if self.routed():
            annotations[LEADER_ROUTED_ANNOTATION] = "true"
        return annotations

    async def step(self) -> None:
        """One read-decide-write round."""
        started = self._now()
        raw = await self.api.get_lease(self.namespace, self.name)
        record = lease_record(raw)
        version = record.resource_version if record is not None else ""
        if version != self._seen_version or self._seen_at is None:
            self._seen_version, self._seen_at = version, self._now()
        leading = self.is_leader()
        decision = decide(
            record,
            me=self.identity,
            now=self.clock(),
            waited=timedelta(seconds=self._now() - self._seen_at),
            duration=self.duration,
            leading=leading,
        )
        if decision.action in (Action.WAIT, Action.LOST):
            self._note_holder(
                decision.holder,
                record.endpoint if record is not None else "",
                record is not None and record.routed,
            )
            self._set_leading(False)
            return
        assert decision.spec is not None
        annotations = self._annotations()
        try:
            if decision.action is Action.CREATE:
                written = await self.api.create_lease(self.namespace, self.name, decision.spec, annotations)
            else:
                assert record is not None
                written = await self.api.replace_lease(
                    self.namespace, self.name, version, decision.spec, annotations
                )
        except Conflict:  # another replica wrote first: read again next round
            self._set_leading(False)
            return
        self._last = written
        self._seen_version = str((written.get("metadata") or {}).get("resourceVersion") or "")
        self._seen_at = self._now()
        self._leading_until = started + self.renew_deadline.total_seconds()
        self._note_holder(self.identity, self.endpoint, LEADER_ROUTED_ANNOTATION in annotations)
        self._set_leading(True, takeover(decision.action, record, leading))

    async def run(self) -> None:
        """Campaign and renew until cancelled; then release the Lease if held and `release_ok`."""
        try:
            while True:
                try:
                    await self.step()
                except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as error:
                    log.warning("Lease %s/%s: %s", self.namespace, self.name, error)
                if self._leading and not self.is_leader():  # could not renew in time
                    self._set_leading(False)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    # Not wait_for: on Python 3.11 it can swallow a cancellation (the shutdown's).
                    async with asyncio.timeout(self.renew_seconds if self._leading else self.retry_seconds):
                        await self._wake.wait()
                    await asyncio.sleep(0.25)  # woken by poke(): at most four reads a second
        finally:
            await asyncio.shield(self._release())

    async def _release(self) -> None:
        was_leading = self.is_leader()
        self._set_leading(False)
        record = lease_record(self._last)
        if not was_leading or not self.release_ok or record is None or record.holder != self.identity:
            return
        try:
            await asyncio.wait_for(
                self.api.replace_lease(
                    self.namespace, self.name, record.resource_version, released_spec(record, self.clock())
                ),
                timeout=3.0,
            )
            log.info("released Lease %s/%s", self.namespace, self.name)
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, error)
