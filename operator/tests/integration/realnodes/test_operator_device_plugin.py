"""The operator's own rendered device-plugin DaemonSet on a real kubelet node, with only the image changed.

The node is built as gpuforge's roles build one: containerd with a runtime named nvidia that is not the
default (nvidia_container_toolkit), CDI on. The plugin is the pretend one, under the name of NVIDIA's
release, so everything else (host paths, sockets, security context, runtime class, config file) is what
the renderer writes for real clusters. A kwok node of the same GPUs beside it runs the same stack through
the simulated agent, so both can be held to one sequence of events.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpuforge.constants import COMPONENT_DEVICE_PLUGIN, COMPONENT_LABEL, SIM_POOL_LABEL
from gpuforge_lab.devcluster import realnodes
from gpuforge_lab.devcluster.cluster import DevCluster
from gpuforge_lab.devcluster.pools import GpuSpec, Pool
from gpuforge_lab.sim.agent import KUBELET_PLUGIN_STOP_GRACE_SECONDS

from ..operator_process import (
    Operator,
    condition,
    kube_json,
    service_account_kubeconfig,
    stack_status,
    wait_for,
)
from .helpers import assert_a_gpu_pod_gets_one_device, gpu_status

pytestmark = [pytest.mark.realnode, pytest.mark.slow]

NODE = "real-0"
SIM_NODE = "sim-0"
STACK = "real"
NAMESPACE = "gpuforge-real"
GPUS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    dev_cluster = DevCluster("realnode-operator", root=tmp_path_factory.mktemp("clusters"))
    try:
        gpu = GpuSpec(product="NVIDIA L4", count=GPUS)
        # A grace long enough to see the simulated node's withdrawal under load, short of kubelet's.
        dev_cluster.up(pools=[Pool("real", 1, gpu, real=True), Pool("sim", 1, gpu)], plugin_stop_grace=30)
        yield dev_cluster
    finally:
        dev_cluster.down()


@pytest.fixture(scope="module")
def operator(cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    workdir = tmp_path_factory.mktemp("operator")
    handle = Operator(service_account_kubeconfig(cluster, workdir / "kubeconfig"), workdir / "op.log")
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()


def stack(version: str = "v0.20.0", **device_plugin: Any) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "gpuforge.io/v1alpha1",
            "kind": "GpuStack",
            "metadata": {"name": STACK},
            "spec": {
                "mode": "devicePlugin",
                "namespace": NAMESPACE,
                "devicePlugin": {
                    "version": version,
                    "image": realnodes.DEVICE_PLUGIN_REPOSITORY,
                    **device_plugin,
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": SIM_POOL_LABEL, "operator": "In", "values": ["real", "sim"]}
                            ]
                        }
                    ]
                },
            },
        }
    )


def plugin_pods(cluster: DevCluster) -> list[dict[str, Any]]:
    pods = kube_json(cluster, "pods", "-n", NAMESPACE, "-l", f"{COMPONENT_LABEL}={COMPONENT_DEVICE_PLUGIN}")
    return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def describe(cluster: DevCluster) -> str:
    pods = cluster.kubectl("describe", "pods", "-n", NAMESPACE, check=False).stdout
    logs = cluster.kubectl(
        "logs",
        "-n",
        NAMESPACE,
        "-l",
        f"{COMPONENT_LABEL}={COMPONENT_DEVICE_PLUGIN}",
        "--tail=30",
        check=False,
    )
    return f"{pods[-3000:]}\n--- plugin log ---\n{logs.stdout}{logs.stderr}"


@pytest.fixture(scope="module")
def deployed(cluster: DevCluster, operator: Operator) -> dict[str, Any]:
    """The stack applied and Ready, its plugin advertising the node's GPUs through the real kubelet."""
    cluster.kubectl("apply", "-f", "-", input=stack())

    def done() -> dict[str, Any] | None:
        status = stack_status(cluster, STACK)
        advertising = all(gpu_status(cluster, node) == ("2", "2") for node in (NODE, SIM_NODE))
        return status if status.get("phase") == "Ready" and advertising else None

    status: dict[str, Any] = wait_for(
        "the stack Ready and the real node advertising",
        done,
        timeout=300,
        describe=lambda: f"{describe(cluster)}\n--- operator ---\n{operator.log_tail()}",
    )
    return status


def test_rendered_daemonset_runs_and_advertises_through_the_real_kubelet(
    cluster: DevCluster, deployed: dict[str, Any]
) -> None:
    assert condition(deployed, "Ready")["status"] == "True"
    assert deployed["nodesReady"] == "2/2"
    [pod] = [p for p in plugin_pods(cluster) if p["spec"]["nodeName"] == NODE]
    assert ready(pod) and pod["spec"]["nodeName"] == NODE
    # Nothing but the image differs from what real clusters get.
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert pod["spec"]["containers"][0]["image"] == f"{realnodes.DEVICE_PLUGIN_REPOSITORY}:v0.20.0"
    log = cluster.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"]).stdout
    assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in log, log


def test_a_gpu_pod_gets_its_device_through_cdi(cluster: DevCluster, deployed: dict[str, Any]) -> None:
    assert_a_gpu_pod_gets_one_device(cluster)


def test_kubelet_and_simulated_agent_withdraw_a_stopped_plugin_alike(
    cluster: DevCluster, deployed: dict[str, Any]
) -> None:
    """Kubelet's device manager keeps a stopped plugin's devices in capacity, unhealthy, for its grace period
    (five minutes) with allocatable 0 at once; the agent does the same over its shorter grace."""
    nodes = (NODE, SIM_NODE)
    # A plugin pod deleted comes back from its DaemonSet and registers again.
    for pod in plugin_pods(cluster):
        cluster.kubectl("delete", "pod", "-n", NAMESPACE, pod["metadata"]["name"], "--wait=false")
    wait_for(
        "new plugin pods Ready and advertising",
        lambda: (
            len([p for p in plugin_pods(cluster) if ready(p)]) == 2
            and all(gpu_status(cluster, node) == (str(GPUS), str(GPUS)) for node in nodes)
        ),
        timeout=180,
        describe=lambda: describe(cluster),
    )

    # The plugins gone for good: allocatable 0 on both at once, capacity still counting the devices.
    seen = {node: [gpu_status(cluster, node)] for node in nodes}

    def record() -> dict[str, list[tuple[str | None, str | None]]]:
        for node in nodes:
            state = gpu_status(cluster, node)
            if seen[node][-1] != state:
                seen[node].append(state)
        return seen

    cluster.kubectl("delete", "gpustack", STACK, "--wait=false")
    gone = time.monotonic()
    withdrawn = (str(GPUS), "0")
    wait_for(
        "allocatable 0 with capacity kept on both nodes",
        lambda: all(withdrawn in record()[node] for node in nodes),
        timeout=120,
        describe=lambda: seen,
    )
    # The agent's grace ends first; the kubelet's (300 s) outlasts it.
    wait_for(
        "the simulated node's capacity withdrawn", lambda: record()[SIM_NODE][-1] == ("0", "0"), timeout=120
    )
    assert record()[NODE][-1] == withdrawn and time.monotonic() - gone < KUBELET_PLUGIN_STOP_GRACE_SECONDS
    advertised = (str(GPUS), str(GPUS))
    assert seen == {NODE: [advertised, withdrawn], SIM_NODE: [advertised, withdrawn, ("0", "0")]}
