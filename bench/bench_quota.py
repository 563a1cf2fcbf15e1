"""Benchmark of the GpuQuota admission webhook on the local control plane.

Measures (p50/p99 at concurrency 1, 8, 32):
- admission latency at the webhook: AdmissionReviews posted straight to it, spread over many quotas;
- end-to-end Deployment create latency through the API server, without and with the webhook, measured
  in pairs under the same conditions (the previous phase's namespace is gone before the next starts);
- one contended quota: creates racing for its last GPUs; over-admission must be zero;
- the floors the webhook cannot go below: the API server's latency for one GpuQuota status write (the
  reservation every admission makes) and what the API server itself observes of the webhook call.

The webhook runs as production runs it: two replicas (separate processes, each with its usage
controller) behind one address (SO_REUSEPORT spreads the API server's connections over them as a
Service does), TLS on, the API server calling it.

Usage: python bench/bench_quota.py --out bench/results/quota.json [--kubeconfig FILE]
Without --kubeconfig a local control plane is started in a temporary state root and stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
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


REPLICA = """
import asyncio, logging, sys
from pathlib import Path
from gpuforge.webhook.run import WebhookOptions, run_until_signalled
logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
port, kubeconfig, work, register = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "1"
asyncio.run(run_until_signalled(WebhookOptions(
    port=port, kubeconfig=kubeconfig, register=register, name="gpuforge-quota-bench",
    cert_file=work / "tls.crt", key_file=work / "tls.key", ca_file=work / "ca.crt", reuse_port=True,
)))
"""


class Webhook:
    """`replicas` webhook processes sharing one port; the first registers the configurations (and
    removes them when it stops). All serve one certificate, so the API server trusts every replica."""

    def __init__(self, kubeconfig: Path, work: Path, replicas: int = 2) -> None:
        from gpuforge.webhook.certs import generate_ca, issue_serving_cert

        self.kubeconfig, self.work, self.replicas = kubeconfig, work, replicas
        now = datetime.now(UTC)
        ca = generate_ca(now)
        pair = issue_serving_cert(ca, ["127.0.0.1", "localhost"], now)
        (work / "ca.crt").write_bytes(ca.cert_pem)
        (work / "tls.crt").write_bytes(pair.cert_pem)
        (work / "tls.key").write_bytes(pair.key_pem)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        for index in range(self.replicas):
            log = self.work / f"webhook-{self.starts}-{index}.log"
            handle = log.open("wb")
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    REPLICA,
                    str(self.port),
                    str(self.kubeconfig),
                    str(self.work),
                ]
                + ["1" if index == 0 else "0"],
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
            self.processes.append(process)
            deadline = time.monotonic() + 60
            while b"serving on" not in log.read_bytes():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"webhook did not start:\n{log.read_text()}")
                time.sleep(0.1)
        time.sleep(3.0)  # informers list and sync; the controllers' first full pass

    def stop(self) -> None:
        for process in reversed(
            self.processes
        ):  # the registering replica last: it unregisters
            process.send_signal(signal.SIGTERM)
            process.wait(30)
        self.processes.clear()

    def cpu_seconds(self) -> float:
        return sum(_cpu_seconds(process.pid) for process in self.processes)


async def replica_metrics(url: str) -> dict[str, dict[str, float]]:
    """Each replica's counters, by its process start time: the port spreads fresh connections over
    the replicas, so a few scrapes reach all of them."""
    seen: dict[str, dict[str, float]] = {}
    for _ in range(16):
        connector = aiohttp.TCPConnector(ssl=False, force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.get(f"{url}/metrics") as response,
        ):
            text = await response.text()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                values[key] = float(value)
        seen[str(values.get("process_start_time_seconds"))] = values
    return seen


def metric_delta(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], name: str
) -> float:
    """Sum over replicas of the growth of every series whose name starts with `name`."""
    total = 0.0
    for replica, values in after.items():
        for key, value in values.items():
            if key.startswith(name):
                total += value - before.get(replica, {}).get(key, 0.0)
    return total


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def apply_crd(kubeconfig: Path) -> None:
    from gpuforge.k8s.quota import QuotaApi
    from gpuforge.webhook.run import apply_crd as apply

    async with QuotaApi.from_kubeconfig(kubeconfig) as api:
        await apply(api, CRD)


async def wait_gone(cluster: Cluster, path: str, timeout: float = 180.0) -> None:
    """Deleting a namespace cascades through hundreds of objects: the next phase must not run beside it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, _ = await cluster.call("GET", path)
        if status == 404:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{path} still there after {timeout}s")


