"""The informer's bookkeeping without a cluster: Store merges, resourceVersion order, tombstones, the
list/watch/re-list loop driven by a scripted source, and which changes wake the operator."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuforge.k8s import quota
from gpuforge.k8s.cache import (
    NODE_INDEXES,
    WEIGHS,
    Relevance,
    node_fingerprint,
    pod_fingerprint,
    trim_node,
    trim_slice,
)
from gpuforge.k8s.client import node_facts, slices_per_node
from gpuforge.k8s.informer import ApiError, Informer, Store, key_of, newer, without_managed_fields
from gpuforge.upgrade.convert import snapshot_from_objects
from gpuforge.upgrade.planner import Weight


def obj(name: str, rv: str, namespace: str = "", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": rv}, **extra}


@pytest.mark.parametrize(
    ("candidate", "current", "expected"),
    [
        ("11", "10", True),
        ("10", "10", False),
        ("9", "10", False),
        ("100", "99", True),  # numeric, not lexical
        ("", "10", True),  # unknown versions count as newer: a stale copy costs a 409, not a wrong write
        ("abc", "10", True),
    ],
)
def test_newer(candidate: str, current: str, expected: bool) -> None:
    assert newer(candidate, current) is expected


@pytest.mark.parametrize(
    ("stored", "offered", "kept"),
    [(None, "5", "5"), ("5", "6", "6"), ("6", "5", "6"), ("6", "6", "6")],
)
def test_offer_keeps_the_newest(stored: str | None, offered: str, kept: str) -> None:
    store = Store()
    if stored:
        store.offer(obj("a", stored))
    store.offer(obj("a", offered))
    assert store.get(("", "a")) == obj("a", kept)


def test_a_late_copy_does_not_bring_a_deleted_object_back() -> None:
    store = Store()
    store.offer(obj("p", "5", "ns"))
    assert store.apply("DELETED", obj("p", "8", "ns"))
    assert not store.offer(obj("p", "7", "ns"))  # e.g. the answer to our DELETE, after the watch's event
    assert ("ns", "p") not in store
    assert store.offer(obj("p", "9", "ns"))  # created again since
    assert store.get(("ns", "p")) == obj("p", "9", "ns")


def test_tombstones_are_bounded() -> None:
    store = Store()
    for i in range(Store.MAX_TOMBSTONES + 10):
        store.forget(("", f"n{i}"), str(i + 1))
    assert len(store._deleted) <= Store.MAX_TOMBSTONES


def test_replace_reports_what_is_gone_and_keeps_newer_own_writes() -> None:
    store = Store()
    store.offer(obj("a", "5"))
    store.offer(obj("b", "20"))  # our write, answered after the list below was served
    store.offer(obj("c", "3"))
    gone = store.replace([obj("a", "6"), obj("b", "10")])
    assert [key_of(o) for o in gone] == [("", "c")]
    assert store.get(("", "a")) == obj("a", "6")
    assert store.get(("", "b")) == obj("b", "20")
    assert len(store) == 2


def test_transform_applies_to_every_stored_copy() -> None:
    store = Store(without_managed_fields)
    node = obj("n", "1")
    node["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    store.offer(node)
    assert "managedFields" not in store.get(("", "n"))["metadata"]  # type: ignore[index]
    assert "managedFields" in node["metadata"]  # the caller's object is left alone


def test_the_index_follows_every_change() -> None:
    """Pods by node: what a quick step reads for the few nodes that changed."""

    def on(node: str, rv: str, name: str = "p") -> dict[str, Any]:
        return obj(name, rv, "ns", spec={"nodeName": node})

    store = Store(indexes={"node": lambda o: (o.get("spec") or {}).get("nodeName")})
    store.offer(on("n1", "1"))
    store.offer(on("n1", "2", "q"))
    assert sorted(o["metadata"]["name"] for o in store.indexed("node", ["n1"])) == ["p", "q"]
    store.offer(on("n2", "3"))  # p moved (a new copy on another node)
    assert [o["metadata"]["name"] for o in store.indexed("node", ["n1"])] == ["q"]
    assert store.indexed("node", ["n2"]) == [on("n2", "3")]
    store.forget(("ns", "q"), "4")
    assert store.indexed("node", ["n1"]) == [] and store._by["node"].keys() == {"n2"}
    store.replace([on("n3", "5")])
    assert store.indexed("node", ["n2"]) == [] and store.indexed("node", ["n3", "n9"]) == [on("n3", "5")]
    assert Store(indexes={"node": lambda o: None}).indexed("node", ["n3"]) == []  # nothing indexed


def test_nodes_that_weigh_on_admission_are_indexed_with_our_own_writes() -> None:
    """Freed slots are counted from these weights: an answer to our own cordon counts at once."""
    store = Store(indexes=NODE_INDEXES)
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    out = Weight(unavailable=True, in_progress=False, failed_on="")
    store.offer(obj("a", "1", spec={}, status=ready))
    store.offer(obj("b", "1", spec={}, status={}))  # NotReady
    assert store.filed(WEIGHS) == [(("", "b"), out)]
    store.offer(obj("a", "2", spec={"unschedulable": True}, status=ready))  # our cordon's answer
    assert sorted(store.filed(WEIGHS)) == [(("", "a"), out), (("", "b"), out)]
    store.offer(obj("a", "3", spec={}, status=ready))
    assert store.filed(WEIGHS) == [(("", "b"), out)]
    assert [key_of(o) for o in store.indexed(WEIGHS, [out])] == [("", "b")]


def test_the_quota_module_reexports_the_one_informer() -> None:
    assert quota.Informer is Informer


class ScriptedSource:
    """A WatchSource playing back lists and watch streams; each watch call takes the next script."""

    def __init__(self, lists: list[tuple[list[dict[str, Any]], str]], watches: list[Any]) -> None:
        self.lists = lists
        self.watches = watches
        self.calls: list[tuple[str, str]] = []

    async def list_with_version(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(("list", field_selector or ""))
        items, version = self.lists.pop(0)
        return [dict(i) for i in items], version

    async def watch(
        self,
        kind: str,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        field_selector: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        self.calls.append(("watch", resource_version))
        if not self.watches:
            await asyncio.Event().wait()  # nothing more: block like an idle watch
        script = self.watches.pop(0)
        if isinstance(script, Exception):
            raise script
        for event in script:
            yield event


async def _run_until(informer: Informer, done: Any) -> None:
    task = asyncio.create_task(informer.run())
    try:
        for _ in range(200):
            await asyncio.sleep(0.01)
            if done():
                return
        raise AssertionError("informer did not get there")
    finally:
        task.cancel()


async def test_a_burst_of_buffered_events_hands_the_loop_back() -> None:
    """Events that arrive together are read without waiting; the informer still lets other tasks (the
    webhook's admissions) run every TIME_SLICE_SECONDS of work, not only after the whole burst."""
    burst = [{"type": "MODIFIED", "object": obj("a", str(11 + i))} for i in range(30)]
    source = ScriptedSource(lists=[([obj("a", "1")], "10")], watches=[burst])
    informer = Informer(source, "Node")
    ticks_during: list[int] = []
    ticks = 0

    def slow_listener(_type: str, _obj: Any) -> None:
        time.sleep(0.001)  # an event that costs a millisecond of work
        ticks_during.append(ticks)

    async def other_task() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    informer.listeners.append(slow_listener)
    ticker = asyncio.create_task(other_task())
    try:
        await _run_until(informer, lambda: len(ticks_during) == 31)
    finally:
        ticker.cancel()
    # At 1 ms or more per event and a 2 ms slice, the 30 events hand the loop back at least 10 times.
    watched = ticks_during[1:]
    assert watched[-1] - watched[0] >= 10


async def test_list_watch_bookmark_and_relist_on_gone() -> None:
    source = ScriptedSource(
        lists=[([obj("a", "1"), obj("b", "2")], "10"), ([obj("a", "30")], "31")],
        watches=[
            [
                {"type": "MODIFIED", "object": obj("a", "11")},
                {"type": "BOOKMARK", "object": obj("", "15")},
            ],  # the server closed the stream: resume from the bookmark
            [
                {"type": "DELETED", "object": obj("b", "16")},
                {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}},
            ],
        ],
    )
    informer = Informer(source, "Node", field_selector="x!=")
    seen: list[tuple[str, str]] = []
    informer.listeners.append(lambda t, o: seen.append((t, o["metadata"]["name"])))
    await _run_until(informer, lambda: informer.lists == 2 and source.calls[-1] == ("watch", "31"))
    assert source.calls == [
        ("list", "x!="),
        ("watch", "10"),
        ("watch", "15"),
        ("list", "x!="),
        ("watch", "31"),
    ]
    assert informer.get("a") == {**obj("a", "30"), "kind": "Node"}
    assert informer.get("b") is None
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b"), ("ADDED", "a")]
    assert informer.synced.is_set()


