"""Leader election and admission gate state machines (gpuforge.quota.leader) with a fixed clock."""

import math
from datetime import UTC, datetime, timedelta

import pytest

from gpuforge.quota.leader import (
    Action,
    Gate,
    LeaseRecord,
    Role,
    Takeover,
    Timing,
    admission_gap,
    decide,
    format_micro_time,
    lease_record,
    released_spec,
    takeover,
    takes_calls,
)

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
D = timedelta(seconds=15)


def lease(holder: str, renewed: datetime = T0, transitions: int = 3, duration: int = 15) -> LeaseRecord:
    return LeaseRecord(holder, duration, T0 - timedelta(minutes=1), renewed, transitions, "42")


@pytest.mark.parametrize(
    ("record", "waited", "leading", "action", "holder"),
    [
        (None, 0, False, Action.CREATE, "me"),
        (lease("me"), 0, True, Action.RENEW, "me"),
        # My own Lease, even long unrenewed: nobody took it, so renewing is safe.
        (lease("me"), 60, False, Action.RENEW, "me"),
        (lease("other"), 0, False, Action.WAIT, "other"),
        (lease("other"), 14, False, Action.WAIT, "other"),
        (lease("other"), 15, False, Action.ACQUIRE, "me"),
        (lease("other"), 0, True, Action.LOST, "other"),
        # Released on clean shutdown: free at once.
        (lease(""), 0, False, Action.ACQUIRE, "me"),
        # The holder asked for a longer term than mine: its term counts.
        (lease("other", duration=40), 20, False, Action.WAIT, "other"),
        (lease("other", duration=40), 40, False, Action.ACQUIRE, "me"),
    ],
)
def test_decide(record: LeaseRecord | None, waited: int, leading: bool, action: Action, holder: str) -> None:
    now = T0 + timedelta(seconds=waited)
    decision = decide(record, me="me", now=now, waited=timedelta(seconds=waited), duration=D, leading=leading)
    assert (decision.action, decision.holder) == (action, holder)
    if action in (Action.WAIT, Action.LOST):
        assert decision.spec is None
    else:
        assert decision.spec is not None
        assert decision.spec["holderIdentity"] == "me"
        assert decision.spec["renewTime"] == format_micro_time(now)
        assert decision.spec["leaseDurationSeconds"] == 15


def test_expiry_ignores_the_holders_clock() -> None:
    """A renewTime far in the past (the holder's clock is behind) does not expire a Lease just seen."""
    record = lease("other", renewed=T0 - timedelta(hours=1))
    decision = decide(record, me="me", now=T0, waited=timedelta(0), duration=D, leading=False)
    assert decision.action is Action.WAIT


def test_transitions_count_takeovers_not_renewals() -> None:
    renew = decide(lease("me"), me="me", now=T0, waited=timedelta(0), duration=D, leading=True)
    take = decide(lease(""), me="me", now=T0, waited=timedelta(0), duration=D, leading=False)
    assert renew.spec is not None and renew.spec["leaseTransitions"] == 3
    assert renew.spec["acquireTime"] == format_micro_time(T0 - timedelta(minutes=1))
    assert take.spec is not None and take.spec["leaseTransitions"] == 4
    assert take.spec["acquireTime"] == format_micro_time(T0)


def test_lease_record_round_trip() -> None:
    obj = {
        "metadata": {
            "name": "l",
            "resourceVersion": "9",
            "annotations": {"gpuforge.io/leader-endpoint": "https://10.0.0.7:8443"},
        },
        "spec": {
            "holderIdentity": "pod-a_12",
            "leaseDurationSeconds": 15,
            "acquireTime": "2026-01-01T11:59:00.000000Z",
            "renewTime": "2026-01-01T12:00:00.123456Z",
            "leaseTransitions": 2,
        },
    }
    record = lease_record(obj)
    assert record == LeaseRecord(
        "pod-a_12",
        15,
        T0 - timedelta(minutes=1),
        T0 + timedelta(microseconds=123456),
        2,
        "9",
        "https://10.0.0.7:8443",
    )
    assert lease_record(None) is None
    assert lease_record({"metadata": {}, "spec": {}}) == LeaseRecord("", 0, None, None, 0, "")
    released = released_spec(record, T0)
    assert released["holderIdentity"] is None and released["leaseTransitions"] == 2


# --- when a leader may admit ----------------------------------------------------------------------

TIMING = Timing(
    lease_duration=timedelta(seconds=15), webhook_timeout=timedelta(seconds=5), persist=timedelta(seconds=5)
)


@pytest.mark.parametrize(
    ("action", "record", "leading", "how"),
    [
        (Action.RENEW, lease("me"), True, Takeover.CONTINUED),
        (Action.RENEW, lease("me"), False, Takeover.RESUMED),  # renewed after its own deadline passed
        (Action.CREATE, None, False, Takeover.CREATED),
        (Action.ACQUIRE, lease(""), False, Takeover.RELEASED),
        (Action.ACQUIRE, lease("other"), False, Takeover.EXPIRED),
        (Action.WAIT, lease("other"), False, None),
        (Action.LOST, lease("other"), True, None),
    ],
)
def test_takeover(action: Action, record: LeaseRecord | None, leading: bool, how: Takeover | None) -> None:
    assert takeover(action, record, leading) is how


