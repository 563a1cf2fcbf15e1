"""Leader election state machine (gpuforge.quota.leader) with a fixed clock."""

from datetime import UTC, datetime, timedelta

import pytest

from gpuforge.quota.leader import Action, LeaseRecord, decide, format_micro_time, lease_record, released_spec

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
D = timedelta(seconds=15)


def lease(holder: str, renewed: datetime = T0, transitions: int = 3, duration: int = 15) -> LeaseRecord:
    return LeaseRecord(holder, duration, T0 - timedelta(minutes=1), renewed, transitions, "42")


@pytest.mark.parametrize(
    ("record", "observed_after", "leading", "action", "holder"),
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
def test_decide(
    record: LeaseRecord | None, observed_after: int, leading: bool, action: Action, holder: str
) -> None:
    now = T0 + timedelta(seconds=observed_after)
    decision = decide(record, me="me", now=now, observed_at=T0, duration=D, leading=leading)
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
    decision = decide(record, me="me", now=T0, observed_at=T0, duration=D, leading=False)
    assert decision.action is Action.WAIT


def test_transitions_count_takeovers_not_renewals() -> None:
    renew = decide(lease("me"), me="me", now=T0, observed_at=T0, duration=D, leading=True)
    take = decide(lease(""), me="me", now=T0, observed_at=T0, duration=D, leading=False)
    assert renew.spec is not None and renew.spec["leaseTransitions"] == 3
    assert renew.spec["acquireTime"] == format_micro_time(T0 - timedelta(minutes=1))
    assert take.spec is not None and take.spec["leaseTransitions"] == 4
    assert take.spec["acquireTime"] == format_micro_time(T0)


def test_lease_record_round_trip() -> None:
    obj = {
        "metadata": {"name": "l", "resourceVersion": "9"},
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
        "pod-a_12", 15, T0 - timedelta(minutes=1), T0 + timedelta(microseconds=123456), 2, "9"
    )
    assert lease_record(None) is None
    assert lease_record({"metadata": {}, "spec": {}}) == LeaseRecord("", 0, None, None, 0, "")
    released = released_spec(record, T0)
    assert released["holderIdentity"] is None and released["leaseTransitions"] == 2
