"""SIMULATION: the GPU node agent of the local control plane (test tooling, not part of the operator).

No GPUs exist here. This agent stands in for what the NVIDIA plugins do on a real node, so the operator can be
tested against a real API server:
- a device-plugin pod (label gpuforge.io/component=device-plugin) Ready on a node: the node's capacity and
  allocatable get what NVIDIA's plugin would register for the node's GPUs with the pod's MIG strategy and
  mounted config (gpuforge_lab.sim.advertise: `nvidia.com/gpu`, `nvidia.com/gpu.shared` with time slicing's
  renameByDefault, `nvidia.com/mig-<profile>` with the mixed strategy), as kubelet's device manager would;
  when the pod goes or turns unready, exactly those drop to 0 in allocatable at once and in capacity
  after kubelet's grace period (device_report; --device-plugin-stop-grace). An advertisement the agent
  did not make (another installation's plugin, written into the node status by a test) is left as it is:
  kubelet keeps serving a plugin it did not lose;
- a DRA kubelet-plugin pod (component=dra-kubelet-plugin) Ready on a node: a ResourceSlice for it appears,
  driver gpu.nvidia.com, in the newest resource.k8s.io version the server serves, with the attributes and
  capacity NVIDIA's driver publishes; when the pod goes, the slice goes.
The node's GPUs come from its `sim.gpuforge.io/gpus` annotation (written by the pool definition).
Plugin pods and the DRA controller are started here, not by kwok: each is judged against the operand
contract of its release (gpuforge.compat.conformance) with the node's runtime facts (labels
sim.gpuforge.io/nvidia-default-runtime, sim.gpuforge.io/mig-enabled) and the device-plugin config it mounts.
A pod the release would not start on is never Ready and never advertises: it crash-loops with the release's
own error, its restartCount growing.
Nodes labelled gpuforge.io/real-node are left alone: their real kubelet starts the pods and registers
what the plugins serve.
Every moment a node advertises through both stacks at once is appended to `violations.jsonl`, so tests can
assert that it never happens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from kubernetes import client, config, watch

from gpuforge.compat.conformance import (
    DEVICE_TYPE_VFIO,
    NodeRuntime,
    Verdict,
    advertised_device_types,
    judge,
    mig_strategy,
)
from gpuforge.compat.operands import OperandRelease, UnsupportedRelease, load_operands
from gpuforge.constants import (
    COMPONENT_DEVICE_PLUGIN,
    COMPONENT_DRA_CONTROLLER,
    COMPONENT_DRA_KUBELET_PLUGIN,
    COMPONENT_LABEL,
    DRA_DRIVER_GPU,
    SIM_FAIL_ANNOTATION,
    SIM_FAIL_TAG_SUFFIXES,
    SIM_MIG_ENABLED_LABEL,
    SIM_NVIDIA_DEFAULT_RUNTIME_LABEL,
)
from gpuforge_lab.devcluster.pools import SIM_GPUS_ANNOTATION, GpuSpec
from gpuforge_lab.devcluster.realnodes import REAL_NODE_LABEL
from gpuforge_lab.sim.advertise import PluginExits, advertised, node_gpus

log = logging.getLogger("gpuforge_lab.sim.agent")
# Operand pods the agent starts (judged against their release); only the plugins advertise.
STARTED_COMPONENTS = (COMPONENT_DEVICE_PLUGIN, COMPONENT_DRA_KUBELET_PLUGIN, COMPONENT_DRA_CONTROLLER)
ADVERTISING_COMPONENTS = (COMPONENT_DEVICE_PLUGIN, COMPONENT_DRA_KUBELET_PLUGIN)
RESOURCE_GROUP = "resource.k8s.io"
SLICE_VERSIONS = ("v1", "v1beta2", "v1beta1")
MANAGED_BY = "gpuforge-sim-agent"
VERSION_LABEL = "app.kubernetes.io/version"
LIST_PAGE = 500  # objects per page of a list
# How often a crash-looping plugin "restarts" (kubelet's back-off reaches minutes; tests need to see it grow).
CRASH_RESTART_SECONDS = 10.0
# How long kubelet's device manager keeps a stopped plugin's devices in the node's capacity (as unhealthy,
# allocatable 0): endpointStopGracePeriod, pkg/kubelet/cm/devicemanager/types.go, five minutes.
KUBELET_PLUGIN_STOP_GRACE_SECONDS = 300.0


@dataclass(frozen=True)
class DeviceReport:
    """What kubelet's device manager reports for the device plugin's resources at one moment."""

    capacity: dict[str, int]
    allocatable: dict[str, int]
    # resources whose plugin stopped, still counted in capacity: resource -> (devices, when it stopped)
    stopped: dict[str, tuple[int, float]]


def device_report(
    registered: Mapping[str, int],
    previously: Mapping[str, int],
    stopped: Mapping[str, tuple[int, float]],
    now: float,
    grace: float,
) -> DeviceReport:
    """Kubelet's device manager (pkg/kubelet/cm/devicemanager/manager.go): a plugin that stops has all its
    devices marked unhealthy (PluginDisconnected -> markResourceUnhealthy), so allocatable drops to 0 at
    once while capacity keeps counting them; once the stop is older than the grace period, GetCapacity
    drops the resource and the node status sets its capacity to 0 (nodestatus/setters.go). A plugin
    registering the resource again ends that."""
    still = {r: since for r, since in stopped.items() if r not in registered}
    for resource, count in previously.items():
        if resource not in registered and resource not in still:
            still[resource] = (count, now)
    capacity, allocatable = dict(registered), dict(registered)
    kept: dict[str, tuple[int, float]] = {}
    for resource, (count, since) in still.items():
        allocatable[resource] = 0
        if now - since >= grace:
            capacity[resource] = 0
        else:
            capacity[resource] = count
            kept[resource] = (count, since)
    return DeviceReport(capacity, allocatable, kept)


def _semver(text: str) -> str:
    """NVIDIA publishes versions as semver; '580.95.05' -> '580.95.5', '13.0' -> '13.0.0'."""
    parts = [str(int(p)) for p in text.split(".") if p.isdigit()][:3]
    while len(parts) < 3:
        parts.append("0")
    return ".".join(parts)


def _uuid(node: str, index: int) -> str:
    digest = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _vfio_device(node: str, gpu: GpuSpec, index: int) -> dict[str, Any]:
    """The passthrough twin of GPU `index` (cmd/gpu-kubelet-plugin/deviceinfo.go VfioDeviceInfo:
    CanonicalName gpu-vfio-<n>, type "vfio"; a subset of its attributes, no capacity)."""
    return {
        "name": f"gpu-vfio-{index}",
        "attributes": {
            "type": {"string": DEVICE_TYPE_VFIO},
            "uuid": {"string": _uuid(node, index)},
            "productName": {"string": gpu.product},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x10 + index:02x}:00.0"},
        },
    }


def render_devices(node: str, gpu: GpuSpec, version: str, vfio: bool = False) -> list[dict[str, Any]]:
    """The devices NVIDIA's gpu-kubelet-plugin would publish for this node, in that API version's shape;
    `vfio`: the plugin runs with PassthroughSupport on, and each GPU is offered for passthrough too
    (nvlib.go enumerateAllPossibleDevices)."""
    devices = []
    for index in range(gpu.count):
        attributes = {
            "type": {"string": "gpu"},
            "uuid": {"string": _uuid(node, index)},
            "productName": {"string": gpu.product},
            "brand": {"string": gpu.brand},
            "architecture": {"string": gpu.architecture},
            "cudaComputeCapability": {"version": _semver(gpu.compute_capability)},
            "driverVersion": {"version": _semver(gpu.driver_version)},
            "cudaDriverVersion": {"version": _semver(gpu.cuda_version)},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x10 + index:02x}:00.0"},
        }
        capacity = {"memory": {"value": f"{gpu.memory_mib}Mi"}}
        if version == "v1beta1":
            devices.append(
                {"name": f"gpu-{index}", "basic": {"attributes": attributes, "capacity": capacity}}
            )
        else:
            devices.append({"name": f"gpu-{index}", "attributes": attributes, "capacity": capacity})
    for index in range(gpu.count if vfio else 0):
        device = _vfio_device(node, gpu, index)
        if version == "v1beta1":
            device = {"name": device["name"], "basic": {"attributes": device["attributes"]}}
        devices.append(device)
    return devices


def render_slice(node: dict[str, Any], gpu: GpuSpec, version: str, vfio: bool = False) -> dict[str, Any]:
    name = node["metadata"]["name"]
    return {
        "apiVersion": f"{RESOURCE_GROUP}/{version}",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{name}-{DRA_DRIVER_GPU}",
            "labels": {"app.kubernetes.io/managed-by": MANAGED_BY},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
            ],
        },
        "spec": {
            "driver": DRA_DRIVER_GPU,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": render_devices(name, gpu, version, vfio),
        },
    }


# --- plugin pod start ---------------------------------------------------------------------------
def node_runtime(node: Mapping[str, Any]) -> NodeRuntime:
    labels = node["metadata"].get("labels") or {}
    return NodeRuntime(
        nvidia_default_runtime=labels.get(SIM_NVIDIA_DEFAULT_RUNTIME_LABEL) == "true",
        mig_enabled=labels.get(SIM_MIG_ENABLED_LABEL) == "true",
    )


def release_of(pod: Mapping[str, Any]) -> OperandRelease | None:
    """The contract entry of the release the pod runs (version label, else the first image tag); None
    for an image the contract does not know, whose needs nobody can tell."""
    component = pod["metadata"].get("labels", {}).get(COMPONENT_LABEL, "")
    version = pod["metadata"].get("labels", {}).get(VERSION_LABEL)
    if version is None:
        images = [c.get("image", "") for c in (pod.get("spec") or {}).get("containers") or []]
        version = images[0].rpartition(":")[2] if images and ":" in images[0] else ""
    try:
        return load_operands().release(component, version)
    except UnsupportedRelease:
        return None


def _publishes_vfio(pod: Mapping[str, Any]) -> bool:
    release = release_of(pod)
    return release is not None and DEVICE_TYPE_VFIO in advertised_device_types(pod, release)


def verdict_of(pod: Mapping[str, Any], node: Mapping[str, Any], config: Mapping[str, Any] | None) -> Verdict:
    """Would the pod's release start on `node`? Each container is judged by the binary it runs (the DRA
    kubelet plugin's compute-domains container by compute-domain-kubelet-plugin's contract)."""
    release = release_of(pod)
    if release is None:
        return Verdict(ok=True)
    return judge(pod, release, node_runtime(node), config, load_operands().container_releases(release))


def plugin_resources(
    pod: Mapping[str, Any], gpu: GpuSpec, node: Mapping[str, Any], config: Mapping[str, Any] | None
) -> dict[str, int]:
    """What the device-plugin pod registers with kubelet on `node`; raises PluginExits where it would exit."""
    containers = (pod.get("spec") or {}).get("containers") or []
    strategy = mig_strategy(containers[0], config) if containers else "none"
    return advertised(node_gpus(gpu, node_runtime(node).mig_enabled), strategy, config)


def _gpu_of(node: Mapping[str, Any]) -> GpuSpec | None:
    raw = (node["metadata"].get("annotations") or {}).get(SIM_GPUS_ANNOTATION)
    return GpuSpec.from_json(raw) if raw is not None else None


def left_to_kwok(pod: Mapping[str, Any]) -> bool:
    """Failure injection (annotation or image tag) is played by kwok's stages."""
    if SIM_FAIL_ANNOTATION in (pod["metadata"].get("annotations") or {}):
        return True
    images = [c.get("image", "") for c in (pod.get("spec") or {}).get("containers") or []]
    return any(image.endswith(suffix) for image in images for suffix in SIM_FAIL_TAG_SUFFIXES)


