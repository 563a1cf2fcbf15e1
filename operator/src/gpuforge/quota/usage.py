"""What a workload takes from a quota: replicas (or parallelism) times its pod template. No I/O.

Counting follows ResourceQuota where it has a rule: a pod's requests are the larger of its regular
containers plus sidecars and its heaviest init step, plus pod overhead; a container's requests default
to its limits; `cpu`/`memory`/`ephemeral-storage` are aliases of their `requests.` keys; a DRA request
counts `count` devices (ExactCount) or 32 (All), and for `firstAvailable` the largest alternative per
device class. gpuforge adds per-model keys (`requests.nvidia.com/gpu.<model>` for the models the pods'
placement proves, charged on top of the generic key: gpuforge.quota.models) and whole-workload counting.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Final

from gpuforge.api.gpuquota import DEVICE_CLASS_KEY_SUFFIX, RESOURCE_CLAIMS_COUNT_KEY, ResourceList
from gpuforge.api.workloadkinds import (
    WORKLOAD_KIND_NAMES,
    Count,
    PodSet,
    controller_kind,
    workload_kind,
)
from gpuforge.constants import GPU_MODEL_LABEL, QUOTA_LABEL, is_gpu_resource
from gpuforge.quota.devicemodels import request_charges
from gpuforge.quota.draextended import DeviceClassMap, claim_charges, pod_charges
from gpuforge.quota.limitranges import ContainerDefaults, apply_defaults, unset_resources
from gpuforge.quota.models import (
    Placement,
    combined_placement,
    pod_placement,
    request_products,
    with_model_keys,
)
from gpuforge.quota.quantity import QuantityError, parse_quantity

# What ResourceQuota charges for a DRA request with allocationMode All (AllocationResultsMaxSize).
ALL_DEVICES_COUNT: Final = 32
# Aliases ResourceQuota accepts for the requests of these resources.
_BARE_ALIASES: Final = frozenset({"cpu", "memory", "ephemeral-storage"})
# Kinds whose objects are charged as a whole (gpuforge.api.workloadkinds); an object controlled by
# one of them is charged to it.
WORKLOAD_KINDS: Final = WORKLOAD_KIND_NAMES


class WorkloadError(ValueError):
    """A workload whose usage cannot be computed; the message names the field."""


@dataclass(frozen=True)
class ClaimRefs:
    """ResourceClaimTemplates and ResourceClaims a pod template refers to (by name, same namespace)."""

    templates: frozenset[str] = frozenset()
    claims: frozenset[str] = frozenset()


@dataclass(frozen=True)
class WorkloadUsage:
    kind: str
    namespace: str
    name: str
    quota: str  # the gpuforge.io/quota label, "" when absent
    replicas: int
    usage: ResourceList = field(default_factory=dict)
    generation: int = 0
    uid: str = ""  # metadata.uid: which object of this name it is
    # Per key (`limits.cpu`, ...), the containers that leave it unset (a quota on it refuses them).
    unset: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Where its pods may land, which proves (or not) the models per-model keys charge.
    placement: Placement = field(default_factory=Placement)
    # Pods counted above `spec.replicas` for a Deployment's rolling update (maxSurge), and what they take.
    surge_pods: int = 0
    surge: ResourceList = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return workload_ref(self.kind, self.namespace, self.name)


def workload_ref(kind: str, namespace: str, name: str) -> str:
    return f"{kind}/{namespace}/{name}"


def add(total: dict[str, Decimal], extra: Mapping[str, Decimal], times: Decimal | int = 1) -> None:
    for key, amount in extra.items():
        total[key] = total.get(key, Decimal(0)) + amount * times


def _maximum(total: dict[str, Decimal], other: Mapping[str, Decimal]) -> None:
    for key, amount in other.items():
        if amount > total.get(key, Decimal(0)):
            total[key] = amount


def _get(obj: Mapping[str, Any], path: str) -> Any:
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping):
            return None
        current = current.get(part)
    return current


def _list(value: object, field: str) -> Sequence[Mapping[str, Any]]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise WorkloadError(f"{field}: expected a list of objects")
    return value


def _quantities(values: object, field: str) -> dict[str, Decimal]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise WorkloadError(f"{field}: expected a map of quantities")
    try:
        return {str(key): parse_quantity(raw, f"{field}.{key}") for key, raw in values.items()}
    except QuantityError as error:
        raise WorkloadError(str(error)) from error


def _container(container: Mapping[str, Any], field: str) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise WorkloadError(f"{field}.resources: expected an object")
    limits = _quantities(resources.get("limits"), f"{field}.resources.limits")
    requests = _quantities(resources.get("requests"), f"{field}.resources.requests")
    for key, amount in limits.items():
        requests.setdefault(key, amount)  # the API server defaults requests to limits
    return requests, limits


def _pod_resources(spec: Mapping[str, Any], field: str, which: int) -> dict[str, Decimal]:
    """Requests (which=0) or limits (which=1) of a pod, the way the scheduler and ResourceQuota sum them."""
    total: dict[str, Decimal] = {}
    for index, container in enumerate(_list(spec.get("containers"), f"{field}.containers")):
        add(total, _container(container, f"{field}.containers[{index}]")[which])
    init_peak: dict[str, Decimal] = {}
    sidecars: dict[str, Decimal] = {}
    for index, container in enumerate(_list(spec.get("initContainers"), f"{field}.initContainers")):
        amounts = _container(container, f"{field}.initContainers[{index}]")[which]
        if container.get("restartPolicy") == "Always":  # a sidecar keeps running next to the app
            add(total, amounts)
            add(sidecars, amounts)
            _maximum(init_peak, sidecars)
        else:
            step = dict(amounts)
            add(step, sidecars)
            _maximum(init_peak, step)
    _maximum(total, init_peak)
    pod_level = spec.get("resources")  # PodLevelResources: they bound cpu and memory for the pod
    if isinstance(pod_level, Mapping):
        requests, limits = _container({"resources": pod_level}, field)
        for key, amount in (requests if which == 0 else limits).items():
            if key in ("cpu", "memory"):
                total[key] = amount
    add(total, _quantities(spec.get("overhead"), f"{field}.overhead"))
    return total


def claim_refs(pod_spec: Mapping[str, Any]) -> ClaimRefs:
    templates, claims = set(), set()
    for item in pod_spec.get("resourceClaims") or ():
        if isinstance(item, Mapping):
            if item.get("resourceClaimTemplateName"):
                templates.add(str(item["resourceClaimTemplateName"]))
            elif item.get("resourceClaimName"):
                claims.add(str(item["resourceClaimName"]))
    return ClaimRefs(frozenset(templates), frozenset(claims))


def device_class_key(device_class: str) -> str:
    return f"{device_class}{DEVICE_CLASS_KEY_SUFFIX}"


def _request_devices(request: Mapping[str, Any], field: str) -> tuple[str, int]:
    device_class = request.get("deviceClassName")
    if not isinstance(device_class, str) or not device_class:
        raise WorkloadError(f"{field}.deviceClassName: missing")
    mode = request.get("allocationMode") or "ExactCount"
    if mode == "All":
        return device_class, ALL_DEVICES_COUNT
    if mode != "ExactCount":
        raise WorkloadError(f"{field}.allocationMode: unknown mode {mode!r}")
    count = request.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise WorkloadError(f"{field}.count: expected a positive integer, got {count!r}")
    return device_class, count


def claim_usage(claim_spec: Mapping[str, Any], field: str = "spec") -> dict[str, Decimal]:
    """Devices per class of one ResourceClaim spec (resource.k8s.io v1, v1beta2 or v1beta1 shape)."""
    devices = claim_spec.get("devices") or {}
    if not isinstance(devices, Mapping):
        raise WorkloadError(f"{field}.devices: expected an object")
    usage: dict[str, Decimal] = {RESOURCE_CLAIMS_COUNT_KEY: Decimal(1)}
    for index, request in enumerate(_list(devices.get("requests"), f"{field}.devices.requests")):
        where = f"{field}.devices.requests[{index}]"
        alternatives = request.get("firstAvailable")
        if alternatives:  # charge the largest alternative per device class (and per model)
            largest: dict[str, Decimal] = {}
            for sub_index, sub in enumerate(_list(alternatives, f"{where}.firstAvailable")):
                device_class, count = _request_devices(sub, f"{where}.firstAvailable[{sub_index}]")
                _maximum(largest, {device_class_key(device_class): Decimal(count)})
                _maximum(largest, request_charges(device_class, count, request_products(sub)))
            add(usage, largest)
            continue
        exactly = request.get("exactly")
        if exactly is not None:  # v1 / v1beta2
            if not isinstance(exactly, Mapping):
                raise WorkloadError(f"{where}.exactly: expected an object")
            device_class, count = _request_devices(exactly, f"{where}.exactly")
            selected = exactly
        else:  # v1beta1 keeps the fields on the request itself
            device_class, count = _request_devices(request, where)
            selected = request
        add(usage, {device_class_key(device_class): Decimal(count)})
        # Devices of one GPU model, where the request's selectors prove it (gpuforge.quota.devicemodels).
        add(usage, request_charges(device_class, count, request_products(selected)))
    return usage


@dataclass(frozen=True)
class ClaimCatalog:
    """Usage of the ResourceClaimTemplates and ResourceClaims of one namespace, by name."""

    # Which DeviceClass serves which extended resource (cluster-wide).
    device_classes: DeviceClassMap = field(default_factory=DeviceClassMap)
    templates: Mapping[str, ResourceList] = field(default_factory=dict)
    claims: Mapping[str, ResourceList] = field(default_factory=dict)
    # The GPU products each one's device requests select (gpuforge.quota.models.claim_products).
    template_products: Mapping[str, tuple[frozenset[str], ...]] = field(default_factory=dict)
    claim_products: Mapping[str, tuple[frozenset[str], ...]] = field(default_factory=dict)


def placement_of(pod_spec: Mapping[str, Any], catalog: ClaimCatalog | None, field: str = "spec") -> Placement:
    """Where a pod may land: its node selection, and the products its claims' device selectors hold."""
    catalog = catalog or ClaimCatalog()
    refs = claim_refs(pod_spec)
    devices = [
        *(held for name in sorted(refs.templates) for held in catalog.template_products.get(name, ())),
        *(held for name in sorted(refs.claims) for held in catalog.claim_products.get(name, ())),
    ]
    return pod_placement(pod_spec, devices, field)


