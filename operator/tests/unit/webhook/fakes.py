"""An in-memory API server for the webhook's shell (unit tests): GpuQuotas with resourceVersion
preconditions, labelled workloads, and Leases. Every answer is a JSON copy, as off the wire."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import aiohttp

from gpuforge.clock import SYSTEM, Clock
from gpuforge.k8s.quota import ApiError, Conflict
from gpuforge.quota.leader import Gate, Role, Timing
from gpuforge.webhook.admission import AdmissionHandlers
from gpuforge.webhook.controller import UsageController
from gpuforge.webhook.leadership import Leadership
from gpuforge.webhook.writeback import WriteBehind

GPU = "requests.nvidia.com/gpu"
TIMING = Timing(
    lease_duration=timedelta(seconds=15), webhook_timeout=timedelta(seconds=5), persist=timedelta(seconds=5)
)


def copy(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def quota(name: str, hard: int = 16, used: int = 0, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": name, "resourceVersion": "1", "generation": 1, "uid": f"uid-{name}"},
        "spec": {"parent": "", "hard": {GPU: str(hard)}, "namespaces": ["ns"]},
        "status": {
            "hard": {GPU: str(hard)},
            "used": {GPU: str(used)},
            "selfUsed": {GPU: str(used)},
            "conditions": [  # as an earlier pass left them
                {"type": "Reconciled", "status": "True", "reason": "Recomputed", "message": ""},
                {"type": "OverQuota", "status": "False", "reason": "WithinHard", "message": ""},
                {"type": "BudgetExhausted", "status": "False", "reason": "BudgetLeft", "message": ""},
            ],
            **status,
        },
    }


def deployment(name: str, quota_name: str, replicas: int = 1, uid: str = "") -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "generation": 1,
            "resourceVersion": "7",
            "uid": uid or f"uid-{name}",
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
    def __init__(
        self, quotas: list[dict[str, Any]] | None = None, deployments: list[dict[str, Any]] | None = None
    ) -> None:
        self.quotas = {q["metadata"]["name"]: copy(q) for q in quotas or []}
        self.deployments = list(deployments or [])
        self.lease: dict[str, Any] | None = None
        self.versions = itertools.count(100)
        self.writes: list[str] = []  # quota status writes, by name
        self.lists = 0
        self.unreachable = False  # every call fails as if the API server could not be reached
        self.events: list[str] = []

    def _check(self) -> None:
        if self.unreachable:
            raise aiohttp.ClientConnectionError("connection refused")

    # GpuQuotas

    async def get_quota(self, name: str) -> dict[str, Any] | None:
        self._check()
        return copy(self.quotas[name]) if name in self.quotas else None

    async def list_quotas(self) -> list[dict[str, Any]]:
        self._check()
        return [copy(q) for q in self.quotas.values()]

    async def replace_quota_status(self, name: str, version: str, status: dict[str, Any]) -> dict[str, Any]:
        self._check()
        if name not in self.quotas:
            raise ApiError(404, f"GpuQuota {name!r} is gone")
        stored = self.quotas[name]
        if stored["metadata"]["resourceVersion"] != version:
            raise Conflict(409, "the object has been modified")
        self.writes.append(name)
        self.quotas[name] = {
            **stored,
            "metadata": {**stored["metadata"], "resourceVersion": str(next(self.versions))},
            "status": copy(status),
        }
        return copy(self.quotas[name])

    def edit_spec(self, name: str, hard: int) -> None:
        """A user edits spec.hard: a new resourceVersion and generation, status untouched."""
        stored = self.quotas[name]
        metadata = {
            **stored["metadata"],
            "resourceVersion": str(next(self.versions)),
            "generation": stored["metadata"]["generation"] + 1,
        }
        self.quotas[name] = {
            **stored,
            "metadata": metadata,
            "spec": {**stored["spec"], "hard": {GPU: str(hard)}},
        }

    # Workloads (informers list and watch them)

    async def list_objects(
        self, kind: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        items, _ = await self.list_with_version(kind)
        return items

    async def list_with_version(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        self._check()
        self.lists += 1
        if kind == "GpuQuota":
            return [copy(q) for q in self.quotas.values()], "1"
        return ([copy(d) for d in self.deployments] if kind == "Deployment" else []), "1"

    async def watch(self, *args: Any, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        await asyncio.Event().wait()  # nothing changes unless a test says so
        yield {}

    async def get_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self._check()
        found = [d for d in self.deployments if d["metadata"]["name"] == name]
        return copy(found[0]) if kind == "Deployment" and found else None

    async def get_claim(self, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
        return None

    async def list_claims(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        return []

    async def record_event(self, **event: Any) -> None:
        self.events.append(str(event.get("reason")))

    # Leases

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check()
        return copy(self.lease) if self.lease else None

    def _store_lease(self, spec: Any, annotations: Any) -> dict[str, Any]:
        metadata = {"resourceVersion": str(next(self.versions)), "annotations": dict(annotations or {})}
        self.lease = {"metadata": metadata, "spec": dict(spec)}
        return copy(self.lease)

    async def create_lease(
        self, namespace: str, name: str, spec: Any, annotations: Any = None
    ) -> dict[str, Any]:
        self._check()
        if self.lease is not None:
            raise Conflict(409, "already exists")
        return self._store_lease(spec, annotations)

    async def replace_lease(
        self, namespace: str, name: str, version: str, spec: Any, annotations: Any = None
    ) -> dict[str, Any]:
        self._check()
        assert self.lease is not None
        if self.lease["metadata"]["resourceVersion"] != version:
            raise Conflict(409, "modified")
        return self._store_lease(spec, annotations)


class Shell:
    """The webhook's pieces as `webhook run` wires them, on a MemoryApi."""

    def __init__(
        self, api: MemoryApi, clock: Any = None, writer_clock: Clock = SYSTEM, **controller: Any
    ) -> None:
        from gpuforge.webhook.admission import utc_now

        self.api = api
        self.leadership = Leadership(TIMING)
        self.writer = WriteBehind(
            api,  # type: ignore[arg-type]
            self.leadership.ledger,
            self.leadership.may_write,
            clock=writer_clock,
        )
        self.controller = UsageController(
            api,  # type: ignore[arg-type]
            self.leadership,
            self.writer,
            clock or utc_now,
            **controller,
        )
        self.handlers = AdmissionHandlers(
            api,  # type: ignore[arg-type]
            self.leadership,
            self.writer,
            self.controller.count,
            self.controller.workload_caches,
            clock or utc_now,
        )

    def admitting(self) -> None:
        """Lead at once, with every quota loaded (what a finished takeover leaves)."""
        self.leadership.gate = Gate(Role.ADMITTING, term=1, admit_from=0.0, leading_until=math.inf)