def config_file(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(ConfigMap name, key) of the device-plugin config file the pod's CONFIG_FILE names, if mounted."""
    spec = pod.get("spec") or {}
    maps = {v["name"]: v["configMap"]["name"] for v in spec.get("volumes") or [] if "configMap" in v}
    for container in spec.get("containers") or []:
        path = next(
            (e.get("value") for e in container.get("env") or [] if e.get("name") == "CONFIG_FILE"), None
        )
        if not path:
            continue
        for mount in container.get("volumeMounts") or []:
            if mount.get("name") in maps and PurePosixPath(path).parent == PurePosixPath(mount["mountPath"]):
                return maps[mount["name"]], PurePosixPath(path).name
    return None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(ready: bool, now: str, message: str = "") -> list[dict[str, Any]]:
    readiness = {"status": "True"} if ready else {"status": "False", "reason": "ContainersNotReady"}
    return [
        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        {
            "type": "Ready",
            "lastTransitionTime": now,
            **readiness,
            **({"message": message} if message else {}),
        },
        {"type": "ContainersReady", "lastTransitionTime": now, **readiness},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
    ]


def _init_statuses(pod: Mapping[str, Any], now: str) -> list[dict[str, Any]]:
    return [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "ready": True,
            "restartCount": 0,
            "state": {
                "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
            },
        }
        for c in (pod.get("spec") or {}).get("initContainers") or []
    ]


