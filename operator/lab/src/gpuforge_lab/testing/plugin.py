"""pytest fixtures for tests on the real local control plane.

A suite loads them explicitly (`pytest_plugins = ["gpuforge_lab.testing.plugin"]` in its top conftest.py);
installing the lab does not add them to anyone else's pytest runs.

- `dev_cluster` (session): one running cluster (API profile 1.36) with mixed GPU pools; see SESSION_POOLS.
- `cluster_factory` (session): start more clusters, e.g. `cluster_factory(profile="1.33", nodes=2)`; each
  is stopped when the test module that started it ends, or with `for_session=True` when the session
  ends (an idle cluster keeps using CPU: its controller-manager, etcd and kwok's heartbeats; left up for
  the whole session, a suite's clusters slowed every later test).
- `namespace` (function): a fresh namespace in `dev_cluster`, deleted afterwards.
- `k8s_api` (session): a kubernetes.client.ApiClient for `dev_cluster`'s admin user.

Clusters live in a temporary state root, apart from the user's own `gpuforge dev cluster` clusters.
`--no-cluster` skips every test marked `cluster`; GPUFORGE_TEST_KEEP=1 leaves the clusters running.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuforge_lab.devcluster.cluster import DevCluster
from gpuforge_lab.devcluster.pools import GpuSpec, Pool, Taint, uniform_pools

H100 = GpuSpec(
    product="NVIDIA H100 80GB HBM3",
    count=8,
    memory_mib=81559,
    compute_capability="9.0",
    architecture="Hopper",
)
A100 = GpuSpec()
L4 = GpuSpec(
    product="NVIDIA L4",
    count=1,
    memory_mib=23034,
    compute_capability="8.9",
    architecture="Ada Lovelace",
    mig_capable=False,
)
SESSION_POOLS: tuple[Pool, ...] = (
    Pool(name="h100", count=4, gpu=H100, kubelet_version="v1.34.2"),
    # nvidia as containerd's default runtime: plugin pods reach NVML without a RuntimeClass
    Pool(name="a100", count=4, gpu=A100, nvidia_default_runtime=True),
    Pool(name="l4", count=2, gpu=L4, taints=(Taint(key="nvidia.com/gpu", effect="NoSchedule"),)),
    Pool(name="cpu", count=2, gpu=None),
)

ClusterFactory = Callable[..., DevCluster]


class _Started:
    """The clusters `cluster_factory` started, those for the whole session apart, and how many in all
    (names stay unique after module clusters are stopped)."""

    def __init__(self) -> None:
        self.for_module: list[DevCluster] = []
        self.for_session: list[DevCluster] = []
        self.count = 0


_STARTED = pytest.StashKey[_Started]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuforge")
    group.addoption("--no-cluster", action="store_true", help="skip tests that need the local control plane")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: needs the local control plane")
    config.stash[_STARTED] = _Started()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--no-cluster"):
        return
    skip = pytest.mark.skip(reason="--no-cluster")
    for item in items:
        if "cluster" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster_state_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpuforge-clusters")


def _keep() -> bool:
    return os.environ.get("GPUFORGE_TEST_KEEP") == "1"


@pytest.fixture(scope="session")
def cluster_factory(cluster_state_root: Path, pytestconfig: pytest.Config) -> Iterator[ClusterFactory]:
    started = pytestconfig.stash[_STARTED]

    def start(
        profile: str = "1.36",
        pools: Sequence[Pool] | None = None,
        nodes: int = 2,
        name: str | None = None,
        for_session: bool = False,
    ) -> DevCluster:
        cluster = DevCluster(name or f"c{started.count}-{secrets.token_hex(2)}", cluster_state_root)
        started.count += 1
        (started.for_session if for_session else started.for_module).append(cluster)
        cluster.up(profile, list(pools) if pools is not None else uniform_pools(nodes))
        return cluster

    yield start
    if not _keep():
        for cluster in [*started.for_module, *started.for_session]:
            cluster.down()


@pytest.fixture(scope="module", autouse=True)
def _module_clusters_stopped(pytestconfig: pytest.Config) -> Iterator[None]:
    """Stop the clusters a test module started once it ends. Autouse, so set up before the module's own
    fixtures and torn down after them (an operator on the cluster is stopped first)."""
    yield
    started = pytestconfig.stash[_STARTED]
    if _keep():
        return
    while started.for_module:
        started.for_module.pop().down()


@pytest.fixture(scope="session")
def dev_cluster(cluster_factory: ClusterFactory) -> DevCluster:
    return cluster_factory(profile="1.36", pools=SESSION_POOLS, name="session", for_session=True)


@pytest.fixture(scope="session")
def k8s_api(dev_cluster: DevCluster) -> Iterator[Any]:
    with dev_cluster.api_client() as api_client:
        yield api_client


@pytest.fixture
def namespace(k8s_api: Any) -> Iterator[str]:
    from kubernetes import client

    name = f"t-{secrets.token_hex(4)}"
    core: Any = client.CoreV1Api(k8s_api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name, propagation_policy="Background")
