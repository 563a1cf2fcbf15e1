"""Workloads of other projects' kinds, admitted whole on the real local control plane: their real CRDs
are served (no controller of theirs runs), and each object's GPUs are charged, or refused, at once."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuforge_lab.devcluster.workload_crds import workload_crds

from .conftest import GPU, Quotas, wait_for

pytestmark = pytest.mark.cluster
LABEL = "gpuforge.io/quota"


@pytest.fixture(scope="session")
def served_workload_crds(api_client: client.ApiClient) -> list[str]:
    """Install the CRDs (kept across runs: a CRD of the same name is replaced) and wait until served."""
    extensions = client.ApiextensionsV1Api(api_client)
    names = []
    for crd in workload_crds():
        name = crd["metadata"]["name"]
        names.append(name)
        try:
            extensions.create_custom_resource_definition(crd)
        except client.ApiException as error:
            if error.status != 409:
                raise
            current = extensions.read_custom_resource_definition(name)
            body = copy.deepcopy(crd)
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            extensions.replace_custom_resource_definition(name, body)

    def established(name: str) -> bool:
        conditions = extensions.read_custom_resource_definition(name).status.conditions or []
        return any(item.type == "Established" and item.status == "True" for item in conditions)

    wait_for("the workload CRDs to be served", lambda: all(established(name) for name in names))
    return names


def pod(gpus: int, image: str = "registry.example/work:1") -> dict[str, Any]:
    return {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": image, "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        }
    }


def jobset(gpus_each: int) -> tuple[str, str, str, dict[str, Any], int]:
    """2 Jobs x 2 pods at once."""
    job = {"parallelism": 2, "completions": 2, "template": pod(gpus_each)}
    spec = {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": job}}]}
    return "jobset.x-k8s.io", "v1alpha2", "jobsets", {"kind": "JobSet", "spec": spec}, 4 * gpus_each


def leader_worker_set(gpus_each: int) -> tuple[str, str, str, dict[str, Any], int]:
    """2 groups of a leader and 2 workers, all from the worker template."""
    spec = {"replicas": 2, "leaderWorkerTemplate": {"size": 3, "workerTemplate": pod(gpus_each)}}
    return (
        "leaderworkerset.x-k8s.io",
        "v1",
        "leaderworkersets",
        {"kind": "LeaderWorkerSet", "spec": spec},
        6 * gpus_each,
    )


def ray_cluster_spec(gpus_each: int) -> dict[str, Any]:
    """A head without GPUs and 3 workers."""
    worker = {
        "groupName": "gpu",
        "replicas": 3,
        "minReplicas": 0,
        "maxReplicas": 3,
        "template": pod(gpus_each),
    }
    return {"headGroupSpec": {"rayStartParams": {}, "template": pod(0)}, "workerGroupSpecs": [worker]}


def ray_cluster(gpus_each: int) -> tuple[str, str, str, dict[str, Any], int]:
    body = {"kind": "RayCluster", "spec": ray_cluster_spec(gpus_each)}
    return "ray.io", "v1", "rayclusters", body, 3 * gpus_each


def ray_job(gpus_each: int) -> tuple[str, str, str, dict[str, Any], int]:
    spec = {"entrypoint": "python train.py", "rayClusterSpec": ray_cluster_spec(gpus_each)}
    return "ray.io", "v1", "rayjobs", {"kind": "RayJob", "spec": spec}, 3 * gpus_each


def pytorch_job(gpus_each: int) -> tuple[str, str, str, dict[str, Any], int]:
    """A master and 3 workers."""
    specs = {
        "Master": {"replicas": 1, "template": pod(gpus_each)},
        "Worker": {"replicas": 3, "template": pod(gpus_each)},
    }
    for replica_spec in specs.values():
        replica_spec["template"]["spec"]["containers"][0]["name"] = "pytorch"
    body = {"kind": "PyTorchJob", "spec": {"pytorchReplicaSpecs": specs}}
    return "kubeflow.org", "v1", "pytorchjobs", body, 4 * gpus_each


def rollout(gpus_each: int) -> tuple[str, str, str, dict[str, Any], int]:
    template = pod(gpus_each)
    template["metadata"] = {"labels": {"app": "r"}}
    template["spec"]["restartPolicy"] = "Always"
    spec = {"replicas": 3, "selector": {"matchLabels": {"app": "r"}}, "template": template}
    return "argoproj.io", "v1alpha1", "rollouts", {"kind": "Rollout", "spec": spec}, 3 * gpus_each


KINDS = {
    "JobSet": jobset,
    "LeaderWorkerSet": leader_worker_set,
    "RayCluster": ray_cluster,
    "RayJob": ray_job,
    "PyTorchJob": pytorch_job,
    "Rollout": rollout,
}


class Objects:
    """Create custom workloads in the test's namespace; delete them afterwards."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.created: list[tuple[str, str, str, str]] = []

    def create(self, kind: str, name: str, quota: str, gpus_each: int) -> tuple[str, int]:
        """("admitted" or the refusal's message, the GPUs the object asks for)."""
        group, version, plural, body, gpus = KINDS[kind](gpus_each)
        body = {
            "apiVersion": f"{group}/{version}",
            **body,
            "metadata": {"name": name, "labels": {LABEL: quota}},
        }
        try:
            self.custom.create_namespaced_custom_object(group, version, self.namespace, plural, body)
        except client.ApiException as error:
            return str(error.body), gpus
        self.created.append((group, version, plural, name))
        return "admitted", gpus

    def delete_all(self) -> None:
        for group, version, plural, name in self.created:
            with contextlib.suppress(client.ApiException):
                self.custom.delete_namespaced_custom_object(group, version, self.namespace, plural, name)