def pod_usage(
    pod_spec: Mapping[str, Any],
    *,
    catalog: ClaimCatalog | None = None,
    field: str = "spec",
    strict_claims: bool = True,
) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
    """Usage of one pod: (per replica, shared by all replicas). Shared = named ResourceClaims."""
    catalog = catalog or ClaimCatalog()
    per_pod: dict[str, Decimal] = {"pods": Decimal(1)}
    requests = _pod_resources(pod_spec, field, 0)
    limits = _pod_resources(pod_spec, field, 1)
    for resource, amount in requests.items():
        add(per_pod, {f"requests.{resource}": amount})
        if resource in _BARE_ALIASES:
            add(per_pod, {resource: amount})
    for resource, amount in limits.items():
        add(per_pod, {f"limits.{resource}": amount})
    add(per_pod, pod_charges(requests, catalog.device_classes))  # DRA-served extended resources
    refs = claim_refs(pod_spec)
    shared: dict[str, Decimal] = {}
    for template in _catalogued(
        refs.templates, catalog.templates, "ResourceClaimTemplate", field, strict_claims
    ):
        add(per_pod, template)
        add(per_pod, claim_charges(template, catalog.device_classes))
    for claim in _catalogued(refs.claims, catalog.claims, "ResourceClaim", field, strict_claims):
        add(shared, claim)
        add(shared, claim_charges(claim, catalog.device_classes))
    # Per-model keys follow the generic ones, for the models the placement proves.
    per_pod = with_model_keys(per_pod, placement_of(pod_spec, catalog, field))
    return per_pod, shared


