"""The workload kinds the GPU quota admits whole, as data: where each keeps its pod templates and how
many pods run from each. Read by the quota core (counting), the webhook configurations (rules, match
conditions), the RBAC of the webhook and its API client (paths). Pure data, no I/O.

A path is dotted field names from the object's root, or, inside a `PodSet` with `each`, from one item
of that list (or value of that map). A `PodSet` runs the product of its `replicas` (and `item_replicas`)
pods from its template; a workload's pods are the sum over its pod sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal


@dataclass(frozen=True)
class Count:
    """A factor of a pod set's size: the integer at `path` (`default` when unset), no more than the one
    at `at_most` (when set; a Job never runs more pods at once than it has completions), less `minus`."""

    path: str
    default: int = 1
    at_most: str = ""
    minus: int = 0


@dataclass(frozen=True)
class PodSet:
    """Pods of one template. `template` holds `metadata` and `spec` ("" : the object is the pod);
    `or_template` stands in where `template` is unset (LeaderWorkerSet's leader defaults to the
    worker template). With `each`, a list (`each_kind` "list") or map ("map") of items, the template
    and `item_replicas` are read in every item."""

    role: str
    template: str
    replicas: tuple[Count, ...] = ()
    or_template: str = ""
    each: str = ""
    each_kind: Literal["list", "map"] = "list"
    item_replicas: tuple[Count, ...] = ()
    # Set to true in an item, that item runs no pods (a suspended Ray worker group).
    item_suspend: str = ""


@dataclass(frozen=True)
class Finished:
    """How a kind says its work is over for good (its pods are done or being deleted): a status
    condition of a type in `conditions` with status "True", or the string at `field` being one of
    `values`; with `only_if`, only while the boolean at that path is true (a RayJob deletes its
    RayCluster only with `shutdownAfterJobFinishes`)."""

    conditions: tuple[str, ...] = ()
    field: str = ""
    values: tuple[str, ...] = ()
    only_if: str = ""


@dataclass(frozen=True)
class WorkloadKind:
    group: str  # "" for the core group
    version: str  # the version gpuforge reads and lists
    kind: str
    plural: str
    pod_sets: tuple[PodSet, ...]
    # Where `kubectl scale` (the scale subresource) sets the replica count, "" without one.
    scale_path: str = ""
    # Objects this kind controls (ownerReference controller: true) are charged to it, not themselves.
    controls: bool = True
    # Set to true, the workload runs no pods and so holds nothing (`spec.suspend`).
    suspend_path: str = ""
    # Extra places where the quota label may be put, besides the object and its pod templates.
    label_paths: tuple[str, ...] = ()
    # Set, the workload holds nothing once its status says it finished.
    finished: Finished | None = None

    @property
    def api_prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def template_paths(self) -> tuple[str, ...]:
        """Every pod template path, `each` items written `<each>[]` (list) or `<each>{}` (map)."""
        paths: list[str] = []
        for pod_set in self.pod_sets:
            # `or_template` when set; "" is a path (the object itself) only as `template`.
            for template in dict.fromkeys((pod_set.template, pod_set.or_template or pod_set.template)):
                if pod_set.each:
                    marker = "[]" if pod_set.each_kind == "list" else "{}"
                    template = f"{pod_set.each}{marker}.{template}"
                if template not in paths:
                    paths.append(template)
        return tuple(paths)


def _job(prefix: str) -> tuple[Count, ...]:
    return (Count(f"{prefix}.parallelism", at_most=f"{prefix}.completions"),)


def _ray_cluster(prefix: str) -> tuple[PodSet, ...]:
    """RayCluster's pods: one head, and `replicas` x `numOfHosts` of each worker group's template."""
    return (
        PodSet("head", f"{prefix}.headGroupSpec.template"),
        PodSet(
            "workers",
            "template",
            each=f"{prefix}.workerGroupSpecs",
            item_replicas=(Count("replicas", default=0), Count("numOfHosts")),
            item_suspend="suspend",
        ),
    )


_REPLICATED = (Count("spec.replicas"),)

WORKLOAD_KINDS: Final[tuple[WorkloadKind, ...]] = (
    WorkloadKind(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        (PodSet("pods", "spec.template", _REPLICATED),),
        scale_path="spec.replicas",
    ),
    WorkloadKind(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        (PodSet("pods", "spec.template", _REPLICATED),),
        scale_path="spec.replicas",
    ),
    WorkloadKind(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        (PodSet("pods", "spec.template", _REPLICATED),),
        scale_path="spec.replicas",
    ),
    WorkloadKind(
        "batch",
        "v1",
        "Job",
        "jobs",
        (PodSet("pods", "spec.template", _job("spec")),),
        suspend_path="spec.suspend",
        finished=Finished(conditions=("Complete", "Failed")),
    ),
    # A schedule, not a controller: each Job it makes is charged itself (see `holds_nothing`).
    WorkloadKind(
        "batch",
        "v1",
        "CronJob",
        "cronjobs",
        (PodSet("pods", "spec.jobTemplate.spec.template", _job("spec.jobTemplate.spec")),),
        controls=False,
        label_paths=("spec.jobTemplate",),
    ),
    # A pod controls what it makes: LeaderWorkerSet's worker StatefulSets are controlled by their
    # group's leader pod, and so charged with the LeaderWorkerSet, not again.
    WorkloadKind("", "v1", "Pod", "pods", (PodSet("pod", ""),)),
    # JobSet: replicatedJobs[].replicas Jobs of each template, each running parallelism pods at once.
    WorkloadKind(
        "jobset.x-k8s.io",
        "v1alpha2",
        "JobSet",
        "jobsets",
        (
            PodSet(
                "pods",
                "template.spec.template",
                each="spec.replicatedJobs",
                item_replicas=(Count("replicas"), *_job("template.spec")),
            ),
        ),
        suspend_path="spec.suspend",
        # jobset.x-k8s.io/v1alpha2 JobSetConditionType: Completed, Failed.
        finished=Finished(conditions=("Completed", "Failed")),
    ),
    # LeaderWorkerSet: `replicas` groups of `size` pods, a leader (its own template, else the worker's)
    # and size - 1 workers.
    WorkloadKind(
        "leaderworkerset.x-k8s.io",
        "v1",
        "LeaderWorkerSet",
        "leaderworkersets",
        (
            PodSet(
                "leader",
                "spec.leaderWorkerTemplate.leaderTemplate",
                _REPLICATED,
                or_template="spec.leaderWorkerTemplate.workerTemplate",
            ),
            PodSet(
                "workers",
                "spec.leaderWorkerTemplate.workerTemplate",
                (*_REPLICATED, Count("spec.leaderWorkerTemplate.size", minus=1)),
            ),
        ),
        scale_path="spec.replicas",
    ),
    WorkloadKind(
        "ray.io", "v1", "RayCluster", "rayclusters", _ray_cluster("spec"), suspend_path="spec.suspend"
    ),
    # A RayJob makes its RayCluster from rayClusterSpec (none with clusterSelector: an existing one).
    # Finished when jobDeploymentStatus is Complete or Failed; its RayCluster (charged to it) is deleted
    # then only with shutdownAfterJobFinishes, else it keeps running and keeps the charge.
    WorkloadKind(
        "ray.io",
        "v1",
        "RayJob",
        "rayjobs",
        _ray_cluster("spec.rayClusterSpec"),
        suspend_path="spec.suspend",
        finished=Finished(
            field="status.jobDeploymentStatus",
            values=("Complete", "Failed"),
            only_if="spec.shutdownAfterJobFinishes",
        ),
    ),
    WorkloadKind(
        "kubeflow.org",
        "v1",
        "PyTorchJob",
        "pytorchjobs",
        (
            PodSet(
                "replicas",
                "template",
                each="spec.pytorchReplicaSpecs",
                each_kind="map",
                item_replicas=(Count("replicas"),),
            ),
        ),
        # Its scale subresource sets the Worker replicas (the training operator's CRD says so).
        scale_path="spec.pytorchReplicaSpecs.Worker.replicas",
        suspend_path="spec.runPolicy.suspend",
        # kubeflow.org/v1 JobConditionType: Succeeded, Failed.
        finished=Finished(conditions=("Succeeded", "Failed")),
    ),
    WorkloadKind(
        "argoproj.io",
        "v1alpha1",
        "Rollout",
        "rollouts",
        (PodSet("pods", "spec.template", _REPLICATED),),
        scale_path="spec.replicas",
    ),
)

BY_KIND: Final = {kind.kind: kind for kind in WORKLOAD_KINDS}
WORKLOAD_KIND_NAMES: Final = tuple(kind.kind for kind in WORKLOAD_KINDS)


def workload_kind(kind: object) -> WorkloadKind | None:
    return BY_KIND.get(kind) if isinstance(kind, str) else None


def api_group(api_version: object) -> str:
    """`apps/v1` -> `apps`; `v1` (the core group) -> ``."""
    return str(api_version).rpartition("/")[0] if isinstance(api_version, str) else ""


def controller_kind(api_version: object, kind: object) -> WorkloadKind | None:
    """The workload kind an ownerReference names, if it is one that controls what it makes (group and
    kind both: a `Job` of another group is not a batch Job)."""
    known = workload_kind(kind)
    if known is None or not known.controls or known.group != api_group(api_version):
        return None
    return known


def plurals_by_group(kinds: tuple[WorkloadKind, ...] = WORKLOAD_KINDS) -> list[tuple[str, list[str]]]:
    """(group, its kinds' plurals) in table order: one RBAC or webhook rule per group."""
    groups: dict[str, list[str]] = {}
    for kind in kinds:
        groups.setdefault(kind.group, []).append(kind.plural)
    return list(groups.items())
