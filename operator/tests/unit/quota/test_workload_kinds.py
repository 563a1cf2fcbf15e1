"""Every workload kind of gpuforge.api.workloadkinds, counted whole from its pod templates: one table
row per kind, then the rules that read the table (labels, controllers, suspension, scale, admission)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from gpuforge.api.gpuquota import GpuQuota
from gpuforge.api.workloadkinds import WORKLOAD_KINDS, controller_kind
from gpuforge.quota.admission import Allowed, Denied, WorkloadAsk, admit_workload
from gpuforge.quota.usage import (
    WorkloadError,
    finish_status,
    holds_nothing,
    is_controlled_by_workload,
    pod_templates,
    quota_label,
    quota_label_conflict,
    referenced_claims,
    takes_gpus,
    workload_usage,
)

LABEL = "gpuforge.io/quota"
GPU = "requests.nvidia.com/gpu"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
D = Decimal


def template(gpus: int = 1, quota: str = "", claim: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]
    }
    if claim:
        spec["resourceClaims"] = [{"name": "shared", "resourceClaimName": claim}]
    return {"metadata": {"labels": {LABEL: quota} if quota else {}}, "spec": spec}


def obj(api_version: str, kind: str, spec: dict[str, Any], quota: str = "q") -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "w", "namespace": "ns", "labels": {LABEL: quota} if quota else {}},
        "spec": spec,
    }


def jobset(replicas: int = 2, parallelism: int = 4, completions: int | None = None) -> dict[str, Any]:
    job: dict[str, Any] = {"parallelism": parallelism, "template": template(1)}
    if completions is not None:
        job["completions"] = completions
    return obj(
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        {
            "replicatedJobs": [
                {"name": "workers", "replicas": replicas, "template": {"spec": job}},
                {"name": "driver", "template": {"spec": {"template": template(0)}}},
            ]
        },
    )


def lws(replicas: int = 3, size: int = 4, leader: bool = True) -> dict[str, Any]:
    group: dict[str, Any] = {"size": size, "workerTemplate": template(2)}
    if leader:
        group["leaderTemplate"] = template(1)
    return obj(
        "leaderworkerset.x-k8s.io/v1",
        "LeaderWorkerSet",
        {"replicas": replicas, "leaderWorkerTemplate": group},
    )


def ray_cluster_spec(workers: int = 3, hosts: int | None = None) -> dict[str, Any]:
    group: dict[str, Any] = {"groupName": "gpu", "replicas": workers, "template": template(1)}
    if hosts is not None:
        group["numOfHosts"] = hosts
    return {
        "headGroupSpec": {"template": template(0)},
        "workerGroupSpecs": [group, {"groupName": "unset", "template": template(8)}],  # replicas: 0
    }


def suspended_group() -> dict[str, Any]:
    spec = ray_cluster_spec()
    spec["workerGroupSpecs"][0]["suspend"] = True
    return spec


def pytorch_job(master: int = 1, workers: int = 3) -> dict[str, Any]:
    return obj(
        "kubeflow.org/v1",
        "PyTorchJob",
        {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": master, "template": template(1)},
                "Worker": {"replicas": workers, "template": template(2)},
            }
        },
    )


def rollout(replicas: int = 5) -> dict[str, Any]:
    return obj("argoproj.io/v1alpha1", "Rollout", {"replicas": replicas, "template": template(1)})


# (object, pods it runs, GPUs it takes)
CASES: dict[str, tuple[dict[str, Any], int, int]] = {
    "Deployment": (obj("apps/v1", "Deployment", {"replicas": 3, "template": template(2)}), 3, 6),
    "StatefulSet": (obj("apps/v1", "StatefulSet", {"template": template(2)}), 1, 2),  # replicas default 1
    "ReplicaSet": (obj("apps/v1", "ReplicaSet", {"replicas": 2, "template": template(1)}), 2, 2),
    "Job": (obj("batch/v1", "Job", {"parallelism": 5, "completions": 3, "template": template(1)}), 3, 3),
    "CronJob": (obj("batch/v1", "CronJob", {"jobTemplate": {"spec": {"template": template(1)}}}), 0, 0),
    "Pod": (obj("v1", "Pod", template(3)["spec"]), 1, 3),
    # 2 Jobs x 4 pods x 1 GPU, and one driver pod without GPUs.
    "JobSet": (jobset(), 9, 8),
    # 3 groups of one leader (1 GPU) and 3 workers (2 GPUs each).
    "LeaderWorkerSet": (lws(), 12, 21),
    # A head without GPUs and 3 workers; the group without replicas runs none.
    "RayCluster": (obj("ray.io/v1", "RayCluster", ray_cluster_spec()), 4, 3),
    "RayJob": (
        obj("ray.io/v1", "RayJob", {"entrypoint": "python x.py", "rayClusterSpec": ray_cluster_spec()}),
        4,
        3,
    ),
    "PyTorchJob": (pytorch_job(), 4, 7),
    "Rollout": (rollout(), 5, 5),
}


def test_every_kind_of_the_table_has_a_case() -> None:
    assert sorted(CASES) == sorted(kind.kind for kind in WORKLOAD_KINDS)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_workload_is_counted_whole(kind: str) -> None:
    workload, pods, gpus = CASES[kind]
    usage = workload_usage(workload)
    assert (usage.kind, usage.quota, usage.replicas) == (kind, "q", pods)
    assert usage.usage.get(GPU, D(0)) == gpus
    assert usage.usage.get("pods", D(0)) == pods


@pytest.mark.parametrize(
    ("workload", "pods", "gpus"),
    [
        (jobset(replicas=1, parallelism=4, completions=2), 3, 2),  # no more pods than completions
        (jobset(replicas=0), 1, 0),
        (lws(replicas=2, size=1), 2, 2),  # a group of one: the leader alone
        (lws(replicas=2, size=3, leader=False), 6, 12),  # the leader runs the worker template
        (obj("ray.io/v1", "RayCluster", ray_cluster_spec(workers=2, hosts=4)), 9, 8),  # multi-host groups
        (obj("ray.io/v1", "RayJob", {"clusterSelector": {"ray.io/cluster": "c"}}), 0, 0),  # an existing one
        (obj("ray.io/v1", "RayCluster", suspended_group()), 1, 0),  # a suspended worker group runs none
        (pytorch_job(master=1, workers=0), 1, 1),
    ],
)
def test_replicas_multiply_as_each_kind_runs_them(workload: dict[str, Any], pods: int, gpus: int) -> None:
    usage = workload_usage(workload)
    assert (usage.replicas, usage.usage.get(GPU, D(0))) == (pods, gpus)


def test_templates_name_their_field() -> None:
    assert [item.field for item in pod_templates(jobset())] == [
        "spec.replicatedJobs[0].template.spec.template.spec",
        "spec.replicatedJobs[1].template.spec.template.spec",
    ]
    assert [item.field for item in pod_templates(pytorch_job())] == [
        "spec.pytorchReplicaSpecs.Master.template.spec",
        "spec.pytorchReplicaSpecs.Worker.template.spec",
    ]
    assert [item.field for item in pod_templates(lws(leader=False))] == [
        "spec.leaderWorkerTemplate.workerTemplate.spec",
        "spec.leaderWorkerTemplate.workerTemplate.spec",
    ]


@pytest.mark.parametrize(
    ("workload", "field"),
    [
        (jobset(replicas=-1), "spec.replicatedJobs[0].replicas"),
        (obj("ray.io/v1", "RayCluster", {"workerGroupSpecs": {"not": "a list"}}), "spec.workerGroupSpecs"),
        (
            obj("kubeflow.org/v1", "PyTorchJob", {"pytorchReplicaSpecs": ["Master"]}),
            "spec.pytorchReplicaSpecs",
        ),
        (obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", {"replicas": "3"}), "spec.replicas"),
    ],
)
def test_a_malformed_workload_names_the_field(workload: dict[str, Any], field: str) -> None:
    with pytest.raises(WorkloadError, match=field.replace("[", r"\[").replace("]", r"\]")):
        workload_usage(workload)


def test_the_quota_label_may_be_on_any_pod_template() -> None:
    workload = pytorch_job()
    workload["metadata"]["labels"] = {}
    workload["spec"]["pytorchReplicaSpecs"]["Worker"]["template"] = template(2, quota="team")
    assert quota_label(workload) == "team"
    assert quota_label_conflict(workload) == ""
    workload["spec"]["pytorchReplicaSpecs"]["Master"]["template"] = template(1, quota="other")
    message = quota_label_conflict(workload)
    assert "'other' on its pod template (spec.pytorchReplicaSpecs.Master.template.metadata.labels)" in message
    assert "'team' on its pod template (spec.pytorchReplicaSpecs.Worker.template.metadata.labels)" in message


def test_the_objects_label_disagreeing_with_a_template_is_a_conflict() -> None:
    workload = lws()
    workload["spec"]["leaderWorkerTemplate"]["workerTemplate"] = template(2, quota="other")
    message = quota_label_conflict(workload)
    assert "'q' on the LeaderWorkerSet but 'other'" in message
    assert "spec.leaderWorkerTemplate.workerTemplate.metadata.labels" in message


@pytest.mark.parametrize(
    ("api_version", "kind", "controls"),
    [
        ("jobset.x-k8s.io/v1alpha2", "JobSet", True),  # its Jobs
        ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", True),  # its StatefulSets
        ("ray.io/v1", "RayJob", True),  # its RayCluster and submitter Job
        ("ray.io/v1", "RayCluster", True),  # its pods
        ("kubeflow.org/v1", "PyTorchJob", True),  # its pods
        ("argoproj.io/v1alpha1", "Rollout", True),  # its ReplicaSets
        ("example.com/v1", "Rollout", False),  # same kind, another group
        ("batch/v1", "CronJob", False),  # each Job it makes is charged itself
        ("v1", "Pod", True),  # LeaderWorkerSet's worker StatefulSets, owned by their leader pod
        ("apps/v1", "Pod", False),
    ],
)
def test_objects_a_workload_controls_are_charged_to_it(api_version: str, kind: str, controls: bool) -> None:
    owned = {
        "kind": "Job",
        "metadata": {
            "ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": "o", "controller": True}]
        },
    }
    assert (controller_kind(api_version, kind) is not None) == controls
    assert is_controlled_by_workload(owned) == controls


@pytest.mark.parametrize(
    ("workload", "path"),
    [
        (jobset(), "spec.suspend"),
        (obj("ray.io/v1", "RayCluster", ray_cluster_spec()), "spec.suspend"),
        (obj("ray.io/v1", "RayJob", {"rayClusterSpec": ray_cluster_spec()}), "spec.suspend"),
        (pytorch_job(), "spec.runPolicy.suspend"),
    ],
)
def test_a_suspended_workload_holds_nothing(workload: dict[str, Any], path: str) -> None:
    assert not holds_nothing(workload)
    *parents, last = path.split(".")
    target = workload
    for part in parents:
        target = target.setdefault(part, {})
    target[last] = True
    assert holds_nothing(workload)
    assert workload_usage(workload).usage.get(GPU) is None


def _conditions(*types: str, status: str = "True") -> dict[str, Any]:
    return {"conditions": [{"type": kind, "status": status} for kind in types]}


def _ray_job(shutdown: bool | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"entrypoint": "python x.py", "rayClusterSpec": ray_cluster_spec()}
    if shutdown is not None:
        spec["shutdownAfterJobFinishes"] = shutdown
    return obj("ray.io/v1", "RayJob", spec)


@pytest.mark.parametrize(
    ("workload", "status", "holds"),
    [
        (jobset(), {}, True),
        (jobset(), _conditions("StartupPolicyCompleted"), True),
        (jobset(), _conditions("Completed"), False),
        (jobset(), _conditions("Failed"), False),
        (jobset(), _conditions("Completed", status="False"), True),
        (jobset(), _conditions("Complete"), True),  # a batch Job's spelling, not JobSet's
        (pytorch_job(), _conditions("Created", "Running"), True),
        (pytorch_job(), _conditions("Created", "Succeeded"), False),
        (pytorch_job(), _conditions("Failed"), False),
        (pytorch_job(), _conditions("Restarting"), True),
        (pytorch_job(), _conditions("Succeeded", status="False"), True),
        (_ray_job(shutdown=True), {"jobDeploymentStatus": "Running"}, True),
        (_ray_job(shutdown=True), {"jobDeploymentStatus": "Complete"}, False),
        (_ray_job(shutdown=True), {"jobDeploymentStatus": "Failed"}, False),
        (_ray_job(shutdown=True), {"jobDeploymentStatus": "Retrying"}, True),
        # Without shutdownAfterJobFinishes its RayCluster keeps running after the job: still charged.
        (_ray_job(shutdown=False), {"jobDeploymentStatus": "Complete"}, True),
        (_ray_job(), {"jobDeploymentStatus": "Complete"}, True),
        # Kinds without a finished rule never finish by status.
        (lws(), _conditions("Completed", "Failed"), True),
        (obj("ray.io/v1", "RayCluster", ray_cluster_spec()), {"jobDeploymentStatus": "Complete"}, True),
    ],
)
def test_a_finished_workload_holds_nothing(
    workload: dict[str, Any], status: dict[str, Any], holds: bool
) -> None:
    finished = {**workload, "status": status}
    assert holds_nothing(finished) is not holds
    assert (workload_usage(finished).usage.get(GPU) is not None) is holds
    # What a workload cache keeps of the status (the rest is dropped) decides the same.
    kept = {**workload, "status": finish_status(finished)}
    assert holds_nothing(kept) is not holds


@pytest.mark.parametrize(
    ("workload", "gpus"), [(lws(replicas=1), 14), (rollout(replicas=1), 2), (pytorch_job(workers=1), 5)]
)
def test_scale_sets_the_replica_count_of_kinds_with_a_scale_subresource(
    workload: dict[str, Any], gpus: int
) -> None:
    assert workload_usage(workload, replicas=2).usage[GPU] == gpus


def test_kinds_without_a_scale_subresource_cannot_be_scaled() -> None:
    with pytest.raises(WorkloadError, match="no scale subresource"):
        workload_usage(jobset(), replicas=2)


def test_claims_and_gpus_are_found_in_every_template() -> None:
    workload = pytorch_job()
    workload["spec"]["pytorchReplicaSpecs"]["Master"]["template"] = template(0)
    workload["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 0
    assert takes_gpus(workload)  # a template of no replicas still asks for GPUs
    workload["spec"]["pytorchReplicaSpecs"]["Worker"]["template"] = template(0, claim="c")
    assert referenced_claims(workload).claims == {"c"}


@pytest.mark.parametrize(
    "kind", ["JobSet", "LeaderWorkerSet", "RayCluster", "RayJob", "PyTorchJob", "Rollout"]
)
def test_a_workload_is_admitted_or_refused_whole(kind: str) -> None:
    workload, _, gpus = CASES[kind]
    usage = workload_usage(workload).usage
    ask = WorkloadAsk("uid", f"{kind}/ns/w", usage, usage, generation=1)
    fits = GpuQuota(name="q", parent="", hard={GPU: D(gpus)})
    decision = admit_workload(fits, ask, NOW)
    assert isinstance(decision, Allowed) and decision.status is not None
    assert decision.status.used[GPU] == gpus
    short = GpuQuota(name="q", parent="", hard={GPU: D(gpus - 1)})
    refused = admit_workload(short, ask, NOW)
    assert isinstance(refused, Denied)
    assert (refused.quota, refused.key, refused.asked) == ("q", GPU, D(gpus))
    assert f'GpuQuota "q": {kind} ns/w asks {GPU}={gpus}' in refused.message
