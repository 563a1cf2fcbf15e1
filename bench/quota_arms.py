"""Two arms of the GpuQuota benchmark (bench_quota.py runs them after its latency arms, or alone with
`--arms race,scale`):

- race: the same race of one-GPU Pods (800 by default, 32 at a time) for half as many GPUs, against a
  native ResourceQuota (our webhook not registered) and against a GpuQuota (registered), on one API
  server, in alternating rounds: pods admitted per second, create p99, over-admission (targets: 0, and
  the GpuQuota's create p99 within 1.5x of the ResourceQuota's). The Pods name a scheduler that does not
  exist, so neither arm pays for the scheduler's retries of the other's pending Pods.
- scale: the webhook with 1,000 quotas and 20,000 labelled Deployments (paused: the Deployment
  controller makes no ReplicaSets, so the API server's load is the creates themselves): the leader's
  resident memory (target < 500 MiB) and its admission p99 at the webhook for creates on top (< 10 ms).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from bench_quota import (
    GPU,
    Cluster,
    Registration,
    Webhook,
    answer_quantiles,
    create_quota,
    deployment,
    namespace,
    percentile,
    replica_metrics,
    result,
    settled,
    timed_posts,
    wait_gone,
)

QUOTA_LABEL = "gpuforge.io/quota"
RACE_CONCURRENCY = 32
RACE_ROUNDS = ("native", "ours", "ours", "native")  # alternating, so neither arm always runs second
NATIVE, OURS = "native", "ours"


def race_pod(name: str, quota: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {QUOTA_LABEL: quota} if quota else {}},
        "spec": {
            "schedulerName": "bench-nobody",  # stays Pending: no scheduler works on it
            "containers": [
                {"name": "main", "image": "bench:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
        },
    }


async def race_creates(
    cluster: Cluster, space: str, quota: str, count: int, concurrency: int
) -> tuple[list[float], int, float]:
    """`count` Pod creates, `concurrency` at a time: latencies (s), how many were admitted, wall seconds."""
    began = time.perf_counter()
    latencies, admitted = await timed_posts(
        cluster,
        f"/api/v1/namespaces/{space}/pods",
        lambda index: race_pod(f"p{index}", quota),
        count,
        concurrency,
    )
    return latencies, admitted, time.perf_counter() - began


async def _native_quota(cluster: Cluster, space: str, hard: int) -> None:
    """A ResourceQuota, waited for until the quota controller has set its status: before that the API
    server refuses every pod it would limit."""
    body = {"metadata": {"name": "gpus"}, "spec": {"hard": {GPU: str(hard)}}}
    await cluster.call("POST", f"/api/v1/namespaces/{space}/resourcequotas", body)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        _, quota = await cluster.call("GET", f"/api/v1/namespaces/{space}/resourcequotas/gpus")
        if ((quota or {}).get("status") or {}).get("hard"):
            return
        await asyncio.sleep(0.2)
    raise RuntimeError("the ResourceQuota got no status in 60 s")


async def _gpu_quota_used(cluster: Cluster, name: str, settle: float = 20.0) -> int:
    """The GpuQuota's status.used GPUs once the usage controller has counted the pods."""
    deadline, used = time.monotonic() + settle, -1
    while time.monotonic() < deadline:
        _, quota = await cluster.call("GET", f"/apis/gpuforge.io/v1alpha1/gpuquotas/{name}")
        status = (quota or {}).get("status") or {}
        used = int(str((status.get("used") or {}).get(GPU, "0")))
        if not status.get("reservations"):
            return used
        await asyncio.sleep(0.5)
    return used


async def race(
    cluster: Cluster, webhook: Webhook, registration: Registration, pods: int
) -> list[dict[str, Any]]:
    """Alternating rounds of the race against a ResourceQuota and against a GpuQuota."""
    hard = pods // 2
    samples: dict[str, list[float]] = {NATIVE: [], OURS: []}
    rates: dict[str, list[float]] = {NATIVE: [], OURS: []}
    over: dict[str, int] = {NATIVE: 0, OURS: 0}
    for arm in RACE_ROUNDS:
        space = await namespace(cluster)
        quota = ""
        try:
            if arm == NATIVE:
                await _native_quota(cluster, space, hard)
            else:
                quota = f"bench-race-{uuid.uuid4().hex[:6]}"
                await create_quota(cluster, quota, hard)
                registration.register()
                await settled(webhook)
            latencies, admitted, seconds = await race_creates(cluster, space, quota, pods, RACE_CONCURRENCY)
            samples[arm] += latencies
            rates[arm].append(admitted / seconds)
            over[arm] = max(over[arm], admitted - hard)
            if arm == OURS:
                over[arm] = max(over[arm], await _gpu_quota_used(cluster, quota) - hard)
        finally:
            if arm == OURS:
                registration.unregister()
            await cluster.call("DELETE", f"/api/v1/namespaces/{space}")
            await wait_gone(cluster, f"/api/v1/namespaces/{space}", timeout=600)
            if quota:
                await cluster.call("DELETE", f"/apis/gpuforge.io/v1alpha1/gpuquotas/{quota}")
    native_p99, ours_p99 = percentile(samples[NATIVE], 0.99), percentile(samples[OURS], 0.99)
    what = f"{pods} one-GPU Pods racing for {hard} GPUs, c={RACE_CONCURRENCY}"
    return [
        result(f"race ({what}): ResourceQuota, pods admitted per second", min(rates[NATIVE]), "pods/s"),
        result(f"race ({what}): GpuQuota, pods admitted per second", min(rates[OURS]), "pods/s"),
        result(f"race ({what}): ResourceQuota, create p99", native_p99 * 1000, "ms"),
        result(f"race ({what}): GpuQuota, create p99", ours_p99 * 1000, "ms"),
        result(f"race ({what}): GpuQuota / ResourceQuota create p99", ours_p99 / native_p99, "x", 1.5),
        result(
            f"race ({what}): ResourceQuota, over-admission (highest round)", max(over[NATIVE], 0), "pods", 0
        ),
        result(f"race ({what}): GpuQuota, over-admission (highest round)", max(over[OURS], 0), "pods", 0),
    ]


