"""Local control plane: cold build time, warm `up` time, 1000 simulated nodes registered and Ready.

Targets: warm `up` under 20 s; 1000 nodes Ready under 60 s. The cold build (every module
downloaded, every package compiled, into an empty temporary cache) takes many minutes: it runs unless
GPUFORGE_BENCH_SKIP_COLD=1, in which case the time recorded in the cache manifest is reported instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from gpuforge_lab.devcluster.build import build, cache_root, build_key, load_versions
from gpuforge_lab.devcluster.cluster import DevCluster
from gpuforge_lab.devcluster.pools import Pool


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()
    rows = []
    if os.environ.get("GPUFORGE_BENCH_SKIP_COLD") == "1":
        build()
        manifest = json.loads(
            (cache_root() / "controlplane" / build_key(load_versions()) / "manifest.json").read_text()
        )
        rows.append(
            {
                "name": "build (recorded in the cache manifest; may have been incremental)",
                "value": manifest["duration_seconds"],
                "unit": "s",
                "note": f"built {manifest['built_at']}",
            }
        )
    else:
        with tempfile.TemporaryDirectory() as cold_cache:
            previous = os.environ.get("GPUFORGE_CACHE")
            os.environ["GPUFORGE_CACHE"] = cold_cache
            started = time.monotonic()
            build()
            cold = time.monotonic() - started
            if previous is None:
                del os.environ["GPUFORGE_CACHE"]
            else:
                os.environ["GPUFORGE_CACHE"] = previous
        rows.append({"name": "cold build (empty module and build caches)", "value": round(cold, 1), "unit": "s"})
        build()
    with tempfile.TemporaryDirectory() as root:
        ups = []
        for index in range(args.repeat):
            cluster = DevCluster(f"bench-up-{index}", Path(root))
            ups.append(cluster.up("1.36", [Pool(name="gpu", count=4)]))
            cluster.down()
        warm = statistics.median(ups)
        rows.append({"name": "warm up (4 nodes, median of %d)" % args.repeat, "value": round(warm, 2),
                     "unit": "s", "target": "< 20 s", "ok": warm < 20})
        cluster = DevCluster("bench-nodes", Path(root))
        cluster.up("1.36", [])
        try:
            started = time.monotonic()
            cluster.add_pools([Pool(name="gpu", count=args.nodes)], wait=True)
            ready = time.monotonic() - started
        finally:
            cluster.down()
        rows.append({"name": f"{args.nodes} nodes registered and Ready", "value": round(ready, 2), "unit": "s",
                     "target": "< 60 s", "ok": ready < 60})
    args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
