"""Device plugin -> DRA switches and back on two real kubelet nodes, driven by the operator's GpuStack
with `maxUnavailable: 1`.

Both operands are the operator's own rendered DaemonSets with only their images replaced by the pretend
plugins, so what the real kubelet does when one plugin goes and the other comes is what the upgrade
engine sees. Kubelet keeps a stopped device plugin's devices in the node's capacity for five minutes
(allocatable 0 at once): the switch must neither wait that out nor let a node offer GPUs through both
stacks, as the kubelet reports them (allocatable), at any sampled moment, nor take more than one node
out of service at a time.
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
from .helpers import NODE, SECOND_NODE, gpu_status, real_nodes

pytestmark = [pytest.mark.realnode, pytest.mark.slow]

STACK = "switching"
NAMESPACE = "gpuforge-switching"
DRIVER = "gpu.nvidia.com"
GPUS = 2
NODES = (NODE, SECOND_NODE)
MAX_UNAVAILABLE = 1
WORKLOAD = "gpu-sleeper"
# States in which the operator is moving a node from one stack to the other.
SWITCHING_STATES = ("drain-required", "wait-old-gone", "operand-restart-required", "validation-required")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    with real_nodes("realnode-switch", tmp_path_factory, len(NODES)) as dev_cluster:
        yield dev_cluster


def slices(cluster: DevCluster, node: str = NODE) -> int:
    items: list[dict[str, Any]] = kube_json(cluster, "resourceslices.v1.resource.k8s.io")["items"]
    return sum(1 for s in items if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == node)


def describe(cluster: DevCluster, operator: Operator) -> str:
    pods = cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
    nodes = cluster.kubectl("get", "nodes", "--show-labels", check=False).stdout
    figures = {node: (gpu_status(cluster, node), slices(cluster, node)) for node in NODES}
    return f"{pods}\n{nodes}\n(capacity, allocatable), slices: {figures}\n" + operator.log_tail()


def serves_through(cluster: DevCluster, node: str) -> str | None:
    """The one stack the node offers its GPUs through, as the kubelet reports them; None for both or none."""
    allocatable = gpu_status(cluster, node)[1]
    device_plugin = allocatable == str(GPUS)
    dra = slices(cluster, node) == 1
    if device_plugin and not dra:
        return "devicePlugin"
    if dra and allocatable in (None, "0"):
        return "dra"
    return None


def settled(cluster: DevCluster, mode: str) -> dict[str, Any] | None:
    status = stack_status(cluster, STACK)
    upgrade = status.get("upgrade") or {}
    if status.get("phase") != "Ready" or not upgrade.get("complete"):
        return None
    return status if all(serves_through(cluster, node) == mode for node in NODES) else None


def assert_uncordoned(cluster: DevCluster) -> None:
    cordoned = [n for n in NODES if kube_json(cluster, "node", n)["spec"].get("unschedulable")]
    assert not cordoned, f"left cordoned: {cordoned}"


def workload(image: str) -> dict[str, Any]:
    """One long-running pod per real node, each holding one GPU through the device plugin."""
    labels = {"app": WORKLOAD}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": WORKLOAD, "namespace": "default"},
        "spec": {
            "replicas": len(NODES),
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {realnodes.REAL_NODE_LABEL: "true"},
                    "terminationGracePeriodSeconds": 1,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "containers": [
                        {
                            "name": "sleeper",
                            "image": image,
                            "imagePullPolicy": "Never",
                            # The DRA plugin's image is the node images' one with a shell and sleep.
                            "command": ["/bin/sleep", "86400"],
                            "resources": {"limits": {"nvidia.com/gpu": 1}},
                        }
                    ],
                },
            },
        },
    }


def running_workload(cluster: DevCluster) -> list[str]:
    pods: list[dict[str, Any]] = kube_json(cluster, "pods", "-n", "default", "-l", f"app={WORKLOAD}")["items"]
    running = [
        p["spec"].get("nodeName", "")
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    return running if len(running) == len(NODES) else []


def test_two_real_nodes_switch_to_dra_and_back_one_at_a_time(cluster: DevCluster, operator: Operator) -> None:
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
            "upgradePolicy": {"maxUnavailable": MAX_UNAVAILABLE},
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(stack))
    wait_for("the device plugin serving both real nodes", lambda: settled(cluster, "devicePlugin"),
             timeout=300, describe=lambda: describe(cluster, operator))  # fmt: skip
    sleeper_image = f"{realnodes.DRA_PLUGIN_REPOSITORY}:{realnodes.DRA_PLUGIN_RELEASES[0]}"
    cluster.kubectl("apply", "-f", "-", input=json.dumps(workload(sleeper_image)))
    wait_for("the GPU workload running", lambda: running_workload(cluster), timeout=180,
             describe=lambda: describe(cluster, operator))  # fmt: skip

    with Sampler(cluster, set(NODES), MAX_UNAVAILABLE, interval=0.2) as sampler:
        merge_patch_stack(cluster, STACK, {"spec": {"mode": "dra"}})
        wait_for("both real nodes on DRA", lambda: settled(cluster, "dra"), timeout=420,
                 describe=lambda: describe(cluster, operator))  # fmt: skip
        # The plugin that went away is still in capacity (kubelet's grace); the switch did not wait for it.
        on_dra = [gpu_status(cluster, node) for node in NODES]
        merge_patch_stack(cluster, STACK, {"spec": {"mode": "devicePlugin"}})
        wait_for("both real nodes back on the device plugin", lambda: settled(cluster, "devicePlugin"),
                 timeout=420, describe=lambda: describe(cluster, operator))  # fmt: skip
    sampler.assert_kept()
    assert sampler.peak_out_of_service == MAX_UNAVAILABLE, sampler.peak_out_of_service
    assert all(allocatable in (None, "0") for _, allocatable in on_dra), on_dra
    assert_uncordoned(cluster)
    # The GPU pods the switch evicted are back, running on the device plugin's GPUs.
    wait_for("the GPU workload running again", lambda: running_workload(cluster), timeout=180,
             describe=lambda: describe(cluster, operator))  # fmt: skip
    cluster.kubectl("delete", "deployment", WORKLOAD, "-n", "default")


def test_a_kubelet_restarted_mid_switch_leaves_the_node_serving(
    cluster: DevCluster, operator: Operator
) -> None:
    """The kubelet restarts while the node waits for the device plugin to go: plugins register again,
    the switch completes, and no moment offers GPUs through both stacks."""
    wait_for("the device plugin serving the real nodes", lambda: settled(cluster, "devicePlugin"),
             timeout=300, describe=lambda: describe(cluster, operator))  # fmt: skip

    def mid_switch() -> str | None:
        state = kube_json(cluster, "node", NODE)["metadata"].get("labels", {}).get(NODE_STATE_LABEL)
        return state if state in ("wait-old-gone", "validation-required") else None

    with Sampler(cluster, set(NODES), MAX_UNAVAILABLE, interval=0.2) as sampler:
        merge_patch_stack(cluster, STACK, {"spec": {"mode": "dra"}})
        wait_for("the real node mid-switch", mid_switch, timeout=300,
                 describe=lambda: describe(cluster, operator))  # fmt: skip
        host = realnodes.container_name(cluster.name, NODE)
        subprocess.run(["podman", "exec", host, "systemctl", "restart", "kubelet"], check=True)
        wait_for("the real nodes on DRA after the kubelet restart", lambda: settled(cluster, "dra"),
                 timeout=300, describe=lambda: describe(cluster, operator))  # fmt: skip
    sampler.assert_kept()
    assert_uncordoned(cluster)


def plugin_pods_on(cluster: DevCluster, node: str, repository: str) -> list[str]:
    """The names of the plugin pods on `node` running an image of `repository`, not being deleted."""
    pods: list[dict[str, Any]] = kube_json(cluster, "pods", "-n", NAMESPACE)["items"]
    return [
        p["metadata"]["name"]
        for p in pods
        if p["spec"].get("nodeName") == node
        and not p["metadata"].get("deletionTimestamp")
        and any(c["image"].startswith(f"{repository}:") for c in p["spec"]["containers"])
    ]


def switch_killing_the_new_plugin(cluster: DevCluster, operator: Operator, mode: str) -> tuple[str, str]:
    """Set the stack's mode and, on the first node the operator moves, delete the incoming stack's plugin
    pod as soon as it exists there; wait for every node to serve through `mode`. Returns (node, its state
    when the pod was deleted)."""
    repository = realnodes.DRA_PLUGIN_REPOSITORY if mode == "dra" else realnodes.DEVICE_PLUGIN_REPOSITORY

    def incoming_plugin() -> tuple[str, str, str] | None:
        for item in kube_json(cluster, "nodes", "-l", f"{realnodes.REAL_NODE_LABEL}=true")["items"]:
            state = item["metadata"].get("labels", {}).get(NODE_STATE_LABEL, "")
            name = item["metadata"]["name"]
            if state in SWITCHING_STATES:
                pods = plugin_pods_on(cluster, name, repository)
                if pods:
                    return name, state, pods[0]
        return None

    merge_patch_stack(cluster, STACK, {"spec": {"mode": mode}})
    node, state, pod = wait_for(f"a {mode} plugin pod on a switching node", incoming_plugin, timeout=300,
                                interval=0.1, describe=lambda: describe(cluster, operator))  # fmt: skip
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, pod, "--wait=false")
    wait_for(f"the real nodes on {mode} after the plugin pod's deletion", lambda: settled(cluster, mode),
             timeout=420, describe=lambda: describe(cluster, operator))  # fmt: skip
    return node, state


def test_a_plugin_pod_deleted_mid_switch_leaves_each_node_on_one_stack(
    cluster: DevCluster, operator: Operator
) -> None:
    """The incoming stack's plugin pod is deleted while the operator moves its node, once each way: its
    DaemonSet starts it again, the operator finishes the switch, and every node ends serving through the
    new stack alone, uncordoned, with no moment offering GPUs through both."""
    wait_for("the real nodes on DRA", lambda: settled(cluster, "dra"), timeout=300,
             describe=lambda: describe(cluster, operator))  # fmt: skip
    with Sampler(cluster, set(NODES), MAX_UNAVAILABLE, interval=0.2) as sampler:
        killed = [switch_killing_the_new_plugin(cluster, operator, mode) for mode in ("devicePlugin", "dra")]
    sampler.assert_kept()
    assert all(state in SWITCHING_STATES for _, state in killed), killed
    assert all(serves_through(cluster, node) == "dra" for node in NODES)
    assert_uncordoned(cluster)