def _rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _create_many(
    cluster: Cluster, space: str, quotas: list[str], count: int, concurrency: int
) -> tuple[int, int]:
    """Create `count` paused Deployments over `quotas`; a refused create ("try again": a leader taking
    over, on a machine this loaded) is retried. Returns (created, retries)."""
    queue = list(range(count))
    created = retries = 0

    async def worker() -> None:
        nonlocal created, retries
        while queue:
            index = queue.pop()
            body = deployment(f"w{index}", quotas[index % len(quotas)])
            body["spec"]["paused"] = True  # no ReplicaSets: the creates alone load the API server
            for _ in range(60):
                status, _ = await cluster.call("POST", f"/apis/apps/v1/namespaces/{space}/deployments", body)
                if status in (201, 409):
                    created += 1
                    break
                retries += 1
                await asyncio.sleep(0.5)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return created, retries


async def scale(cluster: Cluster, webhook: Webhook, quotas: int, workloads: int) -> list[dict[str, Any]]:
    """The webhook's memory and admission latency with `quotas` quotas and `workloads` workloads."""
    names = [f"bench-scale-{i}" for i in range(quotas)]
    for index in range(0, quotas, 32):
        await asyncio.gather(*(create_quota(cluster, name, 1_000_000) for name in names[index : index + 32]))
    space = await namespace(cluster)
    results: list[dict[str, Any]] = []
    webhook.start()
    try:
        await settled(webhook)
        began = time.perf_counter()
        created, retries = await _create_many(cluster, space, names, workloads, 16)
        seconds = time.perf_counter() - began
        await settled(webhook, quiet=3.0, limit=120.0)
        before = await replica_metrics(webhook)
        latencies: list[float] = []
        for index in range(0, 400, 8):  # creates on top, 8 at a time, over every quota

            async def one(at: int) -> None:
                body = deployment(f"top{at}", names[(at * 7) % quotas])
                body["spec"]["paused"] = True
                started = time.perf_counter()
                await cluster.call("POST", f"/apis/apps/v1/namespaces/{space}/deployments", body)
                latencies.append(time.perf_counter() - started)

            await asyncio.gather(*(one(index + i) for i in range(8)))
        after = await replica_metrics(webhook)
        answers = answer_quantiles(before, after)
        metrics = await replica_metrics(webhook)
        leader_port = max(metrics, key=lambda port: metrics[port].get("gpuforge_quota_leader", 0.0))
        leader = webhook.processes[webhook.peer_ports.index(int(leader_port))]
        what = f"{quotas} quotas, {created} workloads"
        results += [
            result(f"scale ({what}): leader resident memory", _rss_mib(leader.pid), "MiB", 500),
            result(f"scale ({what}): leader peak resident memory", _rss_mib(leader.pid, "VmHWM"), "MiB", 500),
            result(
                f"scale ({what}): follower resident memory",
                max(_rss_mib(p.pid) for p in webhook.processes if p is not leader),
                "MiB",
            ),
            result(f"scale ({what}): webhook admission p50 at the webhook", answers["answer_p50_ms"], "ms"),
            result(
                f"scale ({what}): webhook admission p99 at the webhook", answers["answer_p99_ms"], "ms", 10
            ),
            result(f"scale ({what}): e2e create p99, c=8", percentile(latencies, 0.99) * 1000, "ms"),
            result(
                f"scale ({what}): workload creates per second while populating, c=16", created / seconds, "/s"
            ),
            result(f"scale ({what}): creates refused and retried while populating", retries, "creates"),
        ]
    finally:
        webhook.stop()  # unregisters: the clean-up below is not checked by a webhook
        # Not waited for: 20,000 objects take minutes to go, and nothing runs after this arm.
        await cluster.call("DELETE", f"/api/v1/namespaces/{space}")
        for index in range(0, quotas, 32):
            await asyncio.gather(
                *(
                    cluster.call("DELETE", f"/apis/gpuforge.io/v1alpha1/gpuquotas/{name}")
                    for name in names[index : index + 32]
                )
            )
    return results
