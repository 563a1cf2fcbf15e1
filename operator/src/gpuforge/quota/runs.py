"""Which pods ran for which quota, and when: what GPU-hour budgets are charged from. No I/O.

Accrual used to sample the pods that existed at each pass, so a pod that started and was deleted
between two passes (a short Job, a surge pod of a rolling update) was never charged, and one deleted
mid-way lost its last interval. `PodJournal` is fed every pod event instead (a watch of all pods) and
keeps, per quota, the pods that run and those that ended since the quota was last charged, with their
start and end from the pod's status (or, for a pod deleted while running, when its deletion was seen).
Each pass charges every run of a quota within [last charge, now) and then forgets the ended ones: every
GPU-second is charged once, however short the pod.

A pod's quota is decided while it runs (its owners may be gone by the time it is deleted: a Job deleted
with its pods goes first) and kept until it ends: a pod whose owner is deleted with
`--cascade=orphan` stays charged where it was, unless a label names another quota.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuforge.constants import GPU_MODEL_LABEL, QUOTA_LABEL
from gpuforge.quota.reconcile import pod_run_window
from gpuforge.quota.usage import charged_to_owner, quota_label, workload_controller

Obj = Mapping[str, Any]
# Finds a workload controller's object by (kind, namespace, name); None when it does not exist.
OwnerLookup = Callable[[str, str, str], Obj | None]
# The quota a workload at the top of a pod's controllers is charged to: the one it names, or its
# namespace's default quota ("" for none).
Charged = Callable[[Obj], str]
# How many controller levels a pod's charge is followed up (Pod -> ReplicaSet -> Deployment).
MAX_OWNER_DEPTH = 4

_KEPT_LABELS = (QUOTA_LABEL, GPU_MODEL_LABEL)
_KEPT_SPEC = ("nodeName", "containers", "initContainers", "overhead", "resources", "resourceClaims")
_KEPT_CONTAINER = ("name", "resources", "restartPolicy")


def run_part(pod: dict[str, Any]) -> dict[str, Any]:
    """What the journal's pod cache keeps of a pod: who it is and who owns it, what it requests, and when
    it started and finished. A watch of every pod in the cluster stays small this way."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    labels = metadata.get("labels") or {}
    kept_spec: dict[str, Any] = {key: spec[key] for key in _KEPT_SPEC if key in spec}
    for key in ("containers", "initContainers"):
        if key in kept_spec:
            kept_spec[key] = [
                {name: item[name] for name in _KEPT_CONTAINER if name in item}
                for item in kept_spec[key]
                if isinstance(item, Mapping)
            ]
    conditions = [
        {"type": item.get("type"), "lastTransitionTime": item.get("lastTransitionTime")}
        for item in status.get("conditions") or ()
        if isinstance(item, Mapping) and item.get("type") in ("PodScheduled", "Ready")
    ]
    finished = [
        {
            "state": {
                "terminated": {
                    "finishedAt": ((item.get("state") or {}).get("terminated") or {})["finishedAt"]
                }
            }
        }
        for item in status.get("containerStatuses") or ()
        if isinstance(item, Mapping) and ((item.get("state") or {}).get("terminated") or {}).get("finishedAt")
    ]
    kept_status: dict[str, Any] = {key: status[key] for key in ("phase", "startTime") if key in status}
    if conditions:
        kept_status["conditions"] = conditions
    if finished:
        kept_status["containerStatuses"] = finished
    return {
        "kind": "Pod",
        "metadata": {
            **{
                key: metadata[key]
                for key in ("name", "namespace", "uid", "resourceVersion")
                if key in metadata
            },
            "labels": {key: labels[key] for key in _KEPT_LABELS if key in labels},
            **({"ownerReferences": metadata["ownerReferences"]} if metadata.get("ownerReferences") else {}),
        },
        "spec": kept_spec,
        "status": kept_status,
    }


def charging_workload(pod: Obj, lookup: OwnerLookup, charged: Charged = quota_label) -> Obj | None:
    """The workload a pod's run time is charged to, as counting charges it (gpuforge.quota.usage): up
    its controllers (Pod -> ReplicaSet -> Deployment, Pod -> Job) while they exist, each one at the uid
    the reference names; a labelled pod whose controller is not charged to its quota pays itself. None
    when nothing on the way names a quota."""
    return _charging(pod, lookup, charged)[0]


