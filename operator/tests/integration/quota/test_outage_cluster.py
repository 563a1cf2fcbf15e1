"""A webhook outage on the real local control plane: with failurePolicy Fail and nothing answering,
what takes no quota still goes through (matchConditions keep it from the webhook), and only growth of
labelled workloads is refused."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from .conftest import Quotas, WebhookProcess, deployment, kubectl

pytestmark = pytest.mark.cluster


@pytest.fixture
def webhook_crashed(quota_webhook: WebhookProcess) -> Iterator[None]:
    quota_webhook.stop(crash=True)  # SIGKILL: its configurations stay, so calls to it fail
    try:
        yield
    finally:
        quota_webhook.start()


def scale(dev_cluster: Any, namespace: str, name: str, replicas: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*kubectl(dev_cluster), "-n", namespace, "scale", f"deployment/{name}", f"--replicas={replicas}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_an_outage_refuses_only_growth_of_labelled_workloads(
    quotas: Quotas, namespace: str, api_client: Any, dev_cluster: Any, request: pytest.FixtureRequest
) -> None:
    apps = client.AppsV1Api(api_client)
    quotas.create("team", {"requests.nvidia.com/gpu": 8})
    apps.create_namespaced_deployment(namespace, deployment("w", quotas.name("team"), gpus=1, replicas=4))
    webhooks = client.AdmissionregistrationV1Api(api_client)
    configuration = webhooks.read_validating_webhook_configuration("gpuforge-quota-test-workloads")
    assert {hook.failure_policy for hook in configuration.webhooks} == {"Fail"}

    request.getfixturevalue("webhook_crashed")

    down = scale(dev_cluster, namespace, "w", 2)  # the scale subresource
    assert down.returncode == 0, down.stderr
    apps.patch_namespaced_deployment("w", namespace, {"spec": {"replicas": 1}})  # an update lowering replicas
    unlabelled = deployment("free", quotas.name("team"), gpus=1)
    del unlabelled["metadata"]["labels"]["gpuforge.io/quota"]
    apps.create_namespaced_deployment(namespace, unlabelled)
    assert apps.read_namespaced_deployment("w", namespace).spec.replicas == 1

    up = scale(dev_cluster, namespace, "w", 3)
    assert up.returncode != 0 and "failed calling webhook" in up.stderr, up.stderr
    with pytest.raises(client.ApiException, match="failed calling webhook"):
        apps.patch_namespaced_deployment("w", namespace, {"spec": {"replicas": 3}})
    with pytest.raises(client.ApiException, match="failed calling webhook"):
        apps.create_namespaced_deployment(namespace, deployment("more", quotas.name("team"), gpus=1))
    assert apps.read_namespaced_deployment("w", namespace).spec.replicas == 1
