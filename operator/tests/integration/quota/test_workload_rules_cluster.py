"""What a workload takes, on the real local control plane: spec.hard keys as ResourceQuota spells them,
the quota label on the pod template, LimitRange defaults and "must specify", and pods/resize."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from kubernetes import client

from .conftest import GPU, Quotas, deployment, kubectl, wait_for

pytestmark = pytest.mark.cluster
LABEL = "gpuforge.io/quota"


def create(api_client: Any, namespace: str, body: dict[str, Any]) -> str:
    try:
        client.AppsV1Api(api_client).create_namespaced_deployment(namespace, body)
    except client.ApiException as error:
        return str(error.body)
    return "admitted"


def template_only(name: str, quota: str, gpus: int = 1) -> dict[str, Any]:
    body = deployment(name, quota, gpus=gpus)
    del body["metadata"]["labels"][LABEL]
    body["spec"]["template"]["metadata"]["labels"][LABEL] = quota
    return body


def test_hard_keys_are_spelt_as_resource_quota_spells_them(quotas: Quotas) -> None:
    with pytest.raises(client.ApiException, match=r"did you mean requests\.nvidia\.com/gpu"):
        quotas.create("bare", {"nvidia.com/gpu": 1})
    with pytest.raises(client.ApiException, match=r"requests\.nvidia\.com/gpus: not a key gpuforge counts"):
        quotas.create("plural", {"requests.nvidia.com/gpus": 1})
    quotas.create("good", {GPU: 1, "limits.cpu": 2, "cash/requests.nvidia.com/gpu": 10})


def test_a_label_on_the_pod_template_alone_is_checked_and_counted(
    quotas: Quotas, namespace: str, api_client: Any
) -> None:
    quotas.create("team", {GPU: 2})
    quotas.create("other", {GPU: 2})
    team = quotas.name("team")
    assert create(api_client, namespace, template_only("w1", team, gpus=2)) == "admitted"
    wait_for("the template-labelled Deployment to be counted", lambda: quotas.used("team") == "2")
    assert "only 0 is left" in create(api_client, namespace, template_only("w2", team))
    both = deployment("w3", team)
    both["spec"]["template"]["metadata"]["labels"][LABEL] = quotas.name("other")
    answer = create(api_client, namespace, both)
    assert f"is '{team}' on the Deployment but '{quotas.name('other')}' on its pod template" in answer


def test_limit_range_defaults_are_counted_and_an_unset_limit_refused(
    quotas: Quotas, namespace: str, api_client: Any
) -> None:
    quotas.create("team", {GPU: 8, "limits.cpu": 3})
    team = quotas.name("team")
    assert "must specify limits.cpu for: main" in create(api_client, namespace, deployment("w1", team))
    client.CoreV1Api(api_client).create_namespaced_limit_range(
        namespace,
        {
            "metadata": {"name": "defaults"},
            "spec": {"limits": [{"type": "Container", "default": {"cpu": "2"}}]},
        },
    )
    # The webhook reads LimitRanges from its watch cache: the first create after the watch delivers it.
    answers: list[str] = []
    wait_for(
        "the LimitRange default to be applied",
        lambda: (
            answers.append(create(api_client, namespace, deployment("w2", team))) or answers[-1] == "admitted"
        ),
        describe=lambda: answers[-1:],
    )
    wait_for("the defaulted limit to be counted", lambda: quotas.used("team", "limits.cpu") == "2")
    assert "asks limits.cpu=2 but only 1 is left" in create(api_client, namespace, deployment("w3", team))


def test_a_resize_that_grows_a_counted_request_is_checked(
    quotas: Quotas, namespace: str, api_client: Any, dev_cluster: Any
) -> None:
    quotas.create("team", {"requests.cpu": 2})
    pod = {
        "metadata": {"name": "p", "labels": {LABEL: quotas.name("team")}},
        "spec": {
            # Left unscheduled: kwok's simulated nodes do not declare in-place resize, and the API server
            # refuses to resize a pod on such a node before any webhook sees it.
            "nodeSelector": {"gpuforge.io/no-such-node": "true"},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/work:1",
                    "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}},
                }
            ],
        },
    }
    client.CoreV1Api(api_client).create_namespaced_pod(namespace, pod)
    wait_for("the pod to be counted", lambda: quotas.used("team", "requests.cpu") == "1")

    def resize(cpu: str) -> subprocess.CompletedProcess[str]:
        patch = {
            "spec": {
                "containers": [
                    {"name": "main", "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}
                ]
            }
        }
        return subprocess.run(
            [
                *kubectl(dev_cluster),
                "-n",
                namespace,
                "patch",
                "pod",
                "p",
                "--subresource",
                "resize",
                "-p",
                json.dumps(patch),
            ],
            capture_output=True,
            text=True,
            check=False,
        )

    refused = resize("3")
    assert refused.returncode != 0 and "asks requests.cpu=2 but only 1 is left" in refused.stderr, (
        refused.stderr
    )
    grown = resize("2")
    assert grown.returncode == 0, grown.stderr
    wait_for("the resized pod to be counted", lambda: quotas.used("team", "requests.cpu") == "2")


def test_a_namespace_that_requires_a_quota_refuses_gpu_workloads_naming_none(
    quotas: Quotas, namespace: str, api_client: Any
) -> None:
    core = client.CoreV1Api(api_client)
    core.patch_namespace(namespace, {"metadata": {"labels": {"gpuforge.io/quota-required": "true"}}})
    quotas.create("team", {GPU: 2})
    unnamed = deployment("w1", "")
    del unnamed["metadata"]["labels"][LABEL]
    answers: list[str] = []
    wait_for(  # the namespace's new label reaches the webhook through its watch
        "the requirement to apply",
        lambda: (
            answers.append(create(api_client, namespace, unnamed)) or "requires a GpuQuota" in answers[-1]
        ),
        describe=lambda: answers[-1:],
    )
    assert f"Deployment {namespace}/w1 names none" in answers[-1]
    cpu_only = deployment("w2", "")
    del cpu_only["metadata"]["labels"][LABEL]
    del cpu_only["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert create(api_client, namespace, cpu_only) == "admitted"  # takes no GPU
    assert create(api_client, namespace, template_only("w3", quotas.name("team"))) == "admitted"


RUN_DURATION = "sim.gpuforge.io/run-duration"


def cronjob(name: str, quota: str, *, on_template: bool = True) -> dict[str, Any]:
    pod_labels = {LABEL: quota} if on_template else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "labels": {} if on_template else {LABEL: quota}},
        "spec": {
            "schedule": "0 0 1 1 *",  # the test makes its Jobs itself
            "jobTemplate": {
                "spec": {
                    "template": {
                        # Runs 3 s on the simulated node (3 GPU-hours at the webhook's speedup): the
                        # budget is spent even when a loaded kwok marks the pod Running late.
                        "metadata": {"labels": pod_labels, "annotations": {RUN_DURATION: "3s"}},
                        "spec": {
                            "restartPolicy": "Never",
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
                }
            },
        },
    }


def test_jobs_of_a_cronjob_are_charged_when_created_and_refused_once_the_budget_is_spent(
    quotas: Quotas, namespace: str, api_client: Any, dev_cluster: Any, gpu_nodes: list[str]
) -> None:
    # The webhook runs with --speedup 3600: one second of one running GPU counts as one GPU-hour.
    # kwok completes a Job's pod within about a second: a budget of a fifth of a GPU-hour.
    quotas.create("hours", {GPU: 4, f"cash/{GPU}": "200m"})
    hours = quotas.name("hours")
    batch = client.BatchV1Api(api_client)
    with pytest.raises(client.ApiException, match="its Jobs carry only the job template's labels"):
        batch.create_namespaced_cron_job(namespace, cronjob("own-only", hours, on_template=False))
    batch.create_namespaced_cron_job(namespace, cronjob("nightly", hours))
    assert quotas.used("hours") == "0"  # a schedule holds nothing; its Jobs are charged

    def create_job(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*kubectl(dev_cluster), "-n", namespace, "create", "job", name, "--from=cronjob/nightly"],
            capture_output=True,
            text=True,
            check=False,
        )

    first = create_job("first")
    assert first.returncode == 0, first.stderr
    core = client.CoreV1Api(api_client)
    wait_for(
        "the Job's GPU-hours to spend the budget",
        lambda: float(quotas.used("hours", f"cash/{GPU}")) >= 0.2,
        timeout=60,
        describe=lambda: (
            quotas.get("hours").get("status"),
            [(p.metadata.name, p.status.phase) for p in core.list_namespaced_pod(namespace).items],
        ),
    )
    late = create_job("late")
    assert late.returncode != 0 and "budget cash/requests.nvidia.com/gpu is spent" in late.stderr, late.stderr
