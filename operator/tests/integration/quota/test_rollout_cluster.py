"""A Deployment's rolling update charges its surge pods against `hard`, on the real local control plane
(its controller rolls the pods on simulated GPU nodes): the update is refused when the surge would not
fit, and the surge is given back when the rollout ends."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from .conftest import GPU, Quotas, deployment, wait_for
from .test_quota_cluster import create

pytestmark = pytest.mark.cluster


def rolled_out(apps: client.AppsV1Api, namespace: str, name: str, replicas: int) -> bool:
    status = apps.read_namespaced_deployment_status(name, namespace).status
    return (
        status.observed_generation == apps.read_namespaced_deployment(name, namespace).metadata.generation
        and (status.updated_replicas or 0) == replicas
        and (status.replicas or 0) == replicas
        and (status.available_replicas or 0) == replicas
    )


def new_image(image: str, **spec: Any) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "main", "image": image}]}}
    return {"spec": {"template": template, **spec}}


def test_a_rolling_updates_surge_is_charged_and_refused_over_hard(
    quotas: Quotas, namespace: str, api_client: Any, gpu_nodes: list[str]
) -> None:
    apps = client.AppsV1Api(api_client)
    quotas.create("team", {GPU: 3})
    team = quotas.name("team")
    assert create(apps, namespace, deployment("w", team, replicas=2)) == "admitted"
    wait_for("the Deployment to run", lambda: rolled_out(apps, namespace, "w", 2), timeout=60)
    wait_for("2 GPUs to be counted", lambda: quotas.used("team") == "2")

    # Paused, a new template waits to roll with its surge pod (25% of 2, rounded up) charged.
    apps.patch_namespaced_deployment("w", namespace, {"spec": {"paused": True}})
    apps.patch_namespaced_deployment("w", namespace, new_image("registry.example/work:2"))
    wait_for("the surge to be counted", lambda: quotas.used("team") == "3")
    assert "only 0 is left" in create(apps, namespace, deployment("other", team))
    apps.patch_namespaced_deployment("w", namespace, {"spec": {"paused": False}})
    wait_for("the rollout to end", lambda: rolled_out(apps, namespace, "w", 2), timeout=90)
    wait_for("the surge to be given back", lambda: quotas.used("team") == "2", timeout=30)

    # With every GPU of hard in use, an update that would surge is refused, saying so.
    quotas.create("full", {GPU: 2})
    full = quotas.name("full")
    assert create(apps, namespace, deployment("f", full, replicas=2)) == "admitted"
    wait_for("the full Deployment to run", lambda: rolled_out(apps, namespace, "f", 2), timeout=60)
    with pytest.raises(client.ApiException) as refused:
        apps.patch_namespaced_deployment("f", namespace, new_image("registry.example/work:2"))
    message = str(refused.value.body).replace('\\"', '"')
    assert f'GpuQuota "{full}": Deployment {namespace}/f asks {GPU}=1 but only 0 is left' in message
    assert "is its rolling update's surge (1 pod above spec.replicas" in message
    assert "set spec.strategy.rollingUpdate.maxSurge to 0" in message
    # Without surge the same update replaces the pods within hard.
    no_surge = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    apps.patch_namespaced_deployment("f", namespace, new_image("registry.example/work:2", strategy=no_surge))
    wait_for("the surge-less rollout to end", lambda: rolled_out(apps, namespace, "f", 2), timeout=90)
    # status.used is written behind admission, so it is awaited rather than read once.
    wait_for("2 GPUs to be counted in full", lambda: quotas.used("full") == "2", timeout=30)
