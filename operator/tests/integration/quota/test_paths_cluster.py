"""Paths around admission on the real local control plane: a pod cannot skip admission by naming a
controller that is not one, and relabelling a bare Pod into another quota is admitted there."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client

from gpuforge.constants import QUOTA_LABEL

from .conftest import GPU, Quotas, wait_for

pytestmark = pytest.mark.cluster


def bare_pod(name: str, quota: str, gpus: int, owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {QUOTA_LABEL: quota}}
    if owners:
        metadata["ownerReferences"] = owners
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": "no-such-node",  # never runs: only admission and counting matter here
            "containers": [
                {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


@pytest.mark.parametrize(
    "owner",
    [
        {"apiVersion": "example.com/v1", "kind": "Job"},  # a Job, but not batch's
        {"apiVersion": "batch/v1", "kind": "Job"},  # batch's, but no such Job
        {"apiVersion": "apps/v1", "kind": "ReplicaSet"},
    ],
)
def test_a_forged_controller_reference_does_not_skip_admission(
    quotas: Quotas, namespace: str, api_client: Any, owner: dict[str, str]
) -> None:
    quotas.create("forged", {GPU: 1})
    forged = {**owner, "name": "ghost", "uid": str(uuid.uuid4()), "controller": True}
    with pytest.raises(client.ApiException, match=r"asks requests\.nvidia\.com/gpu=2 but only 1 is left"):
        client.CoreV1Api(api_client).create_namespaced_pod(
            namespace, bare_pod("sneaky", quotas.name("forged"), 2, [forged])
        )


def test_relabelling_a_bare_pod_is_admitted_by_the_new_quota(
    quotas: Quotas, namespace: str, api_client: Any
) -> None:
    quotas.create("from", {GPU: 1})
    quotas.create("to", {GPU: 0})
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, bare_pod("mover", quotas.name("from"), 1))
    wait_for("the pod to be charged", lambda: quotas.used("from") == "1", timeout=10)
    relabel = {"metadata": {"labels": {QUOTA_LABEL: quotas.name("to")}}}
    with pytest.raises(client.ApiException, match="but only 0 is left"):
        core.patch_namespaced_pod("mover", namespace, relabel)
    quotas.patch("to", {"spec": {"hard": {GPU: "1"}}})

    def relabelled() -> bool:
        try:
            core.patch_namespaced_pod("mover", namespace, relabel)
        except client.ApiException as error:
            if "but only 0 is left" in str(error.body):
                return False  # the webhook's watch has not delivered the raised hard yet
            raise
        return True

    wait_for("the relabel admitted once the webhook sees the raised quota", relabelled, timeout=15)
    wait_for(
        "the GPU to move to the new quota",
        lambda: quotas.used("from") == "0" and quotas.used("to") == "1",
        timeout=15,
        describe=lambda: f"from {quotas.get('from').get('status')}, to {quotas.get('to').get('status')}",
    )
    # Another label change that keeps the quota is not the webhook's business.
    core.patch_namespaced_pod("mover", namespace, {"metadata": {"labels": {"stage": "two"}}})
