"""The local control plane alone: real API server, scheduler, controller-manager, kwok, simulated agent."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpuforge_lab.devcluster.cluster import SIMULATED_FLEET, DevCluster, list_clusters
from gpuforge_lab.devcluster.pools import Pool

from .helpers import eventually, gpu_pod, plugin_daemonset

pytestmark = pytest.mark.cluster

DEPLOY_LABEL = "test.gpuforge.io/plugin"


def _node_gpus(core: client.CoreV1Api, name: str) -> str | None:
    capacity = core.read_node(name).status.capacity or {}
    value: str | None = capacity.get("nvidia.com/gpu")
    return value


def _label_node(core: client.CoreV1Api, node: str, key: str, value: str | None) -> None:
    core.patch_node(node, {"metadata": {"labels": {key: value}}})


def test_hundred_nodes_ready_with_gpu_labels(cluster_factory: Any) -> None:
    cluster = cluster_factory(profile="1.36", nodes=100)
    with cluster.api_client() as api:
        nodes = client.CoreV1Api(api).list_node().items
    assert len(nodes) == 100
    for node in nodes:
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
        labels = node.metadata.labels
        assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["nvidia.com/gpu.memory"] == "81920"
        assert labels["nvidia.com/cuda.driver.major"] == "580"
        assert node.status.node_info.kubelet_version == "v1.36.0"
    cluster.down()


def test_mixed_pools_report_their_kubelet_versions(k8s_api: Any) -> None:
    nodes = {n.metadata.name: n for n in client.CoreV1Api(k8s_api).list_node().items}
    assert nodes["h100-0"].status.node_info.kubelet_version == "v1.34.2"
    assert nodes["h100-0"].metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert nodes["a100-0"].status.node_info.kubelet_version == "v1.36.0"
    assert "nvidia.com/gpu.present" not in nodes["cpu-0"].metadata.labels
    assert any(t.key == "nvidia.com/gpu" for t in nodes["l4-0"].spec.taints or [])


def test_deployment_pods_are_scheduled_and_running(k8s_api: Any, namespace: str) -> None:
    apps = client.AppsV1Api(k8s_api)
    core = client.CoreV1Api(k8s_api)
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 5,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
                },
            },
        },
    )

    def running() -> list[Any]:
        pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
        ok = [p for p in pods if p.status.phase == "Running" and p.spec.node_name]
        return ok if len(ok) == 5 else []

    eventually(running, what="5 web pods Running")
    eventually(
        lambda: apps.read_namespaced_deployment(namespace=namespace, name="web").status.ready_replicas == 5
    )


def test_gpu_pod_lands_only_where_the_agent_advertised_gpus(k8s_api: Any, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    apps = client.AppsV1Api(k8s_api)
    ds_name = f"dp-{namespace}"
    target = "a100-3"
    _label_node(core, target, DEPLOY_LABEL, ds_name)
    try:
        apps.create_namespaced_daemon_set(
            namespace, plugin_daemonset(ds_name, namespace, "device-plugin", DEPLOY_LABEL)
        )
        eventually(lambda: _node_gpus(core, target) == "8", what="a100-3 advertising 8 GPUs")
        assert _node_gpus(core, "a100-2") in (None, "0")
        core.create_namespaced_pod(namespace, gpu_pod("trainer", namespace, 8))
        pod = eventually(
            lambda: (p := core.read_namespaced_pod("trainer", namespace)).spec.node_name and p,
            what="trainer scheduled",
        )
        assert pod.spec.node_name == target
        # More GPUs than any advertising node has: stays Pending, with the scheduler saying why.
        core.create_namespaced_pod(namespace, gpu_pod("too-big", namespace, 2))
        event = eventually(
            lambda: [
                e
                for e in core.list_namespaced_event(
                    namespace, field_selector="involvedObject.name=too-big"
                ).items
                if e.reason == "FailedScheduling"
            ],
            what="FailedScheduling for too-big",
        )
        assert "nvidia.com/gpu" in event[0].message
    finally:
        apps.delete_namespaced_daemon_set(ds_name, namespace)
        eventually(lambda: _node_gpus(core, target) == "0", what="capacity back to 0 after the plugin left")
        _label_node(core, target, DEPLOY_LABEL, None)


def _device_class(name: str, version: str) -> dict[str, Any]:
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": "device.driver == 'gpu.nvidia.com' && "
                        "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                    }
                }
            ]
        },
    }


def _claim_template(name: str, device_class: str, count: int, version: str) -> dict[str, Any]:
    if version == "v1beta1":
        request: dict[str, Any] = {"name": "gpu", "deviceClassName": device_class, "count": count}
    else:
        request = {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count}}
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def _dra_round_trip(api: Any, namespace: str, version: str, node: str) -> None:
    """A pod whose claim comes from a template is allocated devices from the agent's ResourceSlices."""
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    custom = client.CustomObjectsApi(api)
    ds_name = f"dra-{namespace}"
    class_name = f"{namespace}.gpu.nvidia.com"
    _label_node(core, node, DEPLOY_LABEL, ds_name)
    apps.create_namespaced_daemon_set(
        namespace, plugin_daemonset(ds_name, namespace, "dra-kubelet-plugin", DEPLOY_LABEL)
    )
    try:
        eventually(
            lambda: custom.list_cluster_custom_object(
                "resource.k8s.io", version, "resourceslices", field_selector=f"spec.nodeName={node}"
            )["items"],
            what=f"ResourceSlices of {node} via {version}",
        )
        custom.create_cluster_custom_object(
            "resource.k8s.io", version, "deviceclasses", _device_class(class_name, version)
        )
        custom.create_namespaced_custom_object(
            "resource.k8s.io",
            version,
            namespace,
            "resourceclaimtemplates",
            _claim_template("two", class_name, 2, version),
        )
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "dra-user"},
                "spec": {
                    "tolerations": [{"operator": "Exists"}],
                    "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two"}],
                    "containers": [
                        {"name": "c", "image": "cuda:12", "resources": {"claims": [{"name": "gpus"}]}}
                    ],
                },
            },
        )
        pod = eventually(
            lambda: (p := core.read_namespaced_pod("dra-user", namespace)).status.phase == "Running" and p,
            timeout=60,
            what="dra-user Running",
        )
        assert pod.spec.node_name == node
        claims = custom.list_namespaced_custom_object(
            "resource.k8s.io", version, namespace, "resourceclaims"
        )["items"]
        assert len(claims) == 1
        results = claims[0]["status"]["allocation"]["devices"]["results"]
        assert len(results) == 2
        assert {r["driver"] for r in results} == {"gpu.nvidia.com"}
    finally:
        core.delete_namespaced_pod("dra-user", namespace, grace_period_seconds=0)
        apps.delete_namespaced_daemon_set(ds_name, namespace)
        custom.delete_cluster_custom_object("resource.k8s.io", version, "deviceclasses", class_name)
        _label_node(core, node, DEPLOY_LABEL, None)
    eventually(
        lambda: (
            not custom.list_cluster_custom_object(
                "resource.k8s.io", version, "resourceslices", field_selector=f"spec.nodeName={node}"
            )["items"]
        ),
        what="slices gone with the plugin",
    )


