"""DRA's extended resource mapping on the real local control plane (DRAExtendedResource, beta and on
by default from 1.36): a DeviceClass naming `nvidia.com/gpu` makes GPUs asked for through its claims
count toward `requests.nvidia.com/gpu`, and `nvidia.com/gpu` requests count toward the class."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from .conftest import GPU, Quotas, deployment, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def mapped_class(api_client: client.ApiClient) -> Iterator[str]:
    """A DeviceClass serving `nvidia.com/gpu`, removed afterwards (it maps the name cluster-wide)."""
    custom = client.CustomObjectsApi(api_client)
    name = f"gpu-{uuid.uuid4().hex[:6]}.example.com"
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}],
            "extendedResourceName": "nvidia.com/gpu",
        },
    }
    created = custom.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", body)
    if (created.get("spec") or {}).get("extendedResourceName") != "nvidia.com/gpu":
        pytest.skip("this API server drops spec.extendedResourceName (DRAExtendedResource is off)")
    yield name
    with contextlib.suppress(client.ApiException):
        custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", name)


def claim_template(name: str, device_class: str, count: int) -> dict[str, Any]:
    request = {"name": "gpus", "exactly": {"deviceClassName": device_class, "count": count}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def with_claims(name: str, quota: str, template: str) -> dict[str, Any]:
    body = deployment(name, quota, gpus=0)
    spec = body["spec"]["template"]["spec"]
    spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
    for container in spec["containers"]:
        container["resources"] = {"requests": {"cpu": "100m"}, "claims": [{"name": "gpus"}]}
    return body


def test_gpus_through_a_mapped_class_count_both_ways(
    mapped_class: str, quotas: Quotas, namespace: str, api_client: Any
) -> None:
    devices = f"{mapped_class}.deviceclass.resource.k8s.io/devices"
    quotas.create("team", {GPU: 4, devices: 4})
    team = quotas.name("team")
    custom = client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(
        "resource.k8s.io", "v1", namespace, "resourceclaimtemplates", claim_template("two", mapped_class, 2)
    )
    apps = client.AppsV1Api(api_client)
    # Two devices of the class through a claim: two nvidia.com/gpu as well.
    apps.create_namespaced_deployment(namespace, with_claims("by-claim", team, "two"))
    wait_for("the claim's devices to count as GPUs", lambda: quotas.used("team") == "2")
    assert quotas.used("team", devices) == "2"
    # Two nvidia.com/gpu the class may serve: two of its devices as well.
    apps.create_namespaced_deployment(namespace, deployment("by-name", team, gpus=2))
    wait_for("the GPUs by name to count as devices", lambda: quotas.used("team", devices) == "4")
    assert quotas.used("team") == "4"
    with pytest.raises(client.ApiException, match=r"only 0 is left"):
        apps.create_namespaced_deployment(namespace, with_claims("more", team, "two"))