def _charging(pod: Obj, lookup: OwnerLookup, charged: Charged = quota_label) -> tuple[Obj | None, bool]:
    """`charging_workload`, and whether a controller on the way was not found (not seen yet, or gone)."""
    current: Obj = {**pod, "kind": "Pod"}
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    for _ in range(MAX_OWNER_DEPTH):
        ref = workload_controller(current)
        owner = lookup(ref.kind, namespace, ref.name) if ref is not None else None
        owner_uid = str(((owner or {}).get("metadata") or {}).get("uid") or "")
        if ref is None or owner is None or (ref.uid and owner_uid and ref.uid != owner_uid):
            missing = ref is not None and owner is None
            return (current if charged(current) else None), missing
        if current.get("kind") == "Pod" and quota_label(current) and not charged_to_owner(current, owner):
            return current, False
        current = {**owner, "kind": ref.kind}
    return None, False


@dataclass(frozen=True)
class Run:
    """A pod charged to `quota`: the pod as the cache keeps it, and when its deletion was seen (None while
    it exists)."""

    quota: str
    pod: Obj
    deleted_at: datetime | None = None

    @property
    def window(self) -> tuple[datetime | None, datetime | None]:
        """When it held resources: from its status; a pod deleted while it ran ends at its deletion."""
        started, finished = pod_run_window(self.pod)
        if started is not None and finished is None and self.deleted_at is not None:
            finished = max(started, self.deleted_at)
        return started, finished


@dataclass
class PodJournal:
    """Pods charged to each quota, living and ended since the quota's last charge. Fed by pod events;
    read and drained by the usage controller's passes. One per leader term (a new leader starts afresh
    from the pods that exist)."""

    # Living pods by uid: the quota each is charged to (decided while its owners existed).
    _living: dict[str, Run] = field(default_factory=dict)
    # Pods that ended (were deleted) since their quota's last charge, by quota.
    _ended: dict[str, list[Run]] = field(default_factory=dict)
    # Pods charged to no quota yet whose controller was not found: the pod's watch can deliver it
    # before the owner's watch delivers the owner. Looked at again at each pass (`resolve`).
    _unresolved: dict[str, Obj] = field(default_factory=dict)

    def observe(
        self, event_type: str, pod: Obj, lookup: OwnerLookup, now: datetime, charged: Charged = quota_label
    ) -> str:
        """Take a pod event (ADDED, MODIFIED, DELETED); returns the quota it is charged to ("" if none)."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid:
            return ""
        known = self._living.get(uid)
        if event_type == "DELETED" and known is not None and not pod.get("spec"):
            pod = known.pod  # deleted while not watched: the last state seen
        workload, missing = _charging(pod, lookup, charged)
        quota = charged(workload) if workload is not None else ""
        quota = quota or (known.quota if known is not None else "")  # an orphan keeps its quota
        if missing and not quota and event_type != "DELETED":
            self._unresolved[uid] = pod
        else:
            self._unresolved.pop(uid, None)
        if event_type == "DELETED":
            self._living.pop(uid, None)
            if quota:
                self._ended.setdefault(quota, []).append(Run(quota, pod, deleted_at=now))
            return quota
        if quota:
            if known is not None and known.quota != quota:  # relabelled: the old quota was charged so far
                self._ended.setdefault(known.quota, []).append(Run(known.quota, known.pod, deleted_at=now))
            self._living[uid] = Run(quota, pod)
        return quota

    def resolve(self, lookup: OwnerLookup, now: datetime, charged: Charged = quota_label) -> None:
        """Decide the quota of pods whose controllers were not known when they were last seen."""
        for pod in list(self._unresolved.values()):
            self.observe("MODIFIED", pod, lookup, now, charged)

    def runs(self, quota: str) -> list[Run]:
        """Every pod to charge `quota` for: running or finished, and ended since the last drain."""
        living = [run for run in self._living.values() if run.quota == quota]
        return living + self._ended.get(quota, [])

    def runs_by_quota(self) -> dict[str, list[Run]]:
        result: dict[str, list[Run]] = {}
        for run in self._living.values():
            result.setdefault(run.quota, []).append(run)
        for quota, ended in self._ended.items():
            result.setdefault(quota, []).extend(ended)
        return result

    def drain(self, quota: str) -> None:
        """`quota` was charged up to now: its ended pods are accounted for."""
        self._ended.pop(quota, None)

    def forget_except(self, quotas: set[str]) -> None:
        """Drop ended pods of quotas that do not exist (nothing will charge them)."""
        for quota in [name for name in self._ended if name not in quotas]:
            del self._ended[quota]

    def clear(self) -> None:
        self._living.clear()
        self._ended.clear()
        self._unresolved.clear()

    def __len__(self) -> int:
        return len(self._living)

    @property
    def unresolved(self) -> int:
        """Pods waiting for their controllers to be known."""
        return len(self._unresolved)
