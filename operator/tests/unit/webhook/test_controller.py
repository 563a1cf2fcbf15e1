"""The usage controller's passes against an in-memory API: which quotas a pass recomputes and when a
write that only settles reservations is put off."""

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuforge.webhook.controller import UsageController

GPU = "requests.nvidia.com/gpu"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def quota(name: str, used: int, reservations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "hard": {GPU: "16"},
        "used": {GPU: str(used)},
        "selfUsed": {GPU: str(used)},
        "conditions": [  # as an earlier pass left them
            {"type": "Reconciled", "status": "True", "reason": "Recomputed", "message": ""},
            {"type": "OverQuota", "status": "False", "reason": "WithinHard", "message": ""},
            {"type": "BudgetExhausted", "status": "False", "reason": "BudgetLeft", "message": ""},
        ],
    }
    if reservations:
        status["reservations"] = reservations
    return {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": name, "resourceVersion": "1", "generation": 1, "uid": name},
        "spec": {"parent": "", "hard": {GPU: "16"}},
        "status": status,
    }


def deployment(name: str, quota_name: str, replicas: int) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "generation": 1,
            "resourceVersion": "7",
            "labels": {"gpuforge.io/quota": quota_name},
        },
        "spec": {
            "replicas": replicas,
            "template": {
                "spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
            },
        },
    }


class MemoryApi:
    def __init__(self, quotas: list[dict[str, Any]], deployments: list[dict[str, Any]]) -> None:
        self.quotas = {q["metadata"]["name"]: q for q in quotas}
        self.deployments = deployments
        self.writes: list[str] = []

    async def list_quotas(self) -> list[dict[str, Any]]:
        return [json.loads(json.dumps(q)) for q in self.quotas.values()]

    async def list_objects(
        self, kind: str, namespace: str | None = None, label_selector: str | None = None
    ) -> Any:
        return [json.loads(json.dumps(d)) for d in self.deployments] if kind == "Deployment" else []

    async def get_quota(self, name: str) -> dict[str, Any] | None:
        return json.loads(json.dumps(self.quotas[name]))

    async def replace_quota_status(self, name: str, version: str, status: dict[str, Any]) -> dict[str, Any]:
        stored = self.quotas[name]
        assert stored["metadata"]["resourceVersion"] == version
        self.writes.append(name)
        stored = {
            **stored,
            "metadata": {**stored["metadata"], "resourceVersion": str(int(version) + 1)},
            "status": json.loads(json.dumps(status)),
        }
        self.quotas[name] = stored
        return json.loads(json.dumps(stored))


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


async def test_a_pass_after_events_recomputes_only_the_quotas_they_touched() -> None:
    api = MemoryApi([quota("a", 5), quota("b", 5)], [])  # both stale: nothing runs
    controller = UsageController(api, lambda: NOW)  # type: ignore[arg-type]
    await controller.reconcile_all(only={"a"})
    assert api.writes == ["a"]
    await controller.reconcile_all()  # a full pass (resync) catches the rest
    assert api.writes == ["a", "b"]


async def test_settling_alone_waits_for_a_batch_or_for_time() -> None:
    young = [reservation("Deployment/ns/w", 1)]
    api = MemoryApi([quota("a", 1, young)], [deployment("w", "a", 1)])
    controller = UsageController(api, lambda: NOW, settle_seconds=15, settle_batch=16)  # type: ignore[arg-type]
    await controller.reconcile_all()
    assert api.writes == []  # used is right already; dropping one settled reservation can wait
    later = UsageController(api, lambda: NOW + timedelta(seconds=35))  # type: ignore[arg-type]
    await later.reconcile_all(only=set())  # due by age even though no event named the quota
    assert api.writes == ["a"]
    assert "reservations" not in api.quotas["a"]["status"]


async def test_usage_changes_are_written_at_once() -> None:
    api = MemoryApi([quota("a", 1, [reservation("Deployment/ns/w", 1)])], [deployment("w", "a", 3)])
    controller = UsageController(api, lambda: NOW)  # type: ignore[arg-type]
    await controller.reconcile_all(only={"a"})
    assert api.writes == ["a"] and api.quotas["a"]["status"]["used"] == {GPU: "3"}
