"""Leader election over a coordination.k8s.io/v1 Lease, and when a new leader may admit: pure state
machines (no I/O).

One replica at a time leads: it decides admissions from its in-memory ledger (gpuforge.quota.ledger) and
writes usage. `decide` tells a replica, from the Lease it just read, what to do next: create the Lease,
take it over, renew it, or wait. Expiry is judged by how long this replica has seen the Lease at its
current version on its own monotonic clock (`waited`), never by comparing another host's `renewTime` with
ours, so clock skew between hosts cannot make two leaders. A released Lease (empty holder) is free at once.

A leader stops admitting at its renew deadline (shorter than the Lease duration), so it stops before
anyone may take over. A new leader must still not admit before every admission the old one answered is
visible to it, as a reservation written to a quota's status or as the object itself: `admission_gap` says
how long it waits, by how it got the Lease, and `Gate` tracks a replica through waiting, reading the
cluster afresh and admitting. docs/quota.md ("Concurrency") gives the argument and its timing assumptions.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

LEASE_API_VERSION: Final = "coordination.k8s.io/v1"
# Where the holder serves (https://<pod IP>:<port>): followers forward admission requests there.
LEADER_ENDPOINT_ANNOTATION: Final = "gpuforge.io/leader-endpoint"
# Set by a holder that has made itself the only endpoint of the webhook's address (`takes_calls`).
LEADER_ROUTED_ANNOTATION: Final = "gpuforge.io/leader-routed"
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
    endpoint: str = ""  # the holder's LEADER_ENDPOINT_ANNOTATION
    routed: bool = False  # the holder's LEADER_ROUTED_ANNOTATION: it takes the API server's calls itself


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
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=_parse_time(spec.get("acquireTime")),
        renew_time=_parse_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
        endpoint=str(annotations.get(LEADER_ENDPOINT_ANNOTATION) or ""),
        routed=annotations.get(LEADER_ROUTED_ANNOTATION) == "true",
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
    waited: timedelta,
    duration: timedelta,
    leading: bool,
) -> Decision:
    """What replica `me` does next with the Lease it read.

    `waited` is how long this replica has seen the Lease at its current resourceVersion (its own
    monotonic clock); the holder's term runs out once that reaches `duration` (or the Lease's own
    leaseDurationSeconds, if longer). `leading` is whether this replica believes it leads now. `now`
    (wall clock) only goes into the times written for people to read.
    """
    if lease is None:
        return Decision(Action.CREATE, me, _spec(me, duration, now, now, 0))
    if lease.holder == me:
        acquired = lease.acquire_time or now
        return Decision(Action.RENEW, me, _spec(me, duration, acquired, now, lease.transitions))
    term = max(duration, timedelta(seconds=lease.duration_seconds))
    if not lease.holder or waited >= term:
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


# --- When a leader may admit ------------------------------------------------------------------------


class Takeover(enum.Enum):
    """How a replica came to lead (or go on leading)."""

    CONTINUED = "continued"  # renewed while leading
    RESUMED = "resumed"  # renewed its own Lease after its renew deadline had passed (it stopped meanwhile)
    RELEASED = "released"  # took a Lease the previous holder released (after writing every admission)
    EXPIRED = "expired"  # took a Lease its holder stopped renewing (maybe dead, with admissions unwritten)
    CREATED = "created"  # no Lease existed
    STARTED = "started"  # no election (one replica only): this process started


def takeover(action: Action, lease: LeaseRecord | None, leading: bool) -> Takeover | None:
    """How a successful write of `action` on `lease` (as read) made this replica lead; None for WAIT/LOST."""
    if action is Action.RENEW:
        return Takeover.CONTINUED if leading else Takeover.RESUMED
    if action is Action.CREATE:
        return Takeover.CREATED
    if action is Action.ACQUIRE:
        return Takeover.RELEASED if lease is not None and not lease.holder else Takeover.EXPIRED
    return None


@dataclass(frozen=True)
class Timing:
    """What the wait before admitting is made of (see `admission_gap`)."""

    lease_duration: timedelta  # the replicas' Lease duration (all replicas run with the same settings)
    webhook_timeout: timedelta  # timeoutSeconds of the webhook configurations calling the replicas
    persist: timedelta  # how long the API server may take to store an object after admitting it


def admission_gap(how: Takeover, timing: Timing) -> timedelta:
    """How long a replica that just came to lead waits before it reads the cluster and admits.

    Every admission a previous leader answered must be visible by then, as a reservation it wrote or as
    the object itself. A previous leader answers nothing after its admission cutoff (its renew deadline,
    shorter than the Lease duration), and an answer it sent before reaches the API server within the
    webhook timeout of the request (later, the API server has given up on it), which stores the object
    within `persist`. So objects it admitted but did not write down exist `webhook_timeout + persist`
    after its cutoff:
    - RELEASED: it wrote every admission before releasing the Lease: nothing to wait for.
    - EXPIRED: the Lease expired, so its cutoff has passed: wait `webhook_timeout + persist`.
    - RESUMED: the same for this replica's own cutoff (its ledger was dropped when it passed).
    - CREATED: a leader whose Lease was deleted may admit until its cutoff, up to one Lease duration
      after we saw no Lease: wait that much longer.
    - STARTED: a previous process (no election: one replica) stopped at the latest when this one started.
    """
    settle = timing.webhook_timeout + timing.persist
    if how in (Takeover.CONTINUED, Takeover.RELEASED):
        return timedelta(0)
    if how is Takeover.CREATED:
        return timing.lease_duration + settle
    return settle


class Role(enum.Enum):
    FOLLOWER = "follower"  # forwards admission requests to the leader
    WAITING = "waiting"  # leads; waits out the previous leader's admissions (admission_gap)
    SYNCING = "syncing"  # leads; reads quotas and workloads afresh and builds its ledger
    ADMITTING = "admitting"  # leads and decides admissions
    STOPPING = "stopping"  # shutting down: admits nothing more, writes what it holds, releases the Lease


@dataclass(frozen=True)
class Gate:
    """Whether this replica may decide admissions now. Times are monotonic seconds.

    A `term` is one uninterrupted leadership: the ledger built in a term is dropped when it ends (lost
    Lease, or renew deadline passed), and the next term builds its own after its gap."""

    role: Role = Role.FOLLOWER
    term: int = 0
    admit_from: float = 0.0
    leading_until: float = 0.0  # the renew deadline: no admission and no write after it

    def took(self, how: Takeover, now: float, leading_until: float, timing: Timing) -> Gate:
        if how is Takeover.CONTINUED:
            if self.role is not Role.FOLLOWER:
                return replace(self, leading_until=leading_until)
            how = Takeover.RESUMED  # its term had ended: start a new one, safely
        gap = admission_gap(how, timing).total_seconds()
        return Gate(Role.WAITING, self.term + 1, now + gap, leading_until)

    def syncing(self, term: int) -> Gate:
        return replace(self, role=Role.SYNCING) if self._is(term, Role.WAITING) else self

    def synced(self, term: int) -> Gate:
        return replace(self, role=Role.ADMITTING) if self._is(term, Role.SYNCING) else self

    def lost(self) -> Gate:
        return replace(self, role=Role.FOLLOWER)

    def stopping(self) -> Gate:
        return replace(self, role=Role.STOPPING) if self.role is not Role.FOLLOWER else self

    def _is(self, term: int, role: Role) -> bool:
        return self.term == term and self.role is role

    def leads(self, now: float) -> bool:
        """Holds the Lease within its renew deadline: may write (its ledger's status)."""
        return self.role is not Role.FOLLOWER and now < self.leading_until

    def refusal(self, now: float) -> str | None:
        """None when an admission may be decided now, else why not (the client should try again)."""
        if self.role is Role.ADMITTING and now < self.leading_until:
            return None
        if self.role is Role.FOLLOWER:
            return "this replica is not the GpuQuota leader"
        if now >= self.leading_until:
            return "the GpuQuota leader could not renew its Lease in time and stopped admitting"
        if self.role is Role.WAITING:
            return (
                "a new GpuQuota leader took over and admits in "
                f"{max(0.0, self.admit_from - now):.1f}s, once the previous leader's admissions are visible"
            )
        if self.role is Role.SYNCING:
            return "a new GpuQuota leader is reading quotas and workloads"
        return "the GpuQuota leader is shutting down and handing over"


def takes_calls(role: Role, other_holder: str, holder_routed: bool) -> bool:
    """Whether this replica should be an endpoint of the webhook's address, when calls are routed to
    the leader: the leader always is; a follower only while no other holder says it takes the calls
    itself (no leader yet, the Lease released, or a leader that does not route, such as an older
    version during an upgrade). Followers still forward what reaches them, so this only spares the
    API server's calls a hop; it never decides who admits."""
    if role is not Role.FOLLOWER:
        return True
    return not (other_holder and holder_routed)
