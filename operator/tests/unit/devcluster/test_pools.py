from __future__ import annotations

from typing import Any

import pytest

from gpuforge_lab.devcluster.pools import (
    GpuSpec,
    PoolError,
    gpu_labels,
    parse_pools,
    render_node,
    render_nodes,
)


def test_pool_file_parses_with_defaults() -> None:
    pools = parse_pools(
        {
            "pools": [
                {
                    "name": "h100",
                    "count": 2,
                    "kubeletVersion": "v1.34.2",
                    "gpu": {
                        "product": "NVIDIA H100 80GB HBM3",
                        "count": 8,
                        "memoryMiB": 81559,
                        "driverVersion": 580.95,
                    },
                    "labels": {"zone": "a"},
                    "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
                },
                {"name": "cpu", "count": 1, "gpu": None},
            ]
        }
    )
    assert [p.node_names() for p in pools] == [["h100-0", "h100-1"], ["cpu-0"]]
    assert pools[0].gpu is not None and pools[0].gpu.driver_version == "580.95"
    assert pools[1].gpu is None


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "non-empty list"),
        ({"pools": [{"name": "Bad_Name"}]}, "DNS label"),
        ({"pools": [{"name": "a", "count": -1}]}, "non-negative"),
        ({"pools": [{"name": "a", "kubeletVersion": "1.34"}]}, "v1.34.2"),
        ({"pools": [{"name": "a", "gpu": {"colour": "green"}}]}, "unknown keys"),
        ({"pools": [{"name": "a"}, {"name": "a"}]}, "unique"),
        ({"pools": [{"name": "a", "real": True, "bootstrap": "x.yml"}]}, r"pools\[0\].bootstrap must name"),
        ({"pools": [{"name": "a", "bootstrap": "site.yml"}]}, r"pools\[0\].bootstrap needs real: true"),
    ],
)
def test_bad_pool_files_name_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(PoolError, match=message):
        parse_pools(document)


def test_a_real_pool_may_be_bootstrapped_by_the_site_playbook() -> None:
    [bootstrapped, plain] = parse_pools(
        {"pools": [{"name": "a", "real": True, "bootstrap": "site.yml"}, {"name": "b", "real": True}]}
    )
    assert (bootstrapped.bootstrap, plain.bootstrap) == ("site.yml", None)


def test_gpu_labels_match_nfd_and_gfd_keys() -> None:
    labels = gpu_labels(GpuSpec(product="NVIDIA L4", count=1, memory_mib=23034, driver_version="570.172.08"))
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert labels["nvidia.com/gpu.count"] == "1"
    assert labels["nvidia.com/gpu.memory"] == "23034"
    assert labels["nvidia.com/cuda.driver.major"] == "570"
    assert labels["nvidia.com/cuda.driver-version.full"] == "570.172.08"


def test_nodes_carry_kubelet_version_and_simulation_annotation() -> None:
    pools = parse_pools(
        {"pools": [{"name": "gpu", "count": 1}, {"name": "old", "count": 1, "kubeletVersion": "v1.31.4"}]}
    )
    nodes = render_nodes(pools, "v1.36.0")
    assert [n["status"]["nodeInfo"]["kubeletVersion"] for n in nodes] == ["v1.36.0", "v1.31.4"]
    assert nodes[0]["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert GpuSpec.from_json(nodes[0]["metadata"]["annotations"]["sim.gpuforge.io/gpus"]) == GpuSpec()
    cpu = render_node(parse_pools({"pools": [{"name": "cpu", "gpu": None}]})[0], "cpu-0", "v1.36.0")
    assert "sim.gpuforge.io/gpus" not in cpu["metadata"]["annotations"]


def test_runtime_facts_become_node_labels_and_default_to_a_runc_node_without_mig() -> None:
    plain, nvidia = parse_pools(
        {
            "pools": [
                {"name": "plain"},
                {"name": "nvidia", "nvidiaDefaultRuntime": True, "migEnabled": True},
            ]
        }
    )
    plain_labels = render_node(plain, "plain-0", "v1.34.2")["metadata"]["labels"]
    nvidia_labels = render_node(nvidia, "nvidia-0", "v1.34.2")["metadata"]["labels"]
    assert "sim.gpuforge.io/nvidia-default-runtime" not in plain_labels
    assert "sim.gpuforge.io/mig-enabled" not in plain_labels
    assert nvidia_labels["sim.gpuforge.io/nvidia-default-runtime"] == "true"
    assert nvidia_labels["sim.gpuforge.io/mig-enabled"] == "true"


def test_a_runtime_fact_must_be_a_boolean() -> None:
    with pytest.raises(PoolError, match=r"pools\[0\].nvidiaDefaultRuntime must be true or false"):
        parse_pools({"pools": [{"name": "p", "nvidiaDefaultRuntime": "yes"}]})


def test_a_mig_pool_takes_the_products_default_layout_or_its_own() -> None:
    a100, custom = parse_pools(
        {
            "pools": [
                {"name": "a100", "migEnabled": True},
                {"name": "own", "migEnabled": True, "gpu": {"migProfile": "3g.40gb", "migDevicesPerGpu": 2}},
            ]
        }
    )
    assert a100.gpu is not None and a100.gpu.mig_layout() == ("1g.10gb", 7)
    assert custom.gpu is not None and custom.gpu.mig_layout() == ("3g.40gb", 2)
    restored = GpuSpec.from_json(
        render_node(custom, "own-0", "v1.34.2")["metadata"]["annotations"]["sim.gpuforge.io/gpus"]
    )
    assert restored.mig_layout() == ("3g.40gb", 2)


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ({"product": "NVIDIA L4", "migCapable": False}, r"pools\[0\].migEnabled needs a MIG-capable GPU"),
        (
            {"product": "NVIDIA B200"},
            r"no default MIG layout for 'NVIDIA B200'; set pools\[0\].gpu.migProfile",
        ),
        ({"migProfile": "tiny"}, r"pools\[0\].gpu.migProfile must look like 1g.10gb"),
    ],
)
def test_a_mig_pool_needs_a_layout_it_can_have(gpu: dict[str, object], message: str) -> None:
    with pytest.raises(PoolError, match=message):
        parse_pools({"pools": [{"name": "p", "migEnabled": True, "gpu": gpu}]})
