"""The usage controller: keeps the leader's ledger true to the workloads that exist, and leads its terms.

On workload and GpuQuota events (debounced) and on a full resync (default every 5 minutes) it takes
the labelled workloads from watch-fed caches, recomputes `used`/`selfUsed` with the pure core
(releasing reservations of requests that failed, settling those whose objects it sees), accrues
`cash/` budgets from the run time of pods since `lastReconcileTime` (every pod that ran, from a watch of
pods that runs while some quota holds a budget: gpuforge.quota.runs), and puts the result in the ledger,
which the write-behind writes to each quota's status. When a budget becomes spent it records an Event
and sets the budget metric; running pods are left alone, new workloads are denied by the webhook.

It also walks each leadership term through its start: wait out the previous leader's admissions (the
gate's `admit_from`), list quotas and workloads afresh, build the ledger from them, then admit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from decimal import Decimal
from typing import Any

import aiohttp

from gpuforge.api.gpuquota import (
    CONDITION_BUDGET_EXHAUSTED,
    KIND,
    REASON_BUDGET_EXHAUSTED,
    GpuQuota,
    GpuQuotaStatus,
    is_cash_key,
)
from gpuforge.constants import QUOTA_LABEL
from gpuforge.heap import Heap
from gpuforge.k8s.informer import TimeSlice
from gpuforge.k8s.quota import ApiError, ChangeHandler, Informer, QuotaApi, without_managed_fields
from gpuforge.quota.admission import charged_to_parent
from gpuforge.quota.convert import QuotaSpecError, quota_from_object, remaining, used_from_object
from gpuforge.quota.draextended import DeviceClassMap, device_class_map
from gpuforge.quota.leader import Role
from gpuforge.quota.ledger import Ledger
from gpuforge.quota.limitranges import ContainerDefaults, container_defaults
from gpuforge.quota.models import claim_products
from gpuforge.quota.reconcile import (
    DEFAULT_RESERVATION_TTL,
    PodRun,
    Seen,
    accrue,
    budget_window,
    children_of,
    recompute_status,
    settled_only,
    status_differs,
)
from gpuforge.quota.runs import PodJournal, run_part
from gpuforge.quota.tenancy import admit_namespace, default_quota, lineage
from gpuforge.quota.usage import (
    WORKLOAD_KINDS,
    ClaimCatalog,
    WorkloadError,
    WorkloadUsage,
    charged_quota,
    charged_to_owner,
    claim_usage,
    finish_status,
    generation_of,
    holds_nothing,
    is_controlled_by_workload,
    labels_of,
    pod_usage,
    quota_label,
    referenced_claims,
    rolling_out,
    rollout_status,
    workload_controller,
    workload_ref,
    workload_usage,
)
from gpuforge.webhook import metrics
from gpuforge.webhook.admission import Clock, utc_now
from gpuforge.webhook.leadership import Leadership
from gpuforge.webhook.writeback import WriteBehind

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]


def _key(obj: Obj, kind: str | None = None) -> tuple[str, str, str]:
    metadata = obj.get("metadata") or {}
    return (
        kind or str(obj.get("kind")),
        str(metadata.get("namespace") or ""),
        str(metadata.get("name") or ""),
    )


NAMESPACE = "Namespace"
LIMIT_RANGE = "LimitRange"
DEVICE_CLASS = "DeviceClass"
BY_NAMESPACE = "namespace"
BY_QUOTA = "quota"  # the workload caches' index: the quota a workload is charged to
BY_DEFAULTED = "defaulted"  # ... and the namespace of those its namespace's default quota is charged for


def _quota_of(obj: Obj) -> str | None:
    return quota_label(obj) or None


def _quota_index(kind: str) -> Callable[[Obj], str | None]:
    return lambda obj: _quota_of({"kind": kind, **obj})


# Any non-empty name: whether a workload would be charged to a namespace's default quota.
_SOME_DEFAULT = "-"


def _defaulted(obj: Obj) -> bool:
    """Names no quota, yet would be charged to its namespace's default one (it takes GPUs and no
    workload controller made it)."""
    return not quota_label(obj) and bool(charged_quota(obj, _SOME_DEFAULT))


def _defaulted_index(kind: str) -> Callable[[Obj], str | None]:
    """The workload caches' second index: the namespace of a workload its namespace's default quota
    would be charged for (which quota that is, the namespace decides, and can change)."""
    return lambda obj: _namespace_of(obj) if _defaulted({"kind": kind, **obj}) else None


def _selector(kind: str) -> str | None:
    """Pods are watched by their label; other workloads may carry it on their pod template only, which
    no label selector reaches, so they are watched whole and those naming no quota kept as a stub."""
    return QUOTA_LABEL if kind == "Pod" else None


def _kept_part(kind: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def kept(obj: dict[str, Any]) -> dict[str, Any]:
        typed = {"kind": kind, **obj}
        if _quota_of(typed) is None and not _defaulted(typed):
            metadata = obj.get("metadata") or {}
            names = ("name", "namespace", "uid", "resourceVersion", "generation", "ownerReferences")
            return {"metadata": {key: metadata[key] for key in names if key in metadata}}
        return counted_part(obj)

    return kept


def _namespace_of(obj: Obj) -> str | None:
    return str((obj.get("metadata") or {}).get("namespace") or "") or None


def counted_part(obj: dict[str, Any]) -> dict[str, Any]:
    """What a workload cache keeps: metadata and spec, which counting and scale admission read. Status
    (rewritten with every pod that starts) and managedFields are most of an object and count for
    nothing; dropping them keeps the leader's heap, and so the cyclic GC's pauses, small."""
    kept = {key: value for key, value in without_managed_fields(obj).items() if key != "status"}
    typed = {"kind": obj.get("kind"), **obj}
    # A terminal pod or a finished Job releases its charge; a Deployment's rollout charges its surge.
    status = {**finish_status(typed), **rollout_status(typed)}
    if status:
        kept["status"] = status
    return kept


def _controller_owner(obj: Obj) -> tuple[str, str] | None:
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if owner.get("controller"):
            return str(owner.get("kind")), str(owner.get("name"))
    return None


POD_RUNS = "PodRuns"  # the task watching every pod for the journal


def _pod_name_only(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata") or {}
    kept = {key: metadata[key] for key in ("name", "namespace", "uid", "resourceVersion") if key in metadata}
    return {"kind": "Pod", "metadata": kept}


def namespace_labels_only(obj: dict[str, Any]) -> dict[str, Any]:
    """What the namespaces' cache keeps: the name and labels tenancy decisions read."""
    metadata = obj.get("metadata") or {}
    kept = {key: metadata[key] for key in ("name", "labels", "resourceVersion", "uid") if key in metadata}
    return {"kind": "Namespace", "metadata": kept}


