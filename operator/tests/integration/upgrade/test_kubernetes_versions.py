"""Kubernetes versions under the upgrade engine, on the real local control plane: a pool whose kubelets are
1.31 is refused for DRA by name (and keeps its device plugin), and a control-plane upgrade from the 1.33
API profile (resource.k8s.io v1beta2/v1beta1) to 1.34 (v1) leaves the DeviceClasses served as v1 while
no node stops advertising its GPUs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from gpuforge.constants import DEPLOY_DEVICE_PLUGIN_LABEL, DEPLOY_DRA_KUBELET_PLUGIN_LABEL

from .helpers import (
    Operator,
    Sampler,
    apply,
    condition,
    merge_patch_stack,
    sample_nodes,
    stack_status,
    wait_for,
)

pytestmark = pytest.mark.cluster

POOLS_FILE = (
    ("new", 3, "v1.34.2"),  # speaks DRA gRPC v1 and v1beta1, reads claims with v1
    ("old", 2, "v1.31.4"),  # no NVIDIA DRA driver release serves it
)


@pytest.fixture(scope="module")
def cluster(cluster_factory: Callable[..., Any]) -> Any:
    from gpuforge_lab.devcluster.pools import GpuSpec, Pool

    pools = [Pool(name=n, count=c, gpu=GpuSpec(count=4), kubelet_version=k) for n, c, k in POOLS_FILE]
    return cluster_factory(profile="1.33", pools=pools, name="upgrade-k8s")


@pytest.fixture(scope="module")
def operator(cluster: Any, operator_factory: Callable[[Any], Operator]) -> Operator:
    return operator_factory(cluster)


NEW = {f"new-{i}" for i in range(3)}
OLD = {f"old-{i}" for i in range(2)}


def test_old_kubelets_are_refused_for_dra_by_name_and_keep_their_device_plugin(
    cluster: Any, operator: Operator
) -> None:
    stack = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": "gpus"},
        "spec": {"mode": "devicePlugin", "upgradePolicy": {"maxUnavailable": 2, "maxParallel": 0}},
    }
    apply(cluster, stack)
    wait_for("the device plugin Ready", lambda: stack_status(cluster, "gpus").get("nodesReady") == "5/5")

    with Sampler(cluster, OLD, 0) as sampler:  # the refused nodes never stop serving
        merge_patch_stack(cluster, "gpus", {"spec": {"mode": "dra"}})

        def settled() -> dict[str, Any]:
            status = stack_status(cluster, "gpus")
            upgrade = status.get("upgrade", {})
            return status if upgrade.get("nodes", {}).get("upgrade-done") == len(NEW) else {}

        status = wait_for("the new pool on DRA", settled, timeout=180)
    sampler.assert_kept()

    (refusal,) = status["upgrade"]["refusals"]
    assert refusal["reason"] == "KubeletUnsupported" and sorted(refusal["nodes"]) == sorted(OLD)
    assert "old-0" in refusal["message"] and "old-1" in refusal["message"]
    degraded = condition(status, "Degraded")
    assert degraded["reason"] == "IncompatibleKubelet"
    assert "old-0" in degraded["message"] and "old-1" in degraded["message"]
    with cluster.api_client() as api_client:
        view = sample_nodes(api_client)
    for name in OLD:
        assert view[name].labels.get(DEPLOY_DEVICE_PLUGIN_LABEL) == "true" and view[name].gpus == 4
        assert DEPLOY_DRA_KUBELET_PLUGIN_LABEL not in view[name].labels
    for name in NEW:
        assert view[name].slices == 1 and view[name].gpus == 0 and not view[name].unschedulable
    assert cluster.violations() == []
    assert status["draApiVersion"] == "resource.k8s.io/v1beta2"


def test_control_plane_upgrade_to_1_34_keeps_device_classes_and_gpus(
    cluster: Any, operator: Operator
) -> None:
    with Sampler(cluster, NEW | OLD, 0) as sampler:  # no node may stop advertising at any sampled moment
        cluster.upgrade("1.34")

        def served_as_v1() -> bool:
            raw = cluster.kubectl(
                "get", "--raw", "/apis/resource.k8s.io/v1/deviceclasses/gpu.nvidia.com", check=False
            )
            return raw.returncode == 0 and bool(json.loads(raw.stdout)["apiVersion"] == "resource.k8s.io/v1")

        wait_for("the DeviceClass served as v1", served_as_v1, timeout=120)
        wait_for(
            "the operator to write DeviceClasses as v1",
            lambda: stack_status(cluster, "gpus").get("draApiVersion") == "resource.k8s.io/v1",
            timeout=120,
        )
    sampler.assert_kept()
    with cluster.api_client() as api_client:
        view = sample_nodes(api_client)
    assert all(view[name].slices == 1 for name in NEW)
    assert all(view[name].gpus == 4 for name in OLD)
    assert cluster.violations() == []
