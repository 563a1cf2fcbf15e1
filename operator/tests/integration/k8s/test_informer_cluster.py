"""The shared informer against the real local control plane: list, watch, resume, 410 Gone, own writes."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any

import pytest

from gpuforge.k8s.client import Kube
from gpuforge.k8s.informer import HttpSource, Informer

pytestmark = pytest.mark.cluster


def _source(kube: Kube, paths: dict[str, str], requests: list[tuple[str, str]]) -> HttpSource:
    return HttpSource(
        kube.transport,
        paths,
        on_request=lambda verb, resource: requests.append((verb, resource)),
        page_size=2,  # several pages even for a few objects: the continue token is followed
    )


async def _until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.05)


async def test_informer_mirrors_configmaps_through_list_watch_resume_and_gone(
    dev_cluster: Any, namespace: str
) -> None:
    kube = Kube.from_kubeconfig(str(dev_cluster.kubeconfig))
    base = f"/api/v1/namespaces/{namespace}/configmaps"

    def put(name: str, value: str) -> dict[str, Any]:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}}
        result: dict[str, Any] = kube.request(
            "PATCH",
            f"{base}/{name}",
            query={"fieldManager": "test", "force": "true"},
            body=body,
            content_type="application/apply-patch+yaml",
        )
        return result

    for i in range(5):
        put(f"before-{i}", "0")
    requests: list[tuple[str, str]] = []
    source = _source(kube, {"ConfigMap": base}, requests)
    # The server ends each watch after a second: the informer must resume from its last version.
    informer = Informer(source, "ConfigMap", label_selector=None, timeout_seconds=1)
    seen: list[tuple[str, str]] = []
    informer.listeners.append(lambda t, o: seen.append((t, o["metadata"]["name"])))
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 20)
        names = {item["metadata"]["name"] for item in informer.store.values()}
        assert {f"before-{i}" for i in range(5)} <= names
        assert requests.count(("list", "configmaps")) >= 3  # pages of two

        put("before-0", "changed")
        await _until(lambda: (informer.get("before-0", namespace) or {}).get("data") == {"v": "changed"})
        await asyncio.sleep(2.5)  # at least two server-side watch timeouts
        put("after", "1")
        await _until(lambda: informer.get("after", namespace) is not None)
        kube.request("DELETE", f"{base}/after")
        await _until(lambda: informer.get("after", namespace) is None)
        assert ("DELETED", "after") in seen
        assert informer.lists == 1  # resumed, never listed again
        assert requests.count(("watch", "configmaps")) >= 3

        # Our own write's answer is seen at once, and the watch's older copy does not replace it.
        written = put("before-1", "own")
        informer.offer(written)
        assert informer.get("before-1", namespace) == written
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    await source.close()
    # A 410 Gone cannot be provoked reliably here: the API server's watch cache serves even versions etcd
    # has compacted while they are in its window. The re-list on 410 (an ERROR event or an HTTP 410) is
    # covered by tests/unit/k8s/test_informer.py.


async def test_informer_follows_node_label_changes(dev_cluster: Any) -> None:
    kube = Kube.from_kubeconfig(str(dev_cluster.kubeconfig))
    requests: list[tuple[str, str]] = []
    source = _source(kube, {"Node": "/api/v1/nodes"}, requests)
    informer = Informer(source, "Node")
    task = asyncio.create_task(informer.run())
    node = kube.list_node_objects()[0]["metadata"]["name"]
    label = "test.gpuforge.io/informer"
    value = secrets.token_hex(3)
    try:
        await asyncio.wait_for(informer.synced.wait(), 20)
        kube.patch_node_labels(node, {label: value})
        await _until(
            lambda: ((informer.get(node) or {}).get("metadata") or {}).get("labels", {}).get(label) == value
        )
    finally:
        kube.patch_node_labels(node, {label: None})
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await source.close()


async def test_quota_api_watch_reads_events_longer_than_a_stream_line(
    dev_cluster: Any, namespace: str
) -> None:
    """A watch event above aiohttp's 64 KiB line limit (a workload with a large pod template, a quota with
    many reservations) reaches the informer: the stream is split by us, not by readline."""
    from gpuforge.k8s.quota import QuotaApi

    kube = Kube.from_kubeconfig(str(dev_cluster.kubeconfig))
    label = f"gpuforge.io/test-long-lines={secrets.token_hex(4)}"
    key, value = label.split("=")
    padding = "x" * 200_000
    async with QuotaApi.from_kubeconfig(dev_cluster.kubeconfig) as api:
        informer = Informer(api, "Deployment", label_selector=label)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 20)
            kube.request(
                "POST",
                f"/apis/apps/v1/namespaces/{namespace}/deployments",
                body={
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": "long", "labels": {key: value}, "annotations": {"padding": padding}},
                    "spec": {
                        "replicas": 0,
                        "selector": {"matchLabels": {"app": "long"}},
                        "template": {
                            "metadata": {"labels": {"app": "long"}},
                            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
                        },
                    },
                },
            )
            await _until(lambda: informer.get("long", namespace) is not None)
            stored = informer.get("long", namespace) or {}
            assert stored["metadata"]["annotations"]["padding"] == padding
            assert informer.lists == 1  # seen by the watch, not by a list after the watch failed on it
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