@dataclass
class Snapshot:
    """What exists, as far as quotas care: labelled workloads and their claims."""

    workloads: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    catalogs: dict[str, ClaimCatalog] = field(default_factory=dict)


@dataclass
class UsageController:
    api: QuotaApi
    leadership: Leadership
    writer: WriteBehind
    clock: Clock = utc_now
    resync_seconds: float = 300.0
    # How often budgets accrue; a test shortens it together with `speedup`.
    accrual_seconds: float = 60.0
    # Wall time multiplier for budgets: 3600 makes a second of a running GPU count as one GPU-hour.
    speedup: float = 1.0
    reservation_ttl: timedelta = DEFAULT_RESERVATION_TTL
    # Events within this window are handled by one recompute (a burst of creates is one pass).
    debounce_seconds: float = 1.0
    # A change that only drops settled reservations (used stays the same) is put off until this many
    # are due or the oldest has waited this long: else every create would cost a second status write.
    settle_batch: int = 16
    settle_seconds: float = 15.0
    _dirty: asyncio.Event = field(default_factory=asyncio.Event)
    # Objects seen deleted (ref -> (generation, uid)), so their reservations settle without the TTL; and
    # when each was seen, oldest first, to forget them after the TTL. Kept as `recompute_status` reads
    # it: a pass hands the same mapping to every quota (a copy per quota cost a pass O(quotas x deleted)).
    _deleted: dict[str, Seen] = field(default_factory=dict)
    _deleted_at: dict[str, float] = field(default_factory=dict)
    # What each watched object last counted with: (generation, quota label, whether it holds nothing,
    # whether a rolling update's surge is counted).
    _seen: dict[str, tuple[int, str, bool, bool]] = field(default_factory=dict)
    # Set when a pass put off dropping settled reservations: the next pass comes within settle_seconds.
    _settles_deferred: bool = False
    _workloads: dict[str, Informer] = field(default_factory=dict)
    quotas: Informer = field(init=False)
    # Namespaces' labels, which decide which namespaces may charge a quota (watched by every replica).
    namespaces: Informer = field(init=False)
    # DeviceClasses: which of them serves an extended resource (DRA), charged both ways.
    device_classes: Informer = field(init=False)
    # LimitRanges: their container defaults are counted as the pods will get them.
    limit_ranges: Informer = field(init=False)
    # Every pod (trimmed to what run time needs), feeding `journal` on the leader: budgets are charged
    # for each pod that ran, however short, not only for those a pass happens to see. Watched only
    # while some quota holds a budget: nothing else reads it, and without budgets a cluster's pods
    # (their events, their memory) cost the leader nothing.
    pods: Informer = field(init=False)
    journal: PodJournal = field(default_factory=PodJournal)
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # Quotas an event may have changed since the last pass: a pass after events recomputes only these
    # (and quotas holding reservations); a pass after a quiet period (resync, accrual) recomputes all.
    _dirty_quotas: set[str] = field(default_factory=set)
    # Usage of each workload by its resourceVersion: most events leave most workloads unchanged.
    _usages: dict[tuple[str, str, str], tuple[str, WorkloadUsage]] = field(default_factory=dict)
    # Whether each workload refers to DRA claims, by its resourceVersion.
    _claims: dict[tuple[str, str, str], tuple[str, bool]] = field(default_factory=dict)
    _background: set[asyncio.Task[None]] = field(default_factory=set)
    # Each namespace's default quota as last seen (a change recounts the quotas it moves usage between).
    _defaults: dict[str, str] = field(default_factory=dict)
    # The spec.hard keys each quota's metric series were exported for (removed with the quota or key).
    _exported: dict[str, set[str]] = field(default_factory=dict)
    # Set by the process's entry point (not by tests that run the webhook inside their own process):
    # the heap is settled after each pass (gpuforge.heap).
    heap: Heap | None = None

    def __post_init__(self) -> None:
        self.quotas = Informer(self.api, KIND, transform=without_managed_fields)
        self.namespaces = Informer(self.api, NAMESPACE, transform=namespace_labels_only)
        self.limit_ranges = Informer(
            self.api, LIMIT_RANGE, transform=without_managed_fields, indexes={BY_NAMESPACE: _namespace_of}
        )
        self.device_classes = Informer(self.api, DEVICE_CLASS, transform=without_managed_fields)
        self.device_classes.listeners.append(self._device_classes_changed)
        self._workloads = {
            kind: Informer(
                self.api,
                kind,
                _selector(kind),
                transform=_kept_part(kind),
                indexes={BY_QUOTA: _quota_index(kind), BY_DEFAULTED: _defaulted_index(kind)},
            )
            for kind in WORKLOAD_KINDS
        }
        for kind, informer in self._workloads.items():
            informer.listeners.append(self._listener(kind))
        # The store keeps names only; the journal keeps what a run needs.
        self.pods = Informer(self.api, "Pod", transform=_pod_name_only)
        self.pods.listeners.append(self._pod_changed)
        self.quotas.listeners.append(self._listener(KIND))
        self.namespaces.listeners.append(self._namespace_changed)
        self.writer.on_reload = self.recount
        self.leadership.listeners.append(self.poke)  # a pass ends at once when its term does

    def container_defaults(self, namespace: str) -> ContainerDefaults:
        """The LimitRange defaults of `namespace`, from the watch cache."""
        return container_defaults(self.limit_ranges.store.indexed(BY_NAMESPACE, [namespace]))

    def device_class_map(self) -> DeviceClassMap:
        """Which DeviceClass serves which extended resource, from the watch cache."""
        return device_class_map(self.device_classes.store.values())

    def _device_classes_changed(self, _event_type: str, _obj: Obj) -> None:
        self._usages.clear()  # usage remembered by resourceVersion may charge another class now
        self._dirty_quotas.update(self.ledger.names() if self.leadership.holds_ledger() else ())
        self.poke()

    def _catalog_of(self, snap: Snapshot, namespace: str) -> ClaimCatalog:
        return replace(snap.catalogs.get(namespace) or ClaimCatalog(), device_classes=self.device_class_map())

    @property
    def workload_caches(self) -> Mapping[str, Informer]:
        """Labelled workloads by kind (watch-fed)."""
        return self._workloads

    @property
    def ledger(self) -> Ledger:
        return self.leadership.ledger

    def poke(self) -> None:
        self._dirty.set()

    def default_of(self, namespace: str) -> str:
        """The default quota of `namespace` that may charge it (the tenancy rules of its lineage, as
        in admission), from the watch caches; "" when it names none or one that does not admit it."""
        cached = self.namespaces.get(namespace)
        labels = labels_of(cached) if cached is not None else {}
        name = default_quota(labels)
        if not name:
            return ""
        chain = lineage(name, self.ledger.quota)
        if not chain or admit_namespace(chain, namespace, labels, "") is not None:
            return ""
        return name

    def _charged(self, obj: Obj, namespace: str) -> str:
        return quota_label(obj) or (charged_quota(obj, self.default_of(namespace)) if _defaulted(obj) else "")

    def _namespace_changed(self, event_type: str, obj: Obj) -> None:
        """A namespace's default quota changed: its defaulted workloads move between quotas."""
        name = str((obj.get("metadata") or {}).get("name") or "")
        before = self._defaults.pop(name, "")
        now = "" if event_type == "DELETED" else default_quota(labels_of(obj))
        if now:
            self._defaults[name] = now
        if before != now and self.leadership.holds_ledger():
            self._dirty_quotas.update({before, now} - {""})
            self.poke()

    def _owner(self, kind: str, namespace: str, name: str) -> Obj | None:
        informer = self._workloads.get(kind)
        return informer.get(name, namespace) if informer is not None else None

    def _charged_top(self, obj: Obj) -> str:
        """The quota the top of a pod's controllers is charged to (the pod journal asks)."""
        return self._charged(obj, _namespace_of(obj) or "")

    def _pod_changed(self, event_type: str, obj: Obj) -> None:
        self.journal.observe(event_type, run_part(dict(obj)), self._owner, self.clock(), self._charged_top)

    def _saw_deleted(self, ref: str, seen: Seen) -> None:
        self._deleted[ref] = seen
        self._deleted_at.pop(ref, None)  # (re-inserted: the oldest stay first)
        self._deleted_at[ref] = asyncio.get_running_loop().time()

    def _forget_deleted(self, horizon: float) -> None:
        """Forget deletions seen before `horizon`: their reservations have expired by now."""
        while self._deleted_at:
            ref, seen_at = next(iter(self._deleted_at.items()))
            if seen_at > horizon:
                break
            del self._deleted_at[ref]
            self._deleted.pop(ref, None)

    def recount(self, name: str) -> None:
        """Count `name` again at the next pass (its object was replaced)."""
        self._dirty_quotas.add(name)
        self.poke()

    def _listener(self, kind: str) -> ChangeHandler:
        def changed(event_type: str, obj: Obj) -> None:
            _, namespace, name = _key(obj, kind)
            ref = workload_ref(kind, namespace, name)
            label = self._charged({"kind": kind, **obj}, namespace) if kind != KIND else ""
            previous = self._seen.get(ref)
            if kind == KIND:  # a quota's own hard, and its parent's carve-out of it
                touched = {name, str((obj.get("spec") or {}).get("parent") or "")}
                self._quota_changed(event_type, name, obj)
            else:  # the quota it is charged to, and the one it was charged to before
                touched = {label, previous[1] if previous is not None else ""}
            if event_type == "DELETED":
                self._seen.pop(ref, None)
                self._usages.pop((kind, namespace, name), None)
                self._claims.pop((kind, namespace, name), None)
                uid = str((obj.get("metadata") or {}).get("uid") or "")
                self._saw_deleted(ref, (generation_of(obj), uid))
                if touched - {""}:
                    self._dirty_quotas.update(touched - {""})
                    self.poke()
                return
            if not touched - {""}:
                return  # a workload that names no quota, and never did while watched
            # Status-only updates (a Deployment's ready count, our own status writes) change nothing
            # quotas count; only spec (generation), the quota label, a pod or Job finishing, and a
            # Deployment's rolling update starting or ending (its surge) do.
            typed = {"kind": kind, **obj}
            state = (generation_of(obj), label, holds_nothing(typed), rolling_out(typed))
            if previous is not None and previous[1] and previous[1] != label:
                # Relabelled: gone from its old quota as if deleted, which settles the reservations
                # held there for it (else they would hold its usage until they expire).
                uid = str((obj.get("metadata") or {}).get("uid") or "")
                self._saw_deleted(ref, (generation_of(obj), uid))
            if previous != state:
                self._seen[ref] = state
                self._dirty_quotas.update(touched - {""})
                self.poke()

        return changed

    def _quota_changed(self, event_type: str, name: str, obj: Obj) -> None:
        """Keep the ledger's spec in step with the watch (its status is the ledger's own); a follower
        shows the usage the leader writes."""
        if event_type == "DELETED":  # its series go with it, on every replica
            for key in self._exported.pop(name, set()):
                _drop_series(name, key)
            with contextlib.suppress(KeyError):
                metrics.QUOTA_RECONCILED.remove(name)
        if not self.leadership.holds_ledger():
            if event_type != "DELETED":
                self._export_written(obj)
            return
        if event_type == "DELETED":
            self.ledger.forget(name)
            return
        try:
            if self.ledger.observe(quota_from_object(obj, with_status=False)):
                return
            self.ledger.load(quota_from_object(obj))  # new here, or deleted and created again
        except QuotaSpecError as error:
            log.warning("GpuQuota %s is invalid (%s): admissions to it are denied", name, error)
            self.ledger.forget(name)

    async def run(self) -> None:
        """Watch quotas; lead each term this replica gets, watching workloads meanwhile; reconcile.

        Workloads and GpuQuotas come from watch-fed caches (list once, then watch), so a reconcile costs
        no list calls. A follower watches quotas only (to show the usage the leader writes): a new
        leader lists everything afresh anyway."""
        self._tasks[KIND] = asyncio.create_task(self.quotas.run())
        self._tasks[NAMESPACE] = asyncio.create_task(self.namespaces.run())
        self._tasks[LIMIT_RANGE] = asyncio.create_task(self.limit_ranges.run())
        self._tasks[DEVICE_CLASS] = asyncio.create_task(self.device_classes.run())
        try:
            await self.quotas.synced.wait()
            while True:
                gate = self.leadership.gate
                if gate.role is Role.FOLLOWER or not gate.leads(self.leadership.now()):
                    await self.leadership.changed()
                    continue
                try:
                    await self._lead(gate.term)
                finally:
                    await self._stop_watching_workloads()
        finally:
            for task in (*self._tasks.values(), *self._background):
                task.cancel()
            await asyncio.gather(*self._tasks.values(), *self._background, return_exceptions=True)

    async def _lead(self, term: int) -> None:
        """One term: wait out the previous leader, read everything afresh, then reconcile while it lasts."""
        leadership = self.leadership
        while leadership.current(term, Role.WAITING):
            left = leadership.gate.admit_from - leadership.now()
            if left <= 0:
                leadership.syncing(term)
                break
            await leadership.changed(timeout=left)
        while leadership.current(term, Role.SYNCING):
            try:
                await self._rebuild(term)
            except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as error:
                log.warning("reading quotas and workloads afresh failed, retrying: %s", error)
                await asyncio.sleep(1.0)
                continue
            leadership.synced(term)
        loop = asyncio.get_running_loop()
        full, last_full = False, loop.time()  # the rebuild was a full pass
        while leadership.current(term, Role.ADMITTING, Role.STOPPING):
            self._dirty.clear()
            self._settles_deferred = False
            has_budgets = await self._reconcile_logged(full)
            self._settle_heap()
            period = self.resync_seconds
            if has_budgets:  # budgets accrue on a tick, events or not
                period = min(period, self.accrual_seconds)
            wait = max(0.0, last_full + period - loop.time())
            if self._settles_deferred:
                wait = min(wait, self.settle_seconds)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):  # (not wait_for: on 3.11 it can swallow a cancel)
                    await self._dirty.wait()
            await asyncio.sleep(self.debounce_seconds)
            full = loop.time() - last_full >= period
            if full:
                last_full = loop.time()

    async def _rebuild(self, term: int) -> None:
        """The ledger of a new term, from quotas and workloads listed afresh: every reservation the
        previous leader wrote, and every object it admitted, is in what these lists return."""
        await self._relist()
        if not self.leadership.current(term, Role.SYNCING):
            return
        self.ledger.clear()
        for raw in self.quotas.store.values():
            try:
                self.ledger.load(quota_from_object(raw))
            except QuotaSpecError as error:
                log.warning("GpuQuota %s is invalid (%s): admissions to it are denied", _key(raw)[2], error)
        self._dirty_quotas.clear()
        await self.reconcile_all()
        self._settle_heap(thaw=True)

    def _settle_heap(self, thaw: bool = False) -> None:
        """Collect what the last pass left and freeze the rest (`gpuforge.heap`): with the watch caches of
        a few thousand workloads one automatic full collection paused the event loop, and every
        admission waiting on it, for 40-180 ms. Everything is thawed and collected in one pause at each
        term's start and then every `resync_seconds`."""
        if self.heap is not None:
            self.heap.settle(thaw=thaw)

    async def _relist(self) -> None:
        """(Re)start every informer: each lists its kind with a consistent read, then watches from there.
        The pods' watch starts afterwards, at the first pass that finds a budget (`_watch_pods`): the
        journal decides each pod's quota from its owners, which must be known."""
        await self._watch_pods(False)
        for kind, informer in (*self._workloads.items(), (KIND, self.quotas)):
            await self._stop(kind)
            informer.synced.clear()
            self._tasks[kind] = asyncio.create_task(informer.run())
        for informer in (*self._workloads.values(), self.quotas):
            await informer.synced.wait()
        if NAMESPACE in self._tasks:  # the namespaces' default quotas, watched since the process began
            await self.namespaces.synced.wait()

    async def _watch_pods(self, budgets: bool) -> None:
        """Watch every pod while some quota holds a budget, and only then. A pod that starts and ends
        between a budget's creation and the pass that starts the watch (the debounce, milliseconds) is
        not charged; a pod that runs on is charged from the budget's first accrual."""
        watching = POD_RUNS in self._tasks
        if budgets and self.leadership.holds_ledger():  # (a count finishing after its term starts none)
            if not watching:
                self.pods.synced.clear()
                self._tasks[POD_RUNS] = asyncio.create_task(self.pods.run())
                metrics.PODS_WATCHED.set(1)
            await self.pods.synced.wait()  # a pass accrues from the journal once it holds every pod
        elif not budgets and watching:
            await self._stop(POD_RUNS)
            self.pods.synced.clear()
            self.journal.clear()
            metrics.PODS_WATCHED.set(0)

    async def _stop(self, kind: str) -> None:
        task = self._tasks.pop(kind, None)
        if task is not None:
            task.cancel()
            await asyncio.wait([task])  # (a cancellation of this task itself still goes through)

    async def _stop_watching_workloads(self) -> None:
        for kind, informer in (*self._workloads.items(), (POD_RUNS, self.pods)):
            await self._stop(kind)
            informer.synced.clear()
        self.journal.clear()
        metrics.PODS_WATCHED.set(0)

    async def count(self, name: str) -> None:
        """Count `name` from the workloads now (a quota this leader has not recomputed yet)."""
        await self.reconcile_all({name}, only_named=True)

    async def _reconcile_logged(self, full: bool = True) -> bool:
        dirty, self._dirty_quotas = self._dirty_quotas, set()
        try:
            with metrics.RECONCILE_PASS.labels("all" if full else "touched").time():
                return await self.reconcile_all(None if full else dirty, resync=full)
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as error:
            metrics.RECONCILES.labels("error").inc()
            log.warning("usage reconcile failed, retrying soon: %s", error)
            self._dirty_quotas |= dirty
            await asyncio.sleep(1.0)
            self.poke()
            return True

    async def _list_workloads(self, quotas: set[str] | None) -> dict[str, list[dict[str, Any]]]:
        """Labelled workloads by kind (those charged to `quotas`, or all): from the watch caches when
        running, else listed."""
        defaulting = sorted(
            namespace
            for namespace in self._defaults
            if (quota := self.default_of(namespace)) and (quotas is None or quota in quotas)
        )
        if all(informer.synced.is_set() for informer in self._workloads.values()):
            if quotas is None:
                return {
                    kind: [
                        *(item for item in informer.store.values() if _quota_index(kind)(item)),
                        *informer.store.indexed(BY_DEFAULTED, defaulting),
                    ]
                    for kind, informer in self._workloads.items()
                }
            return {
                kind: [
                    *informer.store.indexed(BY_QUOTA, sorted(quotas)),
                    *informer.store.indexed(BY_DEFAULTED, defaulting),
                ]
                for kind, informer in self._workloads.items()
            }
        lists = await asyncio.gather(
            *(self.api.list_objects(kind, label_selector=_selector(kind)) for kind in WORKLOAD_KINDS)
        )
        result: dict[str, list[dict[str, Any]]] = {}
        for kind, items in zip(WORKLOAD_KINDS, lists, strict=True):
            result[kind] = []
            for item in items:
                charged = self._charged({"kind": kind, **item}, _namespace_of(item) or "")
                if charged and (quotas is None or charged in quotas):
                    result[kind].append(item)
        return result

    def _uses_claims(self, key: tuple[str, str, str], obj: Obj) -> bool:
        """Does the workload refer to ResourceClaims or templates? Remembered by resourceVersion."""
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        known = self._claims.get(key)
        if version and known is not None and known[0] == version:
            return known[1]
        refs = referenced_claims(obj)
        uses = bool(refs.templates or refs.claims)
        if version:
            self._claims[key] = (version, uses)
        return uses

    async def snapshot(self, quotas: set[str] | None = None) -> Snapshot:
        """What exists of the workloads charged to `quotas` (None: all)."""
        snap = Snapshot()
        pace = TimeSlice()
        for kind, items in (await self._list_workloads(quotas)).items():
            for item in items:  # informers set `kind`; a listed item may lack it
                obj = item if item.get("kind") == kind else {**item, "kind": kind}
                if not is_controlled_by_workload(obj) or (kind == "Pod" and not self._pod_owner_pays(obj)):
                    snap.workloads[_key(obj, kind)] = obj
                if pace.spent():
                    await pace.pause()
        # Claims are read only where some workload refers to them (most use device-plugin requests).
        with_claims = sorted({key[1] for key, obj in snap.workloads.items() if self._uses_claims(key, obj)})
        for namespace in with_claims:
            snap.catalogs[namespace] = await self._catalog(namespace)
        return snap

    def _pod_owner_pays(self, pod: Obj) -> bool:
        """Whether a pod that names a controller is charged to it: the controller is among the labelled
        workloads, at that uid, with the pod's quota (else the pod is counted itself, as admitted)."""
        ref = workload_controller(pod)
        if ref is None:
            return False
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        owner = self._workloads[ref.kind].get(ref.name, namespace) if ref.kind in self._workloads else None
        return charged_to_owner(pod, owner)

    async def _catalog(self, namespace: str) -> ClaimCatalog:
        try:
            templates = await self.api.list_claims(namespace, "resourceclaimtemplates")
            claims = await self.api.list_claims(namespace, "resourceclaims")
        except ApiError:  # an API server without resource.k8s.io
            return ClaimCatalog()

        def usage(items: Sequence[Obj], nested: bool) -> dict[str, Any]:
            result = {}
            for item in items:
                spec = item.get("spec") or {}
                try:
                    result[str(item["metadata"]["name"])] = claim_usage(
                        spec.get("spec") or {} if nested else spec
                    )
                except WorkloadError:
                    continue
            return result

        def products(items: Sequence[Obj], nested: bool) -> dict[str, tuple[frozenset[str], ...]]:
            result = {}
            for item in items:
                spec = item.get("spec") or {}
                held = claim_products(spec.get("spec") or {} if nested else spec)
                result[str(item["metadata"]["name"])] = held
            return result

        return ClaimCatalog(
            templates=usage(templates, True),
            claims=usage(claims, False),
            template_products=products(templates, True),
            claim_products=products(claims, False),
        )

    def _runs(self, snap: Snapshot) -> dict[str, list[PodRun]]:
        """Run time of every pod the journal charges to a quota: living, finished, and ended since the
        quota's last charge."""
        runs: dict[str, list[PodRun]] = {}
        self.journal.resolve(self._owner, self.clock(), self._charged_top)
        for quota, items in self.journal.runs_by_quota().items():
            for run in items:
                started, finished = run.window
                if started is None:
                    continue
                pod = run.pod
                namespace = str((pod.get("metadata") or {}).get("namespace") or "")
                try:
                    per_pod, _ = pod_usage(
                        pod.get("spec") or {},
                        catalog=snap.catalogs.get(namespace),
                        strict_claims=False,
                    )
                except WorkloadError:
                    continue
                runs.setdefault(quota, []).append(PodRun(per_pod, started, finished))
        return runs

    async def reconcile_all(
        self, only: set[str] | None = None, *, only_named: bool = False, resync: bool = False
    ) -> bool:
        """Recompute every quota in the ledger once, or (`only`) those named and (unless `only_named`)
        those holding reservations due to expire or settle; a periodic `resync` writes every quota it
        recomputes, changed or not (its lastReconcileTime). Returns whether any quota has a budget
        (accrual needs ticks). Only the workloads charged to the quotas recomputed are read, and the
        loop is handed back every TIME_SLICE_SECONDS of work: a pass never holds up admissions for long."""
        has_budgets = any(is_cash_key(key) for quota in self.ledger.quotas() for key in quota.hard)
        await self._watch_pods(has_budgets)
        now = self.clock()
        self.ledger.expire(now)
        if only is not None and not only_named:
            # Besides the quotas events touched, a pass takes those holding a reservation old enough to
            # expire or whose put-off settling is due.
            due_age = min(2 * self.settle_seconds, self.reservation_ttl.total_seconds())
            only = only | {
                quota.name
                for quota in self.ledger.quotas()
                if any((now - item.created).total_seconds() >= due_age for item in quota.status.reservations)
            }
        snap = await self.snapshot(quotas=only)
        usages: dict[str, list[WorkloadUsage]] = {}
        # A full pass keeps the usage of the workloads that exist, so the cache drops the others.
        usage_cache = {} if only is None else self._usages
        pace = TimeSlice()
        for key, obj in snap.workloads.items():
            if pace.spent():
                await pace.pause()
            default = self.default_of(key[1]) if _defaulted(obj) else ""
            # The usage of a workload its namespace's default quota is charged for depends on that too.
            version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            version = f"{version}/{default}" if version and default else version
            known = self._usages.get(key)
            if version and known is not None and known[0] == version:
                usage = known[1]
            else:
                try:
                    usage = workload_usage(
                        obj,
                        self._catalog_of(snap, key[1]),
                        strict_claims=False,
                        defaults=self.container_defaults(key[1]),
                        default_quota=default,
                    )
                except WorkloadError as error:
                    log.warning("cannot count %s/%s: %s", obj.get("kind"), key[2], error)
                    continue
            if version and not self._uses_claims(key, obj):  # claims can change underneath
                usage_cache[key] = (version, usage)
            usages.setdefault(usage.quota, []).append(usage)
        if only is None:
            self._usages = usage_cache
            self._claims = {key: known for key, known in self._claims.items() if key in snap.workloads}
        runs = self._runs(snap) if has_budgets else {}
        self._forget_deleted(asyncio.get_running_loop().time() - self.reservation_ttl.total_seconds())
        children = children_of(self.ledger.quotas())
        for name in self.ledger.names():
            quota = self.ledger.quota(name)
            if quota is None or (only is not None and name not in only):
                continue
            # Each quota is read and changed in one go, so admissions decided meanwhile are part of
            # what is recomputed; between quotas, waiting admissions go first.
            self._apply(
                quota, children.get(name, []), usages.get(name, []), runs.get(name, []), resync=resync
            )
            self.journal.drain(name)  # charged up to now (or holding no budget): ended pods are done
            if pace.spent():
                await pace.pause()
        if only is None:
            self.journal.forget_except(set(self.ledger.names()))
        return has_budgets

    def _apply(
        self,
        quota: GpuQuota,
        children: list[GpuQuota],
        usages: list[WorkloadUsage],
        runs: list[PodRun],
        *,
        resync: bool = False,
    ) -> None:
        """Recompute `quota` (the ledger's copy) and put the result in the ledger to be written. A full
        resync writes it even unchanged: its lastReconcileTime then says the controller looked."""
        now = self.clock()
        since, period_start, refilled = budget_window(
            quota.refill, quota.status.last_refill_time, quota.status.last_reconcile_time, now, self.speedup
        )
        accrued = accrue(runs, since, now, self.speedup) if runs else {}
        status = recompute_status(
            quota,
            children,
            usages,
            accrued,
            now,
            self.reservation_ttl,
            self._deleted,
            period_start=period_start,
            refilled=refilled,
        )
        metrics.QUOTA_RECONCILED.labels(quota.name).set(now.timestamp())
        budgets = any(is_cash_key(key) for key in quota.hard)
        if not budgets and (not status_differs(quota.status, status) or self._defer_settling(quota, status)):
            metrics.RECONCILES.labels("unchanged").inc()
            # A resync stamps the time on the status as it stands (settling put off stays put off).
            stamped = replace(quota.status, last_reconcile_time=now) if resync else None
            self.ledger.recomputed(quota.name, stamped)
            if stamped is not None:
                self.writer.poke()
            self._export(quota.name, quota.hard, quota.status.used)
            return
        self.ledger.recomputed(quota.name, status)
        self.writer.poke()
        if quota.parent and charged_to_parent(quota) != charged_to_parent(quota, status.used):
            # A child above its hard charges its parent what it uses: the parent follows at once.
            self._dirty_quotas.add(quota.parent)
            self.poke()
        metrics.RECONCILES.labels("changed").inc()
        self._export(quota.name, quota.hard, status.used)
        if _budget_became_spent(quota, status):
            task = asyncio.create_task(self._announce_budget(quota, status))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _defer_settling(self, quota: GpuQuota, status: GpuQuotaStatus) -> bool:
        """Put off a write that would only drop a few recently settled reservations."""
        dropped = settled_only(quota.status, status)
        if not dropped or len(dropped) >= self.settle_batch:
            return False
        oldest = min(item.created for item in dropped)
        if (self.clock() - oldest).total_seconds() >= 2 * self.settle_seconds:
            return False
        self._settles_deferred = True
        return True

    def _export_written(self, obj: Obj) -> None:
        try:  # spec and `used` only: a follower sees every status write the leader makes
            quota = quota_from_object(obj, with_status=False)
            used = used_from_object(obj)
        except QuotaSpecError:
            return  # a quota the webhook refused to parse has no usage to show
        self._export(quota.name, quota.hard, used)

    def _export(self, name: str, hard: Mapping[str, Decimal], used: Mapping[str, Decimal]) -> None:
        left = remaining(hard, used)
        for key in self._exported.get(name, set()) - set(hard):  # a key taken out of spec.hard
            _drop_series(name, key)
        self._exported[name] = set(hard)
        for key, amount in hard.items():
            metrics.QUOTA_HARD.labels(name, key).set(float(amount))
            metrics.QUOTA_USED.labels(name, key).set(float(used.get(key, Decimal(0))))
            metrics.QUOTA_REMAINING.labels(name, key).set(float(left[key]))
            if is_cash_key(key):
                metrics.BUDGET_EXHAUSTED.labels(name, key).set(
                    1.0 if used.get(key, Decimal(0)) >= amount else 0.0
                )

    async def _announce_budget(self, quota: GpuQuota, status: GpuQuotaStatus) -> None:
        spent = next(c for c in status.conditions if c.type == CONDITION_BUDGET_EXHAUSTED)
        await self.api.record_event(
            quota_name=quota.name,
            quota_uid=quota.uid,
            reason=REASON_BUDGET_EXHAUSTED,
            message=f"Budget spent; {spent.message}. Running workloads keep running.",
        )


def _drop_series(quota: str, key: str) -> None:
    for gauge in (metrics.QUOTA_HARD, metrics.QUOTA_USED, metrics.QUOTA_REMAINING, metrics.BUDGET_EXHAUSTED):
        with contextlib.suppress(KeyError):
            gauge.remove(quota, key)


def _budget_became_spent(before: GpuQuota, after: GpuQuotaStatus) -> bool:
    def spent(conditions: Sequence[Any]) -> bool:
        return any(c.type == CONDITION_BUDGET_EXHAUSTED and c.status == "True" for c in conditions)

    return spent(after.conditions) and not spent(before.status.conditions)
