"""The upgrade engine's shell between whole passes (gpuforge.k8s.upgrade.Writer and Stepper), against an
in-memory stand-in for the API server's Nodes (no cluster: the real one is in tests/integration/upgrade).

- A node with a write in flight gets no other write until it lands, and whoever was left out is told
  when it lands; a step planned from a view older than our latest write to its node is left out.
- Admissions in flight count as landed when slots are weighed, uncordons only once landed.
- A whole migration driven only by quick steps and slot filling, with random patch latencies and many
  writes in flight at once, never has more nodes cordoned than maxUnavailable and finishes every node.
"""

from __future__ import annotations

import copy
import random
import threading
import time
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

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
from gpuforge.k8s.cache import Cached, _weighs
from gpuforge.k8s.upgrade import Applied, StepContext, Stepper, Writer, overlaid
from gpuforge.upgrade import plan
from gpuforge.upgrade.convert import snapshot_from_objects
from gpuforge.upgrade.model import (
    Desired,
    IntOrPercent,
    Mode,
    NodeState,
    Policy,
    SetLabels,
    Snapshot,
    Transition,
    Uncordon,
)

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

    def weighing(self) -> list[dict[str, Any]]:
        with self.lock:
            return [o for o in self.nodes.values() if _weighs(o)]

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


def transition(name: str, *actions: Any, ends: bool = False) -> Transition:
    if ends:
        return Transition(name, NodeState.VALIDATION_REQUIRED, NodeState.UPGRADE_DONE, actions, "done")
    return Transition(name, NodeState.WAIT_OLD_GONE, NodeState.VALIDATION_REQUIRED, actions, "step")


