"""Planner inputs from plain Kubernetes objects (JSON-like dicts, camelCase as the API serves them). No I/O.

`gpuforge.k8s` lists the objects; the operator and the `gpuforge status`/`plan` commands both turn them into
a `Snapshot` here, and `spec.upgradePolicy` into a `Policy`. Nothing here talks to a cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from gpuforge.constants import COMPONENT_LABEL, DRA_DRIVER_GPU, is_gpu_resource
from gpuforge.upgrade.labelselector import LabelSelector, SelectorError
from gpuforge.upgrade.model import (
    COMPONENTS,
    Drain,
    GpuNode,
    IntOrPercent,
    Mode,
    OnFailure,
    OperandPod,
    PodDeletion,
    PodRef,
    Policy,
    Snapshot,
    StepTimeouts,
    WaitForCompletion,
    WorkloadPod,
)
from gpuforge.upgrade.planner import Weight, weight_of

_T = TypeVar("_T")
_MODE_OF_COMPONENT = {component: mode for mode, component in COMPONENTS.items()}
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
VERSION_LABEL = "app.kubernetes.io/version"
REVISION_LABEL = "controller-revision-hash"


class PolicyError(ValueError):
    """spec.upgradePolicy does not fit; the message names the field."""


# --- Snapshot ----------------------------------------------------------------------------------------


class ConversionMemo:
    """Conversions of single objects kept from one snapshot to the next: an object with the same uid and
    resourceVersion converts to the same value, so a caller that builds a snapshot every pass from a
    watch-fed cache converts only what changed. Holds what the last two snapshots used, no more."""

    def __init__(self) -> None:
        self._items: dict[tuple[Any, ...], Any] = {}
        self._previous: dict[tuple[Any, ...], Any] = {}

    def next_snapshot(self) -> None:
        """Forget what the snapshot before the last one used (objects since changed or gone)."""
        self._previous, self._items = self._items, {}

    def __len__(self) -> int:
        return len(self._items) + len(self._previous)

    def get(self, obj: Mapping[str, Any], tag: tuple[Any, ...], make: Callable[[], _T]) -> _T:
        metadata = obj.get("metadata") or {}
        version = metadata.get("resourceVersion")
        if not version:
            return make()
        key = (*tag, metadata.get("uid") or metadata.get("name"), version)
        if key in self._items:
            found: _T = self._items[key]
            return found
        value: _T = self._previous[key] if key in self._previous else make()
        self._items[key] = value
        return value


def _node_base(node: Mapping[str, Any]) -> dict[str, Any]:
    # Labels and annotations are the Node's own dicts, not copies: nothing changes a converted node in
    # place, and the watch-fed cache replaces an object on change, so sharing them costs no memory per
    # snapshot and per memo (a copy of each for every node of the cluster).
    return {
        "labels": _labels(node),
        "annotations": _get(node, "metadata", "annotations") or {},
        "kubelet_version": _get(node, "status", "nodeInfo", "kubeletVersion") or "",
        "ready": _condition(node, "Ready"),
        "unschedulable": bool(_get(node, "spec", "unschedulable")),
        "gpu_capacity": _gpu_count(_get(node, "status", "capacity")),
        "gpu_allocatable": _gpu_count(_get(node, "status", "allocatable")),
    }


def snapshot_from_objects(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]] = (),
    *,
    now: datetime,
    claims: Iterable[Mapping[str, Any]] = (),
    served_resource_versions: Collection[str] = ("v1",),
    names: Collection[str] | None = None,
    dra_driver: str = DRA_DRIVER_GPU,
    memo: ConversionMemo | None = None,
) -> Snapshot:
    """Build the planner's snapshot. `nodes`: Node objects (only those in `names`, if given, are kept);
    `pods`: pods on those nodes (operand pods are recognised by gpuforge.io/component); `slices`:
    ResourceSlices; `claims`: ResourceClaims, to see which pods hold an allocated GPU claim. `memo`
    (optional) reuses conversions of unchanged objects from earlier calls."""
    memo = memo if memo is not None else ConversionMemo()
    memo.next_snapshot()
    wanted = set(names) if names is not None else None
    claim_holders = _claim_holders(claims, dra_driver)
    operands: dict[str, list[OperandPod]] = {}
    workloads: dict[str, list[WorkloadPod]] = {}
    for pod in pods:
        node_name = _get(pod, "spec", "nodeName")
        if not node_name or (wanted is not None and node_name not in wanted):
            continue
        if _get(pod, "status", "phase") in _TERMINAL_PHASES:
            continue
        component = _labels(pod).get(COMPONENT_LABEL, "")
        if component in _MODE_OF_COMPONENT:
            mode = _MODE_OF_COMPONENT[component]
            operand = memo.get(pod, ("operand", mode), partial(_operand, pod, mode))
            operands.setdefault(node_name, []).append(operand)
        else:
            holds = (_get(pod, "metadata", "uid") or "") in claim_holders
            workload = memo.get(pod, ("workload", holds), partial(_workload, pod, claim_holders))
            workloads.setdefault(node_name, []).append(workload)
    advertised: dict[str, dict[str, tuple[int, int]]] = {}
    for item in slices:
        node_name = _get(item, "spec", "nodeName")
        driver = _get(item, "spec", "driver")
        if not node_name or not driver:
            continue
        count, devices = advertised.setdefault(node_name, {}).get(driver, (0, 0))
        advertised[node_name][driver] = (count + 1, devices + len(_get(item, "spec", "devices") or ()))
    gpu_nodes = []
    for node in nodes:
        name = _get(node, "metadata", "name")
        if not name or (wanted is not None and name not in wanted):
            continue
        base = memo.get(node, ("node",), partial(_node_base, node))
        gpu_nodes.append(
            GpuNode(
                name=name,
                labels=base["labels"],
                annotations=base["annotations"],
                kubelet_version=base["kubelet_version"],
                ready=base["ready"],
                unschedulable=base["unschedulable"],
                gpu_capacity=base["gpu_capacity"],
                gpu_allocatable=base["gpu_allocatable"],
                slices=advertised.get(name, {}),
                operands=tuple(sorted(operands.get(name, ()), key=lambda p: p.ref.name)),
                pods=tuple(sorted(workloads.get(name, ()), key=lambda p: (p.ref.namespace, p.ref.name))),
            )
        )
    gpu_nodes.sort(key=lambda n: n.name)
    return Snapshot(tuple(gpu_nodes), now, frozenset(served_resource_versions))


def admission_facts(node: Mapping[str, Any], memo: ConversionMemo | None = None) -> GpuNode:
    """A Node object as a GpuNode without pods, operands or advertisement: what
    `gpuforge.upgrade.planner.weighs_on_admission` and the maxUnavailable count read, without grouping
    every pod of the cluster (to pick the few nodes a freed slot is weighed on)."""
    base = memo.get(node, ("node",), partial(_node_base, node)) if memo is not None else _node_base(node)
    return GpuNode(
        name=_get(node, "metadata", "name") or "",
        labels=base["labels"],
        annotations=base["annotations"],
        kubelet_version=base["kubelet_version"],
        ready=base["ready"],
        unschedulable=base["unschedulable"],
    )


def admission_weight(node: Mapping[str, Any]) -> Weight | None:
    """A Node object's `Weight` on admission (None: it does not weigh), read in place: cheap enough to
    run on every watch event of every Node."""
    facts = GpuNode(
        name=_get(node, "metadata", "name") or "",
        labels=_labels(node),
        annotations=_get(node, "metadata", "annotations") or {},
        ready=_condition(node, "Ready"),
        unschedulable=bool(_get(node, "spec", "unschedulable")),
    )
    return weight_of(facts)


def _get(obj: Mapping[str, Any] | None, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _get(obj, "metadata", "labels") or {}


def _condition(obj: Mapping[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in _get(obj, "status", "conditions") or ()
    )


def _quantity(value: Any) -> int:
    """Extended resources are integers; anything else counts as 0."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def _gpu_count(resources: Mapping[str, Any] | None) -> int:
    return sum(_quantity(v) for k, v in (resources or {}).items() if is_gpu_resource(k))