async def drop_namespace(cluster: Cluster, name: str) -> None:
    await cluster.call("DELETE", f"/api/v1/namespaces/{name}")
    await wait_gone(cluster, f"/api/v1/namespaces/{name}")


WEBHOOK_SERIES = "apiserver_admission_webhook_admission_duration_seconds"


async def webhook_seconds(cluster: Cluster) -> tuple[float, float]:
    """(sum, count) of the API server's own timing of calls to our workloads webhook."""
    assert cluster.session is not None
    async with cluster.session.get("metrics") as response:
        text = await response.text()
    total = count = 0.0
    for line in text.splitlines():
        if (
            line.startswith(WEBHOOK_SERIES)
            and 'name="workloads.quota.gpuforge.io"' in line
        ):
            if line.startswith(WEBHOOK_SERIES + "_sum"):
                total += float(line.rsplit(" ", 1)[1])
            elif line.startswith(WEBHOOK_SERIES + "_count"):
                count += float(line.rsplit(" ", 1)[1])
    return total, count


async def status_writes(cluster: Cluster, name: str, count: int) -> list[float]:
    """The reservation write alone: PUT status with a resourceVersion precondition, one after another."""
    _, quota = await cluster.call("GET", f"/apis/gpuforge.io/v1alpha1/gpuquotas/{name}")
    latencies = []
    for _ in range(count):
        body = {
            "apiVersion": "gpuforge.io/v1alpha1",
            "kind": "GpuQuota",
            "metadata": {
                "name": name,
                "resourceVersion": quota["metadata"]["resourceVersion"],
            },
            "status": quota.get("status") or {"used": {GPU: "0"}},
        }
        started = time.perf_counter()
        status, quota = await cluster.call(
            "PUT",
            f"/apis/gpuforge.io/v1alpha1/gpuquotas/{name}/status?fieldManager=gpuforge",
            body,
        )
        latencies.append(time.perf_counter() - started)
        if status != 200:
            raise RuntimeError(f"status write: {status} {quota}")
    return latencies


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


async def status_writes_while(
    cluster: Cluster, name: str, running: asyncio.Task[Any]
) -> list[float]:
    """The reservation write while `running` loads the cluster: what an admission's write costs then."""
    latencies: list[float] = []
    while not running.done():
        latencies.extend(await status_writes(cluster, name, 1))
        await asyncio.sleep(0.02)
    return latencies or [0.0]


def latency_results(
    results: list[dict[str, Any]],
    what: str,
    latencies: list[float],
    p99_target: float | None = None,
) -> None:
    results.append(result(f"{what} p50", percentile(latencies, 0.5) * 1000, "ms"))
    results.append(
        result(f"{what} p99", percentile(latencies, 0.99) * 1000, "ms", p99_target)
    )


