"""Never over-admitted, whatever interleaves: a property test of the pure leader pieces working together.

A small world plays the API server (a Lease, one GpuQuota stored as JSON and pruned by its CRD schema,
the workloads that exist, creates admitted but not stored yet) and webhook replicas, each made of what
the shell is made of: the Lease decision (`decide`, `takeover`), the admission gate (`Gate`), the ledger
(`Ledger`) and the controller's recompute. Hypothesis interleaves requests sent to any replica (followers
forward to the holder they last read), objects stored, failed or deleted, watch events, recomputes,
status writes (with resourceVersion preconditions), Lease rounds, crashes, restarts, graceful
handovers, network cuts between a replica and the API server, spec edits, a deleted Lease, and time.

The timing assumptions of the design are kept, and only those (docs/quota.md, "Concurrency"): an
admitted create is stored within `webhook_timeout + persist` of the decision, or never; a watch delivers
a change well within the reservation TTL (here within WATCH_LAG). After every step, the workloads that
exist plus the creates admitted and still to be stored never exceed the quota.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpuforge.api.gpuquota import GpuQuota, GpuQuotaStatus
from gpuforge.quota.admission import Allowed, WorkloadAsk
from gpuforge.quota.convert import quota_from_object, quota_to_object, status_to_object
from gpuforge.quota.leader import (
    Action,
    Gate,
    LeaseRecord,
    Role,
    Takeover,
    Timing,
    decide,
    takeover,
)
from gpuforge.quota.ledger import Ledger
from gpuforge.quota.reconcile import recompute_status, settled_only, status_differs
from gpuforge.quota.usage import WorkloadUsage

from .test_crd_schema import prune, status_schema

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GPU = "requests.nvidia.com/gpu"
Q = "q"
HARD = 3
# Short times, so that takeovers happen within a few dozen steps; the proportions are the real ones.
LEASE = 3  # seconds
RENEW_DEADLINE = 2.0
STALL = 0.5
TIMING = Timing(
    lease_duration=timedelta(seconds=LEASE),
    webhook_timeout=timedelta(seconds=1),
    persist=timedelta(seconds=1),
)
SETTLE = (TIMING.webhook_timeout + TIMING.persist).total_seconds()
TTL = timedelta(seconds=30)
WATCH_LAG = 5.0


def stored(quota: GpuQuota) -> dict[str, Any]:
    raw = quota_to_object(quota)
    raw["metadata"]["uid"] = "quota-uid"
    raw["status"] = prune(raw["status"], status_schema())
    return raw


@dataclass
class Replica:
    identity: str
    view: dict[str, tuple[str, int]]  # its watch cache: workload name -> (uid, GPUs)
    gate: Gate = field(default_factory=Gate)
    ledger: Ledger = field(default_factory=Ledger)
    alive: bool = True
    cut_off: bool = False  # cannot reach the API server (the API server still reaches it)
    leading: bool = False  # what its elector believes
    seen: tuple[str, float] = ("", 0.0)  # the Lease version it last saw, and since when
    holder: str = ""  # the holder it last read: where it forwards
    deleted: dict[str, tuple[int, str]] = field(default_factory=dict)  # refs it saw deleted
    next_round: float = 0.0  # when its elector reads the Lease next
    cursor: int = 0  # how much of the world's change log its watch has delivered


class World(RuleBasedStateMachine):
    elected = True

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        # {holder, version}: released by a leader that handed over cleanly (lease_deleted: none at all)
        self.lease: dict[str, Any] | None = {"holder": "", "version": 0}
        self.lease_versions = itertools.count(1)
        self.quota_raw = stored(
            GpuQuota(Q, "", {GPU: Decimal(HARD)}, GpuQuotaStatus(), resource_version="1", generation=1)
        )
        self.objects: dict[str, tuple[str, int]] = {}  # name -> (uid, GPUs), all at generation 1
        self.in_flight: dict[str, tuple[str, int, float]] = {}  # admitted: name -> (uid, GPUs, store by)
        # Changes to workloads, in order: (when, name, (uid, GPUs) or None for a deletion).
        self.log: list[tuple[float, str, tuple[str, int] | None]] = []
        self.names = itertools.count()
        self.identities = itertools.count()
        self.replicas: list[Replica] = []

    # --- helpers ----------------------------------------------------------------------------------

    def wall(self) -> datetime:
        return T0 + timedelta(seconds=self.now)

    def spawn(self) -> Replica:
        replica = Replica(f"r{next(self.identities)}", dict(self.objects), cursor=len(self.log))
        if not self.elected:
            replica.gate = replica.gate.took(Takeover.STARTED, self.now, math.inf, TIMING)
        return replica

    def pick(self, index: int) -> Replica:
        return self.replicas[index % len(self.replicas)]

    def record(self) -> LeaseRecord | None:
        if self.lease is None:
            return None
        version = str(self.lease["version"])
        return LeaseRecord(self.lease["holder"], LEASE, None, None, 0, version)

    def lose(self, replica: Replica) -> None:
        replica.leading = False
        replica.gate = replica.gate.lost()
        replica.ledger.clear()

    def recompute(self, replica: Replica, defer: bool) -> None:
        quota = replica.ledger.quota(Q)
        if quota is None:
            return
        usages = [
            WorkloadUsage("Deployment", "ns", name, Q, 1, {GPU: Decimal(gpus)}, 1, uid)
            for name, (uid, gpus) in replica.view.items()
        ]
        status = recompute_status(quota, [], usages, {}, self.wall(), TTL, replica.deleted)
        if not status_differs(quota.status, status) or (defer and settled_only(quota.status, status)):
            replica.ledger.recomputed(Q, None)
        else:
            replica.ledger.recomputed(Q, status)

    def write(self, replica: Replica) -> None:
        """One write-behind attempt: a compare-and-swap on the quota's resourceVersion."""
        pending = replica.ledger.to_write(Q)
        if pending is None:
            return
        quota, change = pending
        if quota.resource_version != self.quota_raw["metadata"]["resourceVersion"]:
            current = quota_from_object(self.quota_raw)  # 409: read again, keep the status held
            if not replica.ledger.observe(replace(current, status=GpuQuotaStatus())):
                replica.ledger.load(current)
            return
        version = str(int(self.quota_raw["metadata"]["resourceVersion"]) + 1)
        self.quota_raw = {
            **self.quota_raw,
            "metadata": {**self.quota_raw["metadata"], "resourceVersion": version},
            "status": prune(status_to_object(quota.status), status_schema()),
        }
        replica.ledger.written(Q, change, version, self.now)

    def deciding(self, replica: Replica) -> Replica | None:
        """Who decides a request the API server sent to `replica` (a follower forwards)."""
        if not self.elected or replica.gate.role is not Role.FOLLOWER:
            return replica
        target = next((r for r in self.replicas if r.identity == replica.holder and r.alive), None)
        return target if target is not None and target is not replica else None

    # --- rules ------------------------------------------------------------------------------------

    @initialize(count=st.integers(1, 3))
    def start(self, count: int) -> None:
        self.replicas = [self.spawn() for _ in range(count if self.elected else 1)]

    @rule(ticks=st.integers(1, 30), writing=st.booleans())
    def time_passes(self, ticks: int, writing: bool) -> None:
        """Tenths of a second pass; meanwhile each replica's elector and controller loops run, as
        they do in the shell: a leader renews every second, a follower reads the Lease every 0.6 s,
        a term goes on as soon as it may, and (if `writing`) the write-behind writes every tick."""
        for _ in range(ticks):
            self.now = round(self.now + 0.1, 6)
            for name, (_, _, store_by) in list(self.in_flight.items()):
                if store_by <= self.now:  # the assumption: stored by then, or never
                    self._store(name)
            for replica in self.replicas:
                self.deliver(replica, until=self.now - WATCH_LAG)
                if replica.alive and self.elected and self.now >= replica.next_round:
                    self.lease_round(replica)
                    replica.next_round = self.now + (1.0 if replica.leading else 0.6)
                if replica.alive:
                    self.term_progress(replica)
                if writing:
                    self.write_behind(self.replicas.index(replica))

    @rule(indexes=st.lists(st.integers(0, 2), min_size=1, max_size=4), gpus=st.sampled_from([1, 1, 1, 2]))
    def requests(self, indexes: list[int], gpus: int) -> None:
        """Creates racing: each sent by the API server to a replica (as the Service picks one)."""
        for index in indexes:
            self.request(index, gpus)

    def request(self, index: int, gpus: int) -> None:
        sent_to = self.pick(index)
        if not sent_to.alive:
            return  # the API server cannot call it: failurePolicy Fail denies
        replica = self.deciding(sent_to)
        if replica is None or not replica.alive:
            return  # no leader reachable: denied, try again
        if replica.gate.refusal(self.now) is not None or Q not in replica.ledger:
            return
        oldest = replica.ledger.oldest_unwritten(Q)
        waited = self.now - oldest if oldest is not None else 0.0
        if waited > STALL and (replica.cut_off or waited > 5 * STALL):
            return  # the leader cannot write (or is far behind): it stops admitting
        name, uid = f"w{next(self.names)}", f"uid-{next(self.names)}"
        delta = {GPU: Decimal(gpus)}
        ask = WorkloadAsk(f"req-{name}", f"Deployment/ns/{name}", delta, delta, generation=1, object_uid=uid)
        decision = replica.ledger.admit(Q, ask, self.wall(), self.now)
        if isinstance(decision, Allowed) and decision.status is not None:
            self.in_flight[name] = (uid, gpus, self.now + SETTLE)

    def _store(self, name: str) -> None:
        uid, gpus, _ = self.in_flight.pop(name)
        self.objects[name] = (uid, gpus)
        self.log.append((self.now, name, (uid, gpus)))

    @precondition(lambda self: self.in_flight)
    @rule(choice=st.integers(0, 100))
    def store_one(self, choice: int) -> None:
        self._store(sorted(self.in_flight)[choice % len(self.in_flight)])

    @precondition(lambda self: self.in_flight)
    @rule(choice=st.integers(0, 100))
    def create_fails_after_admission(self, choice: int) -> None:
        self.in_flight.pop(sorted(self.in_flight)[choice % len(self.in_flight)])

    @precondition(lambda self: self.objects)
    @rule(choice=st.integers(0, 100))
    def delete_workload(self, choice: int) -> None:
        name = sorted(self.objects)[choice % len(self.objects)]
        self.objects.pop(name)
        self.log.append((self.now, name, None))

    def deliver(self, replica: Replica, until: float = math.inf, count: int | None = None) -> None:
        """The watch delivers changes in order: those made by `until`, or the next `count`."""
        while replica.cursor < len(self.log) and (count is None or count > 0):
            when, name, item = self.log[replica.cursor]
            if count is None and when > until:
                return
            replica.cursor += 1
            count = None if count is None else count - 1
            if item is not None:
                replica.view[name] = item
            elif name in replica.view:
                uid, _ = replica.view.pop(name)
                replica.deleted[f"Deployment/ns/{name}"] = (1, uid)

    @rule(index=st.integers(0, 2), count=st.integers(1, 3), everything=st.booleans())
    def watch_event(self, index: int, count: int, everything: bool) -> None:
        self.deliver(self.pick(index), count=None if everything else count)

    @rule(index=st.integers(0, 2), defer=st.booleans())
    def controller_pass(self, index: int, defer: bool) -> None:
        replica = self.pick(index)
        if replica.alive and replica.gate.role in (Role.ADMITTING, Role.STOPPING):
            self.recompute(replica, defer)

    @rule(index=st.integers(0, 2))
    def write_behind(self, index: int) -> None:
        replica = self.pick(index)
        holds = replica.gate.role in (Role.SYNCING, Role.ADMITTING, Role.STOPPING)
        if replica.alive and not replica.cut_off and holds and replica.gate.leads(self.now):
            self.write(replica)

    def term_progress(self, replica: Replica) -> None:
        """The controller walks a term on: after the gap, list everything afresh and build the ledger."""
        if not replica.gate.leads(self.now):
            return
        term = replica.gate.term
        if replica.gate.role is Role.WAITING and self.now >= replica.gate.admit_from:
            replica.gate = replica.gate.syncing(term)
        elif replica.gate.role is Role.SYNCING and not replica.cut_off:
            replica.view, replica.deleted, replica.cursor = dict(self.objects), {}, len(self.log)
            replica.ledger.clear()
            replica.ledger.load(quota_from_object(self.quota_raw))
            self.recompute(replica, defer=False)
            replica.gate = replica.gate.synced(term)

    def lease_round(self, replica: Replica) -> None:
        if replica.cut_off:  # its read of the Lease hangs (until the request times out): no news
            return
        if replica.leading and not replica.gate.leads(self.now):  # its renew deadline passed
            self.lose(replica)
        record = self.record()
        version = record.resource_version if record is not None else ""
        if version != replica.seen[0]:
            replica.seen = (version, self.now)
        leading = replica.leading and replica.gate.leads(self.now)
        waited = timedelta(seconds=self.now - replica.seen[1])
        decision = decide(
            record,
            me=replica.identity,
            now=self.wall(),
            waited=waited,
            duration=timedelta(seconds=LEASE),
            leading=leading,
        )
        if decision.action in (Action.WAIT, Action.LOST):
            replica.holder = decision.holder
            if replica.leading:
                self.lose(replica)
            return
        self.lease = {"holder": replica.identity, "version": next(self.lease_versions)}
        replica.seen = (str(self.lease["version"]), self.now)
        replica.holder = replica.identity
        how = takeover(decision.action, record, leading)
        assert how is not None
        replica.leading = True
        before = replica.gate.term
        replica.gate = replica.gate.took(how, self.now, self.now + RENEW_DEADLINE, TIMING)
        if replica.gate.term != before:
            replica.ledger.clear()

    @rule(index=st.integers(0, 2))
    def crash(self, index: int) -> None:
        self.pick(index).alive = False

    @rule(index=st.integers(0, 2))
    def restart(self, index: int) -> None:
        position = index % len(self.replicas)
        if not self.replicas[position].alive:
            self.replicas[position] = self.spawn()

    @rule(index=st.integers(0, 2))
    def graceful_stop(self, index: int) -> None:
        """SIGTERM: stop admitting, write everything, release the Lease only if all of it was written
        and the term's wait was over; then exit."""
        replica = self.pick(index)
        if not replica.alive:
            return
        if replica.gate.role is not Role.FOLLOWER:
            waited_out = self.now >= replica.gate.admit_from
            replica.gate = replica.gate.stopping()
            for _ in range(3):
                if not replica.cut_off and replica.gate.leads(self.now):
                    self.write(replica)
            written = not replica.ledger.due()
            ours = self.lease is not None and self.lease["holder"] == replica.identity
            if self.elected and written and waited_out and ours and replica.gate.leads(self.now):
                self.lease = {"holder": "", "version": next(self.lease_versions)}
        replica.alive = False

    @rule(index=st.integers(0, 2))
    def network_cut(self, index: int) -> None:
        replica = self.pick(index)
        replica.cut_off = not replica.cut_off

    @rule()
    def spec_edit(self) -> None:
        """Someone edits the quota (a label, say): its resourceVersion moves, the spec stays."""
        metadata = self.quota_raw["metadata"]
        self.quota_raw = {
            **self.quota_raw,
            "metadata": {**metadata, "resourceVersion": str(int(metadata["resourceVersion"]) + 1)},
        }

    @precondition(lambda self: self.elected)
    @rule()
    def lease_deleted(self) -> None:
        self.lease = None

    @invariant()
    def never_over_admitted(self) -> None:
        admitted = sum(gpus for _, gpus in self.objects.values())
        admitted += sum(gpus for _, gpus, _ in self.in_flight.values())
        assert admitted <= HARD, f"{admitted} GPUs admitted against a quota of {HARD}"


