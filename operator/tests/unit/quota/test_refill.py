"""Budgets that start afresh on a schedule (spec.refill): the period a moment falls in, what a pass
accrues across a boundary, and the round trip through the object."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from gpuforge.api.gpuquota import BudgetRefill, GpuQuota, GpuQuotaStatus
from gpuforge.quota.convert import QuotaSpecError, quota_from_object, quota_to_object, status_to_object
from gpuforge.quota.reconcile import (
    PodRun,
    accrue,
    budget_period_start,
    budget_window,
    recompute_status,
    status_differs,
)

GPU = "requests.nvidia.com/gpu"
CASH = f"cash/{GPU}"
D = Decimal
MONDAY = datetime(2026, 11, 23, tzinfo=UTC)  # a Monday, 00:00 UTC
WEEK = BudgetRefill(timedelta(hours=168), anchor=MONDAY)
H = timedelta(hours=1)


@pytest.mark.parametrize(
    ("refill", "last_refill", "now", "start"),
    [
        # Anchored weeks: the Monday at or before now, whatever the last refill says.
        (WEEK, None, MONDAY + 3 * 24 * H, MONDAY),
        (WEEK, MONDAY, MONDAY + 168 * H, MONDAY + 168 * H),  # exactly on a boundary: the new period
        (WEEK, MONDAY, MONDAY + 168 * H - timedelta(microseconds=1), MONDAY),
        (WEEK, MONDAY, MONDAY + 3 * 168 * H + H, MONDAY + 3 * 168 * H),  # three weeks with no leader
        (WEEK, None, MONDAY - 24 * H, MONDAY - 168 * H),  # an anchor in the future counts back
        # Without an anchor the last refill is the origin; the first period starts at the first look.
        (BudgetRefill(24 * H), None, MONDAY + 5 * H, MONDAY + 5 * H),
        (BudgetRefill(24 * H), MONDAY + 5 * H, MONDAY + 28 * H, MONDAY + 5 * H),
        (BudgetRefill(24 * H), MONDAY + 5 * H, MONDAY + 29 * H, MONDAY + 29 * H),
        (BudgetRefill(24 * H), MONDAY + 5 * H, MONDAY + 80 * H, MONDAY + 77 * H),
    ],
)
def test_the_period_a_moment_falls_in(
    refill: BudgetRefill, last_refill: datetime | None, now: datetime, start: datetime
) -> None:
    assert budget_period_start(refill, last_refill, now) == start


def test_a_faster_clock_shortens_the_period() -> None:
    # Tests run the webhook with --speedup 3600: a 24h period lasts 24 s.
    refill = BudgetRefill(24 * H)
    start = MONDAY
    assert budget_period_start(refill, start, start + timedelta(seconds=23)) == start
    assert budget_period_start(refill, start, start + timedelta(seconds=25), 3600) == start + timedelta(
        seconds=24
    )


@pytest.mark.parametrize(
    ("refill", "last_refill", "last_reconcile", "now", "window"),
    [
        # No schedule: accrue since the last reconcile, record nothing.
        (None, None, MONDAY, MONDAY + H, (MONDAY, None, False)),
        # A quota seen first (or given a schedule now): nothing refilled, the period recorded.
        (WEEK, None, MONDAY + 2 * H, MONDAY + 3 * H, (MONDAY + 2 * H, MONDAY, False)),
        # Within the recorded period: carry on.
        (WEEK, MONDAY, MONDAY + 2 * H, MONDAY + 3 * H, (MONDAY + 2 * H, MONDAY, False)),
        # A boundary passed since the last pass: accrue only from the boundary, start afresh.
        (
            WEEK,
            MONDAY,
            MONDAY + 167 * H,
            MONDAY + 169 * H,
            (MONDAY + 168 * H, MONDAY + 168 * H, True),
        ),
        # A leader that restarts after the boundary, its last pass long before: the same answer.
        (
            WEEK,
            MONDAY,
            MONDAY + 100 * H,
            MONDAY + 170 * H,
            (MONDAY + 168 * H, MONDAY + 168 * H, True),
        ),
        # Never reconciled: from now.
        (WEEK, MONDAY, None, MONDAY + H, (MONDAY + H, MONDAY, False)),
    ],
)
def test_budget_window(
    refill: BudgetRefill | None,
    last_refill: datetime | None,
    last_reconcile: datetime | None,
    now: datetime,
    window: tuple[datetime, datetime | None, bool],
) -> None:
    assert budget_window(refill, last_refill, last_reconcile, now) == window


def _spent(quota: GpuQuota, runs: list[PodRun], now: datetime) -> GpuQuotaStatus:
    """One controller pass over `quota`, as UsageController._apply does it."""
    since, start, refilled = budget_window(
        quota.refill, quota.status.last_refill_time, quota.status.last_reconcile_time, now
    )
    accrued = accrue(runs, since, now)
    return recompute_status(quota, [], [], accrued, now, period_start=start, refilled=refilled)


def test_spending_starts_afresh_at_the_boundary_and_does_not_carry_over() -> None:
    quota = GpuQuota(
        "team",
        "",
        {GPU: D(8), CASH: D(100)},
        GpuQuotaStatus(
            self_used={CASH: D(100)}, last_reconcile_time=MONDAY + 167 * H, last_refill_time=MONDAY
        ),
        refill=WEEK,
    )
    before = {c.type: c.status for c in quota.status.conditions}
    assert before == {}
    spent = _spent(
        replace(quota, status=replace(quota.status, self_used={CASH: D(100)})), [], MONDAY + 167 * H
    )
    assert {c.type: c.status for c in spent.conditions}["BudgetExhausted"] == "True"
    # 2 GPUs ran through the boundary: the hour before it belongs to the spent week, the hour after
    # it to the new one.
    runs = [PodRun({GPU: D(2)}, MONDAY)]
    after = _spent(quota, runs, MONDAY + 169 * H)
    assert after.self_used[CASH] == D(2)
    assert after.used[CASH] == D(2)
    assert after.last_refill_time == MONDAY + 168 * H
    assert {c.type: c.status for c in after.conditions}["BudgetExhausted"] == "False"
    # The next pass in the same week carries on from there.
    later = _spent(replace(quota, status=after), runs, MONDAY + 170 * H)
    assert later.self_used[CASH] == D(4)
    assert later.last_refill_time == MONDAY + 168 * H


def test_an_unspent_budget_starts_afresh_too() -> None:
    quota = GpuQuota(
        "team",
        "",
        {CASH: D(100)},
        GpuQuotaStatus(
            self_used={CASH: D(10)}, last_reconcile_time=MONDAY + 160 * H, last_refill_time=MONDAY
        ),
        refill=WEEK,
    )
    assert _spent(quota, [], MONDAY + 170 * H).self_used[CASH] == 0


def test_adding_a_schedule_is_no_refill() -> None:
    quota = GpuQuota(
        "team", "", {CASH: D(10)}, GpuQuotaStatus(self_used={CASH: D(10)}, last_reconcile_time=MONDAY + H)
    )
    status = _spent(replace(quota, refill=WEEK), [], MONDAY + 2 * H)
    assert status.self_used[CASH] == 10
    assert status.last_refill_time == MONDAY
    assert status_differs(quota.status, status)  # the period is worth writing


def test_refill_round_trips_through_the_object() -> None:
    obj = {
        "metadata": {"name": "team"},
        "spec": {
            "hard": {CASH: "100"},
            "refill": {"period": "168h", "anchor": "2026-11-23T00:00:00Z"},
        },
        "status": {"lastRefillTime": "2026-11-23T00:00:00Z"},
    }
    quota = quota_from_object(obj)
    assert quota.refill == WEEK
    assert quota.status.last_refill_time == MONDAY
    again = quota_from_object(quota_to_object(quota))
    assert again.refill == WEEK
    assert status_to_object(quota.status)["lastRefillTime"] == "2026-11-23T00:00:00.000000Z"
    assert quota_from_object({"spec": {"hard": {CASH: "1"}, "refill": {"period": "1h30m"}}}).refill == (
        BudgetRefill(timedelta(minutes=90))
    )


@pytest.mark.parametrize(
    ("refill", "error"),
    [
        ({"period": "a week"}, r"spec\.refill\.period: expected a duration"),
        ({"period": "30m"}, r"spec\.refill\.period: must be at least 1h"),
        ({}, r"spec\.refill\.period: expected a duration"),
        ({"period": "24h", "anchor": "monday"}, r"spec\.refill\.anchor: expected an RFC 3339 time"),
        ("168h", r"spec\.refill: expected an object"),
    ],
)
def test_a_bad_refill_names_its_field(refill: object, error: str) -> None:
    with pytest.raises(QuotaSpecError, match=error):
        quota_from_object({"spec": {"hard": {CASH: "1"}, "refill": refill}})
