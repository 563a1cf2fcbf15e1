"""Helpers for the upgrade engine's tests: a sampler checking the invariants, and readers of the cluster.
The operator subprocess (its own ServiceAccount's credentials, restartable and killable) comes from
tests/integration/operator_process.py.

The sampler reads the real cluster every few hundred milliseconds while a rollout runs and records every
moment an invariant is broken; the simulated node agent records, on its side, every moment a node
advertised through both stacks (`DevCluster.violations()`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson
import yaml

from gpuforge.constants import NODE_STATE_LABEL

# The operator-process plumbing and the kubectl readers live in tests/integration/operator_process.py;
# re-exported so that `from .helpers import ...` keeps working.
from ..operator_process import (
    DEPLOY,
    GPUFORGE,
    OPERATOR_DIR,
    Operator,
    condition,
    kube_json,
    operator_factory,
    service_account_kubeconfig,
    stack_status,
    wait_for,
)

__all__ = [
    "DEPLOY",
    "GPUFORGE",
    "OPERATOR_DIR",
    "Moment",
    "NodeSample",
    "Operator",
    "Recorder",
    "Sampler",
    "apply",
    "condition",
    "kube_json",
    "later_pass",
    "merge_patch_stack",
    "operator_factory",
    "sample_nodes",
    "service_account_kubeconfig",
    "stack_status",
    "wait_for",
]


# --- reading and changing the cluster ---------------------------------------------------------------


def apply(cluster: Any, document: dict[str, Any] | str) -> None:
    text = document if isinstance(document, str) else yaml.safe_dump(document)
    cluster.kubectl("apply", "-f", "-", input=text)


def merge_patch_stack(cluster: Any, name: str, patch: dict[str, Any]) -> None:
    cluster.kubectl("patch", "gpustack", name, "--type=merge", "-p", json.dumps(patch))


def later_pass(cluster: Any, operator: Operator, stack: str, node: str) -> None:
    """Return once a whole pass over GpuStack `stack` has begun after this call and finished: what the
    cluster shows then, that pass planned. A label change on `node` (any node the stack reads) wakes the
    daemon for each pass; the second pass to finish began after the first ended, so after this call."""
    for turn in range(2):
        before = operator.passes(stack)
        cluster.kubectl("label", "node", node, f"test.gpuforge.io/pass={turn}", "--overwrite")
        wait_for(f"a pass over GpuStack {stack}", partial(_passed, operator, stack, before), timeout=90)


def _passed(operator: Operator, stack: str, before: float) -> bool:
    return operator.passes(stack) > before


@dataclass
class NodeSample:
    unschedulable: bool
    gpus: int  # nvidia.com/gpu allocatable
    slices: int  # gpu.nvidia.com ResourceSlices
    labels: dict[str, str]

    @property
    def advertises(self) -> bool:
        return self.gpus > 0 or self.slices > 0


def sample_nodes(api_client: Any) -> dict[str, NodeSample]:
    """Nodes and the GPU driver's ResourceSlices at one moment: the slices are read at exactly the
    resourceVersion of the node list (etcd's revision is global), so a node uncordoned right after its
    slices appeared is never seen uncordoned without them, nor a switching node with both.

    The answers are decoded as plain JSON: the client's typed models take seconds of CPU for a
    thousand nodes, which a sampler running through a whole rollout would take from the cluster."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api_client)
    custom: Any = client.CustomObjectsApi(api_client)
    nodes = orjson.loads(core.list_node(_preload_content=False).data)
    slices: dict[str, int] = {}
    for version in ("v1", "v1beta2", "v1beta1"):
        try:
            answer = custom.list_cluster_custom_object(
                "resource.k8s.io",
                version,
                "resourceslices",
                resource_version=nodes["metadata"]["resourceVersion"],
                resource_version_match="Exact",
                _preload_content=False,
            )
        except client.ApiException as error:
            if error.status == 404:
                continue
            raise
        for item in orjson.loads(answer.data)["items"]:
            if item["spec"].get("driver") == "gpu.nvidia.com" and item["spec"].get("nodeName"):
                slices[item["spec"]["nodeName"]] = slices.get(item["spec"]["nodeName"], 0) + 1
        break
    out = {}
    for node in nodes["items"]:
        name = node["metadata"]["name"]
        allocatable = node.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu", "0")
        out[name] = NodeSample(
            bool(node.get("spec", {}).get("unschedulable")),
            int(allocatable),
            slices.get(name, 0),
            dict(node["metadata"].get("labels") or {}),
        )
    return out


@dataclass
class Sampler:
    """Checks the invariants at every sampled moment of a rollout, in a background thread."""

    cluster: Any
    nodes: set[str]
    max_unavailable: int
    cordoned_by_others: set[str] = field(default_factory=set)
    interval: float = 0.1  # short: the watch-driven operator moves a small pool in a second or two
    samples: int = 0
    broken: list[str] = field(default_factory=list)
    peak_out_of_service: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with self.cluster.api_client() as api_client:
            while not self._stop.is_set():
                try:
                    self.check(sample_nodes(api_client))
                except Exception as error:  # the control plane may be restarting: try again
                    self.errors.append(str(error))
                self._stop.wait(self.interval)

    def check(self, view: dict[str, NodeSample]) -> None:
        self.samples += 1
        moment = time.strftime("%H:%M:%S")
        mine = {n: s for n, s in view.items() if n in self.nodes}
        both = sorted(n for n, s in mine.items() if s.gpus > 0 and s.slices > 0)
        if both:
            self.broken.append(f"{moment}: nodes advertise through both stacks: {both}")
        out = sorted(n for n, s in mine.items() if s.unschedulable or not s.advertises)
        self.peak_out_of_service = max(self.peak_out_of_service, len(out))
        if len(out) > self.max_unavailable:
            self.broken.append(
                f"{moment}: {len(out)} nodes out of service (max {self.max_unavailable}): {out}"
            )
        for name in self.cordoned_by_others:
            if not mine[name].unschedulable:
                self.broken.append(f"{moment}: {name}, cordoned by someone else, was uncordoned")

    def assert_kept(self) -> None:
        assert self.samples >= 5, f"too few samples ({self.samples}); errors: {self.errors[-5:]}"
        assert not self.broken, "\n".join(self.broken[:20])


# --- what happens on each node, moment by moment ----------------------------------------------------


@dataclass(frozen=True)
class Moment:
    """One look at nodes and pods: node name -> Node object, and every non-terminal pod (API dicts)."""

    at: float
    nodes: dict[str, dict[str, Any]]
    pods: list[dict[str, Any]]

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"].get("nodeName") == node]

    def state(self, node: str) -> str:
        return str(self.nodes[node]["metadata"].get("labels", {}).get(NODE_STATE_LABEL, ""))


@dataclass
class Recorder:
    """Reads the nodes and pods of the cluster every `interval` seconds in a background thread and runs
    `checks` on each moment; a check returns a problem in words, or None. Complements `Sampler` (which
    checks the engine's invariants) with checks of one test's own ordering rules."""

    cluster: Any
    checks: list[Callable[[Moment], str | None]]
    interval: float = 0.3
    moments: int = 0
    broken: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Recorder:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)

    def _run(self) -> None:
        from kubernetes import client

        with self.cluster.api_client() as api_client:
            core: Any = client.CoreV1Api(api_client)
            while not self._stop.is_set():
                try:
                    nodes = {
                        n["metadata"]["name"]: n
                        for n in api_client.sanitize_for_serialization(core.list_node().items)
                    }
                    all_pods = core.list_pod_for_all_namespaces().items
                    pods = [
                        p
                        for p in api_client.sanitize_for_serialization(all_pods)
                        if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
                    ]
                    moment = Moment(time.monotonic(), nodes, pods)
                    self.moments += 1
                    for check in self.checks:
                        problem = check(moment)
                        if problem:
                            self.broken.append(f"{time.strftime('%H:%M:%S')}: {problem}")
                except Exception as error:  # the control plane may be busy: look again
                    self.errors.append(str(error))
                self._stop.wait(self.interval)

    def assert_kept(self) -> None:
        assert self.moments > 10, f"too few moments recorded ({self.moments}; errors: {self.errors[:3]})"
        assert not self.broken, "\n".join(self.broken[:20])
