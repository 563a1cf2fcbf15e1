"""Prometheus metrics of the quota webhook, its leader and usage controller (one registry per process)."""

from __future__ import annotations

import asyncio
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from gpuforge.heap import GcPauses

REGISTRY: Final = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, process_start_time_seconds, memory

ADMISSIONS: Final = Counter(
    "gpuforge_quota_admissions_total",
    "Admission requests decided by this replica (the leader), by webhook and result (allowed, denied, "
    "invalid, error).",
    ["webhook", "result"],
    registry=REGISTRY,
)
ADMISSION_LATENCY: Final = Histogram(
    "gpuforge_quota_admission_duration_seconds",
    "Time to answer an admission request, measured inside the webhook (on a follower, forwarding to the "
    "leader included).",
    ["webhook"],
    # Fine below 20 ms, where the target of docs/quota.md ("Measured") is.
    buckets=(
        0.0005,
        0.001,
        0.002,
        0.003,
        0.005,
        0.0075,
        0.01,
        0.015,
        0.02,
        0.05,
        0.1,
        0.25,
        0.5,
        1.0,
        2.5,
        5.0,
    ),
    registry=REGISTRY,
)
BAD_REVIEWS: Final = Counter(
    "gpuforge_quota_bad_requests_total",
    "Malformed or oversized AdmissionReviews answered with HTTP 400.",
    registry=REGISTRY,
)
BATCH_SIZE: Final = Histogram(
    "gpuforge_quota_admission_batch_size",
    "Admissions carried by one GpuQuota status write of the leader's write-behind.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
    registry=REGISTRY,
)
STATUS_WRITES: Final = Counter(
    "gpuforge_quota_status_writes_total",
    "GpuQuota status writes of the leader, by result: written, conflict (HTTP 409: the spec changed; "
    "read again and write again), error.",
    ["result"],
    registry=REGISTRY,
)
WRITE_BEHIND: Final = Histogram(
    "gpuforge_quota_write_behind_seconds",
    "From an admission (answered at once) to the status write that carries its reservation.",
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
    registry=REGISTRY,
)
WRITE_BACKLOG: Final = Gauge(
    "gpuforge_quota_write_behind_backlog",
    "Admissions the leader answered whose reservations are not written yet.",
    registry=REGISTRY,
)
FORWARDED: Final = Counter(
    "gpuforge_quota_forwarded_total",
    "Admission requests a follower forwarded to the leader, by result: answered, no_leader, unreachable.",
    ["result"],
    registry=REGISTRY,
)
FORWARD_LATENCY: Final = Histogram(
    "gpuforge_quota_forward_duration_seconds",
    "Time a follower took to forward an admission request to the leader and get its answer.",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    registry=REGISTRY,
)
BUDGET_EXHAUSTED: Final = Gauge(
    "gpuforge_quota_budget_exhausted",
    "1 while a cash/ budget of a GpuQuota is spent (new workloads using it are denied).",
    ["quota", "key"],
    registry=REGISTRY,
)
BUDGET_DENIALS: Final = Counter(
    "gpuforge_quota_budget_denials_total",
    "Workloads denied because a cash/ budget was spent.",
    ["quota", "key"],
    registry=REGISTRY,
)
QUOTA_USED: Final = Gauge(
    "gpuforge_quota_used",
    "status.used of each GpuQuota key, as last written by the usage controller.",
    ["quota", "key"],
    registry=REGISTRY,
)
QUOTA_HARD: Final = Gauge(
    "gpuforge_quota_hard",
    "spec.hard of each GpuQuota key.",
    ["quota", "key"],
    registry=REGISTRY,
)
QUOTA_REMAINING: Final = Gauge(
    "gpuforge_quota_remaining",
    "What is left of each GpuQuota key: hard - used, 0 when over (under cash/: the budget left, in hours).",
    ["quota", "key"],
    registry=REGISTRY,
)
QUOTA_RECONCILED: Final = Gauge(
    "gpuforge_quota_last_reconcile_timestamp_seconds",
    "When the leader's usage controller last recomputed each GpuQuota (Unix time).",
    ["quota"],
    registry=REGISTRY,
)
PODS_WATCHED: Final = Gauge(
    "gpuforge_quota_pods_watched",
    "1 while the leader watches every pod to charge GPU-hour budgets (some GpuQuota holds a cash/ key), "
    "else 0: without budgets the cluster's pods cost the webhook nothing.",
    registry=REGISTRY,
)
RECONCILES: Final = Counter(
    "gpuforge_quota_reconciles_total",
    "Usage recomputations by the controller, by result (written, unchanged, error).",
    ["result"],
    registry=REGISTRY,
)
CERT_RELOADS: Final = Counter(
    "gpuforge_quota_certificate_reloads_total",
    "Serving certificate reloads after the files changed.",
    registry=REGISTRY,
)
LEADER: Final = Gauge(
    "gpuforge_quota_leader",
    "1 while this replica holds the Lease (it admits and writes usage), else 0.",
    registry=REGISTRY,
)
TAKES_CALLS: Final = Gauge(
    "gpuforge_quota_takes_calls",
    "With --route: 1 while this replica is an endpoint of the webhook's address (the leader, or any replica "
    "while no leader takes the calls), 0 once it stepped out.",
    registry=REGISTRY,
)
ROLE: Final = Gauge(
    "gpuforge_quota_role",
    "1 for this replica's role: follower (forwards to the leader), waiting (a new leader waiting out the "
    "previous one's admissions), syncing (reading the cluster afresh), admitting, stopping.",
    ["role"],
    registry=REGISTRY,
)
RECONCILE_PASS: Final = Histogram(
    "gpuforge_quota_reconcile_pass_seconds",
    "Wall time of one pass of the usage controller (all quotas, or those events touched); it hands the "
    "event loop back to waiting admissions after every 2 ms of work.",
    ["scope"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    registry=REGISTRY,
)
GC_PAUSE: Final = Histogram(
    "gpuforge_gc_pause_seconds",
    "Pauses of Python's cyclic garbage collector, by generation (2: a full collection). Admissions wait "
    "for them.",
    ["generation"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    registry=REGISTRY,
)

EVENT_LOOP_LAG: Final = Histogram(
    "gpuforge_event_loop_lag_seconds",
    "How late the event loop ran a periodic timer: how long an admission arriving at that moment waited "
    "before its handler could start (watch events, a pass, a collection ran instead).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
    registry=REGISTRY,
)
LAG_PROBE_SECONDS: Final = 0.05


async def probe_event_loop_lag(interval: float = LAG_PROBE_SECONDS) -> None:
    """Observe, every `interval`, how much later than asked the loop woke this task (until cancelled)."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time() + interval
        await asyncio.sleep(interval)
        EVENT_LOOP_LAG.observe(max(0.0, loop.time() - asked))


_GC_PAUSES: Final = GcPauses(lambda generation, seconds: GC_PAUSE.labels(str(generation)).observe(seconds))


def time_gc_pauses() -> None:
    """Observe every collection of this process in GC_PAUSE."""
    _GC_PAUSES.install()
