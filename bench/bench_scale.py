"""Scaling curve of the device plugin -> DRA migration: the upgrade benchmark (bench_upgrade) at 500, 1,000,
2,000 and 5,000 simulated nodes, maxUnavailable 10%, each on a fresh local control plane.

Per size:
- time from starting the control plane to every node Ready, and each control-plane process's peak memory;
- operator time added per batch of 100 nodes: bench_upgrade's main figure, the operator's reactions summed
  over a node's steps (gpuforge_upgrade_step_reaction_seconds / nodes; with a sliding window of
  maxUnavailable slots a batch of 100 takes one node cycle);
- operator CPU-seconds per 100 nodes migrated (the operator process's user + system time over the
  migration, divided by nodes / 100): what the operator costs, whatever else shares the machine;
- API requests per node, the operator's peak memory (VmHWM) and its resident memory before the migration
  per node (what the informers' caches hold), and moments a node advertised through both stacks;
- where the rest of the machine's CPU went during the migration: CPU-seconds of each process the local
  control plane started (API server, etcd, kwok, the simulated agent, ...);
- the machine's load (1-minute average), and the CPU-seconds of a fixed pure-Python loop measured just
  before the size's cluster starts: every figure is CPU-bound, so runs on different machines (or days)
  compare only through it.
Then a MODEL, a least-squares line through the measured sizes (a fit, not a measurement): the operator's
total CPU, requests and peak memory as a + b * nodes, extrapolated to 20,000 nodes.
- `gpuforge status` and `gpuforge plan` once the migration is done: wall time and their own CPU-seconds.
The simulated fleet (kwok, the GPU agent) runs at nice 10 (--fleet-nice): it yields the CPU to the control
plane, whose answers are in the time added, and its own steps, which are not, take longer.
Targets at 5,000 nodes: under 1 s of operator time added per batch of 100, under 8 requests per node,
under 400 MiB peak, 0 double advertisement, `status` and `plan` answering in under 2 s.

Each size's figures are written to the --out file as soon as it is measured (a later size that fails
leaves the earlier ones).

Usage: python bench/bench_scale.py --out bench/results/scale.json [--sizes 500,1000,2000,5000] [--add]
[--fleet-nice N]
(--add: measure some sizes now and keep the others from an earlier run, e.g. the largest one alone)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from bench_upgrade import SUMS, measure
from report import write_rows

MODEL_AT = 20_000
TARGET_NODES = 5_000
TARGET_ADDED_PER_BATCH = 1.0
TARGET_REQUESTS = 8.0
TARGET_PEAK_MIB = 400.0
TARGET_CLI_SECONDS = 2.0
# The simulated fleet yields the CPU to the control plane, as 5,000 kubelets on their own machines would
# not take it from the API server (`DevCluster.up(fleet_nice=...)`): the time added is the operator's
# reactions and the API server's answers, not the simulated nodes' own steps.
FLEET_NICE = 10


def figures(nodes: int, measured: dict[str, Any]) -> dict[str, float]:
    """The scaling figures of one measured migration."""
    diff = {name: measured["after"][name] - measured["before"][name] for name in SUMS}
    cpu = measured["after"]["cpu"] - measured["before"]["cpu"]
    return {
        "nodes": nodes,
        "up_seconds": round(measured["up"], 1),
        "migration_seconds": round(measured["wall"], 1),
        "operator_cpu_seconds": round(cpu, 2),
        "cpu_per_100_nodes": round(cpu / (nodes / 100), 3),
        "cpu_ms_per_node": round(1000 * cpu / nodes, 2),
        "added_per_batch": round(diff["reaction"] / nodes, 3),
        # Its parts: per step (the state entered), seconds per node; and the API server's share.
        **{
            f"added_per_node {step}": round(
                (total - measured["before"]["by_step"].get(step, (0.0, 0))[0]) / nodes, 3
            )
            for step, (total, _) in measured["after"]["by_step"].items()
        },
        "node_patch_seconds": round(diff["patch sum"] / max(diff["patch count"], 1), 3),
        "whole_passes": diff["passes"],
        "whole_passes_seconds": round(diff["passes_seconds"], 1),
        "requests": diff["requests"],
        "requests_per_node": round(diff["requests"] / nodes, 2),
        "peak_mib": round(measured["peak"], 1),
        "rss_before_mib": round(measured["rss_before"], 1),
        "violations": measured["violations"],
        "load": round(measured["load"], 1),
        **{f"peak_mib {name}": mib for name, mib in measured["control_plane"].items()},
        # Where the machine's CPU went during the migration, besides the operator.
        **{f"cpu_seconds {name}": used for name, used in measured.get("control_plane_cpu", {}).items()},
        **{
            f"{command}_{what}_seconds": round(value, 2)
            for command, timing in measured.get("cli", {}).items()
            for what, value in timing.items()
        },
    }


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x through the points: (a, b)."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0
    return mean_y - slope * mean_x, slope


def per_process(m: dict[str, float], figure: str, name: str, unit: str) -> list[dict[str, Any]]:
    """A row summing a figure kept per control-plane process (`"<figure> <process>"`), each process in its
    note; none for a size measured before the figure was kept."""
    parts = {k.removeprefix(f"{figure} "): v for k, v in m.items() if k.startswith(f"{figure} ")}
    if not parts:
        return []
    note = ", ".join(f"{process} {v:.0f}" for process, v in parts.items())
    return [{"name": name, "value": round(sum(parts.values()), 0), "unit": unit, "note": note}]


def rows_of(measured: list[dict[str, float]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for m in measured:
        n = int(m["nodes"])
        at_target = n == TARGET_NODES

        def checked(value: float, target: float, at_target: bool = at_target) -> dict[str, Any]:
            return {"target": f"< {target:g}", "ok": value < target} if at_target else {}

        rows += [
            {"name": f"{n} nodes: control plane up, every node Ready", "value": m["up_seconds"], "unit": "s"},
            *per_process(m, "peak_mib", f"{n} nodes: control-plane peak memory", "MiB"),
            {"name": f"{n} nodes: migration wall time", "value": m["migration_seconds"], "unit": "s"},
            *per_process(m, "cpu_seconds", f"{n} nodes: control-plane CPU during the migration", "s of CPU"),
            {
                "name": f"{n} nodes: operator time added per batch of 100",
                "value": m["added_per_batch"],
                "unit": "s",
                **checked(m["added_per_batch"], TARGET_ADDED_PER_BATCH),
                "note": "the operator's reactions summed over a node's steps (a batch is one node cycle)",
            },
            {
                "name": f"{n} nodes: operator CPU per batch of 100",
                "value": m["cpu_per_100_nodes"],
                "unit": "s",
                "note": f"{m['operator_cpu_seconds']} CPU-s in all, {m['cpu_ms_per_node']} ms per node",
            },
            {
                "name": f"{n} nodes: API requests per node",
                "value": m["requests_per_node"],
                "unit": "requests",
                **checked(m["requests_per_node"], TARGET_REQUESTS),
            },
            {
                "name": f"{n} nodes: operator peak memory",
                "value": m["peak_mib"],
                "unit": "MiB",
                **checked(m["peak_mib"], TARGET_PEAK_MIB),
                "note": f"{m['rss_before_mib']} MiB resident before the migration",
            },
            {
                "name": f"{n} nodes: moments a node advertised through both stacks",
                "value": int(m["violations"]),
                "unit": "moments",
                "target": 0,
                "ok": m["violations"] == 0,
            },
            {"name": f"{n} nodes: machine load (1-minute average)", "value": m["load"], "unit": ""},
            *(
                [
                    {
                        "name": f"{n} nodes: simulated fleet's nice (kwok, GPU agent)",
                        "value": m["fleet_nice"],
                        "unit": "",
                        "note": "0: it competes with the control plane for the CPU as an equal",
                    }
                ]
                if "fleet_nice" in m
                else []
            ),
            *(
                [
                    {
                        "name": f"{n} nodes: machine reference (10 million Python additions)",
                        "value": m["machine_reference_seconds"],
                        "unit": "s of CPU",
                    }
                ]
                if "machine_reference_seconds" in m
                else []
            ),
        ]
        for command in ("status", "plan"):
            if f"{command}_wall_seconds" in m:  # sizes measured before the CLI was timed have none
                rows.append(
                    {
                        "name": f"{n} nodes: gpuforge {command} (wall, after the migration)",
                        "value": m[f"{command}_wall_seconds"],
                        "unit": "s",
                        **checked(m[f"{command}_wall_seconds"], TARGET_CLI_SECONDS),
                        "note": f"{m[f'{command}_cpu_seconds']} CPU-s",
                    }
                )
    if len(measured) >= 2:
        xs = [m["nodes"] for m in measured]
        cpu = fit(xs, [m["operator_cpu_seconds"] for m in measured])
        requests = fit(xs, [m["requests"] for m in measured])
        peak = fit(xs, [m["peak_mib"] for m in measured])
        rows += [
            {
                "name": f"MODEL (least-squares fit, not measured): operator CPU per batch of 100 at {MODEL_AT}",
                "value": round((cpu[0] + cpu[1] * MODEL_AT) / (MODEL_AT / 100), 3),
                "unit": "s",
                "note": f"total CPU = {cpu[0]:.1f} s + {1000 * cpu[1]:.2f} ms x nodes",
            },
            {
                "name": f"MODEL (least-squares fit, not measured): API requests per node at {MODEL_AT}",
                "value": round((requests[0] + requests[1] * MODEL_AT) / MODEL_AT, 2),
                "unit": "requests",
                "note": f"requests = {requests[0]:.0f} + {requests[1]:.2f} x nodes",
            },
            {
                "name": f"MODEL (least-squares fit, not measured): operator peak memory at {MODEL_AT}",
                "value": round(peak[0] + peak[1] * MODEL_AT, 0),
                "unit": "MiB",
                "note": f"peak = {peak[0]:.0f} MiB + {1024 * peak[1]:.1f} KiB x nodes",
            },
        ]
        for command in ("status", "plan"):
            timed = [m for m in measured if f"{command}_wall_seconds" in m]
            if len(timed) >= 2:
                line = fit([m["nodes"] for m in timed], [m[f"{command}_wall_seconds"] for m in timed])
                rows.append(
                    {
                        "name": f"MODEL (least-squares fit, not measured): gpuforge {command} at {MODEL_AT}",
                        "value": round(line[0] + line[1] * MODEL_AT, 1),
                        "unit": "s",
                        "note": f"wall = {line[0]:.2f} s + {1000 * line[1]:.3f} ms x nodes",
                    }
                )
    return rows


def machine_reference() -> float:
    """CPU-seconds of a fixed pure-Python loop (10 million additions), the median of three: every
    figure here is CPU-bound on two cores, so runs on different machines (or the same one on a slower
    day) compare only through it."""
    samples = []
    for _ in range(3):
        started, total = time.process_time(), 0
        for i in range(10_000_000):
            total += i
        samples.append(time.process_time() - started)
    return round(sorted(samples)[1], 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", default="500,1000,2000,5000", help="node counts, comma-separated")
    parser.add_argument("--logs", type=Path, help="keep each size's operator log in this directory")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="with --logs: sample the operator's CPU with py-spy during each migration (a dev dependency),"
        " profile the API server and the controller-manager meanwhile (pprof), and sample `status` and"
        " `plan` once each",
    )
    parser.add_argument(
        "--fleet-nice",
        type=int,
        default=FLEET_NICE,
        help="the simulated fleet's CPU priority (kwok and the GPU agent; 0 to compete with the control"
        f" plane as an equal; default {FLEET_NICE})",
    )
    parser.add_argument(
        "--add",
        action="store_true",
        help="keep the sizes measured before (<out>.sizes.json) that this run does not measure again",
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    if args.logs:  # made now: a missing directory would fail only after the longest run had finished
        args.logs.mkdir(parents=True, exist_ok=True)
    earlier = args.out.with_suffix(".sizes.json")
    measured: list[dict[str, float]] = (
        [m for m in json.loads(earlier.read_text()) if m["nodes"] not in sizes]
        if args.add and earlier.exists()
        else []
    )
    for nodes in sizes:
        print(f"--- {nodes} nodes (load {os.getloadavg()[0]:.1f})", flush=True)
        reference = machine_reference()
        log = args.logs / f"operator-{nodes}.log" if args.logs else None
        profile = args.logs / f"operator-{nodes}.pyspy" if args.logs and args.profile else None
        measured.append(
            {
                **figures(nodes, measure(nodes, log, profile, args.fleet_nice)),
                "machine_reference_seconds": reference,
                "fleet_nice": args.fleet_nice,
            }
        )
        print(json.dumps(measured[-1]), flush=True)
        measured.sort(key=lambda m: m["nodes"])
        write_rows(args.out, rows_of(measured))
        args.out.with_suffix(".sizes.json").write_text(json.dumps(measured, indent=2) + "\n")
    for row in rows_of(measured):
        print(f"{row['name']}: {row['value']} {row['unit']}")


if __name__ == "__main__":
    main()
