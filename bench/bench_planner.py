"""Micro-benchmark of the pure upgrade planner (no cluster): is it a negligible part of the 2 s per batch?

Measures, on 1000 GPU nodes:
- plan() at the start of a device plugin -> DRA migration (every node a candidate);
- plan() mid-migration (100 nodes in flight in every state, GPU pods on each node);
- snapshot_from_objects() over 1000 Node dicts, 9000 pod dicts and 1000 ResourceSlices;
- a whole migration with maxUnavailable 10% in the simulated world of the unit tests (plugins ready at
  once): planner CPU per batch of 100 nodes, and planning rounds per batch.

Usage: python bench/bench_planner.py --out bench/results/planner.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator" / "tests" / "unit" / "upgrade"))

from gpuforge.constants import COMPONENT_LABEL, DEPLOY_DEVICE_PLUGIN_LABEL, GFD_COUNT_LABEL
from gpuforge.upgrade import plan
from gpuforge.upgrade.convert import snapshot_from_objects
from gpuforge.upgrade.model import Desired, IntOrPercent, Mode, NodeState, PodRef, Policy
from report import print_rows, write_rows
from upgrade_world import SimPod, World, settled_node

NODES = 1000
VERSIONS = {Mode.DEVICE_PLUGIN: "v0.20.0", Mode.DRA: "v0.4.0"}
POLICY = Policy(max_unavailable=IntOrPercent(10, percent=True), max_parallel=0)


def timed(fn: Callable[[], object], repeat: int = 7) -> float:
    """Median wall time of `fn` in milliseconds."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def world(nodes: int = NODES) -> World:
    sims = [
        settled_node(f"gpu-{i:04d}", Mode.DEVICE_PLUGIN, VERSIONS[Mode.DEVICE_PLUGIN]) for i in range(nodes)
    ]
    for i, node in enumerate(sims):
        for j in range(2):
            node.pods.append(
                SimPod(PodRef("jobs", f"job-{i}-{j}"), Mode.DEVICE_PLUGIN, finishes_in=1 + (i + j) % 3)
            )
    want = Desired(Mode.DRA, VERSIONS, frozenset(n.name for n in sims))
    return World(sims, want, seed=7)


def objects(nodes: int = NODES) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    node_dicts, pods, slices = [], [], []
    for i in range(nodes):
        name = f"gpu-{i:04d}"
        node_dicts.append(
            {
                "metadata": {
                    "name": name,
                    "labels": {DEPLOY_DEVICE_PLUGIN_LABEL: "true", GFD_COUNT_LABEL: "8"},
                },
                "spec": {},
                "status": {
                    "nodeInfo": {"kubeletVersion": "v1.36.0"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "capacity": {"nvidia.com/gpu": "8", "cpu": "96"},
                    "allocatable": {"nvidia.com/gpu": "8"},
                },
            }
        )
        pods.append(
            {
                "metadata": {
                    "name": f"dp-{i}",
                    "namespace": "gpuforge",
                    "labels": {COMPONENT_LABEL: "device-plugin"},
                },
                "spec": {
                    "nodeName": name,
                    "containers": [{"image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"}],
                },
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            }
        )
        for j in range(8):
            pods.append(
                {
                    "metadata": {
                        "name": f"job-{i}-{j}",
                        "namespace": "ml",
                        "uid": f"u{i}-{j}",
                        "ownerReferences": [{"kind": "Job", "controller": True}],
                    },
                    "spec": {
                        "nodeName": name,
                        "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                    },
                    "status": {"phase": "Running"},
                }
            )
        slices.append(
            {"spec": {"nodeName": name, "driver": "gpu.nvidia.com", "devices": [{"name": "gpu-0"}]}}
        )
    return node_dicts, pods, slices


def migrate(w: World) -> tuple[float, int, int]:
    """Run a whole migration; returns (planner CPU ms per batch, rounds, batches)."""
    planner_ms = 0.0
    rounds = 0
    for rounds in range(1, 2000):
        snapshot = w.snapshot()
        start = time.process_time()
        result = plan(snapshot, w.desired, POLICY)
        planner_ms += (time.process_time() - start) * 1000
        if result.complete:
            break
        w.apply_plan(result)
        w.tick()
    batches = -(-NODES // POLICY.max_unavailable.resolve(NODES))
    return planner_ms / batches, rounds, batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    start_world = world()
    start_snapshot = start_world.snapshot()
    start_plan = plan(start_snapshot, start_world.desired, POLICY)
    admitted = sum(1 for t in start_plan.transitions if t.to_state is NodeState.WAIT_FOR_JOBS_REQUIRED)
    assert admitted == 100, admitted

    mid = world()
    for _ in range(6):  # a few rounds in: nodes spread over the states
        mid.apply_plan(plan(mid.snapshot(), mid.desired, POLICY))
        mid.tick()
    mid_snapshot = mid.snapshot()

    node_dicts, pod_dicts, slice_dicts = objects()
    now = datetime.now(UTC)
    per_batch_ms, rounds, batches = migrate(world())

    results: list[dict[str, Any]] = []

    def record(name: str, value: float, unit: str, target: float | None = None) -> None:
        entry: dict[str, Any] = {"name": name, "value": round(value, 2), "unit": unit}
        if target is not None:
            entry["target"] = target
            entry["ok"] = value <= target
        results.append(entry)

    record(
        "planner: plan() 1000 nodes, start of migration",
        timed(lambda: plan(start_snapshot, start_world.desired, POLICY)),
        "ms",
        200,
    )
    record(
        "planner: plan() 1000 nodes, mid-migration",
        timed(lambda: plan(mid_snapshot, mid.desired, POLICY)),
        "ms",
        200,
    )
    record(
        "planner: snapshot_from_objects 1000 nodes / 9000 pods",
        timed(lambda: snapshot_from_objects(node_dicts, pod_dicts, slice_dicts, now=now), repeat=3),
        "ms",
        500,
    )
    record("planner: CPU per batch of 100 nodes (1000-node migration, 10%)", per_batch_ms, "ms", 2000)
    record("planner: planning rounds per batch", rounds / batches, "rounds")

    write_rows(args.out, results)
    print_rows(results, 70, "SLOW")


if __name__ == "__main__":
    main()