def _ref(pod: Mapping[str, Any]) -> PodRef:
    return PodRef(_get(pod, "metadata", "namespace") or "default", _get(pod, "metadata", "name") or "")


def _operand(pod: Mapping[str, Any], mode: Mode) -> OperandPod:
    labels = _labels(pod)
    containers = _get(pod, "spec", "containers") or []
    image = containers[0].get("image", "") if containers else ""
    version = labels.get(VERSION_LABEL) or (
        image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
    )
    return OperandPod(
        ref=_ref(pod),
        mode=mode,
        version=version,
        revision=labels.get(REVISION_LABEL, ""),
        ready=_condition(pod, "Ready"),
        phase=_get(pod, "status", "phase") or "",
        deleting=bool(_get(pod, "metadata", "deletionTimestamp")),
    )


def _workload(pod: Mapping[str, Any], claim_holders: set[str]) -> WorkloadPod:
    owners = _get(pod, "metadata", "ownerReferences") or []
    spec = _get(pod, "spec") or {}
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    requests_gpu = any(
        is_gpu_resource(name)
        for c in containers
        for section in ("requests", "limits")
        for name in ((c.get("resources") or {}).get(section) or {})
    )
    holds_claim = (_get(pod, "metadata", "uid") or "") in claim_holders
    annotations = _get(pod, "metadata", "annotations") or {}
    return WorkloadPod(
        ref=_ref(pod),
        labels=_labels(pod),
        uses_gpu=requests_gpu or holds_claim,
        holds_claim=holds_claim,
        daemonset=any(o.get("kind") == "DaemonSet" for o in owners) or _MIRROR_ANNOTATION in annotations,
        controlled=any(o.get("controller") for o in owners),
        empty_dir=any("emptyDir" in v for v in spec.get("volumes") or []),
        deleting=bool(_get(pod, "metadata", "deletionTimestamp")),
    )


