"""The operator's Events: what is posted about Nodes and GpuStacks, and that repeats are not."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from gpuforge.k8s.client import Kube


class Recording:
    """A transport that answers every request with 201 and keeps what was posted."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str, Any]] = []

    def request_sync(self, method: str, path: str, **options: Any) -> tuple[int, bytes]:
        self.posted.append((method, path, options.get("body")))
        return 201, json.dumps({}).encode()


def test_node_event_names_the_node_and_its_host() -> None:
    transport = Recording()
    Kube(transport).emit_node_event("gpu-1", "Normal", "UpgradeStarted", "x" * 2000)  # type: ignore[arg-type]
    ((method, path, body),) = transport.posted
    assert (method, path) == ("POST", "/api/v1/namespaces/default/events")
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1", "uid": "gpu-1"}
    assert body["source"] == {"component": "gpuforge-operator", "host": "gpu-1"}
    assert body["metadata"]["generateName"] == "gpu-1."
    assert len(body["message"]) == 1024


def test_stack_event_is_posted_once_for_the_same_reason_and_message() -> None:
    transport = Recording()
    kube = Kube(transport)  # type: ignore[arg-type]
    stack: Any = SimpleNamespace(name="default", uid="u-1")
    for message in ("one", "one", "two"):
        kube.emit_event(stack, "Warning", "Degraded", message)
    assert [body["message"] for _, _, body in transport.posted] == ["one", "two"]
    body = transport.posted[0][2]
    assert body["involvedObject"]["kind"] == "GpuStack"
    assert body["source"] == {"component": "gpuforge-operator"}
