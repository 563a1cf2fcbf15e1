"""What the real-node tests share: a cluster of real L4 nodes and a node's GPU figures."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gpuforge_lab.devcluster import realnodes
from gpuforge_lab.devcluster.build import build_nodes
from gpuforge_lab.devcluster.cluster import DevCluster
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

from ..operator_process import kube_json, wait_for

# The nodes `real_nodes` boots, as the pool names them; `one_real_node` boots the first.
NODE = "real-0"
SECOND_NODE = "real-1"


@contextmanager
def real_nodes(
    name: str, tmp_path_factory: pytest.TempPathFactory, count: int, gpus: int = 2
) -> Iterator[DevCluster]:
    """A local control plane with `count` real kubelet nodes of `gpus` pretend L4s each, removed after."""
    dev_cluster = DevCluster(name, root=tmp_path_factory.mktemp("clusters"))
    try:
        dev_cluster.up(pools=[Pool("real", count, GpuSpec(product="NVIDIA L4", count=gpus), real=True)])
        yield dev_cluster
    finally:
        dev_cluster.down()


@contextmanager
def one_real_node(name: str, tmp_path_factory: pytest.TempPathFactory, gpus: int = 2) -> Iterator[DevCluster]:
    """A local control plane with one real kubelet node (`NODE`) of `gpus` pretend L4s, removed afterwards."""
    with real_nodes(name, tmp_path_factory, 1, gpus) as dev_cluster:
        yield dev_cluster


def gpu_status(cluster: DevCluster, node: str = NODE) -> tuple[str | None, str | None]:
    """The node's (capacity, allocatable) of nvidia.com/gpu."""
    status = kube_json(cluster, "node", node)["status"]
    resource = "nvidia.com/gpu"
    return (status.get("capacity") or {}).get(resource), (status.get("allocatable") or {}).get(resource)


def assert_a_gpu_pod_gets_one_device(cluster: DevCluster, node: str = NODE) -> None:
    """Run the GPU workload through `nvidia.com/gpu` on the real nodes and check what it got: one GPU
    of `node`'s simulated hardware, named by the CDI spec the plugin wrote (cdi-annotations and cdi-cri
    name the same device)."""
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
        timeout=180,
    )
    phase = cluster.kubectl("get", "pod", "gpu-job", "-o", "jsonpath={.status.phase}").stdout
    assert phase == "Succeeded", cluster.kubectl("describe", "pod", "gpu-job").stdout
    log = cluster.kubectl("logs", "gpu-job").stdout
    hardware = json.loads((cluster.state_dir / f"nodes/{node}/hardware/gpus.json").read_text())
    uuids = {gpu["uuid"] for gpu in hardware["gpus"]}
    visible = [line.split("=", 1)[1] for line in log.splitlines() if line.startswith("env NVIDIA_VISIBLE_")]
    assert len(visible) == 1 and visible[0] in uuids, log
    assert "(NVIDIA L4)" in log
