"""DRA's extended resource mapping charged both ways, as ResourceQuota's claim evaluator charges it."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from gpuforge.quota.draextended import DeviceClassMap, claim_charges, device_class_map, pod_charges
from gpuforge.quota.usage import ClaimCatalog, claim_usage, workload_usage

D = Decimal
GPU = "requests.nvidia.com/gpu"
DEVICES = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
IMPLICIT = "requests.deviceclass.resource.kubernetes.io/gpu.nvidia.com"
CLAIMS = "count/resourceclaims.resource.k8s.io"


def device_class(name: str, resource: str | None, created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": []}
    if resource is not None:
        spec["extendedResourceName"] = resource
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


MAPPED = device_class_map([device_class("gpu.nvidia.com", "nvidia.com/gpu")])


def test_the_newest_class_serves_a_resource_two_classes_name() -> None:
    classes = device_class_map(
        [
            device_class("old", "nvidia.com/gpu", "2026-01-01T00:00:00Z"),
            device_class("new", "nvidia.com/gpu", "2026-02-01T00:00:00Z"),
            device_class("b-same", "example.com/x", "2026-01-01T00:00:00Z"),
            device_class("a-same", "example.com/x", "2026-01-01T00:00:00Z"),
            device_class("plain", None),
        ]
    )
    assert classes.class_serving("nvidia.com/gpu") == "new"
    assert classes.class_serving("example.com/x") == "a-same"  # equal age: the lower name
    assert classes.class_serving("deviceclass.resource.kubernetes.io/plain") == "plain"  # implicit name
    assert classes.class_serving("nvidia.com/mig-1g.10gb") == ""
    assert classes.extended == {"old": "nvidia.com/gpu", "new": "nvidia.com/gpu", "b-same": "example.com/x",
                                "a-same": "example.com/x"}  # fmt: skip


@pytest.mark.parametrize(
    ("classes", "expected"),
    [
        (MAPPED, {IMPLICIT: D(2), GPU: D(2)}),  # the class names nvidia.com/gpu
        (DeviceClassMap(), {IMPLICIT: D(2)}),  # it names none: its implicit name only
    ],
)
def test_a_claims_devices_count_toward_the_extended_resource(
    classes: DeviceClassMap, expected: dict[str, Decimal]
) -> None:
    assert claim_charges({DEVICES: D(2), CLAIMS: D(1)}, classes) == expected


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        ({"nvidia.com/gpu": D(2)}, {DEVICES: D(2), IMPLICIT: D(2), CLAIMS: D(1)}),
        # The implicit name is the pod's own key already; the class's explicit name is not.
        (
            {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": D(1)},
            {DEVICES: D(1), GPU: D(1), CLAIMS: D(1)},
        ),
        ({"nvidia.com/mig-1g.10gb": D(1), "cpu": D(4)}, {}),  # not served by any class
    ],
)
def test_a_pods_extended_request_served_by_dra_counts_toward_the_class(
    requests: dict[str, Decimal], expected: dict[str, Decimal]
) -> None:
    assert pod_charges(requests, MAPPED) == expected


def deployment(spec: dict[str, Any], model: str = "") -> dict[str, Any]:
    labels = {"gpuforge.io/quota": "q", **({"gpuforge.io/gpu-model": model} if model else {})}
    return {
        "kind": "Deployment",
        "metadata": {"name": "w", "namespace": "ns", "labels": labels},
        "spec": {"replicas": 3, "template": {"spec": spec}},
    }


CLAIM_SPEC = {
    "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}
}


def test_a_workloads_claim_templates_count_toward_nvidia_gpu_and_its_model_key() -> None:
    spec = {
        "containers": [{"name": "main"}],
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two"}],
        # The model is proven by where the pods may land, not by the label.
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    }
    catalog = ClaimCatalog(templates={"two": claim_usage(CLAIM_SPEC)}, device_classes=MAPPED)
    usage = workload_usage(deployment(spec), catalog).usage
    assert (usage[GPU], usage[f"{GPU}.H100"], usage[DEVICES], usage[IMPLICIT]) == (D(6), D(6), D(6), D(6))
    unmapped = workload_usage(deployment(spec), ClaimCatalog(templates=catalog.templates)).usage
    assert GPU not in unmapped and unmapped[DEVICES] == D(6)


def test_a_shared_claim_counts_once_toward_nvidia_gpu() -> None:
    spec = {
        "containers": [{"name": "main"}],
        "resourceClaims": [{"name": "gpus", "resourceClaimName": "shared"}],
    }
    catalog = ClaimCatalog(claims={"shared": claim_usage(CLAIM_SPEC)}, device_classes=MAPPED)
    assert workload_usage(deployment(spec), catalog).usage[GPU] == D(2)


def test_a_workloads_gpu_request_served_by_dra_counts_toward_the_device_class_key() -> None:
    spec = {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
    usage = workload_usage(deployment(spec), ClaimCatalog(device_classes=MAPPED)).usage
    assert (usage[GPU], usage[DEVICES], usage[IMPLICIT], usage[CLAIMS]) == (D(3), D(3), D(3), D(3))
    plain = workload_usage(deployment(spec)).usage  # no class names nvidia.com/gpu: device plugin only
    assert DEVICES not in plain and CLAIMS not in plain
