"""Admission handlers: turn an AdmissionRequest into a decision, reserving usage in GpuQuota status.

Reservations go through a per-quota writer: requests for the same quota that arrive while a write is
in flight are decided together against one fresh read and written with one compare-and-swap (the
resourceVersion precondition), as the API server's own ResourceQuota admission batches its waiters.
A 409 means another replica or the controller wrote first: read again, decide again. Dry-run requests
are decided from a read and never written.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp

from gpuforge.api.gpuquota import KIND as QUOTA_KIND
from gpuforge.api.gpuquota import GpuQuota
from gpuforge.constants import QUOTA_LABEL
from gpuforge.k8s.quota import ApiError, Conflict, Informer, QuotaApi
from gpuforge.quota.admission import (
    Allowed,
    Decision,
    Denied,
    WorkloadAsk,
    admit_many,
    admit_quota_create,
    admit_quota_delete,
    admit_quota_update,
)
from gpuforge.quota.convert import QuotaSpecError, quota_from_object, status_to_object
from gpuforge.quota.usage import (
    ClaimCatalog,
    WorkloadError,
    claim_usage,
    generation_of,
    increase,
    is_controlled_by_workload,
    labels_of,
    referenced_claims,
    workload_ref,
    workload_usage,
)
from gpuforge.webhook import metrics
from gpuforge.webhook.review import AdmissionRequest

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
SCALE_KINDS = {"deployments": "Deployment", "statefulsets": "StatefulSet", "replicasets": "ReplicaSet"}


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Pending:
    ask: WorkloadAsk
    future: asyncio.Future[Decision]


@dataclass
class QuotaWriter:
    """Serialises status writes per quota inside this process and batches waiting requests.

    Decisions start from `quotas` (the watch-fed copy, or the answer to this process's last write), so an
    admission costs one write and no read. A copy that lags only makes the compare-and-swap fail (409),
    and then we read afresh. Denials are never made from a copy alone: a quota the controller just
    released must not refuse work, so a batch with a denial is decided again from a fresh read.
    """

    api: QuotaApi
    clock: Clock = utc_now
    deadline_seconds: float = 4.0
    quotas: Informer | None = None
    _queues: dict[str, list[_Pending]] = field(default_factory=dict)
    _draining: set[str] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # The last copy parsed, by quota: (resourceVersion, quota); parsing status is most of a decision's CPU.
    _parsed: dict[str, tuple[str, GpuQuota]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.quotas is None:  # not watched: remembers only this process's own writes
            self.quotas = Informer(self.api, QUOTA_KIND)

    @property
    def cache(self) -> Informer:
        assert self.quotas is not None
        return self.quotas

    def lock(self, quota_name: str) -> asyncio.Lock:
        """Held while a status write to `quota_name` is decided and made (the controller takes it too)."""
        return self._locks.setdefault(quota_name, asyncio.Lock())

    async def admit(self, quota_name: str, ask: WorkloadAsk) -> Decision:
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(quota_name, []).append(_Pending(ask, future))
        if quota_name not in self._draining:
            self._draining.add(quota_name)
            task = asyncio.create_task(self._drain(quota_name))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _drain(self, quota_name: str) -> None:
        try:
            while batch := self._queues.pop(quota_name, None):
                try:
                    async with self.lock(quota_name):
                        await self._decide(quota_name, batch)
                except Exception as error:  # never leave a waiter hanging; each one reports it
                    for item in batch:
                        if not item.future.done():
                            item.future.set_exception(error)
        finally:
            self._draining.discard(quota_name)

    async def fresh(self, quota_name: str) -> dict[str, Any] | None:
        """The quota as the API server has it now (and remember it)."""
        raw = await self.api.get_quota(quota_name)
        if raw is None:
            self.cache.forget(quota_name)
        else:
            self.cache.offer(raw)
        return raw

    async def decide(
        self, quota_name: str, asks: list[WorkloadAsk]
    ) -> tuple[GpuQuota | None, GpuQuota | None, list[Decision]]:
        """(quota as read, quota with the allowed asks charged, decisions), from the cached copy unless
        it is missing or would deny something."""
        raw, fresh = self.cache.get(quota_name), False
        while True:
            if raw is None:
                raw, fresh = await self.fresh(quota_name), True
            quota, denied = self._parse(quota_name, raw)
            if quota is None:
                if not fresh:
                    raw = None
                    continue
                return None, None, [denied or _unavailable(quota_name, None)] * len(asks)
            updated, decisions = admit_many(quota, asks, self.clock())
            if fresh or not any(isinstance(d, Denied) for d in decisions):
                return quota, updated, decisions
            raw = None

    def parsed(self, raw: Mapping[str, Any]) -> GpuQuota:
        """`raw` parsed, from the copy kept by resourceVersion when it is the same version; raises
        QuotaSpecError for an invalid quota."""
        metadata = raw.get("metadata") or {}
        name, version = str(metadata.get("name") or ""), str(metadata.get("resourceVersion") or "")
        known = self._parsed.get(name)
        if version and known is not None and known[0] == version:
            return known[1]
        quota = quota_from_object(raw)
        if version:
            self._parsed[name] = (version, quota)
        return quota

    def _parse(self, quota_name: str, raw: Mapping[str, Any] | None) -> tuple[GpuQuota | None, Denied | None]:
        version = str(((raw or {}).get("metadata") or {}).get("resourceVersion") or "")
        known = self._parsed.get(quota_name)
        if raw is not None and version and known is not None and known[0] == version:
            return known[1], None
        quota, denied = parse_quota(quota_name, raw)
        if quota is None:
            self._parsed.pop(quota_name, None)
        elif version:
            self._parsed[quota_name] = (version, quota)
        return quota, denied

    def _remember(self, quota_name: str, written: Mapping[str, Any], updated: GpuQuota) -> None:
        """What we just wrote is what the next decision reads (unless the watch brings a newer copy):
        keep it parsed, so a busy quota is not parsed again from JSON after every write."""
        version = str((written.get("metadata") or {}).get("resourceVersion") or "")
        if version:
            self._parsed[quota_name] = (version, replace(updated, resource_version=version))

    async def _decide(self, quota_name: str, batch: list[_Pending]) -> None:
        started = time.monotonic()
        metrics.BATCH_SIZE.observe(len(batch))
        while True:
            quota, updated, decisions = await self.decide(quota_name, [item.ask for item in batch])
            try:
                if quota is not None and updated is not None and updated.status is not quota.status:
                    written = await self.api.replace_quota_status(
                        quota_name, quota.resource_version, status_to_object(updated.status)
                    )
                    self.cache.offer(written)
                    self._remember(quota_name, written, updated)
            except Conflict:
                metrics.STATUS_CONFLICTS.labels("webhook").inc()
                self.cache.forget(quota_name)  # the next round reads afresh
                if time.monotonic() - started > self.deadline_seconds:
                    for item in batch:
                        item.future.set_result(_unavailable(quota_name, "too many concurrent writes"))
                    return
                continue
            for item, decision in zip(batch, decisions, strict=True):
                item.future.set_result(decision)
            return


def _unavailable(quota_name: str, error: object) -> Denied:
    return Denied(
        message=f'GpuQuota "{quota_name}": could not reserve usage ({error}); try again',
        quota=quota_name,
        reason="ServiceUnavailable",
        code=503,
    )


def parse_quota(name: str, raw: Mapping[str, Any] | None) -> tuple[GpuQuota | None, Denied | None]:
    if raw is None:
        return None, Denied(f'GpuQuota "{name}" does not exist', quota=name, reason="NotFound", code=404)
    try:
        return quota_from_object(raw), None
    except QuotaSpecError as error:
        return None, Denied(f'GpuQuota "{name}" is invalid: {error}', quota=name, reason="Invalid", code=422)


async def read_quota(api: QuotaApi, name: str) -> tuple[GpuQuota | None, Denied | None]:
    return parse_quota(name, await api.get_quota(name))


async def claim_catalog(api: QuotaApi, namespace: str, obj: Mapping[str, Any]) -> ClaimCatalog:
    """Fetch the ResourceClaimTemplates and ResourceClaims a workload refers to."""
    refs = referenced_claims(obj)
    if not refs.templates and not refs.claims:
        return ClaimCatalog()

    async def usage_of(plural: str, name: str) -> tuple[str, Any]:
        raw = await api.get_claim(namespace, plural, name)
        if raw is None:
            return name, None
        spec = raw.get("spec") or {}
        if plural == "resourceclaimtemplates":
            spec = spec.get("spec") or {}
        return name, claim_usage(spec, f"{plural}/{name}.spec")

    templates = await asyncio.gather(*(usage_of("resourceclaimtemplates", n) for n in sorted(refs.templates)))
    claims = await asyncio.gather(*(usage_of("resourceclaims", n) for n in sorted(refs.claims)))
    return ClaimCatalog(
        templates={name: usage for name, usage in templates if usage is not None},
        claims={name: usage for name, usage in claims if usage is not None},
    )


@dataclass
class AdmissionHandlers:
    api: QuotaApi
    clock: Clock = utc_now
    # Watch-fed GpuQuotas (run by the caller); None: only this process's own writes are remembered.
    quota_cache: Informer | None = None
    writer: QuotaWriter = field(init=False)

    def __post_init__(self) -> None:
        self.writer = QuotaWriter(self.api, self.clock, quotas=self.quota_cache)

    async def _charge(self, request: AdmissionRequest, quota_name: str, ask: WorkloadAsk) -> Decision:
        if request.dry_run:  # decide, never write
            _, _, (decision,) = await self.writer.decide(quota_name, [ask])
            return decision
        return await self.writer.admit(quota_name, ask)

    async def _usage(
        self, request: AdmissionRequest, obj: Mapping[str, Any], *, replicas: int | None = None, strict: bool
    ) -> dict[str, Any]:
        catalog = await claim_catalog(self.api, request.namespace, obj)
        return dict(workload_usage(obj, catalog, replicas=replicas, strict_claims=strict).usage)

    async def workloads(self, request: AdmissionRequest) -> Decision:
        """CREATE/UPDATE of a Deployment, StatefulSet, ReplicaSet, Job, CronJob or Pod."""
        obj = request.object
        if obj is None or request.operation not in ("CREATE", "UPDATE"):
            return Allowed()
        quota_name = str(labels_of(obj).get(QUOTA_LABEL) or "")
        if not quota_name or is_controlled_by_workload(obj):
            return Allowed()
        obj = {"kind": request.kind, **obj}
        try:
            new = await self._usage(request, obj, strict=True)
        except WorkloadError as error:
            return Denied(
                f"{request.kind} {request.namespace}/{request.name}: {error}", reason="Invalid", code=422
            )
        old_usage: dict[str, Any] = {}
        old = request.old_object
        if (
            request.operation == "UPDATE"
            and old is not None
            and labels_of(old).get(QUOTA_LABEL) == quota_name
            and not is_controlled_by_workload(old)
        ):
            try:
                old_usage = await self._usage(request, {"kind": request.kind, **old}, strict=False)
            except WorkloadError:
                old_usage = {}
        delta = increase(old_usage, new)
        if request.operation == "UPDATE" and not delta:
            return Allowed()  # nothing more is taken; decreases are released by the controller
        name = request.name or str((obj.get("metadata") or {}).get("name") or "")
        if not name:  # generateName: the name is not known yet, the uid keeps reservations apart
            name = f"{(obj.get('metadata') or {}).get('generateName', '')}<{request.uid}>"
        ask = WorkloadAsk(
            request.uid,
            workload_ref(request.kind, request.namespace, name),
            delta,
            new,
            generation=generation_of(obj) or (1 if request.operation == "CREATE" else 0),
            # Set by the API server before validating admission, on create too.
            object_uid=str((obj.get("metadata") or {}).get("uid") or ""),
        )
        return await self._charge(request, quota_name, ask)

    async def scale(self, request: AdmissionRequest) -> Decision:
        """UPDATE of deployments/scale, statefulsets/scale, replicasets/scale (kubectl scale, HPA)."""
        kind = SCALE_KINDS.get(request.resource)
        if kind is None or request.sub_resource != "scale" or request.object is None:
            return Allowed()
        replicas = (request.object.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            return Allowed()  # the API server validates Scale objects itself
        workload = await self.api.get_object(kind, request.namespace, request.name)
        if workload is None:
            return Allowed()
        workload = {"kind": kind, **workload}
        quota_name = str(labels_of(workload).get(QUOTA_LABEL) or "")
        if not quota_name or is_controlled_by_workload(workload):
            return Allowed()
        try:
            new = await self._usage(request, workload, replicas=replicas, strict=True)
            old = await self._usage(request, workload, strict=False)
        except WorkloadError as error:
            return Denied(f"{kind} {request.namespace}/{request.name}: {error}", reason="Invalid", code=422)
        delta = increase(old, new)
        if not delta:
            return Allowed()
        ask = WorkloadAsk(
            request.uid,
            workload_ref(kind, request.namespace, request.name),
            delta,
            new,
            generation=generation_of(workload) + 1,  # a replica change bumps the generation
            # The Scale object carries its workload's uid; the workload read is the fallback.
            object_uid=str(
                (request.object.get("metadata") or {}).get("uid")
                or (workload.get("metadata") or {}).get("uid")
                or ""
            ),
        )
        return await self._charge(request, quota_name, ask)

    async def quotas(self, request: AdmissionRequest) -> Decision:
        """CREATE/UPDATE/DELETE of a GpuQuota: the tree rules."""
        try:
            new = quota_from_object(request.object) if request.object is not None else None
            old = quota_from_object(request.old_object) if request.old_object is not None else None
        except QuotaSpecError as error:
            return Denied(
                f'GpuQuota "{request.name}": {error}', quota=request.name, reason="Invalid", code=422
            )
        if request.operation == "DELETE":
            target = old or new
            if target is None:
                return Allowed()
            children = [item for item in await self.api.list_quotas() if _parent_of(item) == target.name]
            return admit_quota_delete(target, [str(c["metadata"]["name"]) for c in children])
        if new is None:
            return Allowed()
        now = self.clock()
        if request.operation == "CREATE":
            return await self._carve(
                request, new.parent, lambda parent: admit_quota_create(new, parent, request.uid, now)
            )
        if old is None:
            return Allowed()
        return await self._carve(
            request,
            new.parent or old.parent,
            lambda parent: admit_quota_update(old, new, parent, request.uid, now),
        )

    async def _carve(
        self, request: AdmissionRequest, parent_name: str, decide: Callable[[GpuQuota | None], Decision]
    ) -> Decision:
        """Decide against a fresh read of the parent and write its status with a resourceVersion
        precondition (under the parent's lock, so this process's admissions do not race it)."""
        if not parent_name:
            return decide(None)
        started = time.monotonic()
        async with self.writer.lock(parent_name):
            while True:
                parent, denied = parse_quota(parent_name, await self.writer.fresh(parent_name))
                if parent is None and denied is not None and denied.code != 404:
                    return denied
                decision = decide(parent)
                if not isinstance(decision, Allowed) or decision.status is None or request.dry_run:
                    return decision
                assert parent is not None
                try:
                    written = await self.api.replace_quota_status(
                        parent.name, parent.resource_version, status_to_object(decision.status)
                    )
                    self.writer.cache.offer(written)
                    return decision
                except Conflict:
                    metrics.STATUS_CONFLICTS.labels("webhook").inc()
                    if time.monotonic() - started > self.writer.deadline_seconds:
                        return _unavailable(parent.name, "too many concurrent writes")
                    await asyncio.sleep(random.uniform(0, 0.01))


def _parent_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("spec") or {}).get("parent") or "")


Handler = Callable[[AdmissionRequest], Awaitable[Decision]]


async def safely(handler: Handler, request: AdmissionRequest) -> Decision:
    """API failures become a denial that says so (failurePolicy only covers an unreachable webhook)."""
    try:
        return await handler(request)
    except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as error:
        log.warning(
            "admission %s of %s %s/%s failed: %s",
            request.uid,
            request.kind,
            request.namespace,
            request.name,
            error,
        )
        return Denied(
            f"gpuforge quota webhook could not check the quota: {error}", reason="InternalError", code=500
        )
