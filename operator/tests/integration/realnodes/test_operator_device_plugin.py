"""The operator's own rendered device-plugin DaemonSet on a real kubelet node, with only the image changed.

The node is built as gpuforge's roles build one: containerd with a runtime named nvidia that is not the
default (nvidia_container_toolkit), CDI on. The plugin is the pretend one, under the name of NVIDIA's
release, so everything else (host paths, sockets, security context, runtime class, config file) is what
the renderer writes for real clusters.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpuforge.constants import COMPONENT_DEVICE_PLUGIN, COMPONENT_LABEL, SIM_POOL_LABEL
from gpuforge_lab.devcluster import realnodes
from gpuforge_lab.devcluster.build import build_nodes
from gpuforge_lab.devcluster.cluster import DevCluster
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

from ..operator_process import (
    Operator,
    condition,
    kube_json,
    service_account_kubeconfig,
    stack_status,
    wait_for,
)

pytestmark = [pytest.mark.realnode, pytest.mark.slow]

NODE = "real-0"
STACK = "real"
NAMESPACE = "gpuforge-real"
GPUS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    dev_cluster = DevCluster("realnode-operator", root=tmp_path_factory.mktemp("clusters"))
    try:
        dev_cluster.up(pools=[Pool("real", 1, GpuSpec(product="NVIDIA L4", count=GPUS), real=True)])
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
                        {"matchExpressions": [{"key": SIM_POOL_LABEL, "operator": "In", "values": ["real"]}]}
                    ]
                },
            },
        }
    )


def gpu_status(cluster: DevCluster) -> tuple[str | None, str | None]:
    status = kube_json(cluster, "node", NODE)["status"]
    resource = "nvidia.com/gpu"
    return (status.get("capacity") or {}).get(resource), (status.get("allocatable") or {}).get(resource)


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
        return status if status.get("phase") == "Ready" and gpu_status(cluster) == ("2", "2") else None

    status: dict[str, Any] = wait_for(
        "the stack Ready and the real node advertising",
        done,
        timeout=180,
        describe=lambda: f"{describe(cluster)}\n--- operator ---\n{operator.log_tail()}",
    )
    return status


def test_rendered_daemonset_runs_and_advertises_through_the_real_kubelet(
    cluster: DevCluster, deployed: dict[str, Any]
) -> None:
    assert condition(deployed, "Ready")["status"] == "True"
    assert deployed["nodesReady"] == "1/1"
    [pod] = plugin_pods(cluster)
    assert ready(pod) and pod["spec"]["nodeName"] == NODE
    # Nothing but the image differs from what real clusters get.
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert pod["spec"]["containers"][0]["image"] == f"{realnodes.DEVICE_PLUGIN_REPOSITORY}:v0.20.0"
    log = cluster.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"]).stdout
    assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in log, log


def test_a_gpu_pod_gets_its_device_through_cdi(cluster: DevCluster, deployed: dict[str, Any]) -> None:
    workload = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-job", "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {realnodes.REAL_NODE_LABEL: "true"},
            "containers": [
                {
                    "name": "workload",
                    "image": realnodes.program_image_ref(build_nodes(), "gpu-workload"),
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(workload))
    wait_for(
        "the GPU pod to finish",
        lambda: (
            cluster.kubectl("get", "pod", "gpu-job", "-o", "jsonpath={.status.phase}").stdout
            in ("Succeeded", "Failed")
        ),
        timeout=120,
    )
    phase = cluster.kubectl("get", "pod", "gpu-job", "-o", "jsonpath={.status.phase}").stdout
    assert phase == "Succeeded", cluster.kubectl("describe", "pod", "gpu-job").stdout
    log = cluster.kubectl("logs", "gpu-job").stdout
    hardware = json.loads((cluster.state_dir / f"nodes/{NODE}/hardware/gpus.json").read_text())
    uuids = {gpu["uuid"] for gpu in hardware["gpus"]}
    visible = [line.split("=", 1)[1] for line in log.splitlines() if line.startswith("env NVIDIA_VISIBLE_")]
    # One GPU, named by the CDI spec the plugin wrote (cdi-annotations and cdi-cri name the same device).
    assert len(visible) == 1 and visible[0] in uuids, log
    assert "(NVIDIA L4)" in log
