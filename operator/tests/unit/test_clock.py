"""The clock tests drive by hand, and the one `wait_for`."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from gpuforge.clock import SYSTEM, ManualClock, WaitTimeout, wait_for


def test_manual_time_moves_only_when_told() -> None:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC), monotonic=50.0)
    assert clock.monotonic() == 50.0 and clock.now() == datetime(2026, 1, 1, tzinfo=UTC)
    clock.advance(2.5)
    assert clock.monotonic() == 52.5 and clock.now() == datetime(2026, 1, 1, tzinfo=UTC) + timedelta(
        seconds=2.5
    )
    clock.sleep(1.0)  # a thread's sleep is time passing
    assert clock.monotonic() == 53.5


async def test_manual_waits_wake_as_time_reaches_their_deadlines() -> None:
    clock, never = ManualClock(), asyncio.Event()
    short = asyncio.create_task(clock.wait(never, 1.0))
    long = asyncio.create_task(clock.wait(never, 3.0))
    await asyncio.sleep(0)
    assert clock.waiting == 2
    clock.advance(0.99)
    await asyncio.sleep(0)
    assert not short.done()
    clock.advance(0.01)
    assert await short is False
    assert not long.done()
    clock.advance(5)
    assert await long is False and clock.waiting == 0


async def test_a_set_event_ends_a_manual_wait_at_once() -> None:
    clock, event = ManualClock(), asyncio.Event()
    waiting = asyncio.create_task(clock.wait(event, 10.0))
    await asyncio.sleep(0)
    event.set()
    assert await waiting is True
    assert await clock.wait(event, 0) is True  # already set: no wait at all


async def test_the_system_clock_waits_for_an_event_or_its_timeout() -> None:
    event = asyncio.Event()
    assert await SYSTEM.wait(event, 0.01) is False
    event.set()
    assert await SYSTEM.wait(event, 10) is True


def test_wait_for_returns_the_first_truthy_value() -> None:
    clock = ManualClock()
    answers = iter([0, None, "", {"ready": True}])
    assert wait_for("the answer", lambda: next(answers), interval=1.0, clock=clock) == {"ready": True}
    assert clock.monotonic() == 1003.0  # three polls waited out


def test_wait_for_names_what_it_waited_for_and_what_it_last_saw() -> None:
    clock = ManualClock()
    with pytest.raises(WaitTimeout, match=r"after 5s waiting for the pods \(last: \[\]\); 2 pending"):
        wait_for("the pods", list, timeout=5, interval=1.0, describe=lambda: "2 pending", clock=clock)
    assert clock.monotonic() == 1005.0
    assert issubclass(WaitTimeout, TimeoutError)
