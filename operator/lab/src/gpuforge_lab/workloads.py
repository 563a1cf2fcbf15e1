"""Deployments that ask a GpuQuota for GPUs, as the demo, the tests and the benchmark create them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuforge.constants import GPU_MODEL_LABEL, GPU_RESOURCE, QUOTA_LABEL


def gpu_deployment(
    name: str,
    quota: str,
    *,
    gpus: int = 1,
    replicas: int = 1,
    model: str = "",
    namespace: str | None = None,
    requests: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    image: str = "registry.example/cuda-app:1",
) -> dict[str, Any]:
    """A Deployment labelled for `quota` (and `model`, when given) whose pods each take `gpus` GPUs."""
    labels = {QUOTA_LABEL: quota, **({GPU_MODEL_LABEL: model} if model else {})}
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if namespace:
        metadata["namespace"] = namespace
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
    }
    if requests:
        container["resources"]["requests"] = dict(requests)
    pod: dict[str, Any] = {"containers": [container]}
    if node_selector:
        pod["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod["tolerations"] = [dict(toleration) for toleration in tolerations]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod},
        },
    }
