"""The Lease shell (gpuforge.webhook.leader) against an in-memory Lease store with resourceVersion
preconditions, and the usage controller holding its writes while it does not lead (showing the leader's)."""

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuforge.k8s.quota import Conflict
from gpuforge.webhook.controller import UsageController
from gpuforge.webhook.leader import LeaderElector
from gpuforge.webhook.metrics import REGISTRY

from .test_controller import GPU, NOW, MemoryApi, quota

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)


class Leases:
    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return json.loads(json.dumps(self.lease)) if self.lease else None

    def _store(self, spec: Any) -> dict[str, Any]:
        self.version += 1
        self.lease = {"metadata": {"resourceVersion": str(self.version)}, "spec": dict(spec)}
        return json.loads(json.dumps(self.lease))

    async def create_lease(self, namespace: str, name: str, spec: Any) -> dict[str, Any]:
        if self.lease is not None:
            raise Conflict(409, "already exists")
        return self._store(spec)

    async def replace_lease(self, namespace: str, name: str, version: str, spec: Any) -> dict[str, Any]:
        assert self.lease is not None
        if self.lease["metadata"]["resourceVersion"] != version:
            raise Conflict(409, "modified")
        return self._store(spec)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


async def test_one_leader_takeover_after_expiry_and_release() -> None:
    store, clock = Leases(), Clock()
    a = LeaderElector(store, "ns", "l", identity="a", clock=clock)  # type: ignore[arg-type]
    b = LeaderElector(store, "ns", "l", identity="b", clock=clock)  # type: ignore[arg-type]
    await a.step()
    await b.step()
    assert (a.is_leader(), b.is_leader()) == (True, False)
    clock.now += timedelta(seconds=5)
    await a.step()  # renews
    await b.step()  # sees a new version: its wait starts again
    clock.now += timedelta(seconds=14)
    await b.step()
    assert not b.is_leader()
    clock.now += timedelta(seconds=1)  # 15 s without a change: a is gone
    await b.step()
    assert b.is_leader() and store.lease is not None and store.lease["spec"]["leaseTransitions"] == 1
    await a.step()  # a sees b hold it
    assert not a.is_leader()
    await b._release()
    assert store.lease["spec"]["holderIdentity"] is None
    await a.step()  # released: taken at once
    assert a.is_leader()


async def test_a_follower_writes_no_usage() -> None:
    store = Leases()
    store._store({"holderIdentity": "other", "leaseDurationSeconds": 15})
    elector = LeaderElector(store, "ns", "l", identity="me", clock=lambda: NOW)  # type: ignore[arg-type]
    await elector.step()
    api = MemoryApi([quota("a", 5)], [])  # stale usage: a leader would write 0
    controller = UsageController(api, lambda: NOW, leader=elector)  # type: ignore[arg-type]
    await controller.reconcile_all()
    assert api.writes == []
    store.lease = None  # the Lease is gone: create it
    await elector.step()
    await controller.reconcile_all()
    assert api.writes == ["a"] and api.quotas["a"]["status"]["used"] == {GPU: "0"}


async def test_a_follower_shows_the_usage_the_leader_wrote() -> None:
    store = Leases()
    store._store({"holderIdentity": "other", "leaseDurationSeconds": 15})
    elector = LeaderElector(store, "ns", "l", identity="me", clock=lambda: NOW)  # type: ignore[arg-type]
    await elector.step()
    controller = UsageController(MemoryApi([], []), lambda: NOW, leader=elector)  # type: ignore[arg-type]
    controller._listener("GpuQuota")("MODIFIED", quota("shown-by-follower", 7))
    used = REGISTRY.get_sample_value("gpuforge_quota_used", {"quota": "shown-by-follower", "key": GPU})
    hard = REGISTRY.get_sample_value("gpuforge_quota_hard", {"quota": "shown-by-follower", "key": GPU})
    assert (used, hard) == (7.0, 16.0)