class SingleReplica(World):
    """No election: one process, crashed and started again (it waits out its predecessor's admissions)."""

    elected = False


SETTINGS = settings(
    max_examples=200, stateful_step_count=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestElectedReplicas = World.TestCase
TestElectedReplicas.settings = SETTINGS
TestSingleReplica = SingleReplica.TestCase
TestSingleReplica.settings = SETTINGS


# --- the takeovers the property test looks for, step by step ----------------------------------------


def _world(replicas: int, elected: bool = True) -> World:
    world = World() if elected else SingleReplica()
    world.start(count=replicas)
    # The first replica takes the released Lease and admits at once; without election it waits first.
    world.time_passes(ticks=3 if elected else 25, writing=True)
    assert world.replicas[0].gate.role is Role.ADMITTING
    return world


def _full_but_one(world: World, via: int) -> None:
    """Two of the three GPUs admitted through replica `via`, written and stored."""
    world.requests(indexes=[via, via], gpus=1)
    world.time_passes(ticks=1, writing=True)
    world.store_one(0)
    world.store_one(0)
    assert not world.in_flight and len(world.objects) == 2


def test_a_leader_cut_off_and_dead_with_an_admission_unwritten() -> None:
    """The leader loses the API server right after a renewal, admits the last GPU from memory just
    before its renew deadline (it cannot write it), and dies. The create it allowed is stored late, as
    late as the API server may. The next leader takes the expired Lease: it must not admit before that
    object is visible, and must admit again once there is room."""
    world = _world(2)
    leader, follower = world.replicas
    _full_but_one(world, via=1)  # sent to the follower, forwarded to the leader
    version = world.lease["version"] if world.lease else 0
    while world.lease is not None and world.lease["version"] == version:  # until it renews
        world.time_passes(ticks=1, writing=True)
    world.network_cut(0)
    while leader.gate.leading_until - world.now > 0.15:
        world.time_passes(ticks=1, writing=True)
    world.requests(indexes=[0], gpus=1)
    assert len(world.in_flight) == 1  # admitted, not written, not stored
    world.crash(0)
    for _ in range(80):  # clients keep trying through the follower
        world.time_passes(ticks=1, writing=True)
        world.requests(indexes=[1], gpus=1)
        world.never_over_admitted()
    assert follower.gate.role is Role.ADMITTING and len(world.objects) == 3
    world.delete_workload(0)
    world.watch_event(index=1, count=1, everything=True)  # the deletion reaches the new leader
    world.controller_pass(index=1, defer=False)
    world.requests(indexes=[1], gpus=1)
    assert len(world.in_flight) == 1  # admission resumed


def test_a_leader_cut_off_stops_at_its_renew_deadline_even_while_its_lease_read_hangs() -> None:
    """Cut off from the API server, the leader cannot renew, and its elector (waiting for a read that
    hangs) never notices. Once its deadline passes it must refuse what the API server still sends it:
    a new leader admits by then."""
    world = _world(2)
    leader, follower = world.replicas
    world.network_cut(0)
    for _ in range(80):
        world.time_passes(ticks=1, writing=True)
    assert follower.gate.role is Role.ADMITTING and leader.gate.role is Role.ADMITTING  # it believes
    world.requests(indexes=[1, 1, 1], gpus=1)
    assert len(world.in_flight) == 3
    world.requests(indexes=[0], gpus=1)  # the Service still sends it requests
    world.never_over_admitted()
    assert "could not renew" in (leader.gate.refusal(world.now) or "")


def test_a_graceful_handover_writes_everything_then_the_next_leader_admits_at_once() -> None:
    world = _world(2)
    leader, follower = world.replicas
    world.requests(indexes=[0, 1], gpus=1)  # not written yet
    assert len(world.in_flight) == 2 and leader.ledger.due()
    world.graceful_stop(0)
    assert world.lease is not None and world.lease["holder"] == ""  # released: all of it was written
    for _ in range(10):
        world.time_passes(ticks=1, writing=True)
    assert follower.gate.role is Role.ADMITTING and len(world.in_flight) == 2  # not stored yet
    world.requests(indexes=[1, 1], gpus=1)  # the reservations it read leave one GPU
    assert len(world.in_flight) == 3
    world.never_over_admitted()


def test_a_handover_that_could_not_write_leaves_the_lease_to_expire() -> None:
    world = _world(2)
    leader, follower = world.replicas
    world.network_cut(0)
    world.requests(indexes=[1, 1, 1], gpus=1)
    assert len(world.in_flight) == 3
    world.graceful_stop(0)
    assert world.lease is not None and world.lease["holder"] == leader.identity  # not released
    for _ in range(100):
        world.time_passes(ticks=1, writing=True)
        world.requests(indexes=[1], gpus=1)
        world.never_over_admitted()
    assert follower.gate.role is Role.ADMITTING


def test_a_single_replica_started_again_waits_for_its_predecessors_admissions() -> None:
    world = _world(1, elected=False)
    world.requests(indexes=[0, 0, 0], gpus=1)  # admitted, never written
    world.crash(0)
    world.restart(0)
    for _ in range(40):
        world.time_passes(ticks=1, writing=True)
        world.requests(indexes=[0], gpus=1)
        world.never_over_admitted()
    assert world.replicas[0].gate.role is Role.ADMITTING and len(world.objects) == 3