@pytest.mark.parametrize(
    ("how", "seconds"),
    [
        (Takeover.CONTINUED, 0),
        (Takeover.RELEASED, 0),  # the previous leader wrote every admission before releasing
        (Takeover.EXPIRED, 10),  # its answers reach the API server within 5 s, stored within 5 s more
        (Takeover.RESUMED, 10),
        (Takeover.STARTED, 10),
        (Takeover.CREATED, 25),  # a leader whose Lease was deleted admits up to one Lease duration longer
    ],
)
def test_admission_gap(how: Takeover, seconds: int) -> None:
    assert admission_gap(how, TIMING) == timedelta(seconds=seconds)


def test_a_term_waits_syncs_then_admits_until_its_deadline() -> None:
    gate = Gate().took(Takeover.EXPIRED, now=100.0, leading_until=110.0, timing=TIMING)
    assert (gate.role, gate.term, gate.admit_from) == (Role.WAITING, 1, 110.0)
    assert "admits in 10.0s" in (gate.refusal(100.0) or "")
    gate = gate.synced(1)  # not syncing yet: nothing changes
    assert gate.role is Role.WAITING
    gate = gate.syncing(1)
    assert "reading quotas and workloads" in (gate.refusal(100.0) or "")
    gate = gate.synced(1)
    assert gate.role is Role.ADMITTING and gate.refusal(105.0) is None
    assert "could not renew" in (gate.refusal(110.0) or "")  # its renew deadline
    renewed = gate.took(Takeover.CONTINUED, now=108.0, leading_until=118.0, timing=TIMING)
    assert (renewed.role, renewed.term, renewed.refusal(115.0)) == (Role.ADMITTING, 1, None)
    assert renewed.leads(117.0) and not renewed.leads(118.0)


def test_a_term_ends_with_the_lease_and_the_next_starts_afresh() -> None:
    admitting = Gate(Role.ADMITTING, term=3, admit_from=0.0, leading_until=50.0)
    lost = admitting.lost()
    assert lost.role is Role.FOLLOWER and "not the GpuQuota leader" in (lost.refusal(1.0) or "")
    assert lost.syncing(3).role is Role.FOLLOWER and lost.synced(3).role is Role.FOLLOWER
    again = lost.took(Takeover.RESUMED, now=60.0, leading_until=70.0, timing=TIMING)
    assert (again.role, again.term, again.admit_from) == (Role.WAITING, 4, 70.0)
    # A renewal reported to a replica whose term had ended starts a new term, never resumes the old.
    odd = lost.took(Takeover.CONTINUED, now=60.0, leading_until=70.0, timing=TIMING)
    assert (odd.role, odd.term, odd.admit_from) == (Role.WAITING, 4, 70.0)
    assert again.syncing(3).role is Role.WAITING  # a step of the old term changes nothing


def test_stopping_admits_nothing_but_may_still_write() -> None:
    gate = Gate(Role.ADMITTING, term=1, admit_from=0.0, leading_until=math.inf).stopping()
    assert gate.role is Role.STOPPING and "shutting down" in (gate.refusal(5.0) or "")
    assert gate.leads(5.0)
    assert Gate().stopping().role is Role.FOLLOWER


def test_without_election_the_process_waits_once_then_leads_for_good() -> None:
    gate = Gate().took(Takeover.STARTED, now=0.0, leading_until=math.inf, timing=TIMING)
    gate = gate.syncing(1).synced(1)
    assert gate.role is Role.ADMITTING and gate.refusal(1e9) is None


def test_lease_record_reads_whether_the_holder_takes_the_calls() -> None:
    annotations = {"gpuforge.io/leader-routed": "true"}
    routed = lease_record({"metadata": {"annotations": annotations}, "spec": {"holderIdentity": "a"}})
    plain = lease_record({"metadata": {}, "spec": {"holderIdentity": "a"}})
    assert routed is not None and routed.routed
    assert plain is not None and not plain.routed


@pytest.mark.parametrize(
    ("role", "other_holder", "holder_routed", "takes"),
    [
        (Role.ADMITTING, "", False, True),  # the leader always takes calls
        (Role.WAITING, "", False, True),  # a new leader too: it answers "admitting in ..."
        (Role.STOPPING, "", False, True),  # until it is gone
        (Role.FOLLOWER, "", False, True),  # no leader (or the Lease released): followers answer
        (Role.FOLLOWER, "b", False, True),  # a leader that does not route (an older version)
        (Role.FOLLOWER, "b", True, False),  # the leader takes them: step out
    ],
)
def test_takes_calls(role: Role, other_holder: str, holder_routed: bool, takes: bool) -> None:
    assert takes_calls(role, other_holder, holder_routed) is takes
