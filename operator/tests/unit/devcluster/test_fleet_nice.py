"""`DevCluster.up(fleet_nice=...)` refuses what is not a nice value before it starts anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuforge_lab.devcluster.cluster import DevCluster


@pytest.mark.parametrize("nice", [-1, 20])
def test_a_fleet_nice_outside_0_to_19_is_refused_before_anything_starts(tmp_path: Path, nice: int) -> None:
    cluster = DevCluster("fleet", tmp_path)
    with pytest.raises(ValueError, match="fleet_nice must be 0-19"):
        cluster.up(fleet_nice=nice)
    assert not cluster.state_dir.exists()
