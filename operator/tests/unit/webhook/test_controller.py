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


async def test_the_heap_is_frozen_after_each_pass_and_thawed_each_resync_when_the_process_asks() -> None:
    """`gpuforge webhook run` asks (a full GC of the caches paused the event loop); tests that run the
    webhook inside their own process do not, and their objects are never frozen."""
    import gc

    from gpuforge.heap import Heap
    from gpuforge.quota.leader import Gate, Role

    now = [0.0]

    api = MemoryApi([quota("a")], [deployment("w", "a", 1)])
    try:
        for freeze in (False, True):
            shell = Shell(api, lambda: NOW)
            shell.controller.heap = (
                Heap(shell.controller.resync_seconds, clock=lambda: now[0]) if freeze else None
            )
            shell.leadership.gate = Gate(Role.SYNCING, term=1, admit_from=0.0, leading_until=float("inf"))
            gc.unfreeze()
            await shell.controller._rebuild(1)
            assert (gc.get_freeze_count() > 0) is freeze
            assert shell.leadership.ledger.quota("a") is not None
        cycle: list[list[object]] = [[] for _ in range(1000)]  # made after the rebuild, then dropped
        for item in cycle:
            item.append(cycle)
        frozen = gc.get_freeze_count()
        shell.controller._settle_heap()  # a pass: what it made joins the frozen
        assert gc.get_freeze_count() >= frozen + len(cycle)
        del cycle, item
        shell.controller._settle_heap()  # frozen, the dead cycle is not collected...
        assert gc.get_freeze_count() >= frozen + 1000
        now[0] += shell.controller.resync_seconds
        shell.controller._settle_heap()  # ...until the next resync thaws and collects everything
        assert gc.get_freeze_count() < frozen + 1000
    finally:
        gc.unfreeze()


async def test_a_pass_reads_only_the_workloads_of_the_quotas_it_recomputes() -> None:
    """From the watch caches (indexed by quota) and, before they are synced, from a list alike."""
    api = MemoryApi([quota("a"), quota("b")], [deployment("wa", "a", 2), deployment("wb", "b", 3)])
    shell = leading(api)
    controller = shell.controller
    for synced in (False, True):
        if synced:
            for informer in controller.workload_caches.values():
                await informer._list()
        for only, expected in (
            (None, {"wa", "wb"}),
            ({"a"}, {"wa"}),
            ({"b", "gone"}, {"wb"}),
            (set(), set()),
        ):
            snap = await controller.snapshot(quotas=only)
            assert {name for _, _, name in snap.workloads} == expected, (synced, only)
    await controller.reconcile_all(only={"a"})
    held = shell.leadership.ledger.quota("a")
    assert held is not None and held.status.used == {GPU: 2}


async def test_a_deleted_workload_leaves_no_usage_behind() -> None:
    api = MemoryApi([quota("a")], [deployment("w", "a", 2)])
    shell = leading(api)
    for informer in shell.controller.workload_caches.values():
        await informer._list()
    deployments = shell.controller.workload_caches["Deployment"]
    await shell.controller.reconcile_all()
    assert list(shell.controller._usages) == [("Deployment", "ns", "w")]
    stored = deployments.get("w", "ns")
    assert stored is not None
    api.deployments.clear()
    deployments.store.apply("DELETED", stored)
    deployments._changed("DELETED", stored)
    assert shell.controller._usages == {}
    await shell.controller.reconcile_all(only={"a"})
    held = shell.leadership.ledger.quota("a")
    assert held is not None and held.status.used == {GPU: 0}


def test_the_caches_keep_metadata_and_spec_only() -> None:
    from gpuforge.webhook.controller import counted_part

    served = {
        "kind": "Deployment",
        "metadata": {"name": "w", "labels": {"gpuforge.io/quota": "a"}, "managedFields": [{"manager": "x"}]},
        "spec": {"replicas": 2},
        "status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 1, "observedGeneration": 3},
    }
    # Of the status, only what says whether a rolling update runs (its surge is charged).
    assert counted_part(served) == {
        "kind": "Deployment",
        "metadata": {"name": "w", "labels": {"gpuforge.io/quota": "a"}},
        "spec": {"replicas": 2},
        "status": {"replicas": 2, "updatedReplicas": 1, "observedGeneration": 3},
    }
    assert "status" in served and "managedFields" in served["metadata"]  # the watch's copy is untouched


async def test_a_resync_writes_every_quota_with_its_reconcile_time() -> None:
    """Each periodic resync stamps lastReconcileTime, though nothing else changed: the time says the
    controller looked, not only that usage moved."""
    api = MemoryApi([quota("a", used=1)], [deployment("w", "a", 1)])
    shell = leading(api)
    await shell.controller.reconcile_all()
    ledger = shell.leadership.ledger
    assert ledger.due() == []  # a pass after events, or a term's first count: unchanged, not written
    later = leading(api, NOW + timedelta(seconds=300))
    await later.controller.reconcile_all(resync=True)
    held = later.leadership.ledger.quota("a")
    assert later.leadership.ledger.due() == ["a"]
    assert held is not None and held.status.last_reconcile_time == NOW + timedelta(seconds=300)
    assert held.status.used == {GPU: 1}


async def test_a_resync_stamps_the_time_but_still_puts_off_settling() -> None:
    young = [reservation("Deployment/ns/w", 1)]
    api = MemoryApi([quota("a", used=1, reservations=young)], [deployment("w", "a", 1)])
    shell = leading(api, settle_seconds=15, settle_batch=16)
    await shell.controller.reconcile_all(resync=True)
    held = shell.leadership.ledger.quota("a")
    assert shell.leadership.ledger.due() == ["a"]
    assert held is not None and held.status.last_reconcile_time == NOW
    assert len(held.status.reservations) == 1  # dropping it can still wait for a batch


async def test_a_namespace_default_quota_counts_its_unlabelled_gpu_workloads() -> None:
    unlabelled = deployment("w", "", 2)
    del unlabelled["metadata"]["labels"]["gpuforge.io/quota"]
    api = MemoryApi([quota("dflt"), quota("other")], [unlabelled])
    shell = leading(api)
    controller = shell.controller
    namespace = {
        "metadata": {"name": "ns", "resourceVersion": "1", "labels": {"gpuforge.io/default-quota": "dflt"}}
    }

    def seen(obj: dict[str, Any]) -> None:  # as the namespace watch delivers it
        controller.namespaces.store.apply("MODIFIED", obj)
        controller._namespace_changed("MODIFIED", obj)

    seen(namespace)
    await controller.reconcile_all()
    held = shell.leadership.ledger.quota("dflt")
    assert held is not None and held.status.used == {GPU: 2}
    # The default moves: so does the usage of the workloads naming none.
    seen(
        {
            "metadata": {
                **namespace["metadata"],
                "resourceVersion": "2",
                "labels": {"gpuforge.io/default-quota": "other"},
            }
        }
    )
    await controller.reconcile_all()
    moved, left = shell.leadership.ledger.quota("other"), shell.leadership.ledger.quota("dflt")
    assert moved is not None and moved.status.used == {GPU: 2}
    assert left is not None and left.status.used == {GPU: 0}
    # A default quota that does not admit the namespace is charged nothing of it.
    api.quotas["other"]["spec"]["namespaces"] = ["elsewhere"]
    shell.leadership.ledger.load(quota_from_object(api.quotas["other"]))
    await controller.reconcile_all()
    refused = shell.leadership.ledger.quota("other")
    assert refused is not None and refused.status.used.get(GPU, 0) == 0
