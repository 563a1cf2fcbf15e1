"""This replica's part in admission: the gate (gpuforge.quota.leader.Gate) and the ledger it guards.

The elector (or, without election, the start of the process) says when this replica leads and until
when; the usage controller walks a new term through waiting (the previous leader's admissions become
visible), syncing (reading the cluster afresh into the ledger) and admitting. The ledger belongs to one
term: it is dropped when the term ends, so a replica that led before never admits from what it knew then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuforge.quota.leader import Gate, Role, Takeover, Timing
from gpuforge.quota.ledger import Ledger
from gpuforge.webhook import metrics

log = logging.getLogger(__name__)

# The roles in which this replica holds a ledger (and keeps it in step with the GpuQuota watch).
_HOLDING = (Role.SYNCING, Role.ADMITTING, Role.STOPPING)


@dataclass
class Leadership:
    timing: Timing
    ledger: Ledger = field(default_factory=Ledger)
    gate: Gate = field(default_factory=Gate)
    # Monotonic seconds, the elector's clock (default: the event loop's).
    monotonic: Callable[[], float] | None = None
    # Called when the role or the term changes (not on mere renewals).
    listeners: list[Callable[[], None]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._export()

    def now(self) -> float:
        return self.monotonic() if self.monotonic is not None else asyncio.get_running_loop().time()

    # --- changes ------------------------------------------------------------------------------------

    def took(self, how: Takeover, leading_until: float = math.inf) -> None:
        """This replica leads (`how`) until `leading_until` (loop time), unless renewed."""
        before = self.gate
        self._set(self.gate.took(how, self.now(), leading_until, self.timing))
        if self.gate.term != before.term:
            self.ledger.clear()
            wait = max(0.0, self.gate.admit_from - self.now())
            if wait > 0:
                log.info(
                    "leading (%s): admitting in %.1fs, once the previous leader's admissions are visible",
                    how.value,
                    wait,
                )
            else:
                log.info("leading (%s): admitting once quotas and workloads are read afresh", how.value)

    def start(self) -> None:
        """No election: this process is the only replica."""
        self.took(Takeover.STARTED)

    def lost(self) -> None:
        if self.gate.role is not Role.FOLLOWER:
            log.info("no longer leading: admissions go to the leader")
        self.ledger.clear()
        self._set(self.gate.lost())

    def syncing(self, term: int) -> None:
        self._set(self.gate.syncing(term))

    def synced(self, term: int) -> None:
        self._set(self.gate.synced(term))
        if self.gate.role is Role.ADMITTING and self.gate.term == term:
            log.info("admitting GpuQuota requests (term %d, %d quota(s))", term, len(self.ledger))

    def stopping(self) -> None:
        self._set(self.gate.stopping())

    def _set(self, gate: Gate) -> None:
        if gate == self.gate:
            return
        moved = (gate.role, gate.term) != (self.gate.role, self.gate.term)
        self.gate = gate
        self._changed.set()
        if moved:
            self._export()
            for listener in self.listeners:
                listener()

    def _export(self) -> None:
        for role in Role:
            metrics.ROLE.labels(role.value).set(1.0 if role is self.gate.role else 0.0)

    # --- questions --------------------------------------------------------------------------------

    def refusal(self) -> str | None:
        """None when an admission may be decided here now, else why not."""
        return self.gate.refusal(self.now())

    def may_write(self) -> bool:
        return self.gate.role in _HOLDING and self.gate.leads(self.now())

    def holds_ledger(self) -> bool:
        return self.gate.role in _HOLDING

    def is_follower(self) -> bool:
        return self.gate.role is Role.FOLLOWER

    def current(self, term: int, *roles: Role) -> bool:
        return self.gate.term == term and self.gate.role in roles and self.gate.leads(self.now())

    async def changed(self, timeout: float | None = None) -> None:
        """Wait until the gate changes (or `timeout` seconds pass)."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            # Not wait_for: on Python 3.11 it can swallow a cancellation that comes as the event is set.
            async with asyncio.timeout(timeout):
                await self._changed.wait()