def _served(api: Any) -> set[str]:
    for group in client.ApisApi(api).get_api_versions().groups:
        if group.name == "resource.k8s.io":
            return {v.version for v in group.versions}
    return set()


def test_dra_claim_allocated_on_profile_136(k8s_api: Any, namespace: str) -> None:
    assert _served(k8s_api) == {"v1"}
    _dra_round_trip(k8s_api, namespace, "v1", "h100-3")


@pytest.mark.parametrize(
    ("profile", "version"), [("1.33", "v1beta2"), ("1.33", "v1beta1"), ("1.32", "v1beta1")]
)
def test_dra_claim_allocated_on_beta_profiles(cluster_factory: Any, profile: str, version: str) -> None:
    cluster = cluster_factory(profile=profile, nodes=2)
    with cluster.api_client() as api:
        served = _served(api)
        assert "v1" not in served
        assert version in served
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "dra"}})
        _dra_round_trip(api, "dra", version, "gpu-1")
    cluster.down()


def test_upgrade_133_to_134_keeps_objects_and_serves_v1(cluster_factory: Any) -> None:
    cluster: DevCluster = cluster_factory(profile="1.33", nodes=2)
    with cluster.api_client() as api:
        custom = client.CustomObjectsApi(api)
        custom.create_cluster_custom_object(
            "resource.k8s.io", "v1beta2", "deviceclasses", _device_class("kept.example.com", "v1beta2")
        )
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "kept", "labels": {"a": "b"}}})
    cluster.upgrade("1.34")
    with cluster.api_client() as api:
        assert _served(api) == {"v1"}
        device_class = client.CustomObjectsApi(api).get_cluster_custom_object(
            "resource.k8s.io", "v1", "deviceclasses", "kept.example.com"
        )
        assert "gpu.nvidia.com" in device_class["spec"]["selectors"][0]["cel"]["expression"]
        assert client.CoreV1Api(api).read_namespace("kept").metadata.labels["a"] == "b"
        assert len(client.CoreV1Api(api).list_node().items) == 2
    eventually(
        lambda: all(c.running and c.healthy for c in cluster.status()),
        what="every component healthy after the upgrade",
    )
    cluster.down()