def creates_at(concurrency: int) -> int:
    return max(100, 40 * concurrency // 4 + 40)


async def bench(kubeconfig: Path, work: Path) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    await apply_crd(kubeconfig)
    webhook = Webhook(kubeconfig, work)
    async with Cluster(kubeconfig) as cluster:
        many = [f"bench-many-{i}" for i in range(MANY_QUOTAS)]
        for name in many:
            await create_quota(cluster, name, 100_000)
        await cluster.call(
            "POST", "/api/v1/namespaces", {"metadata": {"name": "bench-direct"}}
        )

        # The floor under every admission: its one status write, as the API server serves it alone.
        await create_quota(cluster, "bench-floor", 1)
        writes = await status_writes(cluster, "bench-floor", 200)
        write_p50, write_p99 = (
            percentile(writes, 0.5) * 1000,
            percentile(writes, 0.99) * 1000,
        )
        latency_results(results, "API server GpuQuota status write alone, c=1", writes)

        try:
            for concurrency in CONCURRENCY:
                # Without, then with the webhook, back to back, each in a fresh namespace and only
                # once the previous one is gone (its deletion cascades through every object made).
                ns = await namespace(cluster)
                plain, _ = await timed_creates(
                    cluster,
                    ns,
                    lambda i: many[i % MANY_QUOTAS],
                    creates_at(concurrency),
                    concurrency,
                )
                await drop_namespace(cluster, ns)
                webhook.start()
                ns = await namespace(cluster)
                seconds_before, calls_before = await webhook_seconds(cluster)
                cpu_before = webhook.cpu_seconds()
                creating = asyncio.create_task(
                    timed_creates(
                        cluster,
                        ns,
                        lambda i: many[(i + 1) % MANY_QUOTAS],
                        creates_at(concurrency),
                        concurrency,
                    )
                )
                # The write an admission makes, on a quota no workload uses, while the creates (and
                # the webhook's own writes) load the API server: an admission cannot be faster.
                loaded_writes = await status_writes_while(
                    cluster, "bench-floor", creating
                )
                guarded, _ = await creating
                cpu = webhook.cpu_seconds() - cpu_before
                seconds_after, calls_after = await webhook_seconds(cluster)
                webhook.stop()
                await drop_namespace(cluster, ns)
                latency_results(
                    results, f"e2e create, no webhook, c={concurrency}", plain
                )
                latency_results(
                    results,
                    f"API server GpuQuota status write during the webhook creates, c={concurrency}",
                    loaded_writes,
                )
                latency_results(
                    results, f"e2e create, webhook, c={concurrency}", guarded
                )
                calls = max(1.0, calls_after - calls_before)
                results.append(
                    result(
                        f"webhook call as the API server times it, mean, c={concurrency}",
                        (seconds_after - seconds_before) / calls * 1000,
                        "ms",
                    )
                )
                results.append(
                    result(
                        f"webhook CPU per create (2 replicas), c={concurrency}",
                        cpu / len(guarded) * 1000,
                        "ms",
                    )
                )
                ratio = result(
                    f"e2e p99 webhook/no webhook, c={concurrency}",
                    percentile(guarded, 0.99) / percentile(plain, 0.99),
                    "x",
                    2.0,
                )
                ratio["note"] = (
                    "with the webhook a create waits for one more API server write (the reservation in "
                    f"the GpuQuota's status: {write_p50:.1f}/{write_p99:.1f} ms p50/p99 on a quiet "
                    f"server, {percentile(loaded_writes, 0.5) * 1000:.1f}/"
                    f"{percentile(loaded_writes, 0.99) * 1000:.1f} ms while these creates run) plus "
                    "the webhook call; on 2 cores shared with etcd, the API server and the controllers "
                    "that extra work also slows the create itself"
                )
                results.append(ratio)

            webhook.start()
            for dry_run in (False, True):
                kind = "dry-run admission" if dry_run else "admission"
                for concurrency in CONCURRENCY:
                    latencies = await direct_admissions(
                        webhook.url,
                        many,
                        100 * concurrency // 4 + 100,
                        concurrency,
                        dry_run=dry_run,
                    )
                    latency_results(
                        results,
                        f"webhook {kind}, {MANY_QUOTAS} quotas, c={concurrency}",
                        latencies,
                        10.0,
                    )
                    if not dry_run:
                        results[-1]["note"] = (
                            "an admission is one GpuQuota status write to the API server plus the decision; "
                            f"that write alone: {write_p50:.1f}/{write_p99:.1f} ms p50/p99 at c=1"
                        )
            for concurrency in CONCURRENCY:
                contended = f"bench-contended-{uuid.uuid4().hex[:6]}"
                many.append(contended)  # deleted with the others at the end
                hard = 50
                await create_quota(cluster, contended, hard)
                ns = await namespace(cluster)
                before = await replica_metrics(webhook.url)
                latencies, admitted = await timed_creates(
                    cluster, ns, lambda i, name=contended: name, 2 * hard, concurrency
                )
                after = await replica_metrics(webhook.url)
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
                batches = metric_delta(
                    before, after, "gpuforge_quota_admission_batch_size_count"
                )
                batched = metric_delta(
                    before, after, "gpuforge_quota_admission_batch_size_sum"
                )
                results.append(
                    result(
                        f"contended requests per status write (batching), c={concurrency}",
                        batched / max(1.0, batches),
                        "requests",
                    )
                )
                results.append(
                    result(
                        f"contended status write conflicts (409), c={concurrency}",
                        metric_delta(
                            before, after, "gpuforge_quota_status_conflicts_total"
                        ),
                        "writes",
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
                await drop_namespace(cluster, ns)
        finally:
            webhook.stop()
        for name in [*many, "bench-floor"]:
            await cluster.call("DELETE", f"/apis/gpuforge.io/v1alpha1/gpuquotas/{name}")
        await cluster.call("DELETE", "/api/v1/namespaces/bench-direct")
    results.append(result("load average (1 min) at the end", os.getloadavg()[0], ""))
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
