"""Nodes, plugin pods and ResourceSlices in memory, standing in for the API server and the watch-fed
cache under the upgrade engine's Writer and Stepper (tests/unit/k8s/test_stepper.py, and the threaded
stress test in tests/integration/upgrade/test_stepper_stress.py)."""

from __future__ import annotations

import copy
import random
import threading
import time
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from gpuforge.constants import (
    COMPONENT_DEVICE_PLUGIN,
    COMPONENT_DRA_KUBELET_PLUGIN,
    COMPONENT_LABEL,
    DEPLOY_DEVICE_PLUGIN_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    DRA_DRIVER_GPU,
    GFD_COUNT_LABEL,
    NODE_STATE_LABEL,
    STACK_LABEL,
)
from gpuforge.k8s.cache import Cached
from gpuforge.upgrade.convert import admission_weight, snapshot_from_objects
from gpuforge.upgrade.model import Mode, Snapshot
from gpuforge.upgrade.planner import Weight

NOW = datetime(2026, 1, 1, tzinfo=UTC)
VERSIONS = {Mode.DEVICE_PLUGIN: "v0.18.0", Mode.DRA: "v25.12.0"}


def node(name: str, rv: int = 1) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
            "labels": {GFD_COUNT_LABEL: "2", DEPLOY_DEVICE_PLUGIN_LABEL: "true", STACK_LABEL: "gpus"},
            "annotations": {},
        },
        "spec": {},
        "status": {
            "capacity": {"nvidia.com/gpu": "2"},
            "allocatable": {"nvidia.com/gpu": "2"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kubeletVersion": "v1.34.2"},
        },
    }


def plugin_pod(node_name: str, mode: Mode, rv: int) -> dict[str, Any]:
    component = COMPONENT_DEVICE_PLUGIN if mode is Mode.DEVICE_PLUGIN else COMPONENT_DRA_KUBELET_PLUGIN
    return {
        "metadata": {
            "name": f"{component}-{node_name}",
            "namespace": "gpuforge",
            "uid": f"uid-{component}-{node_name}-{rv}",
            "resourceVersion": str(rv),
            "labels": {COMPONENT_LABEL: component, "app.kubernetes.io/version": VERSIONS[mode]},
        },
        "spec": {"nodeName": node_name, "containers": [{"image": f"plugin:{VERSIONS[mode]}"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return patch
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


class Cluster:
    """Nodes, plugin pods and ResourceSlices in memory, with the plugins' reactions to the deploy labels
    (after a short random delay) and a check of maxUnavailable at every write. Stands in for both the
    API server (`patch_node`, ...) and the watch-fed cache (`read`, `offer`)."""

    def __init__(self, names: list[str], budget: int, latency: float = 0.02, seed: int = 1) -> None:
        self.lock = threading.Lock()
        self.rv = 10
        self.nodes = {n: node(n) for n in names}
        self.pods = {n: plugin_pod(n, Mode.DEVICE_PLUGIN, 2) for n in names}
        self.slices: dict[str, dict[str, Any]] = {}
        self.budget = budget
        self.latency = latency
        self.random = random.Random(seed)
        self.most_cordoned = 0
        self.events: list[str] = []
        self.timers: list[threading.Timer] = []

    # --- the API server ------------------------------------------------------------------------------

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        with self.lock:
            delay = self.random.uniform(0, self.latency)
        time.sleep(delay)
        with self.lock:
            self.rv += 1
            obj = merge(self.nodes[name], patch)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            before = self.nodes[name]["metadata"].get("labels") or {}
            self.nodes[name] = obj
            cordoned = sum(1 for n in self.nodes.values() if n["spec"].get("unschedulable"))
            self.most_cordoned = max(self.most_cordoned, cordoned)
            labels = obj["metadata"].get("labels") or {}
            if DEPLOY_DEVICE_PLUGIN_LABEL in before and DEPLOY_DEVICE_PLUGIN_LABEL not in labels:
                self._later(self._old_gone, name)
            if DEPLOY_DRA_KUBELET_PLUGIN_LABEL not in before and DEPLOY_DRA_KUBELET_PLUGIN_LABEL in labels:
                self._later(self._new_on, name)
            return copy.deepcopy(obj)

    def evict_pod(self, namespace: str, name: str) -> bool:
        return True

    def delete_pod(self, namespace: str, name: str) -> None:
        return None

    def emit_node_event(self, node_name: str, kind: str, reason: str, message: str) -> None:
        with self.lock:
            self.events.append(f"{node_name}: {message}")

    # --- the plugins ---------------------------------------------------------------------------------

    def _later(self, action: Callable[[str], None], name: str) -> None:
        timer = threading.Timer(self.random.uniform(0, 3 * self.latency), action, (name,))
        self.timers.append(timer)
        timer.start()

    def _old_gone(self, name: str) -> None:
        with self.lock:
            self.rv += 1
            self.pods.pop(name, None)
            obj = copy.deepcopy(self.nodes[name])
            obj["status"]["capacity"]["nvidia.com/gpu"] = "0"
            obj["status"]["allocatable"]["nvidia.com/gpu"] = "0"
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.nodes[name] = obj

    def _new_on(self, name: str) -> None:
        with self.lock:
            self.rv += 1
            self.pods[name] = plugin_pod(name, Mode.DRA, self.rv)
            self.rv += 1
            self.slices[name] = {
                "metadata": {"name": f"slice-{name}", "resourceVersion": str(self.rv)},
                "spec": {
                    "nodeName": name,
                    "driver": DRA_DRIVER_GPU,
                    "devices": [{"name": "a"}, {"name": "b"}],
                },
            }

    # --- the watch-fed cache ---------------------------------------------------------------------------

    def read(self, resource_api: str | None, nodes: Collection[str] | None = None) -> Cached:
        with self.lock:

            def on(objects: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
                return [o for name, o in objects.items() if nodes is None or name in nodes]

            return Cached(on(self.nodes), on(self.pods), on(self.slices), [], {})

    def weights(self) -> list[tuple[str, Weight]]:
        with self.lock:
            return [(n, w) for n, o in self.nodes.items() if (w := admission_weight(o)) is not None]

    def nodes_named(self, names: Collection[str]) -> list[dict[str, Any]]:
        with self.lock:
            return [self.nodes[n] for n in names if n in self.nodes]

    def offer(self, kind: str, obj: Any) -> None:
        pass  # read() always shows the truth

    def states(self) -> dict[str, str]:
        with self.lock:
            return {n: o["metadata"]["labels"].get(NODE_STATE_LABEL, "") for n, o in self.nodes.items()}

    def snapshot(self, names: set[str]) -> Snapshot:
        cached = self.read("v1")
        assert cached.nodes is not None and cached.pods is not None and cached.slices is not None
        return snapshot_from_objects(
            cached.nodes, cached.pods, cached.slices, now=datetime.now(UTC), names=names
        )
