"""A dev cluster mixing a real kubelet node (lab host, containerd 1.7) with a kwok node."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuforge_lab.devcluster import realnodes
from gpuforge_lab.devcluster.build import build_nodes
from gpuforge_lab.devcluster.cluster import DevCluster
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

pytestmark = [pytest.mark.realnode, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    dev_cluster = DevCluster("realnode-test", root=tmp_path_factory.mktemp("clusters"))
    pools = [
        Pool("real", 1, GpuSpec(product="NVIDIA L4", count=2), real=True),
        Pool("sim", 1),
    ]
    try:
        dev_cluster.up(pools=pools)
        yield dev_cluster
    finally:
        dev_cluster.down()


def _node(cluster: DevCluster, name: str) -> dict[str, object]:
    return json.loads(cluster.kubectl("get", "node", name, "-o", "json").stdout)  # type: ignore[no-any-return]


def test_real_and_kwok_nodes_are_ready_side_by_side(cluster: DevCluster) -> None:
    real = _node(cluster, "real-0")
    info = real["status"]["nodeInfo"]  # type: ignore[index]
    assert info["kubeletVersion"] == "v1.36.5"
    assert info["containerRuntimeVersion"].startswith("containerd://1.7.")
    labels = real["metadata"]["labels"]  # type: ignore[index]
    assert labels[realnodes.REAL_NODE_LABEL] == "true"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert realnodes.REAL_NODE_LABEL not in _node(cluster, "sim-0")["metadata"]["labels"]  # type: ignore[index]
    assert cluster.real_node_names() == ["real-0"]


def test_a_pod_really_runs_on_the_real_node(cluster: DevCluster) -> None:
    image = realnodes.program_image_ref(build_nodes(), "gpu-workload")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "workload", "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {realnodes.REAL_NODE_LABEL: "true"},
            "containers": [
                {
                    "name": "workload",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}],
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    deadline = time.monotonic() + 180
    phase = ""
    while time.monotonic() < deadline and phase not in ("Succeeded", "Failed"):
        time.sleep(0.5)
        phase = cluster.kubectl("get", "pod", "workload", "-o", "jsonpath={.status.phase}").stdout
    assert phase == "Succeeded", cluster.kubectl("describe", "pod", "workload").stdout
    log = cluster.kubectl("logs", "workload").stdout
    assert "env NVIDIA_VISIBLE_DEVICES=none" in log
    assert log.rstrip().endswith("done")


def _wait_phase(cluster: DevCluster, pod: str, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    phase = ""
    while time.monotonic() < deadline and phase not in ("Succeeded", "Failed"):
        time.sleep(0.5)
        phase = cluster.kubectl("get", "pod", pod, "-o", "jsonpath={.status.phase}").stdout
    return phase


def test_pretend_gpus_reach_a_pod_through_the_device_plugin_and_cdi(cluster: DevCluster) -> None:
    binaries = build_nodes()

    def host_path(name: str, path: str) -> dict[str, object]:
        return {"name": name, "hostPath": {"path": path}}

    plugin = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "device-plugin", "namespace": "default"},
        "spec": {
            "nodeSelector": {realnodes.REAL_NODE_LABEL: "true"},
            "containers": [
                {
                    "name": "plugin",
                    "image": realnodes.program_image_ref(binaries, "gpu-device-plugin"),
                    "imagePullPolicy": "Never",
                    # The release's default is envvar, which runc ignores.
                    "env": [{"name": "DEVICE_LIST_STRATEGY", "value": "cdi-cri"}],
                    "volumeMounts": [
                        {"name": "plugins", "mountPath": "/var/lib/kubelet/device-plugins"},
                        {"name": "cdi", "mountPath": "/var/run/cdi"},
                        {"name": "hardware", "mountPath": "/var/lib/gpuforge-sim", "readOnly": True},
                    ],
                }
            ],
            "volumes": [
                host_path("plugins", "/var/lib/kubelet/device-plugins"),
                host_path("cdi", "/var/run/cdi"),
                host_path("hardware", "/var/lib/gpuforge-sim"),
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(plugin))
    deadline = time.monotonic() + 180
    allocatable = ""
    while time.monotonic() < deadline and allocatable != "2":
        time.sleep(0.5)
        allocatable = cluster.kubectl(
            "get", "node", "real-0", "-o", "jsonpath={.status.allocatable.nvidia\\.com/gpu}"
        ).stdout
    assert allocatable == "2", cluster.kubectl("logs", "device-plugin", check=False).stdout

    workload = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-workload", "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "workload",
                    "image": realnodes.program_image_ref(binaries, "gpu-workload"),
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(workload))
    phase = _wait_phase(cluster, "gpu-workload")
    assert phase == "Succeeded", cluster.kubectl("describe", "pod", "gpu-workload").stdout
    log = cluster.kubectl("logs", "gpu-workload").stdout
    hardware = json.loads((cluster.state_dir / "nodes/real-0/hardware/gpus.json").read_text())
    uuids = {gpu["uuid"] for gpu in hardware["gpus"]}
    visible = [line.split("=", 1)[1] for line in log.splitlines() if line.startswith("env NVIDIA_VISIBLE_")]
    assert len(visible) == 1 and visible[0] in uuids, log  # set by the CDI spec, not by the pod
    assert "(NVIDIA L4)" in log


def test_down_removes_the_hosts(tmp_path: Path) -> None:
    dev_cluster = DevCluster("realnode-down", root=tmp_path)
    dev_cluster.up(pools=[Pool("real", 1, None, real=True)])
    assert realnodes.running_hosts("realnode-down") == ["gpuforge-node-realnode-down-real-0"]
    dev_cluster.down()
    assert realnodes.running_hosts("realnode-down") == []
    bridge = realnodes.bridge_name("gpuforge-node-realnode-down-real-0")
    assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode != 0
    listed = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True)
    assert "gpuforge-node-realnode-down-real-0" not in listed.stdout