def _catalogued(
    names: Iterable[str], known: Mapping[str, ResourceList], kind: str, field: str, strict: bool
) -> Iterator[ResourceList]:
    """The usage of each named claim or template in name order; one not in the catalog is an error when
    `strict`, else skipped (it may not have been read yet)."""
    for name in sorted(names):
        usage = known.get(name)
        if usage is None:
            if strict:
                raise WorkloadError(f"{field}.resourceClaims: {kind} {name!r} not found")
            continue
        yield usage


@dataclass(frozen=True)
class PodTemplate:
    """Where a workload keeps pods: the template's spec, how many run from it, and its field path."""

    spec: Mapping[str, Any]
    labels: Mapping[str, str]
    replicas: int
    field: str


def _replicas(value: object, field: str, default: int = 1) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WorkloadError(f"{field}: expected a non-negative integer, got {value!r}")
    return value


def _count(root: Mapping[str, Any], count: Count, where: str) -> int:
    value = _replicas(_get(root, count.path), f"{where}{count.path}", count.default)
    if count.at_most and _get(root, count.at_most) is not None:
        value = min(value, _replicas(_get(root, count.at_most), f"{where}{count.at_most}"))
    return max(value - count.minus, 0)


def _template_at(root: Mapping[str, Any], path: str) -> Mapping[str, Any] | None:
    template = _get(root, path) if path else root
    return template if isinstance(template, Mapping) else None