def test_a_node_with_a_write_in_flight_gets_no_other_until_it_lands() -> None:
    cluster = Cluster(["a"], budget=1)
    release = threading.Event()
    patch = cluster.patch_node

    def slow_patch(name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        release.wait(5)
        return patch(name, body)

    cluster.patch_node = slow_patch  # type: ignore[method-assign]
    writer = Writer(cluster, cluster)  # type: ignore[arg-type]
    snapshot = cluster.snapshot({"a"})
    retried: list[str] = []
    first = list(
        writer.submit(
            [transition("a", SetLabels({"x": "1"}))], snapshot, writer.mark(), lambda _: None
        ).values()
    )
    second = writer.submit(
        [transition("a", SetLabels({"x": "2"}))],
        snapshot,
        writer.mark(),
        lambda _: None,
        None,
        retried.append,
    )
    assert len(first) == 1 and second == {} and retried == []
    assert set(writer.mark().in_flight) == {"a"}
    release.set()
    first[0].result(5)
    assert retried == ["a"] and writer.mark().in_flight == {}
    assert cluster.nodes["a"]["metadata"]["labels"]["x"] == "1"
    writer.close()


def test_a_step_planned_before_our_latest_write_to_its_node_landed_is_left_out() -> None:
    cluster = Cluster(["a", "b"], budget=1)
    writer = Writer(cluster, cluster)  # type: ignore[arg-type]
    snapshot = cluster.snapshot({"a", "b"})
    old = writer.mark()
    writer.submit([transition("a", SetLabels({"x": "1"}))], snapshot, old, lambda _: None)["a"].result(5)
    retried: list[str] = []
    stale = writer.submit(
        [transition("a", SetLabels({"x": "2"})), transition("b", SetLabels({"x": "2"}))],
        snapshot,
        old,
        lambda _: None,
        None,
        retried.append,
    )
    # b went; a is looked at again
    assert list(stale) == ["b"] and stale["b"].result(5).transitions == 1 and retried == ["a"]
    fresh = writer.submit([transition("a", SetLabels({"x": "3"}))], snapshot, writer.mark(), lambda _: None)
    assert fresh["a"].result(5).transitions == 1
    assert cluster.nodes["a"]["metadata"]["labels"]["x"] == "3"
    writer.close()


def test_admissions_in_flight_count_as_landed_uncordons_only_once_landed() -> None:
    nodes = [node("a"), node("b")]
    nodes[1]["spec"]["unschedulable"] = True
    admission = Transition(
        "a",
        NodeState.UPGRADE_REQUIRED,
        NodeState.WAIT_OLD_GONE,
        (SetLabels({NODE_STATE_LABEL: "wait-old-gone", DEPLOY_DEVICE_PLUGIN_LABEL: None}),),
        "started",
    )
    done = Transition("b", NodeState.VALIDATION_REQUIRED, NodeState.UPGRADE_DONE, (Uncordon(),), "done")
    a, b = overlaid(nodes, {"a": admission, "b": done})
    assert a["metadata"]["labels"][NODE_STATE_LABEL] == "wait-old-gone"
    assert DEPLOY_DEVICE_PLUGIN_LABEL not in a["metadata"]["labels"]
    assert "resourceVersion" not in a["metadata"]  # never mistaken for the stored copy
    assert b is nodes[1] and b["spec"]["unschedulable"] is True
    assert DEPLOY_DEVICE_PLUGIN_LABEL in nodes[0]["metadata"]["labels"]  # the cached copy is untouched


@pytest.mark.parametrize(("nodes", "budget"), [(40, 4), (3, 3), (1, 1)])
def test_a_migration_by_quick_steps_and_slot_filling_keeps_max_unavailable_and_finishes(
    nodes: int, budget: int
) -> None:
    """With nodes left waiting, and with every node started by the one whole pass."""
    names = [f"n{i:02d}" for i in range(nodes)]
    cluster = Cluster(names, budget=budget, latency=0.01, seed=7)
    desired = Desired(Mode.DRA, VERSIONS, frozenset(names), stack="gpus")
    policy = Policy(max_unavailable=IntOrPercent(budget), max_parallel=0)
    writer = Writer(cluster, cluster, workers=8)  # type: ignore[arg-type]
    reports: list[Applied] = []
    changed: set[str] = set()
    lock = threading.Lock()

    def look_again(name: str) -> None:
        with lock:
            changed.add(name)

    stepper = Stepper(cluster, cluster, writer, reports.append, look_again)  # type: ignore[arg-type]

    def whole_pass() -> None:
        mark = writer.mark()
        snapshot = cluster.snapshot(set(names))
        result = plan(snapshot, desired, policy)
        stepper.use(StepContext.of(result, desired, policy, "v1", frozenset({"v1"})), mark)
        stepper.whole_pass(result, snapshot, mark, time.monotonic(), {})

    # One whole pass: its queue goes stale at once (nodes it lists start and finish), and quick steps
    # and slot filling must do the rest by themselves.
    whole_pass()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with lock:
            look, changed = set(names) | changed, set()
        stepper.quick(look, time.monotonic(), datetime.now(UTC))
        time.sleep(0.005)
        if set(cluster.states().values()) == {NodeState.UPGRADE_DONE.value} and not writer.mark().in_flight:
            break
    for timer in cluster.timers:
        timer.join(5)
    writer.close()

    assert set(cluster.states().values()) == {NodeState.UPGRADE_DONE.value}, cluster.states()
    assert cluster.most_cordoned <= budget, (
        f"{cluster.most_cordoned} nodes cordoned at once, allowed {budget}"
    )
    assert cluster.most_cordoned == budget  # and the slots were used
    for obj in cluster.nodes.values():
        labels = obj["metadata"]["labels"]
        assert DEPLOY_DEVICE_PLUGIN_LABEL not in labels and labels[DEPLOY_DRA_KUBELET_PLUGIN_LABEL] == "true"
        assert not obj["spec"].get("unschedulable")
    starts = sum(1 for e in cluster.events if "started" in e)
    assert starts == len(names), f"{starts} admissions for {len(names)} nodes"
    reactions = [step for applied in reports for step, _ in applied.reactions]
    assert reactions.count(NodeState.UPGRADE_DONE.value) == len(names)
