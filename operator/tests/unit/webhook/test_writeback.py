"""The write-behind against an in-memory API server: admissions are answered before anything is
written, then written together; a spec edit costs a read and a second write, never the reservations; a
leader that cannot write stops admitting. Time is a ManualClock: intervals, backoffs and the write budget
pass only when a test moves the clock, so every moment asserted is exact."""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

import pytest

from gpuforge.clock import ManualClock
from gpuforge.quota.admission import Allowed, Denied, WorkloadAsk
from gpuforge.quota.convert import quota_from_object
from gpuforge.quota.ledger import Ledger
from gpuforge.webhook.metrics import REGISTRY
from gpuforge.webhook.review import parse_review
from gpuforge.webhook.writeback import WriteBehind, WriteBudget

from .fakes import GPU, MemoryApi, Shell, quota
from .test_leader import create

NOW = datetime(2026, 1, 1, tzinfo=UTC)
T = TypeVar("T")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def settle() -> None:
    """Let every task run until it waits on the clock or on an event (the fakes never block)."""
    for _ in range(100):
        await asyncio.sleep(0)


async def drive(clock: ManualClock, task: Awaitable[T]) -> T:
    """Await `task`, moving the clock from one waiting deadline to the next whenever all else waits."""
    future = asyncio.ensure_future(task)
    while not future.done():
        await settle()
        if not future.done() and clock.advance_to_next() is None:
            await asyncio.sleep(0)
    return await future


@pytest.fixture
async def shell(clock: ManualClock) -> AsyncIterator[Shell]:
    api = MemoryApi([quota("q", hard=4)])
    shell = Shell(api, writer_clock=clock)
    shell.admitting()
    for raw in api.quotas.values():
        shell.leadership.ledger.load(quota_from_object(raw))
        shell.leadership.ledger.recomputed(raw["metadata"]["name"], None)  # counted: nothing runs
    writer = asyncio.create_task(shell.writer.run())
    yield shell
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)


async def admit(shell: Shell, name: str) -> Any:
    return await shell.handlers.workloads(parse_review(json.dumps(create(name)).encode()))


def batches() -> float:
    return REGISTRY.get_sample_value("gpuforge_quota_admission_batch_size_count") or 0.0


async def test_admissions_are_answered_first_and_written_together(shell: Shell) -> None:
    api = shell.api
    before = batches()
    answers = [await admit(shell, f"w{i}") for i in range(5)]  # no await reaches the writer in between
    assert [isinstance(a, Allowed) for a in answers] == [True] * 4 + [False]
    assert api.writes == []  # answered before anything was written
    assert await shell.writer.flush()
    assert api.writes == ["q"] and batches() == before + 1  # four admissions, one write
    stored = quota_from_object(api.quotas["q"])
    held = shell.leadership.ledger.quota("q")
    assert held is not None and stored == held  # what a new leader reads back is what this one held
    assert stored.status.used == {GPU: 4} and len(stored.status.reservations) == 4


async def test_a_spec_edit_is_read_and_the_reservations_written_on_it(shell: Shell) -> None:
    api = shell.api
    await admit(shell, "a")
    api.edit_spec("q", hard=8)  # before the write: it will meet a 409
    assert await shell.writer.flush()
    stored = api.quotas["q"]
    assert stored["spec"]["hard"] == {GPU: "8"} and stored["status"]["used"] == {GPU: "1"}
    assert len(stored["status"]["reservations"]) == 1
    held = shell.leadership.ledger.quota("q")
    assert held is not None and held.hard == {GPU: 8}
    answers = [await admit(shell, f"b{i}") for i in range(8)]
    assert [isinstance(a, Allowed) for a in answers] == [True] * 7 + [False]  # the new hard: 8


async def test_a_deleted_quota_is_dropped(shell: Shell) -> None:
    await admit(shell, "a")
    del shell.api.quotas["q"]
    assert await shell.writer.flush()
    assert "q" not in shell.leadership.ledger


async def test_a_leader_that_cannot_write_stops_admitting_then_goes_on(
    shell: Shell, clock: ManualClock
) -> None:
    api = shell.api
    shell.handlers.stall_seconds = 0.2
    api.unreachable = True
    assert isinstance(await admit(shell, "a"), Allowed)  # from memory, at once
    await settle()  # the write fails; the writer backs off
    clock.advance(0.15)
    assert isinstance(await admit(shell, "b"), Allowed)  # 0.15 s unwritten: not yet too long
    clock.advance(0.1)
    stalled = await admit(shell, "b")
    assert isinstance(stalled, Denied) and stalled.code == 503
    assert 'admissions to GpuQuota "q" of the last' in stalled.message and "try again" in stalled.message
    assert "connection refused" in stalled.message
    api.unreachable = False
    assert await drive(clock, shell.writer.flush())  # once the backoff is over
    assert isinstance(await admit(shell, "b"), Allowed)


