"""A device plugin -> DRA switch and back on a real kubelet node, driven by the operator's GpuStack.

Both operands are the operator's own rendered DaemonSets with only their images replaced by the pretend
plugins, so what the real kubelet does when one plugin goes and the other comes is what the upgrade
engine sees. Kubelet keeps a stopped device plugin's devices in the node's capacity for five minutes
(allocatable 0 at once): the switch must neither wait that out nor let the node offer GPUs through both
stacks, as the kubelet reports them, at any sampled moment.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from gpuforge.constants import NODE_STATE_LABEL
from gpuforge_lab.devcluster import realnodes
from gpuforge_lab.devcluster.cluster import DevCluster

from ..operator_process import Operator, kube_json, stack_status, wait_for
from ..upgrade.helpers import Sampler, merge_patch_stack
from .helpers import NODE, gpu_status, one_real_node

pytestmark = [pytest.mark.realnode, pytest.mark.slow]

STACK = "switching"
NAMESPACE = "gpuforge-switching"
DRIVER = "gpu.nvidia.com"
GPUS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    with one_real_node("realnode-switch", tmp_path_factory) as dev_cluster:
        yield dev_cluster


def slices(cluster: DevCluster) -> int:
    items: list[dict[str, Any]] = kube_json(cluster, "resourceslices.v1.resource.k8s.io")["items"]
    return sum(1 for s in items if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE)


def describe(cluster: DevCluster, operator: Operator) -> str:
    pods = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide", check=False).stdout
    node = cluster.kubectl("get", "node", NODE, "--show-labels", check=False).stdout
    return f"{pods}\n{node}\ncapacity/allocatable {gpu_status(cluster)}, slices {slices(cluster)}\n" + (
        operator.log_tail()
    )


def settled(cluster: DevCluster, mode: str) -> dict[str, Any] | None:
    status = stack_status(cluster, STACK)
    upgrade = status.get("upgrade") or {}
    if status.get("phase") != "Ready" or not upgrade.get("complete"):
        return None
    allocatable = gpu_status(cluster)[1]
    if mode == "dra":
        return status if slices(cluster) == 1 and allocatable in (None, "0") else None
    return status if slices(cluster) == 0 and allocatable == str(GPUS) else None


def test_a_real_node_switches_to_dra_and_back_without_serving_through_both(
    cluster: DevCluster, operator: Operator
) -> None:
    stack = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": STACK},
        "spec": {
            "mode": "devicePlugin",
            "namespace": NAMESPACE,
            # The rendered DaemonSets as users get them, but for the images: the pretend plugins.
            "devicePlugin": {"version": "v0.20.0", "image": realnodes.DEVICE_PLUGIN_REPOSITORY},
            "dra": {
                "version": "v25.12.0",
                "image": realnodes.DRA_PLUGIN_REPOSITORY,
                "deviceClasses": [DRIVER],
            },
            "upgradePolicy": {"maxUnavailable": 1},
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(stack))
    wait_for("the device plugin serving the real node", lambda: settled(cluster, "devicePlugin"),
             timeout=300, describe=lambda: describe(cluster, operator))  # fmt: skip

    with Sampler(cluster, {NODE}, 1, interval=0.2) as sampler:
        merge_patch_stack(cluster, STACK, {"spec": {"mode": "dra"}})
        wait_for("the real node on DRA", lambda: settled(cluster, "dra"), timeout=300,
                 describe=lambda: describe(cluster, operator))  # fmt: skip
        # The plugin that went away is still in capacity (kubelet's grace); the switch did not wait for it.
        on_dra = gpu_status(cluster)
        merge_patch_stack(cluster, STACK, {"spec": {"mode": "devicePlugin"}})
        wait_for("the real node back on the device plugin", lambda: settled(cluster, "devicePlugin"),
                 timeout=300, describe=lambda: describe(cluster, operator))  # fmt: skip
    sampler.assert_kept()
    assert on_dra[1] in (None, "0"), on_dra
    node = kube_json(cluster, "node", NODE)
    assert not node["spec"].get("unschedulable"), "the node was left cordoned"


def test_a_kubelet_restarted_mid_switch_leaves_the_node_serving(
    cluster: DevCluster, operator: Operator
) -> None:
    """The kubelet restarts while the node waits for the device plugin to go: plugins register again,
    the switch completes, and no moment offers GPUs through both stacks."""
    wait_for("the device plugin serving the real node", lambda: settled(cluster, "devicePlugin"),
             timeout=300, describe=lambda: describe(cluster, operator))  # fmt: skip

    def mid_switch() -> str | None:
        state = kube_json(cluster, "node", NODE)["metadata"].get("labels", {}).get(NODE_STATE_LABEL)
        return state if state in ("wait-old-gone", "validation-required") else None

    with Sampler(cluster, {NODE}, 1, interval=0.2) as sampler:
        merge_patch_stack(cluster, STACK, {"spec": {"mode": "dra"}})
        wait_for("the real node mid-switch", mid_switch, timeout=300,
                 describe=lambda: describe(cluster, operator))  # fmt: skip
        host = realnodes.container_name(cluster.name, NODE)
        subprocess.run(["podman", "exec", host, "systemctl", "restart", "kubelet"], check=True)
        wait_for("the real node on DRA after the kubelet restart", lambda: settled(cluster, "dra"),
                 timeout=300, describe=lambda: describe(cluster, operator))  # fmt: skip
    sampler.assert_kept()
    assert not kube_json(cluster, "node", NODE)["spec"].get("unschedulable"), "the node was left cordoned"
