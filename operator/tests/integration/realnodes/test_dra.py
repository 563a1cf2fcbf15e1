"""The operator's own DRA kubelet-plugin DaemonSet on a real kubelet node, only its image replaced by the
pretend gpu-kubelet-plugin: registration through the kubelet's plugin watcher, ResourceSlices, a claim the
real scheduler allocates, NodePrepareResources writing the CDI spec containerd injects, and
NodeUnprepareResources removing it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from gpuforge_lab.devcluster import realnodes
from gpuforge_lab.devcluster.build import build_nodes
from gpuforge_lab.devcluster.cluster import DevCluster

from ..operator_process import Operator, kube_json, wait_for
from .helpers import NODE, one_real_node

pytestmark = [pytest.mark.realnode, pytest.mark.slow]

OPERANDS = "gpuforge-operands"
DRIVER = "gpu.nvidia.com"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    with one_real_node("realdra-test", tmp_path_factory) as dev_cluster:
        yield dev_cluster


def _host(cluster: DevCluster) -> str:
    return realnodes.container_name(cluster.name, NODE)


def _hardware(cluster: DevCluster) -> list[dict[str, Any]]:
    gpus: list[dict[str, Any]] = json.loads(
        (cluster.state_dir / "nodes" / NODE / "hardware" / "gpus.json").read_text()
    )["gpus"]
    return gpus


def _slices(cluster: DevCluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube_json(cluster, "resourceslices.v1.resource.k8s.io")["items"]
    return [s for s in items if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE]


def _plugin_pods(cluster: DevCluster) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = kube_json(cluster, "pods", "-n", OPERANDS)["items"]
    return [p for p in pods if p["spec"].get("nodeName") == NODE]


def _diagnose(cluster: DevCluster) -> str:
    pods = cluster.kubectl("describe", "pods", "-n", OPERANDS, check=False).stdout
    logs = cluster.kubectl("logs", "-n", OPERANDS, "-l", "app.kubernetes.io/component", "--all-containers",
                           "--tail=40", check=False)  # fmt: skip
    return f"{pods[-4000:]}\n{logs.stdout[-3000:]}{logs.stderr[-500:]}"


def _cdi_specs(cluster: DevCluster) -> list[str]:
    listing = subprocess.run(
        ["podman", "exec", _host(cluster), "ls", "/var/run/cdi"], capture_output=True, text=True, check=True
    )
    return [name for name in listing.stdout.split() if name.startswith(f"k8s.{DRIVER}-")]


@pytest.fixture(scope="module")
def dra_stack(cluster: DevCluster, operator: Operator) -> dict[str, Any]:
    stack = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": "gpus"},
        "spec": {
            "mode": "dra",
            # The rendered DaemonSet as users get it, but for the image: the pretend plugin.
            "dra": {
                "version": "v25.12.0",
                "image": realnodes.DRA_PLUGIN_REPOSITORY,
                "deviceClasses": [DRIVER],
            },
            "namespace": OPERANDS,
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(stack))
    wait_for("the plugin's ResourceSlice", lambda: bool(_slices(cluster)), timeout=300,
             describe=lambda: _diagnose(cluster))  # fmt: skip
    return stack


def test_the_plugin_registers_and_publishes_the_hosts_gpus(cluster: DevCluster, dra_stack: Any) -> None:
    (published,) = _slices(cluster)
    assert published["spec"]["pool"]["name"] == NODE
    hardware = {gpu["uuid"]: gpu for gpu in _hardware(cluster)}
    devices = {d["name"]: d for d in published["spec"]["devices"]}
    assert sorted(devices) == ["gpu-0", "gpu-1"]
    for device in devices.values():
        attributes = {key: next(iter(value.values())) for key, value in device["attributes"].items()}
        gpu = hardware[attributes["uuid"]]
        assert device["name"] == f"gpu-{gpu['index']}"
        assert attributes["type"] == "gpu"
        assert attributes["productName"] == "NVIDIA L4"
        assert attributes["architecture"] == "Ada Lovelace"
        assert attributes["cudaComputeCapability"] == "8.9.0"
        assert attributes["driverVersion"] == "580.95.5"
        assert attributes["cudaDriverVersion"] == "13.0.0"
        assert attributes["resource.kubernetes.io/pciBusID"] == gpu["pci_bus_id"]
        assert device["capacity"]["memory"]["value"] == f"{gpu['memory_mib']}Mi"
    # The kubelet's plugin watcher registered it (the kubelet only then passes claims to it).
    sockets = subprocess.run(
        ["podman", "exec", _host(cluster), "ls", "/var/lib/kubelet/plugins_registry"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert f"{DRIVER}-reg.sock" in sockets


def test_the_plugin_pod_passes_its_grpc_probes(cluster: DevCluster, dra_stack: Any) -> None:
    def ready() -> bool:
        pods = _plugin_pods(cluster)
        return bool(pods) and all(
            c.get("ready") for p in pods for c in p.get("status", {}).get("containerStatuses", [])
        )

    wait_for("the plugin pod's startup probe", ready, timeout=120, describe=lambda: _diagnose(cluster))
    (pod,) = _plugin_pods(cluster)
    (gpus,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "gpus"]
    assert gpus["restartCount"] == 0


def test_a_claim_is_allocated_prepared_injected_and_unprepared(cluster: DevCluster, dra_stack: Any) -> None:
    binaries = build_nodes()
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "one-gpu", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
    }
    holder = realnodes.program_image_ref(binaries, realnodes.DRA_PLUGIN_PROGRAM)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "dra-workload", "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}],
            "containers": [
                {
                    "name": "workload",
                    "image": realnodes.program_image_ref(binaries, "gpu-workload"),
                    "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": "gpu"}]},
                },
                # Keeps the pod, and so the claim's preparation, alive until the test deletes it.
                {
                    "name": "holder",
                    "image": holder,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                },
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(claim))
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def workload_done() -> bool:
        state = cluster.kubectl(
            "get", "pod", "dra-workload", "-o",
            "jsonpath={.status.containerStatuses[?(@.name=='workload')].state.terminated.reason}",
        ).stdout  # fmt: skip
        return state == "Completed"

    wait_for("the DRA workload", workload_done, timeout=180,
             describe=lambda: cluster.kubectl("describe", "pod", "dra-workload").stdout)  # fmt: skip
    allocated = kube_json(cluster, "resourceclaim", "one-gpu")["status"]["allocation"]["devices"]["results"]
    (result,) = allocated
    assert (result["driver"], result["pool"]) == (DRIVER, NODE)
    gpu = next(g for g in _hardware(cluster) if f"gpu-{g['index']}" == result["device"])

    log = cluster.kubectl("logs", "dra-workload", "-c", "workload").stdout
    # Set by the CDI spec NodePrepareResources wrote, not by the pod.
    assert f"env GPUFORGE_GPU_{gpu['index']}={gpu['uuid']} (NVIDIA L4)" in log
    assert "env GPUFORGE_DRA_CLAIM=default/one-gpu" in log
    assert [line for line in log.splitlines() if line.startswith("env GPUFORGE_GPU_")] == [
        f"env GPUFORGE_GPU_{gpu['index']}={gpu['uuid']} (NVIDIA L4)"
    ]
    claim_uid = kube_json(cluster, "resourceclaim", "one-gpu")["metadata"]["uid"]
    assert _cdi_specs(cluster) == [f"k8s.{DRIVER}-device_{claim_uid}.json"]

    cluster.kubectl("delete", "pod", "dra-workload", "--wait=true", "--timeout=120s")
    wait_for("the claim's CDI spec to go", lambda: not _cdi_specs(cluster), timeout=60)


@pytest.mark.parametrize(
    ("env", "error"),
    [
        # cmd/gpu-kubelet-plugin/main.go: image-name is Required (urfave/cli's message).
        ({"NODE_NAME": NODE}, 'Required flag "image-name" not set'),
        # pkg/featuregates/featuregates.go of v25.12.0 has no such gate; featuregate.Set refuses it.
        (
            {"NODE_NAME": NODE, "IMAGE_NAME": "x", "FEATURE_GATES": "Bogus=true"},
            "unrecognized feature gate: Bogus",
        ),
    ],
)
def test_the_plugin_exits_as_the_release_does(cluster: DevCluster, env: dict[str, str], error: str) -> None:
    name = f"bad-plugin-{len(env)}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "nodeName": NODE,
            "containers": [
                {
                    "name": "gpus",
                    "image": realnodes.program_image_ref(build_nodes(), realnodes.DRA_PLUGIN_PROGRAM),
                    "imagePullPolicy": "Never",
                    "env": [{"name": key, "value": value} for key, value in env.items()],
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def exit_code() -> str:
        return cluster.kubectl(
            "get", "pod", name, "-o", "jsonpath={.status.containerStatuses[0].state.terminated.exitCode}"
        ).stdout

    assert wait_for(f"{name} to exit", exit_code, timeout=120) == "1"
    assert error in cluster.kubectl("logs", name).stdout  # the container's stderr, as kubelet logged it


def test_a_kubelet_restart_keeps_the_plugin_serving_claims(cluster: DevCluster, dra_stack: Any) -> None:
    subprocess.run(["podman", "exec", _host(cluster), "systemctl", "restart", "kubelet"], check=True)
    binaries = build_nodes()
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "after-restart", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "after-restart", "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "after-restart"}],
            "containers": [
                {
                    "name": "workload",
                    "image": realnodes.program_image_ref(binaries, "gpu-workload"),
                    "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(claim))
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def phase() -> str:
        value = cluster.kubectl("get", "pod", "after-restart", "-o", "jsonpath={.status.phase}").stdout
        return value if value in ("Succeeded", "Failed") else ""

    assert wait_for("the pod after the kubelet restart", phase, timeout=180,
                    describe=lambda: _diagnose(cluster)) == "Succeeded"  # fmt: skip
    # The kubelet found the plugin again through its registration socket and had it prepare the claim.
    assert "env GPUFORGE_DRA_CLAIM=default/after-restart" in cluster.kubectl("logs", "after-restart").stdout
    # The restarted kubelet removes the node's ResourceSlices of drivers not yet registered with it; the
    # plugin's slice controller, watching them, publishes its pool again.
    wait_for("the plugin's ResourceSlice again", lambda: len(_slices(cluster)) == 1, timeout=120)
    (plugin,) = _plugin_pods(cluster)
    assert all(c["restartCount"] == 0 for c in plugin["status"]["containerStatuses"])