def _items(obj: Mapping[str, Any], pod_set: PodSet) -> Iterator[tuple[Mapping[str, Any], str]]:
    """The items a pod set walks (the object itself without `each`), each with its field path."""
    if not pod_set.each:
        yield obj, ""
        return
    value = _get(obj, pod_set.each)
    if value is None:
        return
    if pod_set.each_kind == "map":
        if not isinstance(value, Mapping) or not all(isinstance(item, Mapping) for item in value.values()):
            raise WorkloadError(f"{pod_set.each}: expected a map of objects")
        for key in sorted(value):
            yield value[key], f"{pod_set.each}.{key}."
        return
    for index, item in enumerate(_list(value, pod_set.each)):
        yield item, f"{pod_set.each}[{index}]."


def pod_templates(obj: Mapping[str, Any]) -> list[PodTemplate]:
    """Every pod template of a workload, with how many pods run from it (gpuforge.api.workloadkinds)."""
    kind = workload_kind(obj.get("kind"))
    if kind is None:
        raise WorkloadError(
            f"kind: {obj.get('kind')!r} is not a workload gpuforge counts ({', '.join(WORKLOAD_KINDS)})"
        )
    templates = []
    for pod_set in kind.pod_sets:
        outer = 1
        for count in pod_set.replicas:
            outer *= _count(obj, count, "")
        for item, where in _items(obj, pod_set):
            path = pod_set.template
            template = _template_at(item, path)
            if template is None and pod_set.or_template:
                path = pod_set.or_template
                template = _template_at(item, path)
            if template is None:
                continue
            replicas = outer
            for count in pod_set.item_replicas:
                replicas *= _count(item, count, where)
            if pod_set.item_suspend and _get(item, pod_set.item_suspend) is True:
                replicas = 0
            field = f"{where}{path}.spec" if path else "spec"
            labels = _get(template, "metadata.labels") if path else labels_of(template)
            templates.append(
                PodTemplate(
                    spec=template.get("spec") or {},
                    labels=labels if isinstance(labels, Mapping) else {},
                    replicas=replicas,
                    field=field,
                )
            )
    return templates


def pod_template(obj: Mapping[str, Any]) -> PodTemplate:
    """A workload's first pod template (its only one, for most kinds; an empty one if it has none)."""
    templates = pod_templates(obj)
    return templates[0] if templates else PodTemplate({}, {}, 0, "spec")


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labels = _get(obj, "metadata.labels")
    return labels if isinstance(labels, Mapping) else {}


@dataclass(frozen=True)
class OwnerRef:
    kind: str
    name: str
    uid: str