async def test_an_http_410_lists_again_at_once() -> None:
    source = ScriptedSource(
        lists=[([obj("a", "1")], "10"), ([obj("a", "40")], "41")],
        watches=[ApiError(410, "Gone")],
    )
    informer = Informer(source, "Pod")
    await _run_until(informer, lambda: informer.lists == 2)
    assert informer.get("a") == {**obj("a", "40"), "kind": "Pod"}


async def test_errors_back_off_and_retry() -> None:
    source = ScriptedSource(lists=[([obj("a", "1")], "10")] * 2, watches=[ApiError(500, "boom")])
    informer = Informer(source, "Pod", max_backoff=0.05)
    await _run_until(informer, lambda: informer.lists == 2)


def node(
    labels: dict[str, str], ready: str = "True", heartbeat: str = "t0", gpus: str = "4"
) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": labels, "resourceVersion": heartbeat},
        "spec": {},
        "status": {
            "conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat}],
            "capacity": {"nvidia.com/gpu": gpus, "cpu": "8"},
            "nodeInfo": {"kubeletVersion": "v1.34.2"},
        },
    }


def test_heartbeats_do_not_wake_the_operator_but_real_changes_do() -> None:
    relevant = Relevance(node_fingerprint)
    assert relevant("ADDED", node({"a": "1"}))
    assert not relevant("MODIFIED", node({"a": "1"}, heartbeat="t1"))
    assert relevant("MODIFIED", node({"a": "2"}, heartbeat="t2"))
    assert relevant("MODIFIED", node({"a": "2"}, ready="False"))
    assert relevant("MODIFIED", node({"a": "2"}, ready="False", gpus="0"))
    assert relevant("DELETED", node({}))
    assert not relevant("DELETED", node({}))  # already gone


