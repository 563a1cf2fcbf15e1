"""What the simulated device plugin advertises, table by table, against k8s-device-plugin's device map."""

from __future__ import annotations

from typing import Any

import pytest

from gpuforge_lab.devcluster.pools import GpuSpec
from gpuforge_lab.sim.advertise import Gpu, PluginExits, advertised, mig_resource, node_gpus

WHOLE = Gpu()
MIG_1G10 = Gpu(mig_devices=("1g.10gb",) * 7)
MIG_3G40 = Gpu(mig_devices=("3g.40gb", "3g.40gb"))
MIG_EMPTY = Gpu(mig_devices=())


def sharing(
    replicas: int, rename_by_default: bool = False, name: str = "nvidia.com/gpu", **extra: Any
) -> dict[str, Any]:
    resource = {"name": name, "replicas": replicas, **extra}
    return {
        "version": "v1",
        "sharing": {"timeSlicing": {"renameByDefault": rename_by_default, "resources": [resource]}},
    }


@pytest.mark.parametrize(
    ("gpus", "strategy", "config", "expected"),
    [
        ([WHOLE] * 8, "none", None, {"nvidia.com/gpu": 8}),
        ([WHOLE] * 8, "none", sharing(4), {"nvidia.com/gpu": 32}),
        ([WHOLE] * 8, "none", sharing(4, rename_by_default=True), {"nvidia.com/gpu.shared": 32}),
        # a bare name gets the nvidia.com/ prefix (resources.go NewResourceName)
        ([WHOLE] * 2, "none", sharing(3, rename_by_default=True, name="gpu"), {"nvidia.com/gpu.shared": 6}),
        # a custom rename and a device subset are ignored (config.go DisableResourceNamingInConfig)
        ([WHOLE] * 2, "none", sharing(2, True, rename="nvidia.com/x"), {"nvidia.com/gpu.shared": 4}),
        ([WHOLE] * 2, "none", sharing(2, False, rename="nvidia.com/y", devices=[0]), {"nvidia.com/gpu": 4}),
        # strategy none: a GPU in MIG mode is advertised whole
        ([MIG_1G10] * 8, "none", None, {"nvidia.com/gpu": 8}),
        ([MIG_1G10] * 8, "single", None, {"nvidia.com/gpu": 56}),
        ([MIG_1G10] * 2, "single", sharing(2, rename_by_default=True), {"nvidia.com/gpu.shared": 28}),
        ([WHOLE] * 4, "single", None, {"nvidia.com/gpu": 4}),
        ([MIG_1G10] * 8, "mixed", None, {"nvidia.com/mig-1g.10gb": 56}),
        (
            [MIG_1G10, MIG_3G40, WHOLE],
            "mixed",
            None,
            {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 7, "nvidia.com/mig-3g.40gb": 2},
        ),
        # time slicing nvidia.com/gpu leaves MIG devices alone under mixed
        (
            [MIG_1G10, WHOLE],
            "mixed",
            sharing(4, rename_by_default=True),
            {"nvidia.com/gpu.shared": 4, "nvidia.com/mig-1g.10gb": 7},
        ),
        ([MIG_1G10], "mixed", sharing(2, name="nvidia.com/mig-1g.10gb"), {"nvidia.com/mig-1g.10gb": 14}),
        # a MIG-mode GPU without MIG devices is only warned about under mixed
        ([MIG_EMPTY, WHOLE], "mixed", None, {"nvidia.com/gpu": 1}),
        # a shared resource the node lacks advertises nothing
        ([MIG_1G10], "mixed", sharing(4), {"nvidia.com/mig-1g.10gb": 7}),
        ([], "none", None, {}),
    ],
)
def test_advertised_resources(gpus: list[Gpu], strategy: str, config: Any, expected: dict[str, int]) -> None:
    assert advertised(gpus, strategy, config) == expected


@pytest.mark.parametrize(
    ("gpus", "strategy", "message"),
    [
        ([MIG_1G10, MIG_3G40], "single", "more than one MIG device type present on node"),
        (
            [MIG_1G10, WHOLE],
            "single",
            "all devices on the node must be configured with the same migEnabled value",
        ),
        ([MIG_1G10, MIG_EMPTY], "single", "device 1 has no MIG devices configured"),
        ([WHOLE], "both", "unknown MIG strategy: both"),
    ],
)
def test_the_plugin_exits_where_upstream_does(gpus: list[Gpu], strategy: str, message: str) -> None:
    with pytest.raises(PluginExits, match=message):
        advertised(gpus, strategy, None)


def test_mig_resource_names_turn_plus_into_dot() -> None:
    assert mig_resource("1g.10gb") == "nvidia.com/mig-1g.10gb"
    assert mig_resource("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"


@pytest.mark.parametrize(
    ("spec", "mig_enabled", "expected"),
    [
        (GpuSpec(), False, [WHOLE] * 8),
        (GpuSpec(), True, [MIG_1G10] * 8),
        (GpuSpec(product="NVIDIA A100-SXM4-40GB", count=1), True, [Gpu(mig_devices=("1g.5gb",) * 7)]),
        (GpuSpec(product="NVIDIA H100 80GB HBM3", count=1), True, [MIG_1G10]),
        (GpuSpec(count=2, mig_profile="3g.40gb", mig_devices_per_gpu=2), True, [MIG_3G40] * 2),
        (GpuSpec(product="NVIDIA L4", count=1, mig_capable=False), True, [WHOLE]),
    ],
)
def test_node_gpus_follow_the_pool_layout(spec: GpuSpec, mig_enabled: bool, expected: list[Gpu]) -> None:
    assert node_gpus(spec, mig_enabled) == expected