def workload_controller(obj: Mapping[str, Any]) -> OwnerRef | None:
    """The controller reference to a workload controller (group and kind both), if any."""
    for owner in _get(obj, "metadata.ownerReferences") or ():
        if not isinstance(owner, Mapping) or not owner.get("controller"):
            continue
        known = controller_kind(owner.get("apiVersion"), owner.get("kind"))
        if known is not None:
            return OwnerRef(known.kind, str(owner.get("name") or ""), str(owner.get("uid") or ""))
    return None


def is_controlled_by_workload(obj: Mapping[str, Any]) -> bool:
    """Pods of a ReplicaSet, ReplicaSets of a Deployment, Jobs of a CronJob: charged to the owner."""
    return workload_controller(obj) is not None


def charged_to_owner(pod: Mapping[str, Any], owner: Mapping[str, Any] | None) -> bool:
    """A pod that names a workload controller is charged to it only if that controller exists (same
    uid) and is charged to the same quota; any pod can claim an owner, so otherwise it pays itself."""
    ref = workload_controller(pod)
    if ref is None or owner is None:
        return False
    uid = str(_get(owner, "metadata.uid") or "")
    if ref.uid and uid and ref.uid != uid:
        return False
    return quota_label({"kind": ref.kind, **owner}) == str(labels_of(pod).get(QUOTA_LABEL) or "")


