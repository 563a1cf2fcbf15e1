from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from gpuforge.api.gpuquota import GpuQuota, GpuQuotaStatus, Reservation
from gpuforge.quota.convert import QuotaSpecError, quota_from_object, quota_to_object
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
