"""A 1,000-node migration from the device plugin to DRA at maxUnavailable 10%, on the real local control
plane: the size where slot filling runs about a thousand times against a hundred nodes out, checked at
every sampled moment (no node advertising through both stacks, never more than 100 out of service).

No workloads: the 30-node rollouts (test_rollouts.py) check evictions and jobs; this one checks that
admission by counts keeps its bounds when many slots free and fill at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from gpuforge.constants import DEPLOY_DEVICE_PLUGIN_LABEL, DEPLOY_DRA_KUBELET_PLUGIN_LABEL, NODE_STATE_LABEL
from gpuforge_lab.devcluster.pools import Pool

from .helpers import Operator, Sampler, apply, merge_patch_stack, sample_nodes, stack_status, wait_for

# The cluster's start (1,000 kwok nodes), the device plugin's rollout and the migration, each with its
# own wait below: on a slow, shared machine the three together take several times the suite's default.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]

NODES = 1000
MAX_UNAVAILABLE = NODES // 10
NAMES = {f"gpu-{i}" for i in range(NODES)}
STACK: dict[str, Any] = {
    "apiVersion": "gpuforge.io/v1alpha1",
    "kind": "GpuStack",
    "metadata": {"name": "gpus"},
    "spec": {"mode": "devicePlugin", "upgradePolicy": {"maxUnavailable": "10%", "maxParallel": 0}},
}


@pytest.fixture(scope="module")
def cluster(cluster_factory: Callable[..., Any]) -> Any:
    return cluster_factory(profile="1.36", pools=(Pool(name="gpu", count=NODES),), name="scale")


@pytest.fixture(scope="module")
def operator(cluster: Any, operator_factory: Callable[[Any], Operator]) -> Operator:
    return operator_factory(cluster)


def rolled_out(cluster: Any, mode: str) -> bool:
    """Every node serves through `mode` alone, with our state label upgrade-done, and the stack says so."""
    status = stack_status(cluster, "gpus")
    if not status.get("upgrade", {}).get("complete") or status.get("phase") != "Ready":
        return False
    with cluster.api_client() as api_client:
        view = sample_nodes(api_client)
    want, other = (
        (DEPLOY_DRA_KUBELET_PLUGIN_LABEL, DEPLOY_DEVICE_PLUGIN_LABEL)
        if mode == "dra"
        else (DEPLOY_DEVICE_PLUGIN_LABEL, DEPLOY_DRA_KUBELET_PLUGIN_LABEL)
    )
    for name in NAMES:
        node = view[name]
        if node.labels.get(want) != "true" or other in node.labels or node.unschedulable:
            return False
        if (mode == "dra" and (node.slices != 1 or node.gpus)) or (mode != "dra" and not node.gpus):
            return False
        if mode == "dra" and node.labels.get(NODE_STATE_LABEL) != "upgrade-done":
            return False
    return True


def test_a_1000_node_migration_to_dra_keeps_max_unavailable_and_never_advertises_twice(
    cluster: Any, operator: Operator
) -> None:
    apply(cluster, STACK)
    wait_for(
        "the device plugin on every node",
        lambda: rolled_out(cluster, "devicePlugin"),
        timeout=500,
        interval=5,
    )
    started = time.monotonic()
    # A sample lists every node and slice: once a second leaves the two cores to the migration.
    with Sampler(cluster, NAMES, MAX_UNAVAILABLE, interval=1.0) as sampler:
        merge_patch_stack(cluster, "gpus", {"spec": {"mode": "dra"}})
        wait_for("every node on DRA", lambda: rolled_out(cluster, "dra"), timeout=1000, interval=5)
    sampler.assert_kept()
    assert cluster.violations() == []
    assert sampler.peak_out_of_service > MAX_UNAVAILABLE // 2  # the slots were used
    print(
        f"{NODES} nodes to DRA: {time.monotonic() - started:.0f}s, {sampler.samples} samples, "
        f"peak out of service {sampler.peak_out_of_service}"
    )
