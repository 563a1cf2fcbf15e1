"""Finished work gives its quota back, on the real local control plane: a Job that completed, a bare
Pod that Succeeded, a suspended Job. Resuming a Job is admitted like a create."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from gpuforge.constants import QUOTA_LABEL

from .conftest import GPU, Quotas, deployment, wait_for

pytestmark = pytest.mark.cluster


def gpu_job(name: str, quota: str, *, suspend: bool = False, run: str = "1s") -> dict[str, Any]:
    """A one-pod Job taking one GPU; the simulated node finishes its pod after `run`."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUOTA_LABEL: quota}},
        "spec": {
            "suspend": suspend,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"sim.gpuforge.io/run-duration": run}},
                "spec": {
                    "restartPolicy": "Never",
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def test_a_completed_job_releases_its_gpus(
    quotas: Quotas, namespace: str, api_client: Any, gpu_nodes: list[str]
) -> None:
    quotas.create("done", {GPU: 1})
    batch = client.BatchV1Api(api_client)
    batch.create_namespaced_job(namespace, gpu_job("first", quotas.name("done")))
    wait_for("the Job to be charged", lambda: quotas.used("done") == "1", timeout=10)
    wait_for(
        "the Job to complete",
        lambda: any(
            c.type == "Complete" and c.status == "True"
            for c in batch.read_namespaced_job_status("first", namespace).status.conditions or ()
        ),
        timeout=60,
    )
    wait_for("the completed Job to release", lambda: quotas.used("done") == "0", timeout=15)
    batch.create_namespaced_job(namespace, gpu_job("second", quotas.name("done")))  # room again


def test_a_succeeded_bare_pod_releases_its_gpus(quotas: Quotas, namespace: str, api_client: Any) -> None:
    quotas.create("pod", {GPU: 1})
    core = client.CoreV1Api(api_client)
    pod = {
        "metadata": {"name": "once", "labels": {QUOTA_LABEL: quotas.name("pod")}},
        "spec": {
            "restartPolicy": "Never",
            "nodeName": "no-such-node",  # no kubelet: the test sets the phase a kubelet would
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    wait_for("the pod to be charged", lambda: quotas.used("pod") == "1", timeout=10)
    with pytest.raises(client.ApiException, match="but only 0 is left"):
        core.create_namespaced_pod(namespace, {**pod, "metadata": {**pod["metadata"], "name": "twice"}})
    core.patch_namespaced_pod_status("once", namespace, {"status": {"phase": "Succeeded"}})
    wait_for("the Succeeded pod to release", lambda: quotas.used("pod") == "0", timeout=15)


def test_suspending_releases_and_resuming_is_admitted_like_a_create(
    quotas: Quotas, namespace: str, api_client: Any
) -> None:
    quotas.create("pause", {GPU: 1})
    batch, apps = client.BatchV1Api(api_client), client.AppsV1Api(api_client)
    batch.create_namespaced_job(namespace, gpu_job("paused", quotas.name("pause"), suspend=True))
    assert quotas.used("pause") == "0"  # a suspended Job runs no pods
    apps.create_namespaced_deployment(namespace, deployment("serve", quotas.name("pause")))
    wait_for("the Deployment to be charged", lambda: quotas.used("pause") == "1", timeout=10)
    with pytest.raises(client.ApiException, match="but only 0 is left"):
        batch.patch_namespaced_job("paused", namespace, {"spec": {"suspend": False}})
    apps.delete_namespaced_deployment("serve", namespace)
    wait_for("the Deployment to release", lambda: quotas.used("pause") == "0", timeout=15)
    batch.patch_namespaced_job("paused", namespace, {"spec": {"suspend": False}})
    wait_for("the resumed Job to be charged", lambda: quotas.used("pause") == "1", timeout=10)
    batch.patch_namespaced_job("paused", namespace, {"spec": {"suspend": True}})
    wait_for("suspending to release", lambda: quotas.used("pause") == "0", timeout=15)
