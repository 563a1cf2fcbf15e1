"""A real kubelet node bootstrapped by the collection's playbooks/site.yml before it joins.

The host starts as a plain Debian 12 machine with containerd (CDI on, runc only); site.yml installs the
imitation driver and toolkit from the imitation NVIDIA repositories, and the toolkit role writes containerd's
nvidia runtime as a drop-in and the CDI spec with nvidia-ctk. The operator's device-plugin DaemonSet then
runs under that runtime, and a GPU pod gets its device through CDI from the plugin's spec.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpuforge.constants import COMPONENT_DEVICE_PLUGIN, COMPONENT_LABEL, SIM_POOL_LABEL
from gpuforge_lab.devcluster import realnodes
from gpuforge_lab.devcluster.cluster import DevCluster
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

from ..operator_process import Operator, condition, kube_json, stack_status, wait_for
from .helpers import NODE, assert_a_gpu_pod_gets_one_device, gpu_status

pytestmark = [pytest.mark.realnode, pytest.mark.slow]

STACK = "bootstrapped"
NAMESPACE = "gpuforge-bootstrapped"
GPUS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    dev_cluster = DevCluster("realnode-site", root=tmp_path_factory.mktemp("clusters"))
    try:
        gpu = GpuSpec(product="NVIDIA L4", count=GPUS)
        dev_cluster.up(pools=[Pool("real", 1, gpu, real=True, bootstrap="site.yml")])
        yield dev_cluster
    finally:
        dev_cluster.down()


def host(cluster: DevCluster, *command: str) -> str:
    container = realnodes.container_name(cluster.name, NODE)
    return subprocess.run(
        ["podman", "exec", container, *command], capture_output=True, text=True, check=True
    ).stdout


def stack() -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "gpuforge.io/v1alpha1",
            "kind": "GpuStack",
            "metadata": {"name": STACK},
            "spec": {
                "mode": "devicePlugin",
                "namespace": NAMESPACE,
                "devicePlugin": {"version": "v0.20.0", "image": realnodes.DEVICE_PLUGIN_REPOSITORY},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": SIM_POOL_LABEL, "operator": "In", "values": ["real"]}]}
                    ]
                },
            },
        }
    )


def describe(cluster: DevCluster) -> str:
    pods = cluster.kubectl("describe", "pods", "-n", NAMESPACE, check=False).stdout
    selector = f"{COMPONENT_LABEL}={COMPONENT_DEVICE_PLUGIN}"
    logs = cluster.kubectl("logs", "-n", NAMESPACE, "-l", selector, "--tail=30", check=False)
    return f"{pods[-3000:]}\n--- plugin log ---\n{logs.stdout}{logs.stderr}"


@pytest.fixture(scope="module")
def deployed(cluster: DevCluster, operator: Operator) -> dict[str, Any]:
    """The stack applied and Ready, its plugin advertising the node's GPUs through the real kubelet."""
    cluster.kubectl("apply", "-f", "-", input=stack())

    def done() -> dict[str, Any] | None:
        status = stack_status(cluster, STACK)
        return status if status.get("phase") == "Ready" and gpu_status(cluster) == ("2", "2") else None

    status: dict[str, Any] = wait_for(
        "the stack Ready and the bootstrapped node advertising",
        done,
        timeout=300,
        describe=lambda: f"{describe(cluster)}\n--- operator ---\n{operator.log_tail()}",
    )
    return status


def test_containerd_runs_on_the_roles_drop_in_and_reads_their_cdi_spec(cluster: DevCluster) -> None:
    main = host(cluster, "cat", "/etc/containerd/config.toml")
    assert 'imports = ["/etc/containerd/conf.d/*.toml"]' in main, main
    drop_in = host(cluster, "cat", "/etc/containerd/conf.d/99-nvidia.toml")
    assert "/usr/bin/nvidia-container-runtime" in drop_in, drop_in
    # What containerd loaded, the drop-in merged in: the nvidia runtime, not the default, and CDI on.
    dump = host(cluster, "containerd", "config", "dump")
    assert "/etc/containerd/conf.d/99-nvidia.toml" in dump
    assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in dump, dump
    assert 'default_runtime_name = "runc"' in dump
    assert "enable_cdi = true" in dump
    cdi_dirs = next(line for line in dump.splitlines() if line.strip().startswith("cdi_spec_dirs"))
    assert '"/etc/cdi"' in cdi_dirs
    # The spec nvidia-ctk wrote for the node's GPUs, where containerd reads, and nothing shadowing it.
    spec = yaml.safe_load(host(cluster, "cat", "/etc/cdi/nvidia.yaml"))
    assert spec["kind"] == "nvidia.com/gpu"
    hardware = json.loads((cluster.state_dir / f"nodes/{NODE}/hardware/gpus.json").read_text())
    names = {device["name"] for device in spec["devices"]}
    assert {str(gpu["index"]) for gpu in hardware["gpus"]} <= names and "all" in names, names
    assert host(cluster, "sh", "-c", "test -e /var/run/cdi/nvidia.yaml || echo none") == "none\n"
    # The driver's nvidia-smi, installed by the role, sees the node's GPUs.
    assert host(cluster, "nvidia-smi", "-L").count("NVIDIA L4") == GPUS


def test_the_operators_plugin_runs_under_the_roles_runtime(
    cluster: DevCluster, deployed: dict[str, Any]
) -> None:
    assert condition(deployed, "Ready")["status"] == "True"
    pods = kube_json(cluster, "pods", "-n", NAMESPACE, "-l", f"{COMPONENT_LABEL}={COMPONENT_DEVICE_PLUGIN}")
    [pod] = [p for p in pods["items"] if p["spec"]["nodeName"] == NODE]
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    log = cluster.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"]).stdout
    assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in log, log


def test_a_gpu_pod_runs_on_the_bootstrapped_node(cluster: DevCluster, deployed: dict[str, Any]) -> None:
    assert_a_gpu_pod_gets_one_device(cluster)
