from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from gpuforge.api.gpuquota import GpuQuota, GpuQuotaStatus, Reservation
from gpuforge.quota.convert import QuotaSpecError, quota_from_object, quota_to_object, status_to_object
from gpuforge.quota.reconcile import (
    PodRun,
    accrue,
    pod_run_window,
    recompute_status,
    settled_only,
)
from gpuforge.quota.usage import WorkloadUsage

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GPU = "requests.nvidia.com/gpu"
CASH = f"cash/{GPU}"
D = Decimal


def reservation(workload: str, gpus: int, age: int) -> Reservation:
    return Reservation(
        uid=workload,
        workload=workload,
        delta={GPU: D(gpus)},
        expected={GPU: D(gpus)},
        created=T0 - timedelta(seconds=age),
    )


def test_recompute_from_workloads_children_and_pending_reservations() -> None:
    quota = GpuQuota(
        "org",
        "",
        {GPU: D(16), CASH: D(100)},
        GpuQuotaStatus(
            used={GPU: D(99)},
            self_used={CASH: D(5)},
            reservations=(
                reservation("Deployment/ns/seen", 2, 1),  # its object exists: counted once, dropped
                reservation("Deployment/ns/racing", 1, 1),  # not seen yet, young: kept
                reservation("Deployment/ns/failed", 3, 600),  # too old: the request failed
                reservation("GpuQuota//new-child", 4, 1),  # a child being created
            ),
        ),
    )
    child = GpuQuota("team", "org", {GPU: D(6), CASH: D(10)})
    workloads = [WorkloadUsage("Deployment", "ns", "seen", "org", 2, {GPU: D(2)})]
    status = recompute_status(quota, [child], workloads, {CASH: D("0.5")}, T0)
    assert status.self_used[GPU] == 3  # 2 seen + 1 racing
    assert status.used[GPU] == 3 + 6 + 4
    assert [r.workload for r in status.reservations] == ["Deployment/ns/racing", "GpuQuota//new-child"]
    assert status.self_used[CASH] == D("5.5")
    assert status.used[CASH] == D("15.5")
    assert status.last_reconcile_time == T0


def test_spent_budget_sets_condition() -> None:
    quota = GpuQuota("t", "", {CASH: D(1)}, GpuQuotaStatus(self_used={CASH: D("0.9")}))
    status = recompute_status(quota, [], [], {CASH: D("0.2")}, T0)
    conditions = {c.type: c.status for c in status.conditions}
    assert conditions["BudgetExhausted"] == "True"


@pytest.mark.parametrize(
    ("run", "hours"),
    [
        (PodRun({GPU: D(2)}, T0 - timedelta(hours=5)), D(2)),  # ran all window: 2 GPUs x 1 h
        (PodRun({GPU: D(2)}, T0 + timedelta(minutes=30)), D(1)),  # started half-way
        (PodRun({GPU: D(1)}, T0, T0 + timedelta(minutes=15)), D("0.25")),  # finished
        (PodRun({GPU: D(1)}, None), D(0)),  # never scheduled
        (PodRun({GPU: D(1)}, T0 - timedelta(hours=3), T0 - timedelta(hours=2)), D(0)),
    ],
)
def test_accrue(run: PodRun, hours: Decimal) -> None:
    assert accrue([run], T0, T0 + timedelta(hours=1)).get(CASH, D(0)) == hours


def test_accrue_with_a_faster_clock() -> None:
    run = PodRun({GPU: D(1)}, T0)
    assert accrue([run], T0, T0 + timedelta(seconds=1), speedup=3600)[CASH] == 1


def test_pod_run_window() -> None:
    pod = {
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Succeeded",
            "startTime": "2026-01-01T00:00:00Z",
            "containerStatuses": [{"state": {"terminated": {"finishedAt": "2026-01-01T01:00:00Z"}}}],
        },
    }
    assert pod_run_window(pod) == (T0, T0 + timedelta(hours=1))
    assert pod_run_window({"spec": {}, "status": {}}) == (None, None)