def test_pod_readiness_and_deletion_wake_the_operator() -> None:
    relevant = Relevance(pod_fingerprint)
    pod: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Pending"}}
    assert relevant("ADDED", pod)
    running = {**pod, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    assert relevant("MODIFIED", running)
    assert not relevant("MODIFIED", running)
    deleting = {**running, "metadata": {**running["metadata"], "deletionTimestamp": "now"}}
    assert relevant("MODIFIED", deleting)


async def test_a_kind_not_served_is_listed_again_after_a_back_off_not_at_once() -> None:
    """A CRD not installed lists as nothing (404): the cache is synced and empty, and the kind is looked
    at again after `max_backoff`, so installing the CRD later needs no restart."""
    source = ScriptedSource(lists=[([], ""), ([obj("a", "1")], "5")], watches=[])
    informer = Informer(source, "JobSet", max_backoff=0.2)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.sleep(0.1)
        assert informer.synced.is_set() and informer.store.values() == [] and informer.lists == 1
        for _ in range(100):
            await asyncio.sleep(0.01)
            if informer.get("a") is not None:
                break
        assert informer.lists == 2 and informer.get("a") is not None
    finally:
        task.cancel()


def test_a_trimmed_node_reads_as_the_whole_node() -> None:
    """The Node cache keeps only what is read: every reading of it is unchanged."""
    whole = {
        "metadata": {
            "name": "n1",
            "resourceVersion": "7",
            "labels": {"nvidia.com/gpu.count": "2"},
            "annotations": {"a": "b"},
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "message": "kubelet has sufficient memory"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": "t"},
            ],
            "nodeInfo": {"kubeletVersion": "v1.36.5", "osImage": "kwok", "machineID": "x"},
            "capacity": {"cpu": "32", "nvidia.com/gpu": "2"},
            "allocatable": {"cpu": "32", "nvidia.com/gpu": "2"},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "images": [{"names": ["registry/image:tag"], "sizeBytes": 1}],
        },
    }
    trimmed = trim_node(whole)
    assert "images" not in trimmed["status"] and "managedFields" not in trimmed["metadata"]
    assert node_fingerprint(trimmed) == node_fingerprint(whole)
    assert node_facts(trimmed, {}) == node_facts(whole, {})
    now = datetime.now(UTC)
    assert snapshot_from_objects([trimmed], [], now=now) == snapshot_from_objects([whole], [], now=now)


def test_a_trimmed_slice_reads_as_the_whole_slice() -> None:
    """The ResourceSlice cache keeps each device's name, not its attributes: every reading is unchanged."""
    device = {
        "name": "gpu-0",
        "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}, "index": {"int": 0}},
        "capacity": {"memory": {"value": "81559Mi"}},
    }
    whole = {
        "metadata": {"name": "n1-gpu", "resourceVersion": "9", "managedFields": [{"manager": "x"}]},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [device, {**device, "name": "gpu-1"}],
        },
    }
    trimmed = trim_slice(whole)
    assert trimmed["spec"]["devices"] == [{"name": "gpu-0"}, {"name": "gpu-1"}]
    assert "managedFields" not in trimmed["metadata"] and trimmed["spec"]["pool"] == whole["spec"]["pool"]
    assert slices_per_node([trimmed]) == slices_per_node([whole])
    node = {"metadata": {"name": "n1", "resourceVersion": "1"}}
    now = datetime.now(UTC)
    assert snapshot_from_objects([node], [], [trimmed], now=now) == snapshot_from_objects(
        [node], [], [whole], now=now
    )
    assert snapshot_from_objects([node], [], [trimmed], now=now).nodes[0].dra_devices("gpu.nvidia.com") == 2
    # A slice without a device list (another driver's shape, a partial object) is kept as it is.
    bare = {"metadata": {"name": "s"}, "spec": {"driver": "other"}}
    assert trim_slice(bare) == bare
