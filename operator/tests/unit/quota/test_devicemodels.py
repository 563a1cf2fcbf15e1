"""Per-model DRA device keys (`<class>.deviceclass.resource.k8s.io/devices.<model>`): charged for the
devices whose request's selectors prove the model, refused where they do not."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from gpuforge.api.gpuquota import GpuQuota, GpuQuotaStatus, is_quota_key
from gpuforge.quota.admission import Allowed, Denied, WorkloadAsk, admit_workload
from gpuforge.quota.keys import key_problem
from gpuforge.quota.models import counted_key
from gpuforge.quota.usage import ClaimCatalog, claim_usage, workload_usage

NOW = datetime(2026, 1, 1, tzinfo=UTC)
DEVICES = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
A100 = f"{DEVICES}.A100"
A100_PRODUCT = "NVIDIA A100-SXM4-80GB"
H100_PRODUCT = "NVIDIA H100 80GB HBM3"


def product_is(*products: str) -> list[dict[str, Any]]:
    attribute = "device.attributes['gpu.nvidia.com'].productName"
    if len(products) == 1:
        expression = f"{attribute} == '{products[0]}'"
    else:
        expression = f"{attribute} in [{', '.join(repr(p) for p in products)}]"
    return [{"cel": {"expression": expression}}]


def request(
    count: int = 1, selectors: list[dict[str, Any]] | None = None, cls: str = "gpu.nvidia.com"
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if selectors:
        exactly["selectors"] = selectors
    return {"name": "gpu", "exactly": exactly}


def claim(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


def deployment(replicas: int = 1) -> dict[str, Any]:
    pod = {
        "containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
    }
    return {
        "kind": "Deployment",
        "metadata": {"name": "w", "namespace": "ns", "labels": {"gpuforge.io/quota": "team"}},
        "spec": {"replicas": replicas, "template": {"spec": pod}},
    }


def usage_of(claim_spec: dict[str, Any], replicas: int = 1) -> dict[str, Decimal]:
    catalog = ClaimCatalog(templates={"t": claim_usage(claim_spec)})
    return dict(workload_usage(deployment(replicas), catalog).usage)


@pytest.mark.parametrize(
    ("claim_spec", "replicas", "a100"),
    [
        (claim(request(2, product_is(A100_PRODUCT))), 1, 2),
        (claim(request(2, product_is(A100_PRODUCT))), 3, 6),  # per pod, from the claim template
        (claim(request(1, product_is(H100_PRODUCT))), 1, 0),  # proven another model
        (claim(request(1)), 1, 0),  # nothing proven
        (claim(request(1, product_is(A100_PRODUCT, H100_PRODUCT))), 1, 0),  # not one model
        # Two requests, each proven: their devices add up under their own models.
        (claim(request(1, product_is(A100_PRODUCT)), request(2, product_is(H100_PRODUCT))), 1, 1),
        # Another class's devices are not this class's.
        (claim(request(1, product_is(A100_PRODUCT), cls="mig.nvidia.com")), 1, 0),
    ],
)
def test_devices_are_charged_under_the_model_their_selectors_prove(
    claim_spec: dict[str, Any], replicas: int, a100: int
) -> None:
    usage = usage_of(claim_spec, replicas)
    assert usage.get(A100, Decimal(0)) == a100


def test_a_first_available_request_charges_its_largest_alternative_per_model() -> None:
    alternatives = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "big",
                "deviceClassName": "gpu.nvidia.com",
                "count": 2,
                "selectors": product_is(A100_PRODUCT),
            },
            {
                "name": "small",
                "deviceClassName": "gpu.nvidia.com",
                "count": 1,
                "selectors": product_is(H100_PRODUCT),
            },
        ],
    }
    usage = usage_of(claim(alternatives))
    assert usage[DEVICES] == 2 and usage[A100] == 2 and usage[f"{DEVICES}.H100"] == 1


def quota(hard: dict[str, int]) -> GpuQuota:
    return GpuQuota(
        name="team",
        parent="",
        hard={key: Decimal(value) for key, value in hard.items()},
        status=GpuQuotaStatus(used={}),
    )


@pytest.mark.parametrize(
    ("key", "claim_spec", "outcome"),
    [
        (A100, claim(request(2, product_is(A100_PRODUCT))), "charged 2"),
        (A100, claim(request(3, product_is(A100_PRODUCT))), f"asks {A100}=3 but only 2 is left"),
        (f"{DEVICES}.a100", claim(request(2, product_is(A100_PRODUCT))), "charged 2"),  # case ignored
        (f"{DEVICES}.NVIDIA-A100", claim(request(2, product_is(A100_PRODUCT))), "charged 2"),
        (A100, claim(request(4, product_is(H100_PRODUCT))), "charged 0"),  # another model: not this key
        (A100, claim(request(1)), "needs the GPU model proven, and a device request of class gpu.nvidia.com"),
        (
            A100,
            claim(request(1, product_is(A100_PRODUCT)), request(1)),  # one request of two unproven
            "needs the GPU model proven",
        ),
        (
            A100,
            claim(request(1, product_is(A100_PRODUCT, H100_PRODUCT))),
            "may select products of other models than A100 as well; select one model",
        ),
        # Both models named, yet every product is NVIDIA: proven for a key that is the vendor's.
        (f"{DEVICES}.NVIDIA", claim(request(1, product_is(A100_PRODUCT, H100_PRODUCT))), "charged 1"),
        # A claim of another class: this class's model key does not ask for proof.
        (A100, claim(request(1, cls="mig.nvidia.com")), "charged 0"),
    ],
)
def test_a_quota_with_a_device_model_key_admits_what_is_proven(
    key: str, claim_spec: dict[str, Any], outcome: str
) -> None:
    usage = usage_of(claim_spec)
    ask = WorkloadAsk("u", "Deployment/ns/w", usage, usage)
    decision = admit_workload(quota({DEVICES: 8, key: 2}), ask, NOW)
    if outcome.startswith("charged"):
        assert isinstance(decision, Allowed), decision
        used = decision.status.used if decision.status is not None else {}
        assert used.get(key, Decimal(0)) == Decimal(outcome.split()[1])
    else:
        assert isinstance(decision, Denied) and outcome in decision.message, decision
        assert decision.key == key or "asks" in outcome


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        (A100, ""),
        ("cash/gpu.nvidia.com.deviceclass.resource.k8s.io/devices.H100", ""),
        (f"{DEVICES}.A100-SXM4", ""),
        (f"{DEVICES}.A100-", "is not a model name"),
        ("GPU.deviceclass.resource.k8s.io/devices.A100", "is not a DeviceClass name"),
    ],
)
def test_device_model_keys_are_spelt_as_resource_quota_spells_device_keys(key: str, problem: str) -> None:
    found = key_problem(key)
    assert (problem in found) if problem else found == ""
    if not problem:
        assert is_quota_key(key)  # the CRD's rule admits it too


def test_a_device_model_key_is_counted_in_canonical_spelling() -> None:
    assert counted_key(f"{DEVICES}.a100-sxm4") == f"{DEVICES}.A100-SXM4"
    assert counted_key(f"cash/{DEVICES}.h100") == f"cash/{DEVICES}.H100"
    assert counted_key(DEVICES) == DEVICES
