"""The shared builder of quota-labelled GPU Deployments, read back by the quota's own usage code."""

from __future__ import annotations

import pytest

from gpuforge.quota.quantity import parse_quantity
from gpuforge.quota.usage import workload_usage
from gpuforge_lab.workloads import gpu_deployment


@pytest.mark.parametrize(
    ("kwargs", "quota", "expected"),
    [
        ({}, "team", {"requests.nvidia.com/gpu": "1"}),
        ({"gpus": 2, "replicas": 3}, "team", {"requests.nvidia.com/gpu": "6"}),
        (
            {
                "gpus": 1,
                "replicas": 2,
                "model": "H100",
                "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            },
            "vision",
            {"requests.nvidia.com/gpu": "2", "requests.nvidia.com/gpu.H100": "2"},
        ),
        (
            {"requests": {"cpu": "1", "memory": "4Gi"}},
            "team",
            {"requests.cpu": "1", "requests.memory": "4Gi"},
        ),
    ],
)
def test_usage_of_built_deployments(kwargs: dict[str, object], quota: str, expected: dict[str, str]) -> None:
    usage = workload_usage(gpu_deployment("work", quota, **kwargs))  # type: ignore[arg-type]
    assert usage.quota == quota
    for key, value in expected.items():
        assert usage.usage[key] == parse_quantity(value), key


def test_optional_fields_only_when_given() -> None:
    plain = gpu_deployment("work", "team")
    assert "namespace" not in plain["metadata"]
    assert set(plain["spec"]["template"]["spec"]) == {"containers"}
    full = gpu_deployment(
        "work", "team", namespace="ns", node_selector={"a": "b"}, tolerations=[{"operator": "Exists"}]
    )
    assert full["metadata"]["namespace"] == "ns"
    assert full["spec"]["template"]["spec"]["nodeSelector"] == {"a": "b"}
    assert full["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]