def _template_quota_labels(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(quota, where) of each pod template (then each extra label place) naming a quota, in order."""
    kind = workload_kind(obj.get("kind"))
    if kind is None or obj.get("kind") == "Pod":
        return []
    try:
        templates = pod_templates(obj)
    except WorkloadError:
        return []
    found = [
        (str(template.labels[QUOTA_LABEL]), template.field.removesuffix(".spec") + ".metadata.labels")
        for template in templates
        if template.labels.get(QUOTA_LABEL)
    ]
    for path in kind.label_paths:
        labels = _get(obj, f"{path}.metadata.labels")
        if isinstance(labels, Mapping) and labels.get(QUOTA_LABEL):
            found.append((str(labels[QUOTA_LABEL]), f"{path}.metadata.labels"))
    return found


def quota_label(obj: Mapping[str, Any]) -> str:
    """The quota a workload names: the `gpuforge.io/quota` label on the object, else the one on its
    (first labelled) pod template, where people put labels for their pods, for a CronJob else its job
    template's. With both set the object's wins; admission refuses any two disagreeing
    (`quota_label_conflict`)."""
    own = labels_of(obj).get(QUOTA_LABEL)
    if own:
        return str(own)
    found = _template_quota_labels(obj)
    return found[0][0] if found else ""


def charged_quota(obj: Mapping[str, Any], default: str = "") -> str:
    """The quota a workload is charged to: the one it names, else its namespace's default quota
    (`default`, the namespace's gpuforge.io/default-quota label) when it takes GPUs. An object a
    workload controller made names none and is charged to its owner."""
    named = quota_label(obj)
    if named or not default or is_controlled_by_workload(obj):
        return named
    try:
        return default if takes_gpus(obj) else ""
    except WorkloadError:
        return ""


def resize_quota(pod: Mapping[str, Any], default: str = "") -> str:
    """The quota a pod's resize (`pods/resize`) is checked against: the one its label names, else its
    namespace's default quota (`default`) when it takes GPUs. Unlike `charged_quota`, a pod a workload
    controller made is not passed to its owner: the owner is counted from its template, so the pod's
    own growth is what the resize adds, for a labelled pod and an unlabelled one alike."""
    named = quota_label(pod)
    if named or not default:
        return named
    try:
        return default if takes_gpus(pod) else ""
    except WorkloadError:
        return ""


def quota_label_conflict(obj: Mapping[str, Any]) -> str:
    """Why the object's and its pod templates' quota labels disagree ("" when they do not)."""
    own = str(labels_of(obj).get(QUOTA_LABEL) or "")
    found = _template_quota_labels(obj)
    first = (own, f"the {obj.get('kind')}") if own else found[0] if found else ("", "")
    for quota, where in found:
        if quota != first[0]:
            what = first[1] if own else f"its pod template ({first[1]})"
            return (
                f"label {QUOTA_LABEL} is {first[0]!r} on {what} but {quota!r} on its pod template "
                f"({where}); set it in one place, or to the same quota in all"
            )
    return ""


def cronjob_label_unreached(obj: Mapping[str, Any]) -> str:
    """Why a CronJob's quota label would not reach its Jobs ("" when it does). A Job gets the job
    template's labels, not the CronJob's own, and is charged by the label it carries."""
    if obj.get("kind") != "CronJob" or not labels_of(obj).get(QUOTA_LABEL):
        return ""
    job_labels = _get(obj, "spec.jobTemplate.metadata.labels")
    if (isinstance(job_labels, Mapping) and job_labels.get(QUOTA_LABEL)) or pod_template(obj).labels.get(
        QUOTA_LABEL
    ):
        return ""
    return (
        f"label {QUOTA_LABEL} is on the CronJob only, and its Jobs carry only the job template's labels, "
        "so they would name no quota; set it on spec.jobTemplate.spec.template.metadata.labels "
        "(or spec.jobTemplate.metadata.labels)"
    )


def takes_gpus(obj: Mapping[str, Any]) -> bool:
    """Whether a workload's pods ask for GPUs: a GPU resource NVIDIA's device plugin advertises, in
    requests or limits of any container, or any DRA claim (its devices are a DeviceClass's, GPUs here)."""
    for template in pod_templates(obj):
        refs = claim_refs(template.spec)
        if refs.templates or refs.claims:
            return True
        resources = {
            *_pod_resources(template.spec, template.field, 0),
            *_pod_resources(template.spec, template.field, 1),
        }
        if any(is_gpu_resource(name) for name in resources):
            return True
    return False


def referenced_claims(obj: Mapping[str, Any]) -> ClaimRefs:
    templates: set[str] = set()
    claims: set[str] = set()
    for template in pod_templates(obj):
        refs = claim_refs(template.spec)
        templates |= refs.templates
        claims |= refs.claims
    return ClaimRefs(frozenset(templates), frozenset(claims))


def gpu_model_of(obj: Mapping[str, Any], template: PodTemplate | None = None) -> str:
    """The GPU model a workload says it wants (`gpuforge.io/gpu-model`): a claim checked against its
    placement, never a proof (gpuforge.quota.models)."""
    model = labels_of(obj).get(GPU_MODEL_LABEL) or (template.labels.get(GPU_MODEL_LABEL) if template else "")
    return str(model or "")


# Pod phases in which a pod holds nothing any more (ResourceQuota stops counting them too).
TERMINAL_POD_PHASES: Final = frozenset({"Succeeded", "Failed"})


def _finished_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a workload's status that says it finished for good, by its kind's `finished` rule
    (gpuforge.api.workloadkinds): the true finishing conditions, or the finishing value of its field.
    Empty while it runs."""
    known = workload_kind(obj.get("kind"))
    finished = known.finished if known is not None else None
    if finished is None or (finished.only_if and _get(obj, finished.only_if) is not True):
        return {}
    conditions = [
        dict(condition)
        for condition in _get(obj, "status.conditions") or ()
        if isinstance(condition, Mapping)
        and condition.get("type") in finished.conditions
        and condition.get("status") == "True"
    ]
    if conditions:
        return {"conditions": conditions}
    if finished.field and _get(obj, finished.field) in finished.values:
        return {finished.field.removeprefix("status."): _get(obj, finished.field)}
    return {}


def holds_nothing(obj: Mapping[str, Any]) -> bool:
    """Work that takes nothing from its quota: a Succeeded or Failed Pod, a workload whose status says
    it finished (a Job Complete or Failed, a JobSet Completed or Failed, a PyTorchJob Succeeded or
    Failed, a RayJob Complete or Failed that shuts its cluster down), a suspended workload (its pods
    are deleted; resuming it is admitted like a create), a CronJob (a schedule: its Jobs are charged as
    they are created, so a spent budget refuses the next one)."""
    kind = obj.get("kind")
    if kind == "CronJob":
        return True
    if kind == "Pod":
        return _get(obj, "status.phase") in TERMINAL_POD_PHASES
    known = workload_kind(kind)
    if known is not None and known.suspend_path and _get(obj, known.suspend_path) is True:
        return True
    return bool(_finished_part(obj))


def finish_status(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a workload's status `holds_nothing` reads (a cache that drops status keeps this)."""
    if obj.get("kind") == "Pod" and _get(obj, "status.phase") in TERMINAL_POD_PHASES:
        return {"phase": _get(obj, "status.phase")}
    return _finished_part(obj)


# What the Deployment controller takes when maxSurge is unset (apps/v1 defaults).
DEFAULT_MAX_SURGE: Final = "25%"


def _scaled_value(value: object, total: int, field: str) -> int:
    """An IntOrString of a rolling update (`2`, `"25%"`) resolved against `total`, a percentage rounded
    up as the Deployment controller rounds maxSurge (intstr.GetScaledValueFromIntOrPercent)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit():
        return -(-int(value[:-1]) * total // 100)
    raise WorkloadError(f"{field}: expected a non-negative integer or a percentage, got {value!r}")


def max_surge(obj: Mapping[str, Any]) -> int:
    """Pods a Deployment's rolling update runs above `spec.replicas`: maxSurge (default 25%, rounded
    up), at most `replicas` (the new ReplicaSet never grows beyond `replicas`, the old ones only
    shrink). 0 for other kinds and for the Recreate strategy (old pods go before new ones start)."""
    if obj.get("kind") != "Deployment":
        return 0
    strategy = _get(obj, "spec.strategy") or {}
    if not isinstance(strategy, Mapping) or strategy.get("type") == "Recreate":
        return 0
    replicas = _replicas(_get(obj, "spec.replicas"), "spec.replicas")
    rolling = strategy.get("rollingUpdate") or {}
    raw = rolling.get("maxSurge", DEFAULT_MAX_SURGE) if isinstance(rolling, Mapping) else DEFAULT_MAX_SURGE
    surge = _scaled_value(raw, replicas, "spec.strategy.rollingUpdate.maxSurge")
    return min(surge, replicas)


def rolling_out(obj: Mapping[str, Any]) -> bool:
    """Whether a Deployment's status says a rolling update runs: pods of an older template remain next
    to the updated ones (`status.replicas` > `status.updatedReplicas`). A change its controller has not
    acted on yet (`status.observedGeneration` < `metadata.generation`) does not count: most are scales,
    which roll nothing, and counting their surge until then would refuse racing scale-ups; the update
    that rolls reserves its surge at admission instead."""
    if obj.get("kind") != "Deployment":
        return False
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return False
    replicas, updated = status.get("replicas"), status.get("updatedReplicas")
    return isinstance(replicas, int) and replicas > (updated if isinstance(updated, int) else 0)


def starts_rollout(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether an update of a Deployment starts (or keeps) a rolling update: it changes the pod template,
    resumes a paused Deployment, or one is running already."""
    if new.get("kind") != "Deployment":
        return False
    changed = _get(old, "spec.template") != _get(new, "spec.template")
    resumed = _get(old, "spec.paused") is True and _get(new, "spec.paused") is not True
    return changed or resumed or rolling_out(old)


def rollout_status(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a Deployment's status `rolling_out` reads (a cache that drops status keeps this)."""
    status = obj.get("status")
    if obj.get("kind") != "Deployment" or not isinstance(status, Mapping):
        return {}
    wanted = ("observedGeneration", "replicas", "updatedReplicas")
    return {key: status[key] for key in wanted if key in status}


def _scaled_to(obj: Mapping[str, Any], replicas: int) -> Mapping[str, Any]:
    """`obj` with its replica count (the scale subresource's field) set to `replicas`."""
    kind = workload_kind(obj.get("kind"))
    if kind is None or not kind.scale_path:
        raise WorkloadError(f"kind: {obj.get('kind')!r} has no scale subresource")
    *parents, last = kind.scale_path.split(".")
    scaled: dict[str, Any] = dict(obj)
    current = scaled
    for part in parents:
        inner = current.get(part)
        current[part] = dict(inner) if isinstance(inner, Mapping) else {}
        current = current[part]
    current[last] = replicas
    return scaled


def workload_usage(
    obj: Mapping[str, Any],
    catalog: ClaimCatalog | None = None,
    *,
    replicas: int | None = None,
    strict_claims: bool = True,
    defaults: ContainerDefaults | None = None,
    default_quota: str = "",
    surge: bool | None = None,
) -> WorkloadUsage:
    """Whole usage of a workload object, all its pod templates together; `replicas` overrides the
    object's replica count (the scale subresource); `defaults` are the namespace's LimitRange defaults,
    filled in as the API server will for its pods; `default_quota` the namespace's default quota
    (charged_quota). Named ResourceClaims are shared: each counts once.

    A Deployment in a rolling update counts its surge pods too (`max_surge`, of its pod template);
    `surge` says whether it is in one (None: as its status says, `rolling_out`)."""
    if replicas is not None:
        obj = _scaled_to(obj, replicas)
    idle = holds_nothing(obj)
    surge_pods = max_surge(obj) if (rolling_out(obj) if surge is None else surge) else 0
    surge_usage: dict[str, Decimal] = {}
    total: dict[str, Decimal] = {}
    pods = 0
    shared_claims: set[str] = set()
    unset: dict[str, tuple[str, ...]] = {}
    # Each template's placement with what one of its pods takes (its shared claims included).
    placed: list[tuple[Placement, dict[str, Decimal]]] = []
    for template in pod_templates(obj):
        if defaults:
            template = replace(template, spec=apply_defaults(template.spec, defaults))
        count = 0 if idle else template.replicas
        per_pod, via_claims = pod_usage(
            template.spec,
            catalog=catalog,
            field=template.field,
            strict_claims=strict_claims,
        )
        if count and surge_pods:  # a Deployment's one template: its surge pods are of it too
            count += surge_pods
            add(surge_usage, per_pod, surge_pods)
        add(total, per_pod, count)
        pods += count
        if count:
            shared_claims |= claim_refs(template.spec).claims
            taken = dict(per_pod)
            add(taken, via_claims)
            placed.append((placement_of(template.spec, catalog, template.field), taken))
        for key, containers in unset_resources(template.spec).items():
            unset[key] = (*unset.get(key, ()), *containers)
    placement = combined_placement(placed)
    catalog = catalog or ClaimCatalog()
    shared: dict[str, Decimal] = {}
    for claim in _catalogued(shared_claims, catalog.claims, "ResourceClaim", "spec", strict_claims):
        add(shared, claim)
        add(shared, claim_charges(claim, catalog.device_classes))
    add(total, with_model_keys(shared, placement))
    metadata = obj.get("metadata") or {}
    return WorkloadUsage(
        kind=str(obj.get("kind")),
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        quota=charged_quota(obj, default_quota),
        replicas=pods,
        usage={key: amount for key, amount in total.items() if amount},
        generation=generation_of(obj),
        uid=str(metadata.get("uid") or ""),
        unset=unset,
        placement=placement,
        surge_pods=surge_pods if surge_usage else 0,
        surge={key: amount for key, amount in surge_usage.items() if amount},
    )


def generation_of(obj: Mapping[str, Any]) -> int:
    generation = _get(obj, "metadata.generation")
    return generation if isinstance(generation, int) and not isinstance(generation, bool) else 0


def increase(old: Mapping[str, Decimal], new: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """Per key, how much `new` takes beyond `old` (decreases are released later by the controller)."""
    result = {}
    for key, amount in new.items():
        grown = amount - old.get(key, Decimal(0))
        if grown > 0:
            result[key] = grown
    return result


def restrict(values: Mapping[str, Decimal], keys: Iterable[str]) -> dict[str, Decimal]:
    wanted = set(keys)
    return {key: amount for key, amount in values.items() if key in wanted}
