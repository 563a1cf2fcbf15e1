"""Small waiting and manifest helpers for the local control plane tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], timeout: float = 30.0, interval: float = 0.2, what: str = "") -> T:
    """Poll until check() returns something truthy; fail with the last value after the timeout."""
    deadline = time.monotonic() + timeout
    last: T = check()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: last {last!r}")
        time.sleep(interval)
        last = check()
    return last


def plugin_daemonset(
    name: str, namespace: str, component: str, node_label: str, image: str = "registry.local/plugin:v1"
) -> dict[str, Any]:
    """A DaemonSet whose pods the simulated agent takes for NVIDIA plugins, on nodes with node_label=name."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "gpuforge.io/component": component}},
                "spec": {
                    "nodeSelector": {node_label: name},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "plugin", "image": image}],
                },
            },
        },
    }


def gpu_pod(name: str, namespace: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {"name": "cuda", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }
