"""The leader's in-memory ledger (gpuforge.quota.ledger): decisions charged at once, written behind."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gpuforge.api.gpuquota import GpuQuota, GpuQuotaStatus
from gpuforge.quota.admission import Allowed, Denied, WorkloadAsk
from gpuforge.quota.ledger import Ledger, newer_version
from gpuforge.quota.reconcile import recompute_status
from gpuforge.quota.usage import WorkloadUsage

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GPU = "requests.nvidia.com/gpu"


def quota(hard: int = 2, version: str = "5", uid: str = "u-q") -> GpuQuota:
    return GpuQuota(
        name="q",
        parent="",
        hard={GPU: Decimal(hard)},
        status=GpuQuotaStatus(used={GPU: Decimal(0)}),
        resource_version=version,
        uid=uid,
        generation=1,
    )


def ask(name: str, gpus: int = 1) -> WorkloadAsk:
    delta = {GPU: Decimal(gpus)}
    return WorkloadAsk(f"req-{name}", f"Deployment/ns/{name}", delta, delta, generation=1, object_uid=name)


def test_admissions_are_charged_at_once_and_the_last_gpu_goes_once() -> None:
    ledger = Ledger()
    ledger.load(quota(hard=2))
    answers = [ledger.admit("q", ask(name), NOW, at=1.0) for name in ("a", "b", "c")]
    assert [isinstance(answer, Allowed) for answer in answers] == [True, True, False]
    assert isinstance(answers[2], Denied) and "only 0 is left (2 of 2 used)" in answers[2].message
    held = ledger.quota("q")
    assert held is not None and held.status.used == {GPU: Decimal(2)}
    assert [item.workload for item in held.status.reservations] == ["Deployment/ns/a", "Deployment/ns/b"]


def test_a_dry_run_is_decided_and_never_recorded() -> None:
    ledger = Ledger()
    ledger.load(quota(hard=1))
    assert isinstance(ledger.decide("q", ask("a"), NOW), Allowed)
    assert isinstance(ledger.decide("q", ask("a", gpus=2), NOW), Denied)
    assert ledger.due() == [] and ledger.backlog() == 0
    assert isinstance(ledger.admit("q", ask("a"), NOW, at=0.0), Allowed)  # the GPU is still there


def test_a_quota_not_held_is_not_found() -> None:
    answer = Ledger().admit("nope", ask("a"), NOW, at=0.0)
    assert isinstance(answer, Denied) and answer.code == 404 and "does not exist" in answer.message


def test_writes_carry_every_admission_made_before_them() -> None:
    ledger = Ledger()
    ledger.load(quota(hard=8))
    ledger.admit("q", ask("a"), NOW, at=10.0)
    ledger.admit("q", ask("b"), NOW, at=10.5)
    assert ledger.due() == ["q"] and ledger.oldest_unwritten("q") == 10.0 and ledger.backlog() == 2
    pending = ledger.to_write("q")
    assert pending is not None
    sent, change = pending
    assert sent.resource_version == "5" and len(sent.status.reservations) == 2
    ledger.admit("q", ask("c"), NOW, at=11.0)  # while the write is in flight
    waits = ledger.written("q", change, "6", at=11.25)
    assert waits == [1.25, 0.75]  # each admission the write carried, and how long it waited
    assert ledger.oldest_unwritten("q") == 11.0 and ledger.due() == ["q"]
    held = ledger.quota("q")
    assert held is not None and held.resource_version == "6"
    pending = ledger.to_write("q")
    assert pending is not None and len(pending[0].status.reservations) == 3
    assert ledger.written("q", pending[1], "7", at=11.5) == [0.5]
    assert ledger.due() == [] and ledger.to_write("q") is None and ledger.backlog() == 0
    assert ledger.written_up_to("q") == ledger.changes("q") == 3


def test_a_watch_event_brings_spec_and_version_never_status() -> None:
    ledger = Ledger()
    ledger.load(quota(hard=2))
    ledger.admit("q", ask("a"), NOW, at=0.0)
    edited = replace(quota(hard=1, version="9"), status=GpuQuotaStatus())  # a spec edit, seen without status
    assert ledger.observe(edited)
    held = ledger.quota("q")
    assert held is not None
    assert (held.hard, held.resource_version, held.status.used) == ({GPU: Decimal(1)}, "9", {GPU: Decimal(1)})
    assert isinstance(ledger.admit("q", ask("b"), NOW, at=0.0), Denied)  # the new hard counts at once
    assert ledger.observe(quota(hard=5, version="8"))  # an older copy changes nothing
    held = ledger.quota("q")
    assert held is not None and held.hard == {GPU: Decimal(1)} and held.resource_version == "9"
    ledger.written("q", 1, "7", at=0.0)  # nor does an older write answer
    held = ledger.quota("q")
    assert held is not None and held.resource_version == "9"
    assert not ledger.observe(quota(version="10", uid="another"))  # deleted and created again: load it
    assert not ledger.observe(replace(quota(), name="unknown"))


def test_a_recompute_counts_workloads_and_settles_reservations() -> None:
    ledger = Ledger()
    ledger.load(quota(hard=4))
    assert not ledger.counted("q")
    ledger.admit("q", ask("a"), NOW, at=0.0)
    held = ledger.quota("q")
    assert held is not None
    seen = [WorkloadUsage("Deployment", "ns", "a", "q", 1, {GPU: Decimal(1)}, generation=1, uid="a")]
    ledger.recomputed("q", recompute_status(held, [], seen, {}, NOW + timedelta(seconds=1)))
    held = ledger.quota("q")
    assert ledger.counted("q") and held is not None
    assert held.status.reservations == () and held.status.used == {GPU: Decimal(1)}
    ledger.recomputed("q", None)  # nothing changed: counted, nothing more to write
    assert ledger.changes("q") == 2


def test_resource_versions_compare_as_numbers() -> None:
    assert newer_version("10", "9") and not newer_version("9", "10") and not newer_version("9", "9")
    assert newer_version("b", "a") and not newer_version("a", "a")


def test_an_admitted_lowering_binds_before_the_watch_brings_it() -> None:
    ledger = Ledger()
    ledger.load(quota(hard=4))
    ledger.lower("q", {GPU: Decimal(1)}, generation=2, until=NOW + timedelta(seconds=10))
    assert isinstance(ledger.admit("q", ask("a"), NOW, at=0.0), Allowed)
    answer = ledger.admit("q", ask("b"), NOW, at=0.0)
    assert isinstance(answer, Denied) and "only 0 is left (1 of 1 used)" in answer.message
    # A status write shows the object before the change is stored: the lowering still holds.
    ledger.observe(replace(quota(hard=4, version="6"), generation=1))
    assert isinstance(ledger.decide("q", ask("b"), NOW), Denied)
    # The stored change ends it; from then on the API server's hard is the one held.
    ledger.observe(replace(quota(hard=3, version="7"), generation=2))
    held = ledger.quota("q")
    assert held is not None and held.hard == {GPU: Decimal(3)}


def test_a_raise_waits_for_the_watch_and_a_lowering_never_stored_is_given_up() -> None:
    ledger = Ledger()
    ledger.load(quota(hard=2))
    ledger.lower("q", {GPU: Decimal(8)}, generation=2, until=NOW + timedelta(seconds=10))
    held = ledger.quota("q")
    assert held is not None and held.hard == {GPU: Decimal(2)}
    ledger.lower("q", {GPU: Decimal(0)}, generation=3, until=NOW + timedelta(seconds=10))
    assert isinstance(ledger.decide("q", ask("a"), NOW), Denied)
    # The request failed after admission (another webhook refused it): ten seconds on, it is given up.
    assert isinstance(ledger.decide("q", ask("a"), NOW + timedelta(seconds=10)), Allowed)
    ledger.lower("q", {GPU: Decimal(0)}, generation=4, until=NOW + timedelta(seconds=30))
    ledger.expire(NOW + timedelta(seconds=30))
    held = ledger.quota("q")
    assert held is not None and held.hard == {GPU: Decimal(2)}