def test_failure_injection_and_double_advertising_record(
    k8s_api: Any, dev_cluster: DevCluster, namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    apps = client.AppsV1Api(k8s_api)
    node = "a100-2"
    dp, dra = f"dp-{namespace}", f"dra-{namespace}"
    _label_node(core, node, DEPLOY_LABEL, dp)
    before = len(dev_cluster.violations())
    try:
        apps.create_namespaced_daemon_set(
            namespace,
            plugin_daemonset(
                dp, namespace, "device-plugin", DEPLOY_LABEL, image="registry.local/dp:v2-sim-never-ready"
            ),
        )
        pod = eventually(
            lambda: core.list_namespaced_pod(namespace, label_selector=f"app={dp}").items, what="dp pod"
        )[0]
        eventually(lambda: core.read_namespaced_pod(pod.metadata.name, namespace).status.phase == "Running")
        assert _node_gpus(core, node) in (None, "0"), "an unready plugin advertises nothing"
        # Fix the image: now it advertises.
        apps.patch_namespaced_daemon_set(
            dp,
            namespace,
            {
                "spec": {
                    "template": {
                        "spec": {"containers": [{"name": "plugin", "image": "registry.local/dp:v2"}]}
                    }
                }
            },
        )
        with contextlib.suppress(client.ApiException):  # the DaemonSet controller may replace it first
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        eventually(lambda: _node_gpus(core, node) == "8", what="advertising after the fix")
        assert len(dev_cluster.violations()) == before
        # A DRA plugin on the same node at once: the agent records it.
        _label_node(core, node, "test.gpuforge.io/dra", dra)
        apps.create_namespaced_daemon_set(
            namespace, plugin_daemonset(dra, namespace, "dra-kubelet-plugin", "test.gpuforge.io/dra")
        )
        eventually(
            lambda: [v for v in dev_cluster.violations()[before:] if v["node"] == node],
            what="violation record",
        )
        # NotReady injection.
        dev_cluster.set_node_health(node, ready=False)
        assert not any(
            c.type == "Ready" and c.status == "True" for c in core.read_node(node).status.conditions
        )
        dev_cluster.set_node_health(node, ready=True)
        eventually(
            lambda: any(
                c.type == "Ready" and c.status == "True" for c in core.read_node(node).status.conditions
            ),
            what="Ready again",
        )
    finally:
        for name in (dp, dra):
            with contextlib.suppress(client.ApiException):
                apps.delete_namespaced_daemon_set(name, namespace)
        _label_node(core, node, DEPLOY_LABEL, None)
        _label_node(core, node, "test.gpuforge.io/dra", None)
        eventually(lambda: _node_gpus(core, node) in (None, "0"), what="capacity gone")


def _thread_nices(pid: int) -> set[int]:
    """The nice value of each of a process's threads (field 19 of its threads' stat)."""
    return {
        int(stat.read_text().rsplit(")", 1)[1].split()[16])
        for stat in Path(f"/proc/{pid}/task").glob("*/stat")
    }


def _autogroup_nice(pid: int) -> int | None:
    """The nice value of the process's autogroup; None on a kernel that does not group by session."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    except OSError:
        return None


def test_second_up_says_it_runs_and_down_leaves_no_process(cluster_state_root: Any) -> None:
    name = f"solo-{secrets.token_hex(2)}"
    env = {**os.environ, "GPUFORGE_STATE": str(cluster_state_root)}
    gpuforge = [sys.executable, "-m", "gpuforge"]
    first = subprocess.run(
        [*gpuforge, "dev", "cluster", "up", "--name", name, "--nodes", "1", "--fleet-nice", "10"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().endswith("admin.kubeconfig")
    second = subprocess.run(
        [*gpuforge, "dev", "cluster", "up", "--name", name], env=env, capture_output=True, text=True
    )
    assert second.returncode == 1
    assert "already running" in second.stderr
    cluster = DevCluster(name, cluster_state_root)
    state = cluster.load_state()
    assert state is not None
    pids = [record.pid for record in state.processes.values()]
    assert len(pids) == 6  # etcd, apiserver, controller-manager, scheduler, kwok, agent
    # --fleet-nice: the simulated fleet yields the CPU to the control plane, every thread of it.
    for component, record in state.processes.items():
        nice = 10 if component in SIMULATED_FLEET else 0
        assert _thread_nices(record.pid) == {nice}, component
        assert _autogroup_nice(record.pid) in (nice, None), component
    down = subprocess.run(
        [*gpuforge, "dev", "cluster", "down", "--name", name], env=env, capture_output=True, text=True
    )
    assert down.returncode == 0, down.stderr
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", (
            f"pid {pid} survived"
        )
    assert name in [c.name for c in list_clusters(cluster_state_root)]
    status = subprocess.run(
        [*gpuforge, "dev", "cluster", "status", "--name", name], env=env, capture_output=True, text=True
    )
    assert status.returncode == 3


def test_pools_file_and_add_nodes(cluster_factory: Any) -> None:
    cluster = cluster_factory(profile="1.35", pools=[Pool(name="old", count=1, kubelet_version="v1.31.4")])
    names = cluster.add_pools([Pool(name="new", count=2)])
    assert names == ["new-0", "new-1"]
    with cluster.api_client() as api:
        nodes = {n.metadata.name: n for n in client.CoreV1Api(api).list_node().items}
    assert nodes["old-0"].status.node_info.kubelet_version == "v1.31.4"
    assert nodes["new-1"].status.node_info.kubelet_version == "v1.35.0"
    cluster.down()


def test_a_plugin_its_release_would_not_start_crash_loops_and_advertises_nothing(
    k8s_api: Any, namespace: str
) -> None:
    """NVIDIA's device plugin without a RuntimeClass reaches NVML only where nvidia is containerd's default
    runtime: on the session's runc nodes (h100) it crash-loops with the release's error, on a100 it starts."""
    core = client.CoreV1Api(k8s_api)
    apps = client.AppsV1Api(k8s_api)
    runc_node, nvidia_node = "h100-3", "a100-3"
    dp = f"dp-{namespace}"
    for node in (runc_node, nvidia_node):
        _label_node(core, node, DEPLOY_LABEL, dp)
    try:
        apps.create_namespaced_daemon_set(
            namespace,
            plugin_daemonset(
                dp, namespace, "device-plugin", DEPLOY_LABEL, image="nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
            ),
        )

        def crashing() -> Any:
            pods = core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={runc_node}").items
            statuses = [s for p in pods for s in p.status.container_statuses or []]
            return statuses and statuses[0].state.waiting and statuses[0]

        status = eventually(crashing, what="the plugin crash-looping on the runc node")
        assert status.state.waiting.reason == "CrashLoopBackOff"
        assert status.last_state.terminated.message == "failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND"
        assert not status.ready
        eventually(lambda: _node_gpus(core, nvidia_node) == "8", what="the plugin advertising on a100")
        restarts = status.restart_count
        eventually(
            lambda: (s := crashing()) and s.restart_count > restarts, timeout=40, what="restartCount growing"
        )
        assert _node_gpus(core, runc_node) in (None, "0"), "a crash-looping plugin advertises nothing"
    finally:
        for node in (runc_node, nvidia_node):
            _label_node(core, node, DEPLOY_LABEL, None)