def running_status(pod: Mapping[str, Any], now: str) -> dict[str, Any]:
    """What kubelet reports for a plugin that started (as kwok's pod-ready stage writes for other pods)."""
    containers = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }
        for c in (pod.get("spec") or {}).get("containers") or []
    ]
    return {
        "phase": "Running",
        "startTime": now,
        "conditions": _conditions(True, now),
        "containerStatuses": containers,
        "initContainerStatuses": _init_statuses(pod, now),
    }


def crash_status(pod: Mapping[str, Any], verdict: Verdict, restarts: int, now: str) -> dict[str, Any]:
    """What kubelet reports for a plugin whose binary exits on start: back-off, the last exit's message."""
    containers = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "ready": False,
            "started": False,
            "restartCount": restarts,
            "lastState": {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "message": verdict.message,
                    "startedAt": now,
                    "finishedAt": now,
                }
            },
            "state": {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off restarting failed container {c['name']}",
                }
            },
        }
        for c in (pod.get("spec") or {}).get("containers") or []
    ]
    return {
        "phase": "Running",
        "startTime": now,
        "conditions": _conditions(False, now, verdict.message),
        "containerStatuses": containers,
        "initContainerStatuses": _init_statuses(pod, now),
    }


def _pending_start(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return (
        not pod["metadata"].get("deletionTimestamp")
        and bool((pod.get("spec") or {}).get("nodeName"))
        and status.get("phase", "Pending") == "Pending"
        and not left_to_kwok(pod)
    )


class WorkQueue:
    """Like client-go's workqueue: a node is never reconciled by two workers at once, and a node marked
    again while being reconciled is reconciled once more afterwards (so the newest state always wins)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        self._lock = threading.Lock()
        self._queued: set[str] = set()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()

    def put(self, name: str) -> None:
        with self._lock:
            if name in self._processing:
                self._dirty.add(name)
                return
            if name in self._queued:
                return
            self._queued.add(name)
        self._queue.put(name)

    def get(self) -> str:
        name = self._queue.get()
        with self._lock:
            self._queued.discard(name)
            self._processing.add(name)
        return name

    def done(self, name: str) -> None:
        with self._lock:
            self._processing.discard(name)
            again = name in self._dirty
            self._dirty.discard(name)
        if again:
            self.put(name)


@dataclass
class NodeView:
    """What the agent knows of one node: its GPUs and which plugin pods are Ready on it."""

    obj: dict[str, Any] | None = None
    # Ready device-plugin pods by uid (their specs say what they advertise)
    device_plugin_pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    dra_pods: set[str] = field(default_factory=set)
    # of those, the ones whose release and feature gates publish vfio devices
    vfio_pods: set[str] = field(default_factory=set)
    # extended resources the agent set on the node for the device plugin, and their counts
    device_plugin_resources: dict[str, int] = field(default_factory=dict)
    # of those, the ones whose plugin went within the kubelet's grace period (device_report)
    stopped_resources: dict[str, tuple[int, float]] = field(default_factory=dict)
    advertising_dra: bool = False
    # no ResourceSlice of ours can be there (removed since the last publish): nothing to delete
    slice_gone: bool = False
    # plugin pods bound here that nobody has started yet, by uid
    pending_pods: dict[str, dict[str, Any]] = field(default_factory=dict)


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without metadata.managedFields (never read here; a third of a node's JSON)."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


def _pod_ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


class Agent:
    def __init__(
        self,
        api: client.ApiClient,
        state_dir: Path,
        plugin_stop_grace: float = KUBELET_PLUGIN_STOP_GRACE_SECONDS,
    ) -> None:
        self.api = api
        self.plugin_stop_grace = plugin_stop_grace
        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self.state_dir = state_dir
        self.nodes: dict[str, NodeView] = {}
        self.pod_nodes: dict[str, tuple[str, str]] = {}  # pod uid -> (node, component)
        self.pending_nodes: dict[str, str] = {}  # pod uid -> node, of plugin pods not started yet
        # the device-plugin config each pod started with, by uid (the plugin reads its file once)
        self.pod_configs: dict[str, Mapping[str, Any] | None] = {}
        # crash-looping plugin pods: uid -> (namespace, name, verdict, restarts)
        self.crashing: dict[str, tuple[str, str, Verdict, int]] = {}
        self.lock = threading.Lock()
        self.work = WorkQueue()
        self.slice_version = self._discover_slice_version()

    def _discover_slice_version(self) -> str | None:
        apis = client.ApisApi(self.api)
        for group in apis.get_api_versions().groups:
            if group.name == RESOURCE_GROUP:
                served = {v.version for v in group.versions}
                for version in SLICE_VERSIONS:
                    if version in served:
                        return version
        return None

    # --- watches -------------------------------------------------------------------------------
    @staticmethod
    def _watch() -> Any:
        return watch.Watch()  # type: ignore[no-untyped-call]

    @staticmethod
    def _list_raw(func: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
        """A list as plain JSON (items without managedFields), in pages of 500, and its resourceVersion:
        with thousands of nodes, turning each into a client object and back costs more CPU than the API
        server's answer, and one answer of every node can outlast the server's 60 s request timeout."""
        items: list[dict[str, Any]] = []
        token = None
        resource_version = ""
        while True:
            page = json.loads(func(_preload_content=False, limit=LIST_PAGE, _continue=token, **kwargs).data)
            items.extend(_slim(item) for item in page.get("items") or [])
            if token is None:  # every page is of the first page's snapshot
                resource_version = page["metadata"]["resourceVersion"]
            token = page["metadata"].get("continue")
            if not token:
                return items, resource_version

    def _watch_raw(self, func: Any, position: list[str], **kwargs: Any) -> Any:
        """(type, object) of a watch from the resourceVersion in `position`, objects as plain JSON without
        managedFields. `position` follows the events and bookmarks, so when the server ends the watch
        (its timeout) the caller goes on from there instead of listing everything again."""

        def unannotated(**call: Any) -> Any:  # no return type: the watch yields plain dicts
            return func(**call)

        for event in self._watch().stream(
            unannotated,
            resource_version=position[0],
            timeout_seconds=300,
            allow_watch_bookmarks=True,
            **kwargs,
        ):
            if event["type"] == "ERROR":
                raise RuntimeError(f"watch error: {event['object']}")
            version = (event["object"].get("metadata") or {}).get("resourceVersion")
            if version:
                position[0] = version
            if event["type"] != "BOOKMARK":
                yield event["type"], _slim(event["object"])

    def _serialize(self, obj: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return result

    def watch_nodes(self) -> None:
        while True:
            try:
                items, resource_version = self._list_raw(self.core.list_node)
                with self.lock:
                    seen = set()
                    for node in items:
                        name = node["metadata"]["name"]
                        seen.add(name)
                        self.nodes.setdefault(name, NodeView()).obj = node
                    for name in set(self.nodes) - seen:
                        self.nodes[name].obj = None
                for name in list(self.nodes):
                    self.work.put(name)
                self._node_synced.set()
                position = [resource_version]
                while True:  # each watch ends after its timeout: go on from where it ended
                    for kind, node in self._watch_raw(self.core.list_node, position):
                        name = node["metadata"]["name"]
                        with self.lock:
                            # a node registered since the list has no slice yet (slices die with it)
                            view = self.nodes.setdefault(name, NodeView(slice_gone=kind == "ADDED"))
                            first = view.obj is None
                            view.obj = None if kind == "DELETED" else node
                        if first or kind == "DELETED":
                            self.work.put(name)
            except Exception as error:  # watches end and fail; start over from a fresh list
                log.info("node watch restarts: %s", error)
                time.sleep(1)

    def watch_pods(self) -> None:
        selector = f"{COMPONENT_LABEL} in ({','.join(STARTED_COMPONENTS)})"
        while True:
            try:
                items, resource_version = self._list_raw(
                    self.core.list_pod_for_all_namespaces, label_selector=selector
                )
                with self.lock:
                    for view in self.nodes.values():
                        view.device_plugin_pods.clear()
                        view.dra_pods.clear()
                        view.vfio_pods.clear()
                        view.pending_pods.clear()
                    self.pod_nodes.clear()
                    self.pending_nodes.clear()
                    # configs of pods deleted while the watch was down are dropped
                    listed = {item["metadata"]["uid"] for item in items}
                    self.pod_configs = {u: c for u, c in self.pod_configs.items() if u in listed}
                for item in items:
                    self._on_pod(item, deleted=False)
                for name in list(self.nodes):
                    self.work.put(name)
                self._pod_synced.set()
                position = [resource_version]
                while True:  # each watch ends after its timeout: go on from where it ended
                    for kind, pod in self._watch_raw(
                        self.core.list_pod_for_all_namespaces, position, label_selector=selector
                    ):
                        self._on_pod(pod, deleted=kind == "DELETED")
            except Exception as error:
                log.info("pod watch restarts: %s", error)
                time.sleep(1)

    def _on_pod(self, pod: dict[str, Any], deleted: bool) -> None:
        uid = pod["metadata"]["uid"]
        node_name = (pod.get("spec") or {}).get("nodeName")
        component = pod["metadata"].get("labels", {}).get(COMPONENT_LABEL, "")
        ready = not deleted and _pod_ready(pod)
        touched = set()
        with self.lock:
            if deleted:
                self.crashing.pop(uid, None)
                self.pod_configs.pop(uid, None)
            pending_on = self.pending_nodes.pop(uid, None)
            if pending_on is not None:
                self.nodes.setdefault(pending_on, NodeView()).pending_pods.pop(uid, None)
            if not deleted and node_name and _pending_start(pod):
                self.nodes.setdefault(node_name, NodeView()).pending_pods[uid] = pod
                self.pending_nodes[uid] = node_name
                touched.add(node_name)
            previous = self.pod_nodes.pop(uid, None)
            if previous:
                old_node, _ = previous
                view = self.nodes.setdefault(old_node, NodeView())
                view.device_plugin_pods.pop(uid, None)
                view.dra_pods.discard(uid)
                view.vfio_pods.discard(uid)
                touched.add(old_node)
            if ready and node_name and component in ADVERTISING_COMPONENTS:
                self.pod_nodes[uid] = (node_name, component)
                view = self.nodes.setdefault(node_name, NodeView())
                if component == COMPONENT_DEVICE_PLUGIN:
                    view.device_plugin_pods[uid] = pod
                else:
                    view.dra_pods.add(uid)
                    if _publishes_vfio(pod):
                        view.vfio_pods.add(uid)
                touched.add(node_name)
        for name in touched:
            self.work.put(name)

    # --- reconcile -----------------------------------------------------------------------------
    def worker(self) -> None:
        while True:
            name = self.work.get()
            try:
                self.reconcile(name)
            except Exception as error:
                log.warning("reconciling %s failed, retrying: %s", name, error)
                time.sleep(0.5)
                self.work.put(name)
            finally:
                self.work.done(name)

    def reconcile(self, name: str) -> None:
        with self.lock:
            view = self.nodes.get(name)
            if view is None or view.obj is None:
                return
            node = view.obj
            if (node["metadata"].get("labels") or {}).get(REAL_NODE_LABEL) == "true":
                return  # a real kubelet starts its pods and registers its plugins' devices itself
            pending = list(view.pending_pods.values())
            dp_pods = list(view.device_plugin_pods.values())
            want_dra = bool(view.dra_pods)
            want_vfio = bool(view.vfio_pods)
            was_dp = dict(view.device_plugin_resources)
            stopped = dict(view.stopped_resources)
        for pod in pending:
            self._start(pod, node)
        gpu = _gpu_of(node)
        if gpu is None:
            return  # not a GPU node: plugins find nothing to advertise
        want_dp = self._device_plugin_resources(dp_pods, gpu, node)
        if want_dp and want_dra and not (was_dp and view.advertising_dra):
            self._record_violation(name, view)
        # withdraw only what this agent advertised, as kubelet does once the plugin is gone
        report = device_report(want_dp, was_dp, stopped, time.monotonic(), self.plugin_stop_grace)
        self._set_capacity(name, node, report.capacity, report.allocatable)
        if want_dra and self.slice_version is not None:
            self._publish_slice(node, gpu, want_vfio)
        elif not view.slice_gone:  # one DELETE, not one per look at each of thousands of nodes
            self._remove_slices(name)
        with self.lock:
            view.slice_gone = not want_dra
            view.device_plugin_resources = want_dp
            view.stopped_resources = report.stopped
            view.advertising_dra = want_dra

    def _device_plugin_resources(
        self, pods: list[dict[str, Any]], gpu: GpuSpec, node: dict[str, Any]
    ) -> dict[str, int]:
        """What the Ready device-plugin pods register; where two register one name, the newer one wins
        (kubelet keeps the last registration)."""
        out: dict[str, int] = {}
        for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
            uid = pod["metadata"]["uid"]
            with self.lock:
                known = uid in self.pod_configs
                config = self.pod_configs.get(uid)
            if not known:  # started before this agent did
                config = self._device_plugin_config(pod)
                with self.lock:
                    self.pod_configs[uid] = config
            try:
                out.update(plugin_resources(pod, gpu, node, config))
            except PluginExits as error:
                log.info("plugin pod %s advertises nothing: %s", pod["metadata"]["name"], error)
        return {resource: count for resource, count in out.items() if count > 0}

    # --- plugin pods ---------------------------------------------------------------------------
    def _device_plugin_config(self, pod: dict[str, Any]) -> Mapping[str, Any] | None:
        where = config_file(pod)
        if where is None:
            return None
        try:
            config_map = self.core.read_namespaced_config_map(where[0], pod["metadata"]["namespace"])
        except client.ApiException as error:
            if error.status == 404:
                return None  # kubelet would not start the pod; nothing to judge yet
            raise
        text = (config_map.data or {}).get(where[1])
        parsed = yaml.safe_load(text) if text else None
        return parsed if isinstance(parsed, Mapping) else None

    def _start(self, pod: dict[str, Any], node: dict[str, Any]) -> None:
        """Start a plugin pod as its release would: Running and Ready, or crash-looping."""
        meta = pod["metadata"]
        config = self._device_plugin_config(pod)
        verdict = verdict_of(pod, node, config)
        gpu = _gpu_of(node)
        component = meta.get("labels", {}).get(COMPONENT_LABEL)
        if verdict.ok and gpu is not None and component == COMPONENT_DEVICE_PLUGIN:
            try:  # the plugin also exits where it cannot build its device map
                plugin_resources(pod, gpu, node, config)
            except PluginExits as error:
                verdict = Verdict(False, str(error))
        with self.lock:
            self.pod_configs[meta["uid"]] = config
        now = _now()
        if verdict.ok:
            body = running_status(pod, now)
        else:
            log.info("plugin pod %s/%s does not start: %s", meta["namespace"], meta["name"], verdict.message)
            body = crash_status(pod, verdict, 1, now)
        try:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": body})
        except client.ApiException as error:
            if error.status != 404:
                raise
            return
        with self.lock:
            self.nodes[node["metadata"]["name"]].pending_pods.pop(meta["uid"], None)
            self.pending_nodes.pop(meta["uid"], None)
            if not verdict.ok:
                self.crashing[meta["uid"]] = (meta["namespace"], meta["name"], verdict, 1)

    def restart_crashing(self) -> None:
        """Kubelet restarts a crashed container with back-off; each restart exits the same way."""
        while True:
            time.sleep(CRASH_RESTART_SECONDS)
            with self.lock:
                crashing = list(self.crashing.items())
            for uid, (namespace, name, verdict, restarts) in crashing:
                try:
                    pod = self._serialize(self.core.read_namespaced_pod(name, namespace))
                    if pod["metadata"]["uid"] != uid or pod["metadata"].get("deletionTimestamp"):
                        raise LookupError(name)
                    body = {"status": crash_status(pod, verdict, restarts + 1, _now())}
                    body["status"].pop("startTime")
                    self.core.patch_namespaced_pod_status(name, namespace, body)
                except (LookupError, client.ApiException) as error:
                    if isinstance(error, client.ApiException) and error.status != 404:
                        log.info("restarting %s/%s later: %s", namespace, name, error)
                        continue
                    with self.lock:
                        self.crashing.pop(uid, None)
                    continue
                with self.lock:
                    if uid in self.crashing:
                        self.crashing[uid] = (namespace, name, verdict, restarts + 1)

    def _set_capacity(
        self, name: str, node: dict[str, Any], capacity: Mapping[str, int], allocatable: Mapping[str, int]
    ) -> None:
        """Write the device manager's report into the node's status (only what changed)."""
        current = (node.get("status") or {}).get("capacity") or {}
        current_allocatable = (node.get("status") or {}).get("allocatable") or {}
        # a resource never advertised is not mentioned at all
        mentioned = [r for r in capacity if not (capacity[r] == 0 and r not in current)]
        if all(
            current.get(r) == str(capacity[r]) and current_allocatable.get(r) == str(allocatable[r])
            for r in mentioned
        ):
            return
        body = {
            "status": {
                "capacity": {r: str(capacity[r]) for r in mentioned},
                "allocatable": {r: str(allocatable[r]) for r in mentioned},
            }
        }
        updated = _slim(json.loads(self.core.patch_node_status(name, body, _preload_content=False).data))
        with self.lock:
            view = self.nodes.get(name)
            if view is not None:
                view.obj = updated

    def _publish_slice(self, node: dict[str, Any], gpu: GpuSpec, vfio: bool) -> None:
        assert self.slice_version is not None
        body = render_slice(node, gpu, self.slice_version, vfio)
        try:
            self.custom.create_cluster_custom_object(
                RESOURCE_GROUP, self.slice_version, "resourceslices", body
            )
        except client.ApiException as error:
            if error.status != 409:
                raise
            # a plugin restarted with other feature gates publishes another device list
            self.custom.patch_cluster_custom_object(
                RESOURCE_GROUP,
                self.slice_version,
                "resourceslices",
                body["metadata"]["name"],
                {"spec": {"devices": body["spec"]["devices"]}},
            )

    def _remove_slices(self, name: str) -> None:
        if self.slice_version is None:
            return
        try:
            self.custom.delete_cluster_custom_object(
                RESOURCE_GROUP, self.slice_version, "resourceslices", f"{name}-{DRA_DRIVER_GPU}"
            )
        except client.ApiException as error:
            if error.status != 404:
                raise

    def _record_violation(self, name: str, view: NodeView) -> None:
        entry = {
            "time": time.time(),
            "node": name,
            "devicePluginPods": sorted(view.device_plugin_pods),
            "draPods": sorted(view.dra_pods),
        }
        log.error("node %s advertises GPUs through both the device plugin and DRA", name)
        with (self.state_dir / "violations.jsonl").open("a") as stream:
            stream.write(json.dumps(entry) + "\n")

    # --- main ----------------------------------------------------------------------------------
    def expire_stopped_plugins(self) -> None:
        """Reconcile a node once a stopped plugin's grace period is over, as kubelet's next status sync."""
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            with self.lock:
                due = [
                    name
                    for name, view in self.nodes.items()
                    if any(
                        now - since >= self.plugin_stop_grace for _, since in view.stopped_resources.values()
                    )
                ]
            for name in due:
                self.work.put(name)

    def run(self, workers: int = 4) -> None:
        self._node_synced = threading.Event()
        self._pod_synced = threading.Event()
        threading.Thread(target=self.watch_nodes, daemon=True, name="nodes").start()
        self._node_synced.wait()
        threading.Thread(target=self.watch_pods, daemon=True, name="pods").start()
        self._pod_synced.wait()
        for index in range(workers):
            threading.Thread(target=self.worker, daemon=True, name=f"worker-{index}").start()
        threading.Thread(target=self.restart_crashing, daemon=True, name="crash-loops").start()
        threading.Thread(target=self.expire_stopped_plugins, daemon=True, name="plugin-grace").start()
        (self.state_dir / "ready").write_text(f"slices via {self.slice_version}\n")
        log.info("agent ready; ResourceSlices via %s/%s", RESOURCE_GROUP, self.slice_version)
        threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="SIMULATION: GPU node agent for the local control plane")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument(
        "--device-plugin-stop-grace",
        type=float,
        default=KUBELET_PLUGIN_STOP_GRACE_SECONDS,
        help="seconds a stopped plugin's devices stay in capacity (kubelet: 300)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args.state_dir.mkdir(parents=True, exist_ok=True)
    (args.state_dir / "ready").unlink(missing_ok=True)
    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=args.kubeconfig, client_configuration=configuration
    )
    configuration.connection_pool_maxsize = 16
    Agent(client.ApiClient(configuration), args.state_dir, args.device_plugin_stop_grace).run()


if __name__ == "__main__":
    main()