@pytest.fixture
def objects(
    served_workload_crds: list[str], quotas: Quotas, api_client: client.ApiClient, namespace: str
) -> Iterator[Objects]:
    helper = Objects(api_client, namespace)
    yield helper
    helper.delete_all()  # before the quotas (the `quotas` fixture's cleanup runs after this one)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_workload_of_another_project_is_admitted_whole_or_refused_whole(
    kind: str, objects: Objects, quotas: Quotas
) -> None:
    _, _, _, _, whole = KINDS[kind](2)
    quotas.create("team", {GPU: whole + 1})
    team = quotas.name("team")
    answer, gpus = objects.create(kind, "fits", team, 2)
    assert answer == "admitted"
    wait_for(f"the {kind} to be counted whole", lambda: quotas.used("team") == str(gpus))

    def counted_from_the_object() -> bool:  # the usage controller saw it: no reservation holds it
        status = quotas.get("team").get("status") or {}
        return not status.get("reservations") and quotas.used("team") == str(gpus)

    wait_for(f"the usage controller to count the {kind}", counted_from_the_object, timeout=90)
    # One GPU is left; a second object asks for more than that, so none of it is admitted.
    answer, gpus = objects.create(kind, "too-big", team, 1)
    assert f'GpuQuota \\"{team}\\": {kind} {objects.namespace}/too-big asks {GPU}={gpus}' in answer
    assert "but only 1 is left" in answer
    assert quotas.used("team") == str(whole)


def test_what_a_workload_makes_is_not_charged_again(
    objects: Objects, quotas: Quotas, api_client: client.ApiClient, namespace: str
) -> None:
    """The pods a PyTorchJob makes, and the Jobs a JobSet makes (as their controllers would: labelled,
    with a controller reference), are admitted though the quota has no room left: the whole object is
    charged already."""
    quotas.create("team", {GPU: 12})
    team = quotas.name("team")
    assert objects.create("PyTorchJob", "train", team, 1)[0] == "admitted"
    assert objects.create("JobSet", "sweep", team, 2)[0] == "admitted"
    wait_for("both to be counted", lambda: quotas.used("team") == "12")
    custom = client.CustomObjectsApi(api_client)

    def owner(group: str, version: str, plural: str, kind: str, name: str) -> dict[str, Any]:
        found = custom.get_namespaced_custom_object(group, version, namespace, plural, name)
        uid = found["metadata"]["uid"]
        return {
            "apiVersion": f"{group}/{version}",
            "kind": kind,
            "name": name,
            "uid": uid,
            "controller": True,
        }

    trainer = owner("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", "train")
    core = client.CoreV1Api(api_client)
    for index in range(4):
        body = pod(1)
        body["metadata"] = {"name": f"train-{index}", "labels": {LABEL: team}, "ownerReferences": [trainer]}
        core.create_namespaced_pod(namespace, body)
    sweep = owner("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", "sweep")
    job = {
        "metadata": {"name": "sweep-workers-0", "labels": {LABEL: team}, "ownerReferences": [sweep]},
        "spec": {"parallelism": 2, "completions": 2, "template": pod(2)},
    }
    client.BatchV1Api(api_client).create_namespaced_job(namespace, job)
    # A pod naming an owner that is not there pays for itself, and there is no room for it.
    stray = pod(1)
    forged = {**trainer, "uid": "00000000-0000-0000-0000-000000000000"}
    stray["metadata"] = {"name": "stray", "labels": {LABEL: team}, "ownerReferences": [forged]}
    with pytest.raises(client.ApiException, match="only 0 is left"):
        core.create_namespaced_pod(namespace, stray)
    assert quotas.used("team") == "12"


