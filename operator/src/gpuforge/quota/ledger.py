"""The leader's in-memory ledger of GpuQuota usage: admissions are decided here at once, written behind.

One replica at a time admits (the holder of the Lease; see gpuforge.quota.leader). For each quota it holds
the status it knows to be true: `used` counted from the workloads its watch caches hold (the usage
controller's recompute) plus every reservation it admitted whose object is not counted yet. A request is
decided against that status and charged to it before the answer leaves, so two requests decided one after
the other can never both take the last GPU, with no API call in between. A background writer then writes
the status to the API server (one write may carry many admissions), with the quota's resourceVersion as
precondition; `unwritten` says how long the oldest admission has waited for that, so the leader can stop
admitting when it cannot write.

No I/O and no clocks: the shell passes in what it read, the time (`now`, wall clock, for reservations) and
the monotonic moment (`at`, for write-behind ages), and takes out what to write.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal

from gpuforge.api.gpuquota import GpuQuota, GpuQuotaStatus, ResourceList
from gpuforge.quota.admission import Allowed, Decision, Denied, WorkloadAsk, admit_workload


def newer_version(candidate: str, current: str) -> bool:
    """Is resourceVersion `candidate` later than `current`? Opaque to clients, but etcd's are increasing
    integers; an unknown form counts as newer (a stale copy only costs a 409 and a read)."""
    if candidate.isdigit() and current.isdigit():
        return int(candidate) > int(current)
    return candidate != current


def not_found(name: str) -> Denied:
    return Denied(f'GpuQuota "{name}" does not exist', quota=name, reason="NotFound", code=404)


@dataclass(frozen=True)
class _Lowering:
    """A change of hard this leader admitted that the watch does not show yet."""

    hard: ResourceList
    generation: int  # the object's generation once the change is stored
    until: datetime  # given up then: the request failed after it was admitted


@dataclass
class _Entry:
    quota: GpuQuota  # spec and resourceVersion as last seen, but hard as held; the status held true
    shown_hard: ResourceList  # hard as the API server last showed it
    counted: bool = False  # recomputed from the workloads since it was loaded
    changes: int = 0  # status changes made here (admissions and recomputes)
    written: int = 0  # changes the API server has (carried by the last successful write)
    # Admissions not written yet: (change number, monotonic moment), oldest first.
    unwritten: deque[tuple[int, float]] = field(default_factory=deque)
    lowering: _Lowering | None = None

    def hold_hard(self) -> None:
        """Decide against the lower, key by key, of what the API server shows and what is admitted."""
        hard = _lowest(self.shown_hard, self.lowering.hard) if self.lowering is not None else self.shown_hard
        if hard != self.quota.hard:
            self.quota = replace(self.quota, hard=hard)

    def give_up_lowering(self, now: datetime) -> None:
        if self.lowering is not None and now >= self.lowering.until:
            self.lowering = None
            self.hold_hard()


def _lowest(first: ResourceList, second: ResourceList) -> dict[str, Decimal]:
    """Both limits, key by key: the lower where both set one."""
    lowest = dict(first)
    for key, value in second.items():
        lowest[key] = min(value, lowest.get(key, value))
    return lowest


class Ledger:
    """Quotas by name, with the status the leader holds true and what of it is not written yet."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return list(self._entries)

    def quota(self, name: str, now: datetime | None = None) -> GpuQuota | None:
        """The quota as decisions see it; with `now`, a lowering not stored by then is given up first."""
        entry = self._entries.get(name)
        if entry is None:
            return None
        if now is not None:
            entry.give_up_lowering(now)
        return entry.quota

    def quotas(self) -> list[GpuQuota]:
        return [entry.quota for entry in self._entries.values()]

    def counted(self, name: str) -> bool:
        entry = self._entries.get(name)
        return entry is not None and entry.counted

    def clear(self) -> None:
        self._entries.clear()

    # --- what the API server has ------------------------------------------------------------------

    def load(self, quota: GpuQuota) -> None:
        """A quota as read from the API server, status included (a takeover, or a quota new to this
        leader): its reservations are the ones written so far. Not counted until recomputed."""
        self._entries[quota.name] = _Entry(quota, shown_hard=quota.hard)

    def observe(self, quota: GpuQuota) -> bool:
        """A newer copy of the object (a watch event, or a read after a conflict): take its spec and
        resourceVersion, keep the status held here (this leader is its only writer). False when it is
        another object of that name (deleted and created again, or never loaded): load it instead."""
        entry = self._entries.get(quota.name)
        if entry is None or (quota.uid and entry.quota.uid and quota.uid != entry.quota.uid):
            return False
        if newer_version(quota.resource_version, entry.quota.resource_version):
            entry.shown_hard = quota.hard
            if entry.lowering is not None and quota.generation >= entry.lowering.generation:
                entry.lowering = None  # stored (or changed again since)
            entry.quota = replace(
                entry.quota,
                parent=quota.parent,
                namespaces=quota.namespaces,
                namespace_selector=quota.namespace_selector,
                refill=quota.refill,
                generation=quota.generation,
                uid=quota.uid or entry.quota.uid,
                resource_version=quota.resource_version,
            )
            entry.hold_hard()
        return True

    def lower(self, name: str, hard: Mapping[str, Decimal], generation: int, until: datetime) -> None:
        """An admitted change of the quota's hard, not stored yet: until the watch shows the object at
        `generation` (or `until` passes), decisions take the lower of it and the hard shown, key by
        key. A lowered limit then binds from the moment its change is admitted, not from the moment
        the watch brings it; a raised one waits for the watch."""
        entry = self._entries.get(name)
        if entry is None:
            return
        if entry.lowering is not None:
            held = entry.lowering
            merged = _lowest(held.hard, hard)
            entry.lowering = _Lowering(merged, max(generation, held.generation), max(until, held.until))
        else:
            entry.lowering = _Lowering(dict(hard), generation, until)
        entry.hold_hard()

    def expire(self, now: datetime) -> None:
        """Give up the lowerings whose change was not stored in time."""
        for entry in self._entries.values():
            entry.give_up_lowering(now)

    def forget(self, name: str) -> None:
        self._entries.pop(name, None)

    # --- decisions ------------------------------------------------------------------------------

    def decide(self, name: str, ask: WorkloadAsk, now: datetime) -> Decision:
        """What `admit` would answer, recording nothing (dry-run)."""
        entry = self._entries.get(name)
        if entry is None:
            return not_found(name)
        entry.give_up_lowering(now)
        return admit_workload(entry.quota, ask, now)

    def admit(self, name: str, ask: WorkloadAsk, now: datetime, at: float) -> Decision:
        """Decide `ask` against the quota and, if allowed, charge it (a reservation) before answering."""
        entry = self._entries.get(name)
        if entry is None:
            return not_found(name)
        entry.give_up_lowering(now)
        decision = admit_workload(entry.quota, ask, now)
        if isinstance(decision, Allowed) and decision.status is not None:
            self._change(entry, decision.status, at)
        return decision

    def charge(self, name: str, status: GpuQuotaStatus, at: float) -> None:
        """A status decided by the caller from `quota(name)` (a child quota's carve-out): held at once,
        written like an admission."""
        entry = self._entries.get(name)
        if entry is not None:
            self._change(entry, status, at)

    def recomputed(self, name: str, status: GpuQuotaStatus | None) -> None:
        """The controller recomputed the quota from `quota(name)` and the workloads (None: no change)."""
        entry = self._entries.get(name)
        if entry is None:
            return
        entry.counted = True
        if status is not None:
            self._change(entry, status, None)

    @staticmethod
    def _change(entry: _Entry, status: GpuQuotaStatus, at: float | None) -> None:
        entry.quota = replace(entry.quota, status=status)
        entry.changes += 1
        if at is not None:
            entry.unwritten.append((entry.changes, at))

    # --- writing behind -----------------------------------------------------------------------------

    def due(self) -> list[str]:
        """Quotas with changes the API server does not have yet."""
        return [name for name, entry in self._entries.items() if entry.changes > entry.written]

    def to_write(self, name: str) -> tuple[GpuQuota, int] | None:
        """(the quota to write: its status and the resourceVersion to write it on, the change number it
        carries), or None when nothing is due."""
        entry = self._entries.get(name)
        if entry is None or entry.changes <= entry.written:
            return None
        return entry.quota, entry.changes

    def written(self, name: str, change: int, resource_version: str, at: float) -> list[float]:
        """A write carrying changes up to `change` succeeded; returns how long each admission it carried
        waited for it (seconds)."""
        entry = self._entries.get(name)
        if entry is None:
            return []
        entry.written = max(entry.written, change)
        if newer_version(resource_version, entry.quota.resource_version):
            entry.quota = replace(entry.quota, resource_version=resource_version)
        waits = []
        while entry.unwritten and entry.unwritten[0][0] <= change:
            waits.append(at - entry.unwritten.popleft()[1])
        return waits

    def changes(self, name: str) -> int:
        """How many changes were made to `name` (admissions and recomputes) since it was loaded."""
        entry = self._entries.get(name)
        return entry.changes if entry is not None else 0

    def written_up_to(self, name: str) -> int:
        """How many of them the API server has; a quota no longer held counts as written."""
        entry = self._entries.get(name)
        return entry.written if entry is not None else 1 << 62

    def oldest_unwritten(self, name: str) -> float | None:
        """The monotonic moment of the oldest admission to `name` not written yet."""
        entry = self._entries.get(name)
        return entry.unwritten[0][1] if entry is not None and entry.unwritten else None

    def backlog(self) -> int:
        """Admissions not written yet, over all quotas."""
        return sum(len(entry.unwritten) for entry in self._entries.values())
