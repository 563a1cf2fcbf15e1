"""Admission handlers of the leader: turn an AdmissionRequest into a decision from the in-memory ledger.

A workload is charged to its quota in the ledger (gpuforge.quota.ledger) and answered at once; the
write-behind (gpuforge.webhook.writeback) writes the reservation to the quota's status afterwards. Only
the leader decides (gpuforge.webhook.leadership); until it has built its ledger, and once it cannot
write for longer than `stall_seconds`, it denies with a message saying to try again. Dry-run requests
are decided and never recorded. A child quota's carve-out is decided the same way and written before
the answer (quotas change rarely; a user who creates a child sees its parent's usage at once).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from gpuforge.api.gpuquota import KIND, PLURAL, GpuQuota
from gpuforge.api.workloadkinds import WORKLOAD_KINDS as KIND_TABLE
from gpuforge.constants import DEFAULT_QUOTA_LABEL, GROUP, QUOTA_LABEL
from gpuforge.k8s.quota import ApiError, Informer, QuotaApi
from gpuforge.quota.admission import (
    ROOT_VERB,
    Allowed,
    Decision,
    Denied,
    WorkloadAsk,
    admit_quota_create,
    admit_quota_delete,
    admit_quota_update,
    charging_workloads,
    hard_keys_denied,
    needs_root_permission,
    root_denied,
)
from gpuforge.quota.convert import QuotaSpecError, quota_from_object
from gpuforge.quota.draextended import DeviceClassMap
from gpuforge.quota.ledger import Ledger
from gpuforge.quota.limitranges import ContainerDefaults
from gpuforge.quota.models import claim_products, claimed_model_problem
from gpuforge.quota.tenancy import admit_namespace, default_quota, needs_labels, quota_required
from gpuforge.quota.usage import (
    WORKLOAD_KINDS,
    ClaimCatalog,
    OwnerRef,
    WorkloadError,
    WorkloadUsage,
    charged_quota,
    charged_to_owner,
    claim_usage,
    cronjob_label_unreached,
    generation_of,
    gpu_model_of,
    increase,
    is_controlled_by_workload,
    labels_of,
    pod_template,
    quota_label,
    quota_label_conflict,
    referenced_claims,
    resize_quota,
    rolling_out,
    starts_rollout,
    takes_gpus,
    workload_controller,
    workload_ref,
    workload_usage,
)
from gpuforge.webhook.leadership import Leadership
from gpuforge.webhook.review import AdmissionRequest
from gpuforge.webhook.writeback import WriteBehind

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
# An admitted object is stored within this long (webhook timeout 5 s + --persist-seconds 5 s).
UNSTORED_SECONDS = 10.0
UNSTORED = timedelta(seconds=UNSTORED_SECONDS)
# Workload kinds by the plural of their scale subresource (`deployments/scale`, `rollouts/scale`, ...).
SCALE_KINDS = {kind.plural: kind.kind for kind in KIND_TABLE if kind.scale_path}


def utc_now() -> datetime:
    return datetime.now(UTC)


def unavailable(message: str) -> Denied:
    return Denied(f"gpuforge quota webhook: {message}; try again", reason="ServiceUnavailable", code=503)


def parse_quota(name: str, raw: Mapping[str, Any] | None) -> tuple[GpuQuota | None, Denied | None]:
    if raw is None:
        return None, Denied(f'GpuQuota "{name}" does not exist', quota=name, reason="NotFound", code=404)
    try:
        return quota_from_object(raw), None
    except QuotaSpecError as error:
        return None, Denied(f'GpuQuota "{name}" is invalid: {error}', quota=name, reason="Invalid", code=422)


async def claim_catalog(api: QuotaApi, namespace: str, obj: Mapping[str, Any]) -> ClaimCatalog:
    """Fetch the ResourceClaimTemplates and ResourceClaims a workload refers to."""
    refs = referenced_claims(obj)
    if not refs.templates and not refs.claims:
        return ClaimCatalog()

    async def usage_of(plural: str, name: str) -> tuple[str, Any, tuple[frozenset[str], ...]]:
        raw = await api.get_claim(namespace, plural, name)
        if raw is None:
            return name, None, ()
        spec = raw.get("spec") or {}
        if plural == "resourceclaimtemplates":
            spec = spec.get("spec") or {}
        return name, claim_usage(spec, f"{plural}/{name}.spec"), claim_products(spec)

    templates = await asyncio.gather(*(usage_of("resourceclaimtemplates", n) for n in sorted(refs.templates)))
    claims = await asyncio.gather(*(usage_of("resourceclaims", n) for n in sorted(refs.claims)))
    return ClaimCatalog(
        templates={name: usage for name, usage, _ in templates if usage is not None},
        claims={name: usage for name, usage, _ in claims if usage is not None},
        template_products={name: held for name, usage, held in templates if usage is not None},
        claim_products={name: held for name, usage, held in claims if usage is not None},
    )


def trivially_allowed(request: AdmissionRequest, default: str | None = "") -> bool:
    """Requests any replica may allow without the ledger: workloads that name no quota (on the object
    or its pod template) and are not charged to their namespace's default quota (`default`: "" for
    none, None when not known here), that a workload controller owns (charged to their owner), or that
    are not created or updated. A pod that names a controller is not, nor is a pod's resize: any pod can claim
    an owner, and whether it exists is for the leader to see."""
    if request.kind == "GpuQuota" or request.sub_resource in ("scale", "resize"):
        return False
    obj = request.object
    if obj is None or request.operation not in ("CREATE", "UPDATE"):
        return True
    typed = {"kind": request.kind, **obj}
    if not quota_label(typed):
        # Allowed, unless its namespace requires a quota (any replica can tell: required) or charges
        # it to a default quota; a namespace the cache does not hold yet is for the leader to read.
        return default is not None and not charged_quota(typed, default)
    return request.kind != "Pod" and is_controlled_by_workload(obj)


@dataclass
class AdmissionHandlers:
    api: QuotaApi
    leadership: Leadership
    writer: WriteBehind
    # Counts a quota from the workloads (the usage controller), for a quota new to the ledger.
    count: Callable[[str], Awaitable[None]]
    # Labelled workloads by kind, from the controller's watch caches (the scale webhook reads them).
    workload_caches: Mapping[str, Informer]
    clock: Clock = utc_now
    # An admission waiting this long to be written means the leader cannot write: it stops admitting.
    stall_seconds: float = 2.0
    # Namespaces' labels (watch-fed), for which namespaces may charge a quota; None: read each time.
    namespaces: Informer | None = None
    # A namespace's LimitRange defaults (watch-fed), filled into templates before they are counted.
    container_defaults: Callable[[str], ContainerDefaults] = lambda _namespace: ContainerDefaults()
    # Which DeviceClass serves which extended resource (watch-fed), charged both ways.
    device_classes: Callable[[], DeviceClassMap] = DeviceClassMap

    @property
    def ledger(self) -> Ledger:
        return self.leadership.ledger

    def cached_default_quota(self, namespace: str) -> str | None:
        """The namespace's default quota from the watch cache ("" for none; None when not cached). Without
        a namespace watch (handlers built for one request path, as in tests) no namespace has one."""
        if self.namespaces is None:
            return ""
        cached = self.namespaces.get(namespace)
        return default_quota(labels_of(cached)) if cached is not None else None

    async def _default_for(self, request: AdmissionRequest, obj: Mapping[str, Any]) -> str:
        """The namespace's default quota when `obj` names none ("" otherwise): watch-fed, read only
        for a namespace the cache has not seen yet."""
        if quota_label(obj):
            return ""
        return default_quota(await self._namespace_labels(request.namespace))

    def _refusal(self, quota_name: str) -> Denied | None:
        """Why no admission to `quota_name` may be decided now (None: it may)."""
        refusal = self.leadership.refusal()
        if refusal is not None:
            return unavailable(refusal)
        stalled = self.writer.stalled(quota_name, self.stall_seconds)
        if stalled is not None:
            error = self.writer.last_error(quota_name)
            return unavailable(
                f'admissions to GpuQuota "{quota_name}" of the last {stalled:.1f}s are not written to the '
                f"API server yet{f' ({error})' if error else ''}"
            )
        return None

    async def _ensure(self, quota_name: str) -> Decision | None:
        """The quota in the ledger and counted (None), or why it cannot be: missing or invalid. A quota
        new to this leader (just created, its watch event not here yet) is read and counted first."""
        term = self.leadership.gate.term
        if quota_name not in self.ledger:
            raw = await self.api.get_quota(quota_name)
            quota, denied = parse_quota(quota_name, raw)
            if quota is None:
                return denied
            if self.leadership.gate.term != term or not self.leadership.holds_ledger():
                return unavailable("the GpuQuota leader changed")
            if quota_name not in self.ledger:
                self.ledger.load(quota)
        if not self.ledger.counted(quota_name):
            await self.count(quota_name)
        return None

    def _lineage(self, quota_name: str) -> list[GpuQuota]:
        """The quota and its ancestors, nearest first, as the ledger holds them."""
        lineage: list[GpuQuota] = []
        name = quota_name
        while name and len(lineage) < 64 and all(item.name != name for item in lineage):
            quota = self.ledger.quota(name)
            if quota is None:
                break
            lineage.append(quota)
            name = quota.parent
        return lineage

    async def _namespace_labels(self, namespace: str) -> Mapping[str, str]:
        """The namespace's labels from the watch cache; read only when the cache has not seen it yet
        (a namespace created a moment ago)."""
        cached = self.namespaces.get(namespace) if self.namespaces is not None else None
        if cached is None:
            cached = await self.api.get_object("Namespace", "", namespace)
        return labels_of(cached) if cached is not None else {}

    async def _tenancy(self, namespace: str, quota_name: str, workload: str) -> Denied | None:
        """Whether `namespace` may charge `quota_name` (and its ancestors allow it)."""
        lineage = self._lineage(quota_name)
        if not lineage:
            return None  # _ensure found it; a quota deleted meanwhile is refused by the ledger
        labels = await self._namespace_labels(namespace) if needs_labels(lineage) else {}
        kind, _, rest = workload.partition("/")
        return admit_namespace(lineage, namespace, labels, f"{kind} {rest}")

    async def _charge(self, request: AdmissionRequest, quota_name: str, ask: WorkloadAsk) -> Decision:
        refusal = self._refusal(quota_name)
        if refusal is not None:
            return refusal
        missing = await self._ensure(quota_name)
        if missing is not None:
            return missing
        tenancy = await self._tenancy(request.namespace, quota_name, ask.workload)
        if tenancy is not None:
            return tenancy
        # From here to the answer nothing waits: the decision and the charge are one step.
        refusal = self._refusal(quota_name)
        if refusal is not None:
            return refusal
        if request.dry_run:  # decide, never record
            return self.ledger.decide(quota_name, ask, self.clock())
        decision: Decision = self.ledger.admit(quota_name, ask, self.clock(), self.writer.clock.monotonic())
        if isinstance(decision, Allowed) and decision.status is not None:
            self.writer.poke()
        return decision

    async def _usage(
        self,
        request: AdmissionRequest,
        obj: Mapping[str, Any],
        *,
        replicas: int | None = None,
        strict: bool,
        surge: bool | None = None,
    ) -> WorkloadUsage:
        catalog = replace(
            await claim_catalog(self.api, request.namespace, obj), device_classes=self.device_classes()
        )
        defaults = self.container_defaults(request.namespace)
        return workload_usage(
            obj, catalog, replicas=replicas, strict_claims=strict, defaults=defaults, surge=surge
        )

    async def workloads(self, request: AdmissionRequest) -> Decision:
        """CREATE/UPDATE of a workload of a kind in gpuforge.api.workloadkinds, and a pod's resize
        (`pods/resize`, which changes a running pod's requests in place)."""
        unnamed = await self.required(request)
        if unnamed is not None:
            return unnamed
        if request.object is None or request.operation not in ("CREATE", "UPDATE"):
            return Allowed()
        obj = {"kind": request.kind, **request.object}
        default = await self._default_for(request, obj)
        if trivially_allowed(request, default):
            return Allowed()
        where = f"{request.kind} {request.namespace}/{request.name}"
        conflict = quota_label_conflict(obj) or cronjob_label_unreached(obj)
        if conflict:
            return Denied(f"{where}: {conflict}", reason="Invalid", code=422)
        resize = request.sub_resource == "resize"
        quota_name = resize_quota(obj, default) if resize else charged_quota(obj, default)
        if not quota_name:
            return Allowed()  # a resize of a pod that names no quota and takes no GPU there
        if not resize and not quota_label(obj) and request.kind == "Pod" and workload_controller(obj) is None:
            # The usage controller watches pods by their label: an unlabelled bare pod would go uncounted.
            return Denied(
                f"{where}: a Pod that takes GPUs in namespace {request.namespace!r} is charged to its "
                f"default GpuQuota {quota_name!r} ({DEFAULT_QUOTA_LABEL}); a bare Pod must carry the "
                f"label itself: {QUOTA_LABEL}={quota_name}",
                quota=quota_name,
                key=QUOTA_LABEL,
                reason="Invalid",
                code=422,
            )
        owner_ref = workload_controller(obj) if request.kind == "Pod" and not resize else None
        if owner_ref is not None and charged_to_owner(obj, await self._owner(request.namespace, owner_ref)):
            return Allowed()  # made by a workload charged to the same quota
        old = {"kind": request.kind, **request.old_object} if request.old_object is not None else None
        # A Deployment's update that rolls its pods runs surge pods above replicas: they are charged
        # with it (a create rolls nothing; the stored status cannot tell yet, so it is decided here).
        surge = request.operation == "UPDATE" and old is not None and starts_rollout(old, obj)
        try:
            counted = await self._usage(request, obj, strict=True, surge=surge)
        except WorkloadError as error:
            return Denied(f"{where}: {error}", reason="Invalid", code=422)
        claimed = claimed_model_problem(gpu_model_of(obj, pod_template(obj)), counted.placement)
        if claimed:
            return Denied(f"{where}: {claimed}", reason="Invalid", code=422)
        new = dict(counted.usage)
        old_usage: dict[str, Any] = {}
        old_placement = None
        if (
            request.operation == "UPDATE"
            and old is not None
            and (
                resize_quota(old, default)
                if resize
                else charged_quota(old, "" if quota_label(old) else default)
            )
            == quota_name
            and (request.kind == "Pod" or not is_controlled_by_workload(old))
        ):
            try:
                old_counted = await self._usage(request, old, strict=False)
                old_usage, old_placement = dict(old_counted.usage), old_counted.placement
            except WorkloadError:
                old_usage = {}
        delta = increase(old_usage, new)
        if request.operation == "UPDATE" and not delta and old_placement == counted.placement:
            # Nothing more is taken (decreases are released by the controller), nor moved elsewhere: a
            # change of placement is checked, since it may leave the model a quota needs unproven.
            return Allowed()
        name = request.name or str((obj.get("metadata") or {}).get("name") or "")
        if not name:  # generateName: the name is not known yet, the uid keeps reservations apart
            name = f"{(obj.get('metadata') or {}).get('generateName', '')}<{request.uid}>"
        generation = generation_of(obj) or (1 if request.operation == "CREATE" else 0)
        ask = WorkloadAsk(
            request.uid,
            workload_ref(request.kind, request.namespace, name),
            delta,
            new,
            generation=generation,
            # Set by the API server before validating admission, on create too.
            object_uid=str((obj.get("metadata") or {}).get("uid") or ""),
            unset={} if resize else counted.unset,
            placement=counted.placement,
            surge_pods=counted.surge_pods,
            surge=counted.surge,
        )
        return await self._charge(request, quota_name, ask)

    async def required(self, request: AdmissionRequest) -> Decision | None:
        """A workload that names no quota, created or changed in a namespace that requires one: refused
        if it takes GPUs, else allowed. None for every other request. Needs no ledger (the namespace's
        labels are watch-fed on every replica), so a follower decides it too."""
        obj = request.object
        if obj is None or request.sub_resource or request.operation not in ("CREATE", "UPDATE"):
            return None
        obj = {"kind": request.kind, **obj}
        if quota_label(obj) or is_controlled_by_workload(obj):
            return None
        where = f"{request.kind} {request.namespace}/{request.name}"
        try:
            gpus = takes_gpus(obj)
        except WorkloadError as error:
            return Denied(f"{where}: {error}", reason="Invalid", code=422)
        labels = await self._namespace_labels(request.namespace) if gpus else {}
        if gpus and default_quota(labels):
            return None  # charged to the namespace's default quota
        return quota_required(request.namespace, labels, where, gpus) or Allowed()

    async def _owner(self, namespace: str, ref: OwnerRef) -> Mapping[str, Any] | None:
        """The controller a pod names, from the labelled workloads' cache (a controller charged to a
        quota is there); read when the cache does not have it at that uid (a forged reference, an
        unlabelled owner, or one the watch has not delivered yet)."""
        cache = self.workload_caches.get(ref.kind)
        cached = cache.get(ref.name, namespace) if cache is not None else None
        if cached is not None and (not ref.uid or (cached.get("metadata") or {}).get("uid") == ref.uid):
            return cached
        return await self.api.get_object(ref.kind, namespace, ref.name)

    async def _scaled(self, kind: str, request: AdmissionRequest) -> dict[str, Any] | None:
        """The workload a scale request changes, as it is now: the watch cache's copy when it is the very
        version the request was made against (the old Scale carries the workload's resourceVersion),
        else read. A copy that lags would charge against an old replica count and generation."""
        current = str(((request.old_object or {}).get("metadata") or {}).get("resourceVersion") or "")
        cache = self.workload_caches.get(kind)
        cached = cache.get(request.name, request.namespace) if cache is not None else None
        cached_version = (cached.get("metadata") or {}).get("resourceVersion") if cached is not None else None
        if cached is not None and current and cached_version == current:
            return dict(cached)
        return await self.api.get_object(kind, request.namespace, request.name)

    async def scale(self, request: AdmissionRequest) -> Decision:
        """UPDATE of a workload's scale subresource, `deployments/scale` and the like (kubectl scale, HPA)."""
        kind = SCALE_KINDS.get(request.resource)
        if kind is None or request.sub_resource != "scale" or request.object is None:
            return Allowed()
        replicas = (request.object.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            return Allowed()  # the API server validates Scale objects itself
        workload = await self._scaled(kind, request)
        if workload is None:
            return Allowed()
        workload = {"kind": kind, **workload}
        quota_name = charged_quota(workload, await self._default_for(request, workload))
        if not quota_name or is_controlled_by_workload(workload):
            return Allowed()
        try:
            # A rolling update keeps running at the new size, its surge resolved against it.
            counted = await self._usage(
                request, workload, replicas=replicas, strict=True, surge=rolling_out(workload)
            )
            old = (await self._usage(request, workload, strict=False)).usage
        except WorkloadError as error:
            return Denied(f"{kind} {request.namespace}/{request.name}: {error}", reason="Invalid", code=422)
        delta = increase(old, counted.usage)
        if not delta:
            return Allowed()
        new = counted.usage
        ask = WorkloadAsk(
            request.uid,
            workload_ref(kind, request.namespace, request.name),
            delta,
            new,
            generation=generation_of(workload) + 1,  # a replica change bumps the generation
            unset=counted.unset,
            placement=counted.placement,
            surge_pods=counted.surge_pods,
            surge=counted.surge,
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
            names = [str(c["metadata"]["name"]) for c in children]
            if names:
                return admit_quota_delete(target, names)
            return admit_quota_delete(target, [], await self._charging(target.name))
        if new is None:
            return Allowed()
        bad_keys = hard_keys_denied(new, old)
        if bad_keys is not None:
            return bad_keys
        if needs_root_permission(old, new) and not await self.api.may(
            request.user_info,
            {"verb": ROOT_VERB, "group": GROUP, "resource": PLURAL, "name": new.name},
        ):
            return root_denied(new.name, request.user, creating=old is None)
        now = self.clock()
        if request.operation == "CREATE":
            return await self._carve(
                request, new.parent, lambda parent: admit_quota_create(new, parent, request.uid, now)
            )
        if old is None:
            return Allowed()
        child_quotas: list[GpuQuota] = []
        if set(new.hard) - set(old.hard):  # keys added: every child must hold them already
            for item in await self.api.list_quotas():
                if _parent_of(item) != new.name:
                    continue
                try:
                    child_quotas.append(quota_from_object(item, with_status=False))
                except QuotaSpecError:  # unreadable: holds no key, so it is named as lacking
                    name = str((item.get("metadata") or {}).get("name") or "")
                    child_quotas.append(GpuQuota(name=name, parent=new.name, hard={}))
        # What the parent counts of this quota is its hard or, where larger, its usage: the ledger's.
        known = self.ledger.quota(new.name) if self.leadership.holds_ledger() else None
        used = known.status.used if known is not None else None
        decision = await self._carve(
            request,
            new.parent or old.parent,
            lambda parent: admit_quota_update(
                old, new, parent, request.uid, now, children=child_quotas, used=used
            ),
        )
        changed = isinstance(decision, Allowed) and not request.dry_run and new.hard != old.hard
        if changed and self.leadership.holds_ledger():  # a lower hard binds before the watch brings it
            self.ledger.lower(new.name, new.hard, new.generation, now + UNSTORED)
        return decision

    async def _charging(self, quota_name: str) -> list[str]:
        """Workloads that charge `quota_name` now, from a fresh list (quotas are deleted rarely), and
        those the leader admitted moments ago, which may not be stored yet (an admitted object is
        stored within the webhook timeout plus the API server's persist time; older reservations
        belong to objects the list shows, or to requests that failed)."""
        lists = await asyncio.gather(
            *(
                self.api.list_objects(kind, label_selector=f"{QUOTA_LABEL}={quota_name}")
                for kind in WORKLOAD_KINDS
            )
        )
        objects = [
            {"kind": kind, **item}
            for kind, items in zip(WORKLOAD_KINDS, lists, strict=True)
            for item in items
        ]
        refs = set(charging_workloads(quota_name, objects))
        known = self.ledger.quota(quota_name) if self.leadership.holds_ledger() else None
        for reservation in known.status.reservations if known is not None else ():
            fresh = (self.clock() - reservation.created).total_seconds() < UNSTORED_SECONDS
            if fresh and not reservation.workload.startswith(f"{KIND}//"):
                refs.add(reservation.workload)
        return sorted(refs)

    async def _carve(
        self, request: AdmissionRequest, parent_name: str, decide: Callable[[GpuQuota | None], Decision]
    ) -> Decision:
        """Decide a child's carve-out against the parent in the ledger; charge it there and write it
        before answering."""
        if not parent_name:
            return decide(None)
        refusal = self._refusal(parent_name)
        if refusal is not None:
            return refusal
        missing = await self._ensure(parent_name)
        if isinstance(missing, Denied) and missing.code != 404:
            return missing
        refusal = self._refusal(parent_name)
        if refusal is not None:
            return refusal
        decision = decide(self.ledger.quota(parent_name, self.clock()))
        if not isinstance(decision, Allowed) or decision.status is None or request.dry_run:
            return decision
        self.ledger.charge(parent_name, decision.status, self.writer.clock.monotonic())
        if not await self.writer.flush([parent_name]):
            # Held in the ledger all the same (a retry of this create replaces it, never adds to it).
            return unavailable(f'the carve-out from GpuQuota "{parent_name}" could not be written yet')
        return decision


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
