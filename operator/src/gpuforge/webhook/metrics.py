"""Prometheus metrics of the quota webhook and its usage controller (one registry per process)."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

REGISTRY: Final = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, process_start_time_seconds, memory

ADMISSIONS: Final = Counter(
    "gpuforge_quota_admissions_total",
    "Admission requests answered, by webhook and result (allowed, denied, invalid, error).",
    ["webhook", "result"],
    registry=REGISTRY,
)
ADMISSION_LATENCY: Final = Histogram(
    "gpuforge_quota_admission_duration_seconds",
    "Time to answer an admission request, measured inside the webhook.",
    ["webhook"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    registry=REGISTRY,
)
BAD_REVIEWS: Final = Counter(
    "gpuforge_quota_bad_requests_total",
    "Malformed or oversized AdmissionReviews answered with HTTP 400.",
    registry=REGISTRY,
)
BATCH_SIZE: Final = Histogram(
    "gpuforge_quota_admission_batch_size",
    "Admission requests for one quota decided together and reserved with one status write.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
    registry=REGISTRY,
)
STATUS_CONFLICTS: Final = Counter(
    "gpuforge_quota_status_conflicts_total",
    "GpuQuota status writes that lost a race (HTTP 409) and were decided again from a fresh read.",
    ["writer"],
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
CONTROLLER_LEADER: Final = Gauge(
    "gpuforge_quota_controller_leader",
    "1 while this replica's usage controller holds the Lease and writes recomputed usage, else 0.",
    registry=REGISTRY,
)
