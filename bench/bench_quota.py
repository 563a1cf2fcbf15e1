"""Benchmark of the GpuQuota admission webhook on the local control plane.

Measures (p50/p99 at concurrency 1, 8, 32):
- admission latency at the webhook: AdmissionReviews posted straight to it, spread over many quotas;
- end-to-end Deployment create latency through the API server, without and with the webhook;
- one contended quota: creates racing for its last GPUs; over-admission must be zero.

Usage: python bench/bench_quota.py --out bench/results/quota.json [--kubeconfig FILE]
Without --kubeconfig a local control plane is started in a temporary state root and stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Self

import aiohttp
from gpuforge.k8s.quota import load_credentials

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "operator" / "deploy" / "crds" / "gpuquotas.gpuforge.io.yaml"
GPU = "requests.nvidia.com/gpu"
CONCURRENCY = (1, 8, 32)
MANY_QUOTAS = 100


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def deployment(name: str, quota: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"gpuforge.io/quota": quota}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "bench"}},
            "template": {
                "metadata": {"labels": {"app": "bench"}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "bench:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            },
        },
    }


class Cluster:
    def __init__(self, kubeconfig: Path) -> None:
        self.credentials = load_credentials(kubeconfig)
        self.kubeconfig = kubeconfig
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self.session = aiohttp.ClientSession(
            base_url=self.credentials.server.rstrip("/") + "/",
            connector=aiohttp.TCPConnector(ssl=self.credentials.ssl_context, limit=64),
            headers=dict(self.credentials.headers),
        )
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert self.session is not None
        async with self.session.request(
            method, path.lstrip("/"), json=body
        ) as response:
            text = await response.text()
            return response.status, (json.loads(text) if text else None)


async def timed_creates(
    cluster: Cluster, namespace: str, quota_of: Any, count: int, concurrency: int
) -> tuple[list[float], int]:
    """Create `count` Deployments with `concurrency` workers; latencies (s) and how many were admitted."""
    latencies: list[float] = []
    admitted = 0
    queue = list(range(count))

    async def worker() -> None:
        nonlocal admitted
        while queue:
            index = queue.pop()
            started = time.perf_counter()
            status, _ = await cluster.call(
                "POST",
                f"/apis/apps/v1/namespaces/{namespace}/deployments",
                deployment(f"d{index}", quota_of(index)),
            )
            latencies.append(time.perf_counter() - started)
            admitted += status == 201

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, admitted


async def namespace(cluster: Cluster) -> str:
    name = f"bench-{uuid.uuid4().hex[:6]}"
    await cluster.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    return name


async def create_quota(cluster: Cluster, name: str, gpus: int) -> None:
    body = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": name},
        "spec": {"parent": "", "hard": {GPU: str(gpus)}},
    }
    status, answer = await cluster.call(
        "POST", "/apis/gpuforge.io/v1alpha1/gpuquotas", body
    )
    if status not in (201, 409):
        raise RuntimeError(f"creating GpuQuota {name}: {status} {answer}")


def review(index: int, quota: str, namespace: str, dry_run: bool = False) -> bytes:
    obj = deployment(f"direct{index}", quota)
    obj["metadata"]["namespace"] = namespace
    obj["metadata"]["generation"] = 1
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                "resource": {
                    "group": "apps",
                    "version": "v1",
                    "resource": "deployments",
                },
                "operation": "CREATE",
                "dryRun": dry_run,
                "namespace": namespace,
                "name": obj["metadata"]["name"],
                "object": obj,
            },
        }
    ).encode()


async def direct_admissions(
    url: str, quotas: list[str], count: int, concurrency: int, dry_run: bool = False
) -> list[float]:
    latencies: list[float] = []
    queue = list(range(count))
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=False, limit=concurrency)
    ) as session:

        async def worker() -> None:
            while queue:
                index = queue.pop()
                body = review(
                    index, quotas[index % len(quotas)], "bench-direct", dry_run
                )
                started = time.perf_counter()
                async with session.post(
                    f"{url}/validate-workloads",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as response:
                    answer = await response.json()
                latencies.append(time.perf_counter() - started)
                if not answer["response"]["allowed"]:
                    raise RuntimeError(answer["response"]["status"]["message"])

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def start_webhook(kubeconfig: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    handle = log.open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuforge",
            "webhook",
            "run",
            "--register",
            "--port",
            str(port),
            "--kubeconfig",
            str(kubeconfig),
            "--crd",
            str(CRD),
            "--name",
            "gpuforge-quota-bench",
        ],
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while b"serving on" not in log.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"webhook did not start:\n{log.read_text()}")
        time.sleep(0.1)
    return process, f"https://127.0.0.1:{port}"


def result(
    name: str,
    value: float,
    unit: str,
    target: float | None = None,
    higher_is_better: bool = False,
) -> dict[str, Any]:
    item: dict[str, Any] = {"name": name, "value": round(value, 3), "unit": unit}
    if target is not None:
        item["target"] = target
        item["ok"] = value >= target if higher_is_better else value <= target
    return item


async def bench(kubeconfig: Path, work: Path) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    async with Cluster(kubeconfig) as cluster:
        # The CRD must exist for quotas; the webhook applies it, so start and stop it once first.
        process, _ = start_webhook(kubeconfig, work / "webhook-setup.log")
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        many = [f"bench-many-{i}" for i in range(MANY_QUOTAS)]
        for name in many:
            await create_quota(cluster, name, 100_000)
        await cluster.call(
            "POST", "/api/v1/namespaces", {"metadata": {"name": "bench-direct"}}
        )

        without: dict[int, float] = {}
        for concurrency in CONCURRENCY:
            ns = await namespace(cluster)
            latencies, _ = await timed_creates(
                cluster,
                ns,
                lambda i: many[i % MANY_QUOTAS],
                40 * concurrency // 4 + 40,
                concurrency,
            )
            without[concurrency] = percentile(latencies, 0.99)
            results.append(
                result(
                    f"e2e create p50, no webhook, c={concurrency}",
                    percentile(latencies, 0.5) * 1000,
                    "ms",
                )
            )
            results.append(
                result(
                    f"e2e create p99, no webhook, c={concurrency}",
                    without[concurrency] * 1000,
                    "ms",
                )
            )
            await cluster.call("DELETE", f"/api/v1/namespaces/{ns}")

        process, url = start_webhook(kubeconfig, work / "webhook.log")
        try:
            for concurrency in CONCURRENCY:
                latencies = await direct_admissions(
                    url, many, 100 * concurrency // 4 + 100, concurrency
                )
                results.append(
                    result(
                        f"webhook admission p50, {MANY_QUOTAS} quotas, c={concurrency}",
                        percentile(latencies, 0.5) * 1000,
                        "ms",
                    )
                )
                results.append(
                    result(
                        f"webhook admission p99, {MANY_QUOTAS} quotas, c={concurrency}",
                        percentile(latencies, 0.99) * 1000,
                        "ms",
                        10.0,
                    )
                )
            # Dry-run admissions are decided from the watch-fed cache and write nothing: the cost of
            # the webhook itself, without the reservation write to the API server.
            for concurrency in CONCURRENCY:
                latencies = await direct_admissions(
                    url, many, 100 * concurrency // 4 + 100, concurrency, dry_run=True
                )
                results.append(
                    result(
                        f"webhook dry-run admission p50, {MANY_QUOTAS} quotas, c={concurrency}",
                        percentile(latencies, 0.5) * 1000,
                        "ms",
                    )
                )
                results.append(
                    result(
                        f"webhook dry-run admission p99, {MANY_QUOTAS} quotas, c={concurrency}",
                        percentile(latencies, 0.99) * 1000,
                        "ms",
                        10.0,
                    )
                )
            for concurrency in CONCURRENCY:
                ns = await namespace(cluster)
                latencies, _ = await timed_creates(
                    cluster,
                    ns,
                    lambda i: many[i % MANY_QUOTAS],
                    40 * concurrency // 4 + 40,
                    concurrency,
                )
                p99 = percentile(latencies, 0.99)
                results.append(
                    result(
                        f"e2e create p50, webhook, c={concurrency}",
                        percentile(latencies, 0.5) * 1000,
                        "ms",
                    )
                )
                results.append(
                    result(
                        f"e2e create p99, webhook, c={concurrency}", p99 * 1000, "ms"
                    )
                )
                results.append(
                    result(
                        f"e2e p99 webhook/no webhook, c={concurrency}",
                        p99 / without[concurrency],
                        "x",
                        2.0,
                    )
                )
                await cluster.call("DELETE", f"/api/v1/namespaces/{ns}")
            for concurrency in CONCURRENCY:
                contended = f"bench-contended-{uuid.uuid4().hex[:6]}"
                hard = 50
                await create_quota(cluster, contended, hard)
                ns = await namespace(cluster)
                latencies, admitted = await timed_creates(
                    cluster, ns, lambda i, name=contended: name, 2 * hard, concurrency
                )
                _status, quota = await cluster.call(
                    "GET", f"/apis/gpuforge.io/v1alpha1/gpuquotas/{contended}"
                )
                used = int(
                    ((quota or {}).get("status") or {}).get("used", {}).get(GPU, "0")
                )
                results.append(
                    result(
                        f"contended over-admission, c={concurrency}",
                        max(0, admitted - hard) + max(0, used - hard),
                        "deployments",
                        0,
                    )
                )
                results.append(
                    result(
                        f"contended admitted, c={concurrency}",
                        admitted,
                        "deployments",
                        hard,
                        higher_is_better=True,
                    )
                )
                results.append(
                    result(
                        f"contended e2e create p99, c={concurrency}",
                        percentile(latencies, 0.99) * 1000,
                        "ms",
                        100.0,
                    )
                )
                await cluster.call("DELETE", f"/api/v1/namespaces/{ns}")
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
        for name in many:
            await cluster.call("DELETE", f"/apis/gpuforge.io/v1alpha1/gpuquotas/{name}")
        await cluster.call("DELETE", "/api/v1/namespaces/bench-direct")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kubeconfig", type=Path)
    args = parser.parse_args()
    work = args.out.parent / "quota-work"
    work.mkdir(parents=True, exist_ok=True)
    if args.kubeconfig is not None:
        results = asyncio.run(bench(args.kubeconfig, work))
    else:
        # Our own throwaway cluster in a temporary state root: works on a fresh machine and never
        # touches the user's clusters.
        from gpuforge.devcluster.cluster import DevCluster
        from gpuforge.devcluster.pools import uniform_pools

        with tempfile.TemporaryDirectory(prefix="gpuforge-bench-quota-") as root:
            cluster = DevCluster("bench-quota", Path(root))
            cluster.up(pools=uniform_pools(1))
            try:
                results = asyncio.run(bench(cluster.kubeconfig, work))
            finally:
                cluster.down()
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for item in results:
        mark = "" if "ok" not in item else ("  ok" if item["ok"] else "  MISSED")
        print(f"{item['name']:<55} {item['value']:>10} {item['unit']}{mark}")


if __name__ == "__main__":
    main()