@pytest.mark.parametrize(("kind", "plural", "group", "version"), [
    ("LeaderWorkerSet", "leaderworkersets", "leaderworkerset.x-k8s.io", "v1"),
    ("Rollout", "rollouts", "argoproj.io", "v1alpha1"),
])  # fmt: skip
def test_scaling_a_workload_of_another_project_is_checked_whole(
    kind: str, plural: str, group: str, version: str, objects: Objects, quotas: Quotas
) -> None:
    """`kubectl scale` (the scale subresource of their CRDs) grows the whole object: refused when the
    growth does not fit, admitted and counted when it does."""
    _, _, _, _, whole = KINDS[kind](1)
    replicas = 2 if kind == "LeaderWorkerSet" else 3  # as KINDS makes them
    per_replica = whole // replicas
    quotas.create("team", {GPU: whole + per_replica})
    team = quotas.name("team")
    assert objects.create(kind, "w", team, 1)[0] == "admitted"
    wait_for(f"the {kind} to be counted", lambda: quotas.used("team") == str(whole))

    def scale(to: int) -> None:
        body = {"spec": {"replicas": to}}
        objects.custom.patch_namespaced_custom_object_scale(
            group, version, objects.namespace, plural, "w", body
        )

    with pytest.raises(client.ApiException, match=f"only {per_replica} is left"):
        scale(replicas + 2)
    scale(replicas + 1)
    wait_for(f"the scaled {kind} to be counted", lambda: quotas.used("team") == str(whole + per_replica))


def _condition(kind: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": kind,
        "message": "set by the test, as the project's controller sets it",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "lastUpdateTime": "2026-01-01T00:00:00Z",
    }


@pytest.mark.parametrize(("kind", "plural", "group", "version", "status"), [
    ("JobSet", "jobsets", "jobset.x-k8s.io", "v1alpha2", {"conditions": [_condition("Completed")]}),
    ("PyTorchJob", "pytorchjobs", "kubeflow.org", "v1", {"conditions": [_condition("Succeeded")]}),
    ("RayJob", "rayjobs", "ray.io", "v1", {"jobDeploymentStatus": "Failed"}),
])  # fmt: skip
def test_a_finished_workload_of_another_project_releases_its_gpus(
    kind: str, plural: str, group: str, version: str, status: dict[str, Any], objects: Objects, quotas: Quotas
) -> None:
    """Its status says it finished, as its controller writes it (none of theirs runs here): the charge
    is released, and the room goes to the next one."""
    _, _, _, _, whole = KINDS[kind](1)
    quotas.create("team", {GPU: whole})
    team = quotas.name("team")
    assert objects.create(kind, "first", team, 1)[0] == "admitted"
    wait_for(f"the {kind} to be counted", lambda: quotas.used("team") == str(whole))
    if kind == "RayJob":  # its RayCluster is deleted after the job only with this set
        objects.custom.patch_namespaced_custom_object(
            group, version, objects.namespace, plural, "first", {"spec": {"shutdownAfterJobFinishes": True}}
        )
    assert "only 0 is left" in objects.create(kind, "second", team, 1)[0]
    objects.custom.patch_namespaced_custom_object_status(
        group, version, objects.namespace, plural, "first", {"status": status}
    )
    wait_for(f"the finished {kind} to release its GPUs", lambda: quotas.used("team") == "0", timeout=30)
    assert objects.create(kind, "second", team, 1)[0] == "admitted"