async def test_nothing_is_written_once_leadership_ends(shell: Shell) -> None:
    await admit(shell, "a")
    shell.leadership.lost()
    assert await shell.writer.flush(timeout=0.2)  # nothing held, nothing to write
    assert shell.api.writes == []


def test_an_admission_waiting_its_turn_behind_writes_that_land_is_not_a_stall(clock: ManualClock) -> None:
    ledger = Ledger()
    ledger.load(quota_from_object(quota("q")))
    writer = WriteBehind(MemoryApi(), ledger, lambda: True, clock=clock)  # type: ignore[arg-type]
    ask = WorkloadAsk("r", "Deployment/ns/w", {GPU: Decimal(1)}, {GPU: Decimal(1)}, generation=1)
    now = clock.monotonic()
    ledger.admit("q", ask, NOW, at=now - 1.0)
    writer._landed = now  # other quotas' writes land: the API server is there, only busy
    assert writer.stalled("q", 0.5) is None
    writer._errors["q"] = "422: invalid"  # its own writes fail
    assert writer.stalled("q", 0.5) == 1.0
    writer._errors.clear()
    writer._landed = now - 1.0  # nothing lands anywhere: cut off, or requests hang
    assert writer.stalled("q", 0.5) == 1.0
    writer._landed = now
    writer.max_unwritten = 0.8
    assert writer.stalled("q", 0.5) is not None  # waiting that long for its turn is too long anyway


async def test_a_busy_quota_is_written_once_per_interval_with_every_admission_since(
    shell: Shell, clock: ManualClock
) -> None:
    api = shell.api
    shell.writer.min_interval = 0.3
    await admit(shell, "a")
    await settle()
    assert api.writes == ["q"]  # the first at once
    clock.advance(0.1)
    await admit(shell, "b")
    await admit(shell, "c")
    await settle()
    clock.advance(0.19)
    await settle()
    assert api.writes == ["q"]  # the next waits out the interval
    clock.advance(0.01)
    await settle()
    assert api.writes == ["q", "q"] and len(api.quotas["q"]["status"]["reservations"]) == 3
    await admit(shell, "d")
    assert await shell.writer.flush(timeout=0.1)  # a flush does not wait for the interval
    assert len(api.writes) == 3


@pytest.mark.parametrize(
    ("rate", "burst", "takes", "seconds"),
    [
        (0.0, 0.0, 50, 0.0),  # no limit
        (40.0, 4.0, 4, 0.0),  # a quiet webhook writes at once, up to the burst
        (40.0, 4.0, 8, 0.1),  # then one write every 1/rate seconds: 4 more take 0.1 s
        (20.0, 1.0, 3, 0.1),
    ],
)
async def test_the_write_budget_spreads_writes_over_time(
    clock: ManualClock, rate: float, burst: float, takes: int, seconds: float
) -> None:
    budget = WriteBudget(rate, burst, clock=clock)
    started = clock.monotonic()
    for _ in range(takes):
        await drive(clock, budget.take(asyncio.Event()))
    assert clock.monotonic() - started == pytest.approx(seconds)


async def test_a_flush_does_not_wait_for_the_write_budget(clock: ManualClock) -> None:
    budget, hurry = WriteBudget(1.0, 1.0, clock=clock), asyncio.Event()
    await budget.take(hurry)  # the budget is spent for a second
    waiting = asyncio.create_task(budget.take(hurry))
    await settle()
    clock.advance(0.5)
    await settle()
    assert not waiting.done()
    hurry.set()  # a handover or a carve-out flushes
    await settle()
    assert waiting.done() and clock.monotonic() == 1000.5


async def test_many_busy_quotas_share_the_write_budget(shell: Shell, clock: ManualClock) -> None:
    """Twenty quotas with an admission each, a budget of 10 writes a second with a burst of 10: ten are
    written at once, the others one every 0.1 s, each write carrying its admission."""
    for index in range(20):
        name = f"q{index}"
        shell.api.quotas[name] = quota(name, hard=4)
        shell.leadership.ledger.load(quota_from_object(shell.api.quotas[name]))
        shell.leadership.ledger.recomputed(name, None)
    shell.writer._budget = WriteBudget(10.0, 10.0, clock=clock)
    for index in range(20):
        review = create(f"w{index}")
        review["request"]["object"]["metadata"]["labels"]["gpuforge.io/quota"] = f"q{index}"
        assert isinstance(await shell.handlers.workloads(parse_review(json.dumps(review).encode())), Allowed)
    await settle()
    assert len(shell.api.writes) == 10
    started = clock.monotonic()
    written_at = []
    while len(shell.api.writes) < 20:
        assert clock.advance_to_next() is not None
        await settle()
        written_at.extend([clock.monotonic() - started] * (len(shell.api.writes) - 10 - len(written_at)))
    assert written_at == pytest.approx([0.1 * (i + 1) for i in range(10)])
    assert await shell.writer.flush(timeout=0.1)
