"""The operator's watch-fed view of the cluster: Nodes, scheduled unfinished Pods, the GPU driver's
ResourceSlices and ResourceClaims, each mirrored by one `gpuforge.k8s.informer.Informer` on kopf's loop.

A reconcile pass (in a worker thread) reads its snapshot here instead of listing; a kind whose informer
has not synced yet is listed as before, so the cache only ever saves requests. Changes that matter to the
planner (not kubelet heartbeats) call `on_change` with the node they are about (None for a claim), which
the handlers debounce into one pass, or a quick step of just those nodes. Our own
writes are offered back to the store, so a pass right after a write sees it even before the watch does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpuforge.constants import DRA_DRIVER_GPU, GPU_RESOURCE
from gpuforge.k8s.client import RESOURCE_GROUP, Kube, Obj
from gpuforge.k8s.informer import HttpSource, Index, Informer, key_of, without_managed_fields
from gpuforge.upgrade.convert import admission_weight
from gpuforge.upgrade.planner import Weight

log = logging.getLogger(__name__)

NODE, POD, SLICE, CLAIM = "Node", "Pod", "ResourceSlice", "ResourceClaim"
# Only pods bound to a node and not finished: a pod that finishes leaves the cache (a DELETED event).
POD_FIELDS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
SLICE_FIELDS = f"spec.driver={DRA_DRIVER_GPU}"


def _resource_paths(resource_api: str | None) -> dict[str, str]:
    paths = {NODE: "/api/v1/nodes", POD: "/api/v1/pods"}
    if resource_api is not None:
        paths[SLICE] = f"/apis/{RESOURCE_GROUP}/{resource_api}/resourceslices"
        paths[CLAIM] = f"/apis/{RESOURCE_GROUP}/{resource_api}/resourceclaims"
    return paths


def _trim_pod(pod: Obj) -> Obj:
    """Container statuses are the bulk of a running pod and the planner never reads them."""
    pod = without_managed_fields(pod)
    status = pod.get("status")
    if isinstance(status, dict) and ("containerStatuses" in status or "initContainerStatuses" in status):
        trimmed = {k: v for k, v in status.items() if k not in ("containerStatuses", "initContainerStatuses")}
        pod = {**pod, "status": trimmed}
    return pod


def trim_node(node: Obj) -> Obj:
    """What is read of a Node (the planner's conversion, `client.node_facts`, `node_fingerprint`): its
    metadata and spec, the Ready condition, the kubelet's version, capacity and allocatable. The rest of
    its status (images, addresses, the other conditions with their messages) is most of what a stored
    Node weighs, times every node of the cluster."""
    node = without_managed_fields(node)
    status = node.get("status")
    if not isinstance(status, dict):
        return node
    kept: dict[str, Any] = {
        key: status[key] for key in ("capacity", "allocatable") if isinstance(status.get(key), dict)
    }
    ready = [
        {"type": "Ready", "status": c.get("status")}
        for c in status.get("conditions") or ()
        if isinstance(c, dict) and c.get("type") == "Ready"
    ]
    if ready:
        kept["conditions"] = ready
    version = (status.get("nodeInfo") or {}).get("kubeletVersion")
    if version is not None:
        kept["nodeInfo"] = {"kubeletVersion": version}
    return {**node, "status": kept}


def trim_slice(item: Obj) -> Obj:
    """What is read of a ResourceSlice (the planner's conversion, `client.slices_per_node`): its metadata,
    driver, node and pool, and how many devices it lists, kept as their names. Each device's attributes
    and capacity are most of what a stored slice weighs (about 28 KB of Python objects for eight GPUs),
    times every DRA node of the cluster."""
    item = without_managed_fields(item)
    spec = item.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("devices"), list):
        return item
    names = [{"name": d.get("name")} if isinstance(d, dict) else {} for d in spec["devices"]]
    return {**item, "spec": {**spec, "devices": names}}


def _condition_status(obj: Mapping[str, Any], kind: str) -> str:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return str(condition.get("status"))
    return ""


def _canonical(mapping: Mapping[str, Any]) -> bytes:
    """Labels or annotations as one comparable value (orjson: an eighth of the standard json's time,
    and every Node heartbeat is fingerprinted)."""
    return orjson.dumps(mapping, option=orjson.OPT_SORT_KEYS)


def node_fingerprint(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the planner and placement read from a Node; heartbeats and timestamps change nothing here."""
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    gpus = tuple(
        (section, k, str(v))
        for section in ("capacity", "allocatable")
        for k, v in sorted((status.get(section) or {}).items())
        if k == GPU_RESOURCE or k.startswith("nvidia.com/")
    )
    return (
        _canonical(meta.get("labels") or {}),
        _canonical(meta.get("annotations") or {}),
        bool((node.get("spec") or {}).get("unschedulable")),
        _condition_status(node, "Ready"),
        (status.get("nodeInfo") or {}).get("kubeletVersion"),
        gpus,
    )


def pod_fingerprint(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return (
        _canonical(meta.get("labels") or {}),
        bool(meta.get("deletionTimestamp")),
        status.get("phase"),
        _condition_status(pod, "Ready"),
        bool(status.get("extendedResourceClaimStatus")),
    )


def _any_change(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    return ((obj.get("metadata") or {}).get("resourceVersion"),)


FINGERPRINTS: dict[str, Callable[[Mapping[str, Any]], tuple[Any, ...]]] = {
    NODE: node_fingerprint,
    POD: pod_fingerprint,
    SLICE: _any_change,
    CLAIM: _any_change,
}


class Relevance:
    """Decides which watch events are worth a pass: the first sight of an object, its removal, or a change
    of its fingerprint. No I/O."""

    def __init__(self, fingerprint: Callable[[Mapping[str, Any]], tuple[Any, ...]]) -> None:
        self._fingerprint = fingerprint
        # The fingerprint's hash, not the fingerprint: one small int per object of the cluster instead of
        # its labels and annotations again (a collision would only skip one event's wake-up).
        self._seen: dict[tuple[str, str], int] = {}

    def __call__(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        key = key_of(obj)
        if event_type == "DELETED":
            return self._seen.pop(key, None) is not None
        fingerprint = hash(self._fingerprint(obj))
        if self._seen.get(key) == fingerprint:
            return False
        self._seen[key] = fingerprint
        return True


def node_of(kind: str, obj: Mapping[str, Any]) -> str | None:
    """The node a watched object is about: the Node itself, or where a Pod or ResourceSlice is."""
    if kind == NODE:
        name = (obj.get("metadata") or {}).get("name")
    elif kind in (POD, SLICE):
        name = (obj.get("spec") or {}).get("nodeName")
    else:
        return None
    return name if isinstance(name, str) and name else None


WEIGHS = "weighs"
# Nodes that the planner counts when it admits, filed under their `Weight` (see
# gpuforge.upgrade.planner.weight_of), kept up to date with every change and our own writes, so freed
# slots are counted without reading, let alone converting, any node; pods and ResourceSlices by the node
# they are on, for quick steps on a few nodes.
NODE_INDEXES: Mapping[str, Index] = {WEIGHS: admission_weight}
BY_NODE: Mapping[str, Index] = {NODE: lambda obj: node_of(POD, obj)}  # spec.nodeName


@dataclass(frozen=True)
class Cached:
    """What the cache can answer now; None for a kind that has to be listed instead."""

    nodes: list[Obj] | None
    pods: list[Obj] | None
    slices: list[Obj] | None
    claims: list[Obj] | None
    # Per node: when (time.monotonic) the latest change that matters about it (the Node, its pods, its
    # ResourceSlices) reached us; what a step taken on this snapshot reacts to.
    changed_at: Mapping[str, float] = field(default_factory=dict)


class ClusterCache:
    """Informers for the kinds a reconcile pass reads, started on the running loop by `start`."""

    def __init__(
        self, kube: Kube, on_change: Callable[[str | None], None], *, timeout_seconds: int = 300
    ) -> None:
        self._kube = kube
        self._on_change = on_change
        self._timeout_seconds = timeout_seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._source: HttpSource | None = None
        self._informers: dict[str, Informer] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.resource_api: str | None = None  # the resource.k8s.io version slices and claims are watched in
        self._changed_at: dict[str, float] = {}  # node name -> latest relevant change about it (see Cached)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._source = HttpSource(
            self._kube.transport, _resource_paths(None), on_request=self._kube.count_request
        )
        self._run(NODE, Informer(self._source, NODE, transform=trim_node, indexes=NODE_INDEXES))
        self._run(
            POD,
            Informer(self._source, POD, field_selector=POD_FIELDS, transform=_trim_pod, indexes=BY_NODE),
        )

    def _run(self, kind: str, informer: Informer) -> None:
        informer.timeout_seconds = self._timeout_seconds
        relevant = Relevance(FINGERPRINTS[kind])

        def listener(event_type: str, obj: Mapping[str, Any]) -> None:
            if relevant(event_type, obj):
                node = node_of(kind, obj)
                if node is not None:
                    self._changed_at[node] = time.monotonic()
                self._on_change(node)

        informer.listeners.append(listener)
        self._informers[kind] = informer
        self._tasks[kind] = asyncio.create_task(informer.run(), name=f"gpuforge-informer-{kind}")

    def _stop(self, kind: str) -> None:
        self._informers.pop(kind, None)
        task = self._tasks.pop(kind, None)
        if task is not None:
            task.cancel()

    def _use_resource_api(self, version: str | None) -> None:
        """(On the loop.) Watch slices and claims in `version`, e.g. after the control plane moved from
        v1beta1 to v1; stop watching them when DRA is not served."""
        if version == self.resource_api or self._source is None:
            return
        log.info("watching ResourceSlices and ResourceClaims in resource.k8s.io/%s", version)
        self._stop(SLICE)
        self._stop(CLAIM)
        self.resource_api = version
        self._source.paths = _resource_paths(version)
        if version is not None:
            slices = Informer(
                self._source, SLICE, field_selector=SLICE_FIELDS, transform=trim_slice, indexes=BY_NODE
            )
            self._run(SLICE, slices)
            self._run(CLAIM, Informer(self._source, CLAIM, transform=without_managed_fields))

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for kind in list(self._tasks):
            self._stop(kind)
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._source is not None:
            await self._source.close()

    async def wait_synced(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                for informer in list(self._informers.values()):
                    await informer.synced.wait()
        except TimeoutError:
            return False
        return True

    # --- from the reconcile thread -------------------------------------------------------------------

    def _values(self, kind: str) -> list[Obj] | None:
        informer = self._informers.get(kind)
        if informer is None or not informer.synced.is_set():
            return None
        return informer.store.values()

    def _on(self, kind: str, nodes: Collection[str]) -> list[Obj] | None:
        """The synced kind's objects about `nodes` (Nodes by name, Pods and slices by node)."""
        informer = self._informers.get(kind)
        if informer is None or not informer.synced.is_set():
            return None
        if kind == NODE:
            return [obj for name in nodes if (obj := informer.store.get(("", name))) is not None]
        return informer.store.indexed(NODE, nodes)

    def weights(self) -> list[tuple[str, Weight]] | None:
        """(Node name, weight) of each Node the planner counts when it admits (cordoned, NotReady, held,
        in flight, failed), from the index alone; None before the Nodes have synced."""
        informer = self._informers.get(NODE)
        if informer is None or not informer.synced.is_set():
            return None
        return [(key[1], w) for key, w in informer.store.filed(WEIGHS) if isinstance(w, Weight)]

    def nodes_named(self, names: Collection[str]) -> list[Obj] | None:
        """The Nodes named (those stored); None before the Nodes have synced."""
        return self._on(NODE, names)

    def read(self, resource_api: str | None, nodes: Collection[str] | None = None) -> Cached:
        """The synced kinds' objects; with `nodes`, only those Nodes and the Pods and ResourceSlices on
        them (claims all the same). Slices and claims come from here only when watched in
        `resource_api`; otherwise the cache is told to switch and they are listed this time."""
        changed_at = dict(self._changed_at)  # first: a change landing while we copy counts as newer

        def values(kind: str) -> list[Obj] | None:
            return self._values(kind) if nodes is None or kind == CLAIM else self._on(kind, nodes)

        if resource_api != self.resource_api and self._loop is not None:
            self._loop.call_soon_threadsafe(self._use_resource_api, resource_api)
            return Cached(values(NODE), values(POD), None, None, changed_at)
        if resource_api is None:
            return Cached(values(NODE), values(POD), [], [], changed_at)
        return Cached(values(NODE), values(POD), values(SLICE), values(CLAIM), changed_at)

    def offer(self, kind: str, obj: Obj | None) -> None:
        """Our own write's answer (a patched Node, a deleted Pod): newer than what the watch has shown."""
        informer = self._informers.get(kind)
        if informer is not None and obj and obj.get("metadata"):
            informer.offer(obj)
