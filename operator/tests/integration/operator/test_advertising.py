"""What GPU nodes advertise under a GpuStack's sharing and MIG settings, on the real local control plane.

The simulated node agent registers what NVIDIA's device plugin would for the config the operator renders
(gpuforge_lab.sim.advertise); the operator must take those resources as the node's GPUs and report Ready.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from gpuforge.constants import SIM_POOL_LABEL
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

from ..operator_process import Operator, condition, kube_json, operator_factory, stack_status, wait_for
from .test_gpustack import apply, delete_stack_and_wait

__all__ = ["operator_factory"]

# Two GPUs per node: one pool shares whole GPUs, one has its GPUs in MIG mode (A100 80GB: 7x 1g.10gb each).
GPUS = 2
POOLS = (
    Pool(name="whole", count=1, gpu=GpuSpec(count=GPUS)),
    Pool(name="mig", count=1, gpu=GpuSpec(count=GPUS), mig_enabled=True),
)
MIG_DEVICES = GPUS * 7

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def adv_cluster(cluster_factory: Callable[..., Any]) -> Any:
    return cluster_factory(profile="1.36", pools=POOLS, name="advertising")


@pytest.fixture(scope="module")
def operator(adv_cluster: Any, operator_factory: Callable[[Any], Operator]) -> Operator:
    return operator_factory(adv_cluster)


@pytest.fixture
def stacks(adv_cluster: Any, operator: Operator) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        delete_stack_and_wait(adv_cluster, name)


def stack_on_pool(name: str, pool: str, device_plugin: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "gpuforge.io/v1alpha1",
            "kind": "GpuStack",
            "metadata": {"name": name},
            "spec": {
                "mode": "devicePlugin",
                "namespace": f"gpuforge-{name}",
                "devicePlugin": {"version": "v0.20.0", **device_plugin},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": SIM_POOL_LABEL, "operator": "In", "values": [pool]}]}
                    ]
                },
            },
        }
    )


def gpu_capacity(cluster: Any, node: str) -> dict[str, str]:
    capacity = kube_json(cluster, "node", node)["status"].get("capacity") or {}
    return {k: v for k, v in capacity.items() if k.startswith("nvidia.com/")}


def gpu_allocatable(cluster: Any, node: str) -> dict[str, str]:
    """What the scheduler may hand out: a stopped plugin's devices stay in capacity for kubelet's grace
    period (docs/local-control-plane.md), but leave allocatable at once."""
    allocatable = kube_json(cluster, "node", node)["status"].get("allocatable") or {}
    return {k: v for k, v in allocatable.items() if k.startswith("nvidia.com/")}


def ready_advertising(cluster: Any, name: str, node: str, resource: str, count: int) -> dict[str, Any]:
    """Wait until the stack is Ready with `node` advertising `count` of `resource`; the stack's status."""

    def done() -> dict[str, Any] | None:
        status = stack_status(cluster, name)
        capacity = gpu_capacity(cluster, node)
        ready = status.get("phase") == "Ready" and capacity.get(resource) == str(count)
        return status if ready else None

    status: dict[str, Any] = wait_for(f"{name} Ready with {node} advertising {count} {resource}", done)
    assert condition(status, "Ready")["status"] == "True"
    assert status["nodesReady"] == "1/1"
    return status


def test_time_slicing_with_rename_advertises_shared_gpus(adv_cluster: Any, stacks: list[str]) -> None:
    cluster = adv_cluster
    stacks.append("shared")
    sharing = {"sharing": {"timeSlicing": {"replicas": 4, "renameByDefault": True}}}
    apply(cluster, stack_on_pool("shared", "whole", {"config": sharing}))

    ready_advertising(cluster, "shared", "whole-0", "nvidia.com/gpu.shared", 4 * GPUS)
    assert "nvidia.com/gpu" not in gpu_capacity(cluster, "whole-0")

    # The plugin going withdraws exactly what it advertised.
    delete_stack_and_wait(cluster, "shared")
    wait_for(
        "nvidia.com/gpu.shared withdrawn",
        lambda: gpu_capacity(cluster, "whole-0").get("nvidia.com/gpu.shared") == "0",
    )
    assert "nvidia.com/gpu" not in gpu_capacity(cluster, "whole-0")


def test_mixed_mig_strategy_advertises_mig_profiles(adv_cluster: Any, stacks: list[str]) -> None:
    cluster = adv_cluster
    stacks.append("mig-mixed")
    apply(cluster, stack_on_pool("mig-mixed", "mig", {"migStrategy": "mixed"}))

    ready_advertising(cluster, "mig-mixed", "mig-0", "nvidia.com/mig-1g.10gb", MIG_DEVICES)
    assert gpu_allocatable(cluster, "mig-0").get("nvidia.com/gpu", "0") == "0"


def test_single_mig_strategy_advertises_mig_devices_as_gpus(adv_cluster: Any, stacks: list[str]) -> None:
    cluster = adv_cluster
    stacks.append("mig-single")
    apply(cluster, stack_on_pool("mig-single", "mig", {"migStrategy": "single"}))

    ready_advertising(cluster, "mig-single", "mig-0", "nvidia.com/gpu", MIG_DEVICES)
    assert gpu_allocatable(cluster, "mig-0").get("nvidia.com/mig-1g.10gb", "0") == "0"
