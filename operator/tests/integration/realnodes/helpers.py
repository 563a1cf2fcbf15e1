"""What the real-node tests share: a cluster of real L4 nodes and a node's GPU figures."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gpuforge_lab.devcluster.cluster import DevCluster
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

from ..operator_process import kube_json

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
