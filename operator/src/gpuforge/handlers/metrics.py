"""Prometheus metrics of the GpuStack operator (served by `gpuforge operator run --metrics-port`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("gpuforge_reconciles_total", "GpuStack reconcile passes.", ["stack", "result"])
RECONCILE_SECONDS = Histogram(
    "gpuforge_reconcile_duration_seconds",
    "Wall time of one GpuStack reconcile pass.",
    ["stack"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
STACK_NODES = Gauge("gpuforge_stack_nodes", "Selected nodes per state.", ["stack", "state"])
STACK_READY = Gauge("gpuforge_stack_ready", "1 when the GpuStack's Ready condition is True.", ["stack"])
API_REQUESTS = Counter("gpuforge_api_requests_total", "Kubernetes API requests made.", ["verb", "resource"])


def count_request(verb: str, resource: str) -> None:
    API_REQUESTS.labels(verb, resource).inc()


def record_nodes(stack: str, counts: Mapping[str, int], ready: bool) -> None:
    for state, value in counts.items():
        if state != "total":
            STACK_NODES.labels(stack, state).set(value)
    STACK_READY.labels(stack).set(1 if ready else 0)


def forget(stack: str) -> None:
    """Drop a deleted stack's series."""
    for state in ("ready", "pending", "switching", "refused", "conflict"):
        with contextlib.suppress(KeyError):
            STACK_NODES.remove(stack, state)
    with contextlib.suppress(KeyError):
        STACK_READY.remove(stack)
