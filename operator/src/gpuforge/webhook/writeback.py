"""Write-behind: the leader's ledger written to each GpuQuota's status, in the background.

An admission is answered as soon as the ledger (gpuforge.quota.ledger) has charged it; this writer then
replaces the quota's status with what the ledger holds, with the resourceVersion it knows as the
precondition. One write per quota at a time, up to `concurrency` quotas at once, and one per quota per
`min_interval` at most: admissions that come meanwhile go together in the next write (a busy quota is
written once a second, not once per admission). All quotas together take turns in a write budget of
`rate` writes a second (`WriteBudget`): a status write costs the API server about what a small create
does, so with many busy quotas one write per admission would double the load the guarded creates put
on it; with the budget, what the webhook adds stays bounded however many quotas are busy, and each
write carries every admission to its quota since the last. `flush` (a handover, a child quota's
carve-out) waits for neither. A 409 means the object changed since: the leader
is the only status writer, so that is a spec edit; read the quota, take its spec and resourceVersion, and
write the ledger's status again. Nothing is written once the leader's renew deadline has passed
(`may_write`).

`stalled` tells admission when to stop: when a quota's oldest unwritten admission has waited more than
the limit and its writes fail, or no write has landed anywhere for that long (a leader cut off from the
API server, whose requests may hang rather than fail). A quota that only waits its turn behind writes
that do land is not stalled, up to `max_unwritten` seconds: a busy API server slows the writes, and many
busy quotas share the budget; each write then carries more admissions.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from gpuforge.clock import SYSTEM, Clock
from gpuforge.k8s.quota import ApiError, Conflict, QuotaApi
from gpuforge.quota.convert import QuotaSpecError, quota_from_object, status_to_object
from gpuforge.quota.ledger import Ledger
from gpuforge.webhook import metrics

log = logging.getLogger(__name__)


@dataclass
class WriteBudget:
    """A token bucket: `rate` writes a second on average, `burst` at once (a quiet webhook writes at
    once). Writers wait their turn in arrival order (asyncio.Lock is fair), so the quota that has
    waited longest is written first. A `rate` of 0 means no limit."""

    rate: float
    burst: float = 0.0
    clock: Clock = SYSTEM
    _tokens: float = field(init=False)
    _at: float = field(init=False)
    _turn: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.burst = max(1.0, self.burst or self.rate)
        self._tokens, self._at = self.burst, self.clock.monotonic()

    async def take(self, hurry: asyncio.Event) -> None:
        """Wait for a write's turn; at once while `hurry` is set (it may then overdraw the budget,
        which later writes pay back)."""
        if self.rate <= 0:
            return
        async with self._turn:
            while True:
                now = self.clock.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
                self._at = now
                if self._tokens >= 1.0 or hurry.is_set():
                    self._tokens -= 1.0
                    return
                await self.clock.wait(hurry, (1.0 - self._tokens) / self.rate)


@dataclass
class WriteBehind:
    api: QuotaApi
    ledger: Ledger
    may_write: Callable[[], bool]
    concurrency: int = 16
    min_interval: float = 1.0
    # Status writes a second, all quotas together (0: no limit); see WriteBudget.
    rate: float = 10.0
    # How long an admission may wait its turn to be written while writes do land (see `stalled`).
    max_unwritten: float = 30.0
    # Called with a quota whose object was deleted and created again under its name (reloaded here):
    # the controller counts it afresh.
    on_reload: Callable[[str], None] | None = None
    max_backoff: float = 2.0
    # Every interval, deadline and age here (and the ledger's admission moments) is on this clock.
    clock: Clock = SYSTEM
    _due: asyncio.Event = field(default_factory=asyncio.Event)
    _progress: asyncio.Event = field(default_factory=asyncio.Event)
    _busy: set[str] = field(default_factory=set)
    _errors: dict[str, str] = field(default_factory=dict)  # the last failure per quota, for denials
    _landed: float = field(init=False)  # when a write last succeeded
    _started: dict[str, float] = field(default_factory=dict)  # when each quota's last write began
    _hurry: asyncio.Event = field(default_factory=asyncio.Event)  # set while a flush waits
    _flushes: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _budget: WriteBudget = field(init=False)

    def __post_init__(self) -> None:
        self._budget = WriteBudget(self.rate, clock=self.clock)
        self._landed = self.clock.monotonic()

    def poke(self) -> None:
        """The ledger changed: write what is due."""
        self._due.set()

    def last_error(self, name: str) -> str:
        return self._errors.get(name, "")

    def stalled(self, name: str, limit: float) -> float | None:
        """How long the oldest admission to `name` has waited to be written, when admission to it must
        stop (see the module's docstring); None while it may go on."""
        oldest = self.ledger.oldest_unwritten(name)
        if oldest is None:
            return None
        now = self.clock.monotonic()
        waited = now - oldest
        if waited <= limit:
            return None
        if name in self._errors or now - self._landed > limit or waited > max(limit, self.max_unwritten):
            return waited
        return None

    async def run(self) -> None:
        semaphore = asyncio.Semaphore(self.concurrency)
        try:
            while True:
                await self._due.wait()
                self._due.clear()
                if not self.may_write():
                    continue
                for name in self.ledger.due():
                    if name not in self._busy:
                        self._busy.add(name)
                        task = asyncio.create_task(self._write_all(name, semaphore))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def flush(self, names: list[str] | None = None, timeout: float = 3.0) -> bool:
        """Wait until every change made so far to `names` (default: every quota) is written."""
        targets = {name: self.ledger.changes(name) for name in (names or self.ledger.names())}
        deadline = self.clock.monotonic() + timeout
        self._flushes += 1
        self._hurry.set()
        self.poke()
        try:
            while any(self.ledger.written_up_to(name) < change for name, change in targets.items()):
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    return False
                self._progress.clear()
                if not await self.clock.wait(self._progress, left):
                    return False
            return True
        finally:
            self._flushes -= 1
            if not self._flushes:
                self._hurry.clear()

    async def _write_all(self, name: str, semaphore: asyncio.Semaphore) -> None:
        backoff = 0.0
        try:
            while self.may_write() and self.ledger.to_write(name) is not None:
                wait = self._started.get(name, -math.inf) + self.min_interval - self.clock.monotonic()
                if wait > 0 and not self._hurry.is_set():
                    await self.clock.wait(self._hurry, wait)  # admissions meanwhile join this write
                    continue
                await self._budget.take(self._hurry)
                pending = self.ledger.to_write(name)  # with every admission made while it waited
                if pending is None or not self.may_write():
                    break
                quota, change = pending
                self._started[name] = self.clock.monotonic()
                try:
                    async with semaphore:
                        written = await self.api.replace_quota_status(
                            name, quota.resource_version, status_to_object(quota.status)
                        )
                except Conflict:
                    metrics.STATUS_WRITES.labels("conflict").inc()
                    try:
                        await self._read_again(name)
                    except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as error:
                        backoff = await self._failed(name, error, backoff)
                    continue
                except ApiError as error:
                    metrics.STATUS_WRITES.labels("error").inc()
                    if error.status == 404:  # the quota is gone: so are its reservations
                        self.ledger.forget(name)
                        break
                    backoff = await self._failed(name, error, backoff)
                    continue
                except (aiohttp.ClientError, OSError, TimeoutError) as error:
                    metrics.STATUS_WRITES.labels("error").inc()
                    backoff = await self._failed(name, error, backoff)
                    continue
                backoff = 0.0
                self._landed = self.clock.monotonic()
                self._errors.pop(name, None)
                version = str((written.get("metadata") or {}).get("resourceVersion") or "")
                waits = self.ledger.written(name, change, version, self.clock.monotonic())
                metrics.STATUS_WRITES.labels("written").inc()
                if waits:
                    metrics.BATCH_SIZE.observe(len(waits))
                    for waited in waits:
                        metrics.WRITE_BEHIND.observe(waited)
                metrics.WRITE_BACKLOG.set(self.ledger.backlog())
                self._progress.set()
        finally:
            self._busy.discard(name)
            self._progress.set()
            if self.ledger.to_write(name) is not None:
                self.poke()  # changed while the last write was finishing, or cut short

    async def _failed(self, name: str, error: object, backoff: float) -> float:
        self._errors[name] = str(error)
        log.warning("GpuQuota %s: status write failed, retrying: %s", name, error)
        backoff = min(self.max_backoff, backoff * 2 or 0.1)
        await self.clock.wait(asyncio.Event(), backoff)  # an event never set: the backoff in full
        return backoff

    async def _read_again(self, name: str) -> None:
        """After a 409: the quota as it is now. Its spec and resourceVersion go into the ledger (the next
        write carries the ledger's status on them); another object of that name is loaded afresh."""
        raw = await self.api.get_quota(name)
        if name not in self.ledger:  # dropped meanwhile (leadership ended)
            return
        if raw is None:
            self.ledger.forget(name)
            return
        try:
            quota = quota_from_object(raw)
        except QuotaSpecError as error:
            log.warning("GpuQuota %s became invalid (%s): admissions to it are denied", name, error)
            self.ledger.forget(name)
            return
        if not self.ledger.observe(quota):
            self.ledger.load(quota)
            if self.on_reload is not None:
                self.on_reload(name)