def test_convert_round_trip_and_errors() -> None:
    obj = {
        "metadata": {"name": "org", "resourceVersion": "7"},
        "spec": {"parent": "", "hard": {GPU: "16", "requests.cpu": "500m"}},
        "status": {"used": {GPU: "3"}},
    }
    quota = quota_from_object(obj)
    assert quota.hard == {GPU: 16, "requests.cpu": D("0.5")}
    assert quota_from_object(quota_to_object(quota)).hard == quota.hard
    with pytest.raises(QuotaSpecError, match=r"spec\.hard\.requests\.cpu"):
        quota_from_object({"spec": {"hard": {"requests.cpu": "much"}}})
    with pytest.raises(QuotaSpecError, match="must not be negative"):
        quota_from_object({"spec": {"hard": {GPU: "-1"}}})


def test_settling_alone_is_told_apart_from_a_change_of_usage() -> None:
    """The controller may put off a write that only drops settled reservations (used stays the same),
    never one that releases usage (an expired reservation) or changes what is counted."""
    seen, racing = reservation("Deployment/ns/seen", 2, 1), reservation("Deployment/ns/racing", 1, 1)
    status = GpuQuotaStatus(
        hard={GPU: D(16)}, used={GPU: D(3)}, self_used={GPU: D(3)}, reservations=(seen, racing)
    )
    quota = GpuQuota("org", "", {GPU: D(16)}, status)
    quota = replace(quota, status=recompute_status(quota, [], [], {}, T0))  # neither object seen yet
    assert quota.status.used == {GPU: D(3)}
    workloads = [WorkloadUsage("Deployment", "ns", "seen", "org", 2, {GPU: D(2)})]
    settled = recompute_status(quota, [], workloads, {}, T0)
    assert settled_only(quota.status, settled) == (seen,)
    expired = recompute_status(quota, [], workloads, {}, T0 + timedelta(minutes=5))
    assert settled_only(quota.status, expired) is None  # racing's GPU is released: write now
    grown = [WorkloadUsage("Deployment", "ns", "seen", "org", 3, {GPU: D(3)})]
    assert settled_only(quota.status, recompute_status(quota, [], grown, {}, T0)) is None


REF = "Deployment/ns/same"
Obj = tuple[int, str] | None


@pytest.mark.parametrize(
    ("uids", "live", "deleted", "counted"),
    [
        # The recreated object (uid new) is not seen yet; the old one (uid old) was seen deleted:
        # the old deletion must not settle the new reservation.
        (("new",), None, (1, "old"), True),
        (("old", "new"), None, (1, "old"), True),  # nor when it replaced the old one's reservation
        (("new",), (1, "old"), None, True),  # a lagging cache still shows the old object
        (("new",), (1, "new"), None, False),  # the new object is seen: its usage counts instead
        (("new",), None, (1, "new"), False),  # the new object itself came and went
        (("new",), (1, "old"), (1, "new"), False),  # ... after the old one (both events seen)
        # A retried create: its first attempt persisted (uid first), the retry's (uid retry) did not.
        (("first", "retry"), (1, "first"), None, False),
        (("new",), (0, "new"), None, True),  # seen, but not yet at the generation the request made
        ((), None, (1, "old"), False),  # a reservation without uids (older webhook): the name decides
        (("new",), (1, ""), None, False),  # an object without uid: the name decides
    ],
)
def test_a_reservation_settles_only_against_its_own_object(
    uids: tuple[str, ...], live: Obj, deleted: Obj, counted: bool
) -> None:
    pending = replace(reservation(REF, 3, 1), generation=1, object_uids=uids)
    quota = GpuQuota("org", "", {GPU: D(8)}, GpuQuotaStatus(reservations=(pending,)))
    workloads = []
    if live is not None:
        workloads.append(
            WorkloadUsage("Deployment", "ns", "same", "org", 1, {GPU: D(2)}, generation=live[0], uid=live[1])
        )
    status = recompute_status(quota, [], workloads, {}, T0, deleted={REF: deleted} if deleted else None)
    live_gpus = 2 if live is not None else 0
    assert status.used[GPU] == live_gpus + (3 if counted else 0)
    assert (pending in status.reservations) == counted


def test_object_uids_round_trip_through_status() -> None:
    item = replace(reservation(REF, 1, 1), object_uids=("a", "b"))
    raw = status_to_object(GpuQuotaStatus(reservations=(item,)))
    assert raw["reservations"][0]["objectUids"] == ["a", "b"]
    parsed = quota_from_object({"metadata": {"name": "q"}, "spec": {"hard": {}}, "status": raw})
    assert parsed.status.reservations == (item,)
    bare = status_to_object(GpuQuotaStatus(reservations=(reservation(REF, 1, 1),)))
    assert "objectUids" not in bare["reservations"][0]