def _claim_holders(claims: Iterable[Mapping[str, Any]], driver: str) -> set[str]:
    """UIDs of pods that a ResourceClaim allocated from `driver` is reserved for."""
    holders: set[str] = set()
    for claim in claims:
        results = _get(claim, "status", "allocation", "devices", "results") or []
        if not any(r.get("driver") == driver for r in results):
            continue
        for consumer in _get(claim, "status", "reservedFor") or []:
            if consumer.get("resource") == "pods" and consumer.get("uid"):
                holders.add(consumer["uid"])
    return holders


# --- Policy ------------------------------------------------------------------------------------------


_POLICY_FIELDS = {
    "maxUnavailable",
    "maxParallel",
    "waitForCompletion",
    "podDeletion",
    "drain",
    "onFailure",
    "maxFailures",
    "paused",
    "stepTimeoutSeconds",
    "stepTimeouts",
}


def policy_from_spec(spec: Mapping[str, Any] | None) -> Policy:
    """`spec.upgradePolicy` (camelCase) -> Policy. Missing fields take the defaults; a bad value raises
    PolicyError naming the field, e.g. `upgradePolicy.maxUnavailable: ...`."""
    spec = spec or {}
    _known(spec, _POLICY_FIELDS, "upgradePolicy")
    default = Policy()
    step_default = _int(spec, "stepTimeoutSeconds", None, "upgradePolicy")
    timeouts = default.timeouts
    if step_default is not None:
        timeouts = StepTimeouts(step_default, step_default, step_default, step_default)
    step_spec = _section(spec, "stepTimeouts", "upgradePolicy")
    _known(
        step_spec, {"waitOldGone", "operandRestart", "validation", "rollback"}, "upgradePolicy.stepTimeouts"
    )
    path = "upgradePolicy.stepTimeouts"
    timeouts = StepTimeouts(
        wait_old_gone=_int(step_spec, "waitOldGone", timeouts.wait_old_gone, path),
        operand_restart=_int(step_spec, "operandRestart", timeouts.operand_restart, path),
        validation=_int(step_spec, "validation", timeouts.validation, path),
        rollback=_int(step_spec, "rollback", timeouts.rollback, path),
    )
    wait = _section(spec, "waitForCompletion", "upgradePolicy")
    _known(wait, {"podSelector", "timeoutSeconds"}, "upgradePolicy.waitForCompletion")
    deletion = _section(spec, "podDeletion", "upgradePolicy")
    _known(deletion, {"enable", "force", "timeoutSeconds", "deleteEmptyDir"}, "upgradePolicy.podDeletion")
    drain = _section(spec, "drain", "upgradePolicy")
    _known(
        drain, {"enable", "force", "podSelector", "timeoutSeconds", "deleteEmptyDir"}, "upgradePolicy.drain"
    )
    try:
        max_unavailable = IntOrPercent.parse(spec.get("maxUnavailable", str(default.max_unavailable)))
    except (ValueError, AttributeError) as error:
        raise PolicyError(f"upgradePolicy.maxUnavailable: {error}") from None
    on_failure_text = spec.get("onFailure", default.on_failure.value)
    try:
        on_failure = OnFailure(on_failure_text)
    except ValueError:
        raise PolicyError(
            f"upgradePolicy.onFailure: must be one of {', '.join(m.value for m in OnFailure)}, "
            f"got {on_failure_text!r}"
        ) from None
    d_del, d_drain = default.pod_deletion, default.drain
    return Policy(
        max_unavailable=max_unavailable,
        max_parallel=_int(spec, "maxParallel", default.max_parallel, "upgradePolicy"),
        wait_for_completion=WaitForCompletion(
            pod_selector=_selector(wait, "upgradePolicy.waitForCompletion"),
            timeout_seconds=_int(wait, "timeoutSeconds", 0, "upgradePolicy.waitForCompletion"),
        ),
        pod_deletion=PodDeletion(
            enable=_bool(deletion, "enable", d_del.enable, "upgradePolicy.podDeletion"),
            force=_bool(deletion, "force", d_del.force, "upgradePolicy.podDeletion"),
            timeout_seconds=_int(
                deletion, "timeoutSeconds", d_del.timeout_seconds, "upgradePolicy.podDeletion"
            ),
            delete_empty_dir=_bool(
                deletion, "deleteEmptyDir", d_del.delete_empty_dir, "upgradePolicy.podDeletion"
            ),
        ),
        drain=Drain(
            enable=_bool(drain, "enable", d_drain.enable, "upgradePolicy.drain"),
            force=_bool(drain, "force", d_drain.force, "upgradePolicy.drain"),
            pod_selector=_selector(drain, "upgradePolicy.drain"),
            timeout_seconds=_int(drain, "timeoutSeconds", d_drain.timeout_seconds, "upgradePolicy.drain"),
            delete_empty_dir=_bool(drain, "deleteEmptyDir", d_drain.delete_empty_dir, "upgradePolicy.drain"),
        ),
        timeouts=timeouts,
        on_failure=on_failure,
        max_failures=_int(spec, "maxFailures", default.max_failures, "upgradePolicy"),
        paused=_bool(spec, "paused", default.paused, "upgradePolicy"),
    )


def _known(spec: Mapping[str, Any], fields: set[str], path: str) -> None:
    unknown = sorted(set(spec) - fields)
    if unknown:
        raise PolicyError(f"{path}.{unknown[0]}: unknown field")


def _section(spec: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = spec.get(key) or {}
    if not isinstance(value, Mapping):
        raise PolicyError(f"{path}.{key}: expected an object")
    return value


def _int(spec: Mapping[str, Any], key: str, default: int | None, path: str) -> Any:
    value = spec.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PolicyError(f"{path}.{key}: expected a non-negative integer, got {value!r}")
    return value


def _bool(spec: Mapping[str, Any], key: str, default: bool, path: str) -> bool:
    value = spec.get(key, default)
    if not isinstance(value, bool):
        raise PolicyError(f"{path}.{key}: expected true or false, got {value!r}")
    return value


def _selector(spec: Mapping[str, Any], path: str) -> LabelSelector:
    try:
        return LabelSelector.from_any(spec.get("podSelector"))
    except (SelectorError, AttributeError) as error:
        raise PolicyError(f"{path}.podSelector: {error}") from None
