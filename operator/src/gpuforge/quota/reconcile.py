"""Recompute a GpuQuota's status from what exists, and accrue `cash/` budgets from pod run time. No I/O.

The controller calls `recompute_status` on events and on a periodic full resync. `used` is rebuilt from
scratch (existing workloads, existing children, and reservations of admitted requests not seen yet), so
usage reserved by a request that then failed is released once its reservation expires. Budgets are the
one thing carried forward: `cash/` usage only grows, by the run time of pods since the last reconcile,
until the quota's refill period (spec.refill) ends; the next period starts from what it accrues alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from gpuforge.api.gpuquota import (
    CASH_PREFIX,
    CONDITION_BUDGET_EXHAUSTED,
    CONDITION_OVER_QUOTA,
    CONDITION_RECONCILED,
    KIND,
    BudgetRefill,
    Condition,
    GpuQuota,
    GpuQuotaStatus,
    Reservation,
    ResourceList,
    is_cash_key,
)
from gpuforge.quota.admission import charged_to_parent, spent_budgets
from gpuforge.quota.models import restrict_to_keys
from gpuforge.quota.quantity import format_quantity
from gpuforge.quota.usage import WorkloadUsage, add, restrict

ZERO = Decimal(0)
# Budgets are kept to a millionth of an hour (3.6 ms of one GPU): exact enough, and short in status.
CASH_RESOLUTION = Decimal("0.000001")
# A reservation whose object has not appeared after this long belongs to a request that failed.
DEFAULT_RESERVATION_TTL = timedelta(seconds=60)


@dataclass(frozen=True)
class PodRun:
    """A pod holding resources between `started` and `finished` (None: still running)."""

    usage: ResourceList
    started: datetime | None
    finished: datetime | None = None


def accrue(
    runs: Iterable[PodRun], since: datetime, until: datetime, speedup: float = 1.0
) -> dict[str, Decimal]:
    """`cash/<key>` used in [since, until): each pod's `<key>` times the hours it ran in that window.

    `speedup` scales wall time (a test can make one second count as an hour).
    """
    total: dict[str, Decimal] = {}
    for run in runs:
        if run.started is None:
            continue
        start = max(run.started, since)
        end = min(run.finished or until, until)
        if end <= start:
            continue
        hours = Decimal(str((end - start).total_seconds() * speedup / 3600))
        for key, amount in run.usage.items():
            if not is_cash_key(key):
                total[f"{CASH_PREFIX}{key}"] = total.get(f"{CASH_PREFIX}{key}", ZERO) + amount * hours
    return {key: amount.quantize(CASH_RESOLUTION) for key, amount in total.items()}


def budget_period_start(
    refill: BudgetRefill, last_refill: datetime | None, now: datetime, speedup: float = 1.0
) -> datetime:
    """Start of the budget period `now` falls in: the latest `origin + k * period` not after `now`, the
    origin being the anchor, else the last refill (else `now`: a quota's first period starts when the
    controller first sees it). Pure, so a leader that starts after a boundary finds the same period as
    one that ran through it. `speedup` shortens the period as it speeds up accrual (tests)."""
    length = refill.period / speedup
    origin = refill.anchor or last_refill or now
    periods = (now - origin) // length
    return origin + periods * length


def budget_window(
    refill: BudgetRefill | None,
    last_refill: datetime | None,
    last_reconcile: datetime | None,
    now: datetime,
    speedup: float = 1.0,
) -> tuple[datetime, datetime | None, bool]:
    """(accrue from, the period's start to record, whether spending starts afresh). Spending starts
    afresh when a boundary passed since the recorded refill; it then counts only the run time after
    that boundary. A quota given a refill schedule, or seen first, keeps what it spent until its first
    boundary (adding the schedule is no refill)."""
    since = last_reconcile or now
    if refill is None:
        return since, None, False
    start = budget_period_start(refill, last_refill, now, speedup)
    refilled = last_refill is not None and start > last_refill
    return (max(since, start) if refilled else since), start, refilled


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def pod_run_window(pod: Mapping[str, Any]) -> tuple[datetime | None, datetime | None]:
    """When a pod started to hold its node's resources and when it let go (None: not yet)."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if not spec.get("nodeName"):
        return None, None
    conditions = {c.get("type"): c for c in status.get("conditions") or () if isinstance(c, Mapping)}
    started = (
        _time(status.get("startTime"))
        or _time((conditions.get("PodScheduled") or {}).get("lastTransitionTime"))
        or _time((pod.get("metadata") or {}).get("creationTimestamp"))
    )
    finished = None
    if status.get("phase") in ("Succeeded", "Failed"):
        ends = [
            _time(((item.get("state") or {}).get("terminated") or {}).get("finishedAt"))
            for item in status.get("containerStatuses") or ()
            if isinstance(item, Mapping)
        ]
        known = [end for end in ends if end is not None]
        finished = max(known) if known else _time((conditions.get("Ready") or {}).get("lastTransitionTime"))
        finished = finished or started
    return started, finished


# What a recompute knows of an object by its ref: (metadata.generation, metadata.uid).
Seen = tuple[int, str]


def _settled(reservation: Reservation, live: Mapping[str, Seen], deleted: Mapping[str, Seen]) -> bool:
    """The object the request made exists at the generation it produced (or later): its usage is
    counted. Another object of the same name (deleted, then created again) settles nothing: a live one
    must have one of the reservation's uids, a deleted one the newest (this request's own)."""
    uids = reservation.object_uids
    seen = live.get(reservation.workload)
    if seen is not None:
        generation, uid = seen
        if not uids or not uid or uid in uids:
            return generation >= reservation.generation
    gone = deleted.get(reservation.workload)
    if gone is not None:
        generation, uid = gone
        if not uids or not uid or uid == uids[-1]:
            return generation >= reservation.generation
    return False


def set_condition(
    conditions: Sequence[Condition], type_: str, status: bool, reason: str, message: str, now: datetime
) -> tuple[Condition, ...]:
    """Replace condition `type_`, keeping its transition time when its status did not change."""
    text = "True" if status else "False"
    kept = [c for c in conditions if c.type != type_]
    previous = next((c for c in conditions if c.type == type_), None)
    since = previous.last_transition_time if previous is not None and previous.status == text else now
    return (*kept, Condition(type_, text, reason, message, since))


def recompute_status(
    quota: GpuQuota,
    children: Sequence[GpuQuota],
    workloads: Sequence[WorkloadUsage],
    accrued: ResourceList,
    now: datetime,
    reservation_ttl: timedelta = DEFAULT_RESERVATION_TTL,
    deleted: Mapping[str, Seen] | None = None,
    *,
    period_start: datetime | None = None,
    refilled: bool = False,
) -> GpuQuotaStatus:
    """A fresh status for `quota`: usage of `workloads` (those charged to it), what `children` hold of
    it (each child's hard, or its used where larger: gpuforge.quota.admission.charged_to_parent),
    pending reservations, budgets carried forward plus `accrued`.

    `deleted` maps objects seen deleted (by ref) to their last generation and uid: a reservation for an
    object that was created and deleted before any recompute saw it is settled too. A settled
    reservation is dropped: its usage is counted from its object from now on.

    `period_start` and `refilled` come from `budget_window`: a refilled budget forgets what it spent
    before (`accrued` is then what ran since the period began)."""
    counted = [key for key in quota.hard if not is_cash_key(key)]
    live: dict[str, Seen] = {item.ref: (item.generation, item.uid) for item in workloads}
    for child in children:
        live[f"{KIND}//{child.name}"] = (child.generation, child.uid)
    pending = [
        reservation
        for reservation in quota.status.reservations
        if now - reservation.created < reservation_ttl and not _settled(reservation, live, deleted or {})
    ]
    self_used: dict[str, Decimal] = {key: ZERO for key in counted}
    for item in workloads:
        add(self_used, restrict_to_keys(item.usage, counted))
    used = dict(self_used)
    charged = {child.name: charged_to_parent(child) for child in children}
    for child in children:
        add(used, restrict(charged[child.name], counted))
    for reservation in pending:
        add(used, reservation.delta)
        if not reservation.workload.startswith(f"{KIND}//"):
            add(self_used, reservation.delta)
    accrued = restrict_to_keys(accrued, [key for key in quota.hard if is_cash_key(key)])
    for key in (key for key in quota.hard if is_cash_key(key)):
        carried = ZERO if refilled else quota.status.self_used.get(key, ZERO)
        spent = carried + accrued.get(key, ZERO)
        self_used[key] = spent
        used[key] = spent + sum((charged[child.name].get(key, ZERO) for child in children), ZERO)
    status = replace(
        quota.status,
        hard=dict(quota.hard),
        used=used,
        self_used=self_used,
        reservations=tuple(pending),
        last_reconcile_time=now,
        last_refill_time=period_start,
    )
    return with_conditions(replace(quota, status=status), now).status


def with_conditions(quota: GpuQuota, now: datetime) -> GpuQuota:
    """Set Reconciled, OverQuota and BudgetExhausted from the quota's status."""
    status = quota.status
    conditions = set_condition(status.conditions, CONDITION_RECONCILED, True, "Recomputed", "", now)
    over = sorted(
        key for key, hard in quota.hard.items() if not is_cash_key(key) and status.used.get(key, ZERO) > hard
    )
    conditions = set_condition(
        conditions,
        CONDITION_OVER_QUOTA,
        bool(over),
        "UsedAboveHard" if over else "WithinHard",
        "; ".join(
            f"{key}: {format_quantity(status.used[key])} used of {format_quantity(quota.hard[key])}"
            for key in over
        ),
        now,
    )
    spent = spent_budgets(quota)
    conditions = set_condition(
        conditions,
        CONDITION_BUDGET_EXHAUSTED,
        bool(spent),
        "BudgetSpent" if spent else "BudgetLeft",
        ("new workloads using these are denied: " + ", ".join(spent)) if spent else "",
        now,
    )
    return replace(quota, status=replace(status, conditions=conditions))


def children_of(quotas: Iterable[GpuQuota]) -> dict[str, list[GpuQuota]]:
    result: dict[str, list[GpuQuota]] = {}
    for quota in quotas:
        if quota.parent:
            result.setdefault(quota.parent, []).append(quota)
    return result


def status_differs(old: GpuQuotaStatus, new: GpuQuotaStatus) -> bool:
    """Worth a write? Ignores the reconcile time and unchanged conditions' timestamps."""

    def key(status: GpuQuotaStatus) -> tuple[object, ...]:
        return (
            dict(status.hard),
            {k: v for k, v in status.used.items() if v},
            {k: v for k, v in status.self_used.items() if v},
            status.reservations,
            status.last_refill_time,
            tuple(sorted((c.type, c.status, c.reason, c.message) for c in status.conditions)),
        )

    return key(old) != key(new)


def settled_only(old: GpuQuotaStatus, new: GpuQuotaStatus) -> tuple[Reservation, ...] | None:
    """The reservations a recompute dropped, when dropping them is all it changed (None otherwise).

    A settled reservation's usage is counted from its object from then on, so `used` stays the same and
    the write only shortens the list: the controller may put it off and batch it with later ones."""
    if status_differs(old, replace(new, reservations=old.reservations)):
        return None
    if any(item not in old.reservations for item in new.reservations):
        return None
    return tuple(item for item in old.reservations if item not in new.reservations)
