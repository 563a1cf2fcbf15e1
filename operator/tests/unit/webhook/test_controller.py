"""The usage controller's passes against an in-memory API: what a pass puts in the leader's ledger (and
so what the write-behind writes), which quotas it recomputes, and when a change that only settles
reservations is put off."""

from datetime import UTC, datetime, timedelta
from typing import Any

from gpuforge.quota.convert import quota_from_object

from .fakes import GPU, MemoryApi, Shell, deployment, quota

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def reservation(workload: str, age_seconds: float) -> dict[str, Any]:
    created = (NOW - timedelta(seconds=age_seconds)).isoformat().replace("+00:00", "Z")
    return {
        "uid": workload,
        "workload": workload,
        "delta": {GPU: "1"},
        "expected": {GPU: "1"},
        "created": created,
        "generation": 1,
    }


def leading(api: MemoryApi, at: datetime = NOW, **options: Any) -> Shell:
    shell = Shell(api, lambda: at, **options)
    shell.admitting()
    for raw in api.quotas.values():
        shell.leadership.ledger.load(quota_from_object(raw))
    return shell


async def test_a_pass_after_events_recomputes_only_the_quotas_they_touched() -> None:
    api = MemoryApi([quota("a", used=5), quota("b", used=5)])  # both stale: nothing runs
    shell = leading(api)
    await shell.controller.reconcile_all(only={"a"})
    assert shell.leadership.ledger.due() == ["a"]
    assert api.writes == []  # written behind, by the writer (not running here)
    await shell.controller.reconcile_all()  # a full pass (resync) catches the rest
    assert sorted(shell.leadership.ledger.due()) == ["a", "b"]


async def test_settling_alone_waits_for_a_batch_or_for_time() -> None:
    young = [reservation("Deployment/ns/w", 1)]
    api = MemoryApi([quota("a", used=1, reservations=young)], [deployment("w", "a", 1)])
    shell = leading(api, settle_seconds=15, settle_batch=16)
    await shell.controller.reconcile_all()
    ledger = shell.leadership.ledger
    assert ledger.due() == [] and ledger.counted("a")  # used is right already; dropping it can wait
    later = leading(api, NOW + timedelta(seconds=35))
    await later.controller.reconcile_all(only=set())  # due by age even though no event named the quota
    held = later.leadership.ledger.quota("a")
    assert later.leadership.ledger.due() == ["a"] and held is not None and held.status.reservations == ()


async def test_usage_changes_go_into_the_ledger_at_once() -> None:
    api = MemoryApi(
        [quota("a", used=1, reservations=[reservation("Deployment/ns/w", 1)])], [deployment("w", "a", 3)]
    )
    shell = leading(api)
    await shell.controller.reconcile_all(only={"a"})
    held = shell.leadership.ledger.quota("a")
    assert held is not None and held.status.used == {GPU: 3}


async def test_a_rebuild_freezes_what_the_caches_hold_when_the_process_asks() -> None:
    """`gpuforge webhook run` asks (a full GC of the caches paused the event loop); tests that run the
    webhook inside their own process do not, and their objects are never frozen."""
    import gc

    from gpuforge.quota.leader import Gate, Role

    api = MemoryApi([quota("a")], [deployment("w", "a", 1)])
    for freeze in (False, True):
        shell = Shell(api, lambda: NOW)
        shell.controller.freeze_gc_after_rebuild = freeze
        shell.leadership.gate = Gate(Role.SYNCING, term=1, admit_from=0.0, leading_until=float("inf"))
        gc.unfreeze()
        await shell.controller._rebuild(1)
        assert (gc.get_freeze_count() > 0) is freeze
        gc.unfreeze()
        assert shell.leadership.ledger.quota("a") is not None
