"""Tree integrity on the real local control plane: a busy child keeps charging its parent for what
runs in it, a leaf that workloads charge cannot be deleted, and a parent gains a key only once its
children hold it."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from .conftest import GPU, Quotas, deployment, wait_for

pytestmark = pytest.mark.cluster


def test_a_busy_child_keeps_its_usage_charged_and_cannot_be_deleted(
    quotas: Quotas, namespace: str, api_client: Any
) -> None:
    apps = client.AppsV1Api(api_client)
    quotas.create("org", {GPU: 16})
    quotas.create("team", {GPU: 8}, parent="org")
    apps.create_namespaced_deployment(namespace, deployment("busy", quotas.name("team"), gpus=1, replicas=4))
    wait_for("the child to count its Deployment", lambda: quotas.used("team") == "4")

    quotas.patch("team", {"spec": {"hard": {GPU: "2"}}})  # lowering is always allowed
    wait_for(
        "the parent to give back only what does not run (8 -> 4, not 2)",
        lambda: quotas.used("org") == "4",
        describe=lambda: quotas.get("org").get("status"),
    )
    with pytest.raises(client.ApiException, match="still charged by 1 running workload") as refused:
        quotas.delete("team")
    assert f"Deployment/{namespace}/busy" in str(refused.value.body)

    apps.delete_namespaced_deployment("busy", namespace)
    wait_for("the parent to get back what stopped running", lambda: quotas.used("org") == "2")
    quotas.delete("team")
    wait_for("the parent to get the deleted leaf's quota back", lambda: quotas.used("org") == "0")


def test_a_parent_gains_a_key_only_once_its_children_hold_it(quotas: Quotas) -> None:
    quotas.create("org", {GPU: 16})
    quotas.create("vision", {GPU: 4}, parent="org")
    quotas.create("speech", {GPU: 4}, parent="org")
    with pytest.raises(client.ApiException, match=r"add it to the children first") as refused:
        quotas.patch("org", {"spec": {"hard": {"requests.cpu": "64"}}})
    body = str(refused.value.body)
    assert quotas.name("speech") in body and quotas.name("vision") in body and "requests.cpu" in body
    assert "requests.cpu" not in quotas.get("org")["spec"]["hard"]  # refused: nothing changed

    quotas.patch("vision", {"spec": {"hard": {"requests.cpu": "8"}}})
    quotas.patch("speech", {"spec": {"hard": {"requests.cpu": "8"}}})
    quotas.patch("org", {"spec": {"hard": {"requests.cpu": "64"}}})
    assert quotas.get("org")["spec"]["hard"]["requests.cpu"] == "64"
