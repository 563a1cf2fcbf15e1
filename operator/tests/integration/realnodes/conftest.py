"""Real-node tests boot lab hosts under rootful podman; they run with the rest of the suite (`-m "not
realnode"` leaves them out). Where no host can boot (no podman, not root) they are skipped, saying why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuforge_lab.devcluster.cluster import DevCluster
from gpuforge_lab.devcluster.realnodes import can_boot_hosts

from ..operator_process import Operator, running_operator


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = can_boot_hosts()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "realnode" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def operator(cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """The operator with its ServiceAccount's credentials on the module's `cluster`."""
    with running_operator(cluster, tmp_path_factory.mktemp("operator")) as handle:
        yield handle
