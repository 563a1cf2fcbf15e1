"""A namespace's default GpuQuota on the local control plane: GPU workloads naming no quota are charged
to it by the webhook, and counted to it by the usage controller."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from kubernetes import client

from .conftest import GPU, Quotas, deployment, kubectl, wait_for
from .test_quota_cluster import create

LABEL = "gpuforge.io/quota"
DEFAULT = "gpuforge.io/default-quota"


def unlabelled(name: str, gpus: int = 1) -> dict[str, Any]:
    body = deployment(name, "", gpus=gpus)
    del body["metadata"]["labels"][LABEL]
    if not gpus:
        del body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    return body


def bare_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/work:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def name_default(core: client.CoreV1Api, namespace: str, quota: str) -> str:
    """Label the namespace and wait until the webhook (through its namespace watch) and the API server
    (its namespaceSelector) both apply it: a bare GPU pod, tried as a dry run, is then refused."""
    core.patch_namespace(namespace, {"metadata": {"labels": {DEFAULT: quota}}})
    answers: list[str] = []

    def refused() -> bool:
        try:
            core.create_namespaced_pod(namespace, bare_pod("probe"), dry_run="All")
            answers.append("admitted")
        except client.ApiException as error:
            answers.append(str(error.body))
        return "default GpuQuota" in answers[-1]

    wait_for("the default quota to apply", refused, describe=lambda: answers[-1:])
    return answers[-1]


def test_unlabelled_gpu_workloads_are_charged_to_the_default(
    quotas: Quotas, namespace: str, api_client: Any
) -> None:
    quotas.create("dflt", {GPU: 2})
    name = quotas.name("dflt")
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    probe = name_default(core, namespace, name)
    assert f"a bare Pod must carry the label itself: {LABEL}={name}" in probe
    assert create(apps, namespace, unlabelled("w1", gpus=2)) == "admitted"
    refused = create(apps, namespace, unlabelled("w2")).replace('\\"', '"')
    assert (
        f'GpuQuota "{name}": Deployment {namespace}/w2 asks requests.nvidia.com/gpu=1 but only 0 is left'
        in refused
    )
    assert create(apps, namespace, unlabelled("cpu-only", gpus=0)) == "admitted"  # takes no GPU: not charged
    # The controller counts the stored object to the default quota too (and nothing else).
    wait_for("the controller to count 2", lambda: quotas.used("dflt") == "2", timeout=10)
    # Scaling up through the scale subresource is charged to it as well.
    try:
        apps.patch_namespaced_deployment_scale("w1", namespace, {"spec": {"replicas": 2}})
        scaled = "admitted"
    except client.ApiException as error:
        scaled = str(error.body)
    assert "requests.nvidia.com/gpu=2 but only 0 is left" in scaled
    # A workload that names a quota is charged to that one.
    quotas.create("named", {GPU: 1})
    assert create(apps, namespace, deployment("named", quotas.name("named"))) == "admitted"
    wait_for("the named quota to count 1", lambda: quotas.used("named") == "1", timeout=10)
    assert quotas.used("dflt") == "2"


def test_the_default_quota_must_admit_the_namespace(quotas: Quotas, namespace: str, api_client: Any) -> None:
    quotas.create("elsewhere", {GPU: 2}, namespaces=["some-other-namespace"])
    name = quotas.name("elsewhere")
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    name_default(core, namespace, name)
    refused = create(apps, namespace, unlabelled("w")).replace('\\"', '"')
    assert f'namespace "{namespace}" may not charge GpuQuota "{name}"' in refused


def test_a_default_quota_answers_a_namespace_that_requires_one(
    quotas: Quotas, namespace: str, api_client: Any
) -> None:
    quotas.create("answers", {GPU: 1})
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    core.patch_namespace(namespace, {"metadata": {"labels": {"gpuforge.io/quota-required": "true"}}})
    name_default(core, namespace, quotas.name("answers"))
    assert create(apps, namespace, unlabelled("w")) == "admitted"  # charged, not refused as naming none
    wait_for("the controller to count 1", lambda: quotas.used("answers") == "1", timeout=10)


def test_a_resize_of_an_unlabelled_pod_is_checked_against_the_default(
    quotas: Quotas, namespace: str, api_client: Any, dev_cluster: Any
) -> None:
    """A GPU pod naming no quota (created before the namespace named its default) grows in place: the
    growth is checked against the default quota, as a labelled pod's is against its own."""
    core = client.CoreV1Api(api_client)
    pod = bare_pod("p")
    container = pod["spec"]["containers"][0]
    container["resources"] = {"requests": {"cpu": "1"}, "limits": {"cpu": "1", "nvidia.com/gpu": "1"}}
    # Left unscheduled: kwok's simulated nodes do not declare in-place resize, and the API server
    # refuses to resize a pod on such a node before any webhook sees it.
    pod["spec"]["nodeSelector"] = {"gpuforge.io/no-such-node": "true"}
    core.create_namespaced_pod(namespace, pod)
    quotas.create("dflt", {"requests.cpu": 2})
    name_default(core, namespace, quotas.name("dflt"))

    def resize(cpu: str) -> subprocess.CompletedProcess[str]:
        resources = {"requests": {"cpu": cpu}, "limits": {"cpu": cpu, "nvidia.com/gpu": "1"}}
        patch = {"spec": {"containers": [{"name": "main", "resources": resources}]}}
        return subprocess.run(
            [
                *kubectl(dev_cluster),
                *("-n", namespace, "patch", "pod", "p", "--subresource", "resize"),
                *("-p", json.dumps(patch)),
            ],
            capture_output=True,
            text=True,
            check=False,
        )

    refused = resize("4")
    assert refused.returncode != 0, refused.stdout
    assert f'GpuQuota "{quotas.name("dflt")}": Pod {namespace}/p asks requests.cpu=3 but only 2 is left' in (
        refused.stderr.replace('\\"', '"')
    ), refused.stderr
    grown = resize("3")
    assert grown.returncode == 0, grown.stderr
    # The growth is held for it (the pod names no quota, so it is charged by the reservation).
    wait_for("the growth to be charged", lambda: quotas.used("dflt", "requests.cpu") == "2")
