"""Leader election over a coordination.k8s.io/v1 Lease, as a pure state machine (no I/O).

Only one replica's usage controller may write recomputed usage at a time; `decide` tells a replica,
from the Lease it just read, what to do next: create the Lease, take it over, renew it, or wait.
Expiry is judged by the local clock from when this replica first saw the Lease's current version
(`observed_at`), never by comparing another host's `renewTime` with ours, so clock skew between
hosts cannot make two leaders. A released Lease (empty holder) is free at once.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

LEASE_API_VERSION: Final = "coordination.k8s.io/v1"
_MICRO_TIME: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


class Action(enum.Enum):
    CREATE = "create"  # no Lease yet: create it holding it
    ACQUIRE = "acquire"  # released or expired: take it over (replace with the read resourceVersion)
    RENEW = "renew"  # mine: bump renewTime (replace with the read resourceVersion)
    WAIT = "wait"  # another replica holds it
    LOST = "lost"  # another replica holds it and I thought I did: stop writing at once


@dataclass(frozen=True)
class LeaseRecord:
    """What leader election needs of a Lease."""

    holder: str
    duration_seconds: int
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int
    resource_version: str


@dataclass(frozen=True)
class Decision:
    action: Action
    holder: str  # who holds the Lease once this action succeeds
    # The spec to write for CREATE/ACQUIRE/RENEW (None for WAIT/LOST).
    spec: Mapping[str, Any] | None = None


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    text = str(value).replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def format_micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return moment.astimezone(UTC).strftime(_MICRO_TIME)


def lease_record(obj: Mapping[str, Any] | None) -> LeaseRecord | None:
    """The election state of a Lease object as read from the API (None: no Lease)."""
    if obj is None:
        return None
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=_parse_time(spec.get("acquireTime")),
        renew_time=_parse_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
    )


def _spec(
    me: str, duration: timedelta, acquired: datetime, now: datetime, transitions: int
) -> dict[str, Any]:
    return {
        "holderIdentity": me,
        "leaseDurationSeconds": max(1, round(duration.total_seconds())),
        "acquireTime": format_micro_time(acquired),
        "renewTime": format_micro_time(now),
        "leaseTransitions": transitions,
    }


def decide(
    lease: LeaseRecord | None,
    *,
    me: str,
    now: datetime,
    observed_at: datetime,
    duration: timedelta,
    leading: bool,
) -> Decision:
    """What replica `me` does next with the Lease it read.

    `observed_at` is when this replica first saw the Lease at its current resourceVersion (its own
    clock); the holder's lease runs out `duration` after that (or after the Lease's own
    leaseDurationSeconds, if longer). `leading` is whether this replica believes it leads now.
    """
    if lease is None:
        return Decision(Action.CREATE, me, _spec(me, duration, now, now, 0))
    if lease.holder == me:
        acquired = lease.acquire_time or now
        return Decision(Action.RENEW, me, _spec(me, duration, acquired, now, lease.transitions))
    term = max(duration, timedelta(seconds=lease.duration_seconds))
    if not lease.holder or now >= observed_at + term:
        return Decision(Action.ACQUIRE, me, _spec(me, duration, now, now, lease.transitions + 1))
    return Decision(Action.LOST if leading else Action.WAIT, lease.holder)


def released_spec(lease: LeaseRecord, now: datetime) -> dict[str, Any]:
    """The spec a leader writes on clean shutdown: no holder, so the next replica takes over at once."""
    return {
        "holderIdentity": None,
        "leaseDurationSeconds": max(1, lease.duration_seconds),
        "acquireTime": format_micro_time(lease.acquire_time or now),
        "renewTime": format_micro_time(now),
        "leaseTransitions": lease.transitions,
    }
