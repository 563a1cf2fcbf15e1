"""Pure parts of the real nodes: pools marked real, what a real node is told, and the node build's key."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from gpuforge_lab.devcluster import build, realnodes
from gpuforge_lab.devcluster.pools import (
    GpuSpec,
    Pool,
    PoolError,
    Taint,
    lab_gpu_models,
    parse_pools,
    real_node_patch,
    render_nodes,
)


def test_a_real_pool_is_parsed_and_not_rendered_as_kwok_nodes() -> None:
    pools = parse_pools({"pools": [{"name": "real", "count": 2, "real": True}, {"name": "sim", "count": 1}]})
    assert [pool.real for pool in pools] == [True, False]
    assert [node["metadata"]["name"] for node in render_nodes(pools, "v1.36.5")] == ["sim-0"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": "r", "real": "yes"}, "pools[0].real must be true or false"),
        ({"name": "r", "real": True, "kubeletVersion": "v1.34.2"}, "pools[0].kubeletVersion cannot be set"),
    ],
)
def test_bad_real_pools_are_refused(raw: dict[str, object], message: str) -> None:
    with pytest.raises(PoolError, match=re.escape(message)):
        parse_pools({"pools": [raw]})


@pytest.mark.parametrize(
    ("gpu", "models"),
    [
        (None, ()),
        (GpuSpec(product="NVIDIA L4", count=2), ("l4", "l4")),
        (GpuSpec(product="NVIDIA L40S", count=1), ("l40s",)),
        (GpuSpec(product="NVIDIA H100 80GB HBM3", count=1), ("h100",)),
        (GpuSpec(product="Tesla T4", count=1), ("t4",)),
        (GpuSpec(product="Something New", count=1), ("a100",)),
    ],
)
def test_lab_hardware_follows_the_pool_gpus(gpu: GpuSpec | None, models: tuple[str, ...]) -> None:
    assert lab_gpu_models(gpu) == models


def test_real_node_patch_carries_discovery_labels_and_taints() -> None:
    pool = Pool("real", 1, GpuSpec(product="NVIDIA L4", count=1), labels={"team": "a"}, real=True,
                taints=(Taint("nvidia.com/gpu", "NoSchedule"),))  # fmt: skip
    patch = real_node_patch(pool)
    labels = patch["metadata"]["labels"]
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert labels["team"] == "a"
    assert patch["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]


def test_kubelet_listens_on_its_own_ports() -> None:
    node = realnodes.RealNode("real-0", "c", 20250, 20248, ())
    config = realnodes.kubelet_config(node, "192.0.2.2")
    assert (config["port"], config["healthzPort"], config["readOnlyPort"]) == (20250, 20248, 0)
    assert config["address"] == "192.0.2.2"
    assert config["failCgroupV1"] is False


def test_containerd_honours_cdi_and_never_pulls_the_sandbox() -> None:
    text = realnodes.containerd_config("localhost/gpuforge/pause:k")
    assert 'sandbox_image = "localhost/gpuforge/pause:k"' in text
    assert "enable_cdi = true" in text


def test_a_host_to_bootstrap_starts_without_the_nvidia_runtime() -> None:
    """The toolkit role adds it in a drop-in; the main file keeps CDI and the sandbox image."""
    lab = realnodes.containerd_config("p", nvidia_runtime=True)
    plain = realnodes.containerd_config("p", nvidia_runtime=False)
    assert "runtimes.nvidia" in lab and "runtimes.nvidia" not in plain
    assert "enable_cdi = true" in plain and "imports" not in plain


def test_bootstrap_inventory_reaches_hosts_through_podman_and_the_imitation_repositories() -> None:
    node = realnodes.RealNode("real-0", "gpuforge-node-c-real-0", 20250, 20248, ("l4",), bootstrap="site.yml")
    inventory = realnodes.bootstrap_inventory([node], "http://127.0.0.1:8000")["all"]
    assert inventory["children"]["gpu_nodes"]["hosts"] == {
        "real-0": {"ansible_host": "gpuforge-node-c-real-0", "ansible_connection": "containers.podman.podman"}
    }
    assert inventory["vars"]["nvidia_driver_repo_base_url"] == "http://127.0.0.1:8000/compute/cuda/repos"
    assert (
        inventory["vars"]["nvidia_container_toolkit_repo_base_url"]
        == "http://127.0.0.1:8000/libnvidia-container"
    )


def test_cni_bridge_is_the_pods_gateway_without_masquerade() -> None:
    config = realnodes.cni_config("gpuforge-node-a-real-0", "10.244.100.0/24")
    bridge = config["plugins"][0]
    assert (bridge["isDefaultGateway"], bridge["ipMasq"]) == (True, False)
    assert len(bridge["bridge"]) <= 15  # a Linux interface name


def test_pods_reach_the_api_server_only_through_their_own_bridge() -> None:
    commands = realnodes.service_route("gpuforge-node-a-real-0", 6443)
    bridge = realnodes.bridge_name("gpuforge-node-a-real-0")
    dnat = commands[-1]
    assert dnat[:5] == ["iptables", "-t", "nat", "-I", "PREROUTING"]
    assert dnat[dnat.index("-i") + 1] == bridge
    assert dnat[dnat.index("-d") + 1] == "10.96.0.1/32"
    assert dnat[-1] == "127.0.0.1:6443"
    assert f"net.ipv4.conf.{bridge}.route_localnet=1" in commands[2]


def test_a_node_subnet_skips_routes_in_use_and_ones_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    first = realnodes.free_subnet("gpuforge-node-a-real-0", set())
    routes = f"{first} dev gfother proto kernel scope link src 10.244.0.1\n"
    monkeypatch.setattr(
        realnodes, "_run", lambda command: subprocess.CompletedProcess(command, 0, routes, "")
    )
    taken: set[str] = set()
    second = realnodes.free_subnet("gpuforge-node-a-real-0", taken)
    third = realnodes.free_subnet("gpuforge-node-a-real-0", taken)
    assert len({first, second, third}) == 3
    assert taken == {second, third}


def test_the_hosts_driver_is_the_lab_stub_stamped_with_its_version() -> None:
    stub = realnodes.nvidia_smi_stub()
    assert f'DRIVER_VERSION = "{realnodes.HOST_DRIVER_VERSION}"' in stub
    assert "@CUDA_VERSION@" not in stub


def test_node_programs_have_a_key_of_their_own() -> None:
    versions = build.load_versions()
    control_plane_files = list(build._recipe_files(nodes=False))
    node_files = list(build._recipe_files(nodes=True))
    assert not any(path.is_relative_to(build.GOMOD_DIR / build.NODE_GOMOD) for path in control_plane_files)
    assert any(path.name == "main.go" and "pause" in str(path) for path in node_files)
    assert build.node_build_key(versions).startswith(f"kubelet-{versions.kubernetes}_")


@pytest.mark.parametrize(("before", "after", "raised"), [("128\n", "512", 128), ("1024\n", "1024", None)])
def test_the_inotify_instance_limit_is_raised_only_when_lower(
    tmp_path: Path, before: str, after: str, raised: int | None
) -> None:
    limit = tmp_path / "max_user_instances"
    limit.write_text(before)
    assert realnodes.raise_inotify_limit(limit, 512) == raised
    assert limit.read_text().strip() == after


def test_without_podman_there_is_no_node_container_to_remove(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kwok-only cluster on a machine without podman is taken down all the same."""

    def no_podman(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("podman")

    monkeypatch.setattr(realnodes.shutil, "which", lambda name: None)
    monkeypatch.setattr(realnodes.subprocess, "run", no_podman)
    assert realnodes.remove_nodes("c1") == []
