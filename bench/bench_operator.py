"""GpuStack operator at scale: 1000 simulated GPU nodes on the local control plane.

Reports the time from applying examples/gpustack-device-plugin.yaml to the GpuStack being Ready on every
node (the simulated plugins become Ready as soon as kwok runs their pods), the API requests the operator
made per node (its own requests as counted in gpuforge_api_requests_total; kopf's single watch stream is
not included), the operator process's peak memory (VmHWM), and the CPU time of one no-op resync (one
`reconcile` pass over a settled stack, measured in this process with time.process_time): once reading
the cluster from the watch-fed cache as the operator does, and once listing everything (a cold start).
Targets: Ready under 60 s; no-op resync under 1 s of CPU; peak memory under 250 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

from harness import ROOT, cluster_with_operator, peak_rss_mib
from report import write_rows

from gpuforge.k8s.cache import ClusterCache
from gpuforge.k8s.client import Kube
from gpuforge.k8s.memory import StackMemory
from gpuforge.k8s.stack import reconcile


def _cached_noop(kube: Kube) -> tuple[float, int]:
    """CPU time and requests of one settled pass reading from a synced ClusterCache, as the operator does
    (process time of all threads: the cache's watch handling during the pass counts too)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_loop(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(120)

    cache = ClusterCache(kube, lambda _node: None)
    memory = StackMemory()  # what the operator's passes remember between them, as in the operator
    try:
        on_loop(cache.start())
        reconcile(kube, "gpus", memory, cache)  # the cache learns the resource.k8s.io version here
        time.sleep(0.5)
        assert on_loop(cache.wait_synced(60)), "the cluster cache did not sync"
        reconcile(kube, "gpus", memory, cache)
        kube.requests.clear()
        cpu = time.process_time()
        outcome = reconcile(kube, "gpus", memory, cache)
        noop_cpu = time.process_time() - cpu
        requests = sum(n for (verb, _), n in kube.requests.items() if verb not in ("watch",))
        assert outcome is not None and outcome.labelled == 0
        return noop_cpu, requests
    finally:
        on_loop(cache.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()

    with cluster_with_operator("bench-operator", args.nodes) as (cluster, process):
        started = time.monotonic()
        cluster.kubectl("apply", "-f", str(ROOT / "examples/gpustack-device-plugin.yaml"))
        wanted = f"{args.nodes}/{args.nodes}"
        while True:
            out = cluster.kubectl("get", "gpustack", "gpus", "-o", "json", check=False).stdout
            status = json.loads(out).get("status", {}) if out else {}
            if status.get("phase") == "Ready" and status.get("nodesReady") == wanted:
                break
            if time.monotonic() - started > 600:
                raise SystemExit(f"not Ready after 600 s: {status.get('nodesReady')}")
            time.sleep(0.5)
        ready_seconds = time.monotonic() - started
        requests = process.requests()
        peak = peak_rss_mib(process.pid)

        kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
        memory = StackMemory()
        reconcile(kube, "gpus", memory)  # warm caches (compat data, templates, what was applied)
        kube.requests.clear()
        cpu = time.process_time()
        outcome = reconcile(kube, "gpus", memory)
        list_cpu = time.process_time() - cpu
        list_requests = sum(kube.requests.values())
        assert outcome is not None and outcome.labelled == 0
        noop_cpu, noop_requests = _cached_noop(kube)

    rows = [
        {
            "name": f"apply to Ready, {args.nodes} nodes",
            "value": round(ready_seconds, 2),
            "unit": "s",
            "target": 60,
            "ok": ready_seconds < 60,
        },
        {
            "name": "operator API requests per node (to Ready)",
            "value": round(requests / args.nodes, 2),
            "unit": "requests",
        },
        {
            "name": "operator peak memory",
            "value": round(peak, 1),
            "unit": "MiB",
            "target": 250,
            "ok": peak < 250,
        },
        {
            "name": "no-op resync CPU time",
            "value": round(noop_cpu, 3),
            "unit": "s",
            "target": 1,
            "ok": noop_cpu < 1,
        },
        {
            "name": "no-op resync API requests",
            "value": noop_requests,
            "unit": "requests",
        },
        {
            "name": "no-op resync CPU time, listing (cold start)",
            "value": round(list_cpu, 3),
            "unit": "s",
            "target": 1,
            "ok": list_cpu < 1,
        },
        {
            "name": "no-op resync API requests, listing (cold start)",
            "value": list_requests,
            "unit": "requests",
        },
    ]
    write_rows(args.out, rows)
    for row in rows:
        print(f"{row['name']}: {row['value']} {row['unit']}")


if __name__ == "__main__":
    main()
