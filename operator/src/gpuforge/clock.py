"""Time, as the code that waits or times out sees it: a `Clock` (monotonic seconds for intervals and
deadlines, UTC wall time for timestamps, and the sleeps), so that tests can drive time by hand instead
of sleeping; and `wait_for`, the one way to poll until something holds.

`SYSTEM` is the real clock. `ManualClock` is one whose time moves only when told to: its sleepers wake
in deadline order as `advance` passes their deadlines, so a test sees exactly the moments it names.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (intervals, deadlines)."""
        ...

    def now(self) -> datetime:
        """The wall time, in UTC (timestamps written to objects, timers kept in annotations)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for `seconds` of this clock."""
        ...

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        """Wait until `event` is set (True) or `seconds` of this clock have passed (False)."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        if event.is_set():
            return True
        try:
            async with asyncio.timeout(seconds):  # (not wait_for: on 3.11 it can swallow a cancel)
                await event.wait()
        except TimeoutError:
            return False
        return True


SYSTEM: Clock = SystemClock()


class ManualClock:
    """A clock for tests: time moves only by `advance` (or by a thread's `sleep`, which advances it at
    once). Async waits wake when `advance` passes their deadline, or when their event is set."""

    def __init__(self, start: datetime = datetime(2026, 1, 1, tzinfo=UTC), monotonic: float = 1000.0) -> None:
        self._wall0, self._mono0 = start, monotonic
        self._now = monotonic
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def now(self) -> datetime:
        return self._wall0 + timedelta(seconds=self._now - self._mono0)

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move time on by `seconds`, waking every async wait whose deadline that reaches."""
        self._now += max(0.0, seconds)
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, woken = heapq.heappop(self._sleepers)
            if not woken.done():
                woken.set_result(None)

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        if event.is_set():
            return True
        if seconds <= 0:
            return False
        deadline: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # At least one step of the float past now, so a wait for a sliver of a second still moves time.
        wake_at = max(self._now + seconds, math.nextafter(self._now, math.inf))
        heapq.heappush(self._sleepers, (wake_at, next(self._order), deadline))
        setter = asyncio.ensure_future(event.wait())
        waiters: list[asyncio.Future[Any]] = [deadline, setter]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            setter.cancel()
            deadline.cancel()
        return event.is_set()

    def advance_to_next(self) -> float | None:
        """Move time on to the earliest deadline an async wait has (waking it); the seconds that took,
        or None when nothing waits on this clock."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        if not self._sleepers:
            return None
        step = max(0.0, self._sleepers[0][0] - self._now)
        self.advance(step)
        return step

    @property
    def waiting(self) -> int:
        """Async waits not yet woken (for tests that must know a task has gone to sleep)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())


class WaitTimeout(TimeoutError):
    """`wait_for` gave up; the message names what it waited for and what it last saw."""


def wait_for(
    what: str,
    check: Callable[[], T],
    *,
    timeout: float = 120.0,
    interval: float = 0.5,
    describe: Callable[[], object] | None = None,
    clock: Clock = SYSTEM,
) -> T:
    """Call `check` every `interval` seconds until it returns something truthy, and return that. After
    `timeout` seconds raise `WaitTimeout` naming `what`, the last value, and what `describe()` says."""
    deadline = clock.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if clock.monotonic() >= deadline:
            state = f"; {describe()}" if describe is not None else ""
            raise WaitTimeout(
                f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r:.800}){state}"
            )
        clock.sleep(interval)
