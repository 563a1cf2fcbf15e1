"""Upgrade engine at scale: a 1000-node device plugin -> DRA migration on the local control plane.

The operator (`gpuforge operator run`, a subprocess with the admin kubeconfig) first puts the device
plugin on every simulated node; then the GpuStack switches to `mode: dra` with `maxUnavailable: 10%` and
`maxParallel: 0` (batches of 100). The simulated plugins become Ready as soon as kwok runs their pods, so
the wall time is mostly the operator's passes and the control plane's work. Reported:
- wall time of the migration (mode switch to every node upgrade-done on DRA);
- time the operator itself added per batch of 100 nodes: the slots of maxUnavailable work as a sliding
  window (a node that finishes frees its slot for the next), so a batch of 100 takes one node cycle, and
  the operator's share of a node's cycle is the sum over its steps (admission with cordon and old stack
  off; new stack on; uncordon) of the time from the change allowing the step reaching the operator (the
  latest watch event about that node; for an admission, the landing of the uncordon that freed its slot,
  or the spec change) to the step's node patch landing: debounce, planning, waiting for a free writer,
  and the patch's round trip (gpuforge_upgrade_step_reaction_seconds, summed over the migration, divided
  by the nodes). The rest of the cycle is the cluster's: kwok deleting and starting pods, the simulated
  agent advertising, watch delivery.
- what the API server's answers cost inside those reactions: the average round trip of a node patch and
  of an event (gpuforge_api_request_duration_seconds);
- time nodes spent in wait-old-gone and validation-required on average (gpuforge_upgrade_step_seconds):
  with the operator's time for admission, the node cycle, to check against the wall time per batch;
- for comparison, how busy the operator was per batch: the summed wall time of its whole passes
  (gpuforge_reconcile_duration_seconds, API round trips included) and of its quick steps (planned and
  queued; the two run side by side and overlap the cluster's work), with the number of passes and the
  operator process's CPU time per batch;
- API requests per node migrated (gpuforge_api_requests_total during the migration / nodes);
- the operator process's peak memory (VmHWM), and the machine's load average (other work on the same two
  cores slows the API server: compare runs made under similar load).
Targets: under 2 s per batch of 100 nodes, under 30 requests per node.

Usage: python bench/bench_upgrade.py --out bench/results/upgrade.json [--nodes 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import (
    GoProfiles,
    Operator,
    cluster_with_operator,
    control_plane_cpu_seconds,
    control_plane_peaks_mib,
    cpu_seconds,
    peak_rss_mib,
    rss_mib,
)
from report import write_rows

from gpuforge_lab.devcluster.cluster import DevCluster

MAX_UNAVAILABLE_PERCENT = 10


def _reactions_by_step(text: str) -> dict[str, tuple[float, float]]:
    """Per step (the state entered): (summed seconds, count) of gpuforge_upgrade_step_reaction_seconds."""
    out: dict[str, tuple[float, float]] = {}
    for m in re.finditer(
        r'^gpuforge_upgrade_step_reaction_seconds_(sum|count)\{.*step="([^"]+)".*\} (\S+)$', text, re.M
    ):
        total, count = out.get(m[2], (0.0, 0.0))
        out[m[2]] = (total + float(m[3]), count) if m[1] == "sum" else (total, count + float(m[3]))
    return out


PHASES = ("read", "plan", "nodes", "operands", "status")
# Figure -> the metric samples summed for it (group 1: the value).
SUMS = {
    "requests": r"^gpuforge_api_requests_total\{.*\} (\S+)$",
    "passes_seconds": r"^gpuforge_reconcile_duration_seconds_sum\{.*\} (\S+)$",
    "passes": r"^gpuforge_reconcile_duration_seconds_count\{.*\} (\S+)$",
    "wake_delay": r"^gpuforge_reconcile_wake_delay_seconds_sum\{.*\} (\S+)$",
    "quick": r"^gpuforge_quick_step_seconds_sum\{.*\} (\S+)$",
    "reaction": r"^gpuforge_upgrade_step_reaction_seconds_sum\{.*\} (\S+)$",
    "steps": r"^gpuforge_upgrade_step_reaction_seconds_count\{.*\} (\S+)$",
    **{
        f"{what} {part}": rf"^gpuforge_api_request_duration_seconds_{part}"
        rf'\{{(?=[^}}]*verb="{verb}")(?=[^}}]*resource="{resource}")[^}}]*\}} (\S+)$'
        for what, verb, resource in (("patch", "patch", "nodes"), ("event", "create", "events"))
        for part in ("sum", "count")
    },
    **{
        f"in {state} {part}": rf'^gpuforge_upgrade_step_seconds_{part}\{{.*state="{state}"\}} (\S+)$'
        for state in ("wait-old-gone", "validation-required")
        for part in ("sum", "count")
    },
    **{
        f"phase {phase}": rf'^gpuforge_reconcile_phase_seconds_sum\{{.*phase="{phase}".*\}} (\S+)$'
        for phase in PHASES
    },
}


def _readings(process: Operator) -> dict[str, Any]:
    """Every figure the benchmark reports as a difference, read once from the operator's metrics."""
    text = process.metrics()
    out: dict[str, Any] = {name: process.metric_sum(pattern, text) for name, pattern in SUMS.items()}
    out["by_step"] = _reactions_by_step(text)
    out["cpu"] = cpu_seconds(process.pid)
    return out


def _status(cluster: DevCluster) -> dict[str, Any]:
    out = cluster.kubectl("get", "gpustack", "gpus", "-o", "json", check=False).stdout
    return json.loads(out).get("status", {}) if out else {}


def _wait(what: str, check: Any, timeout: float, cluster: DevCluster) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(
                f"timed out after {timeout:.0f}s waiting for {what}: {_last}; "
                f"the API server says: {_cluster_side(cluster)}"
            )
        time.sleep(0.5)


def _cluster_side(cluster: DevCluster) -> dict[str, int]:
    """What the cluster shows, to tell a stuck operator from a slow cluster."""
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    pods = json.loads(
        cluster.kubectl("get", "pods", "-A", "-l", "gpuforge.io/component", "-o", "json").stdout
    )["items"]
    return {
        "nodes with nvidia.com/gpu": sum(
            1 for n in nodes if int((n["status"].get("capacity") or {}).get("nvidia.com/gpu", "0")) > 0
        ),
        "plugin pods": len(pods),
        "plugin pods ready": sum(
            1
            for p in pods
            if any(
                c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or []
            )
        ),
    }


_last: Any = None


def _done(cluster: DevCluster, nodes: int, mode: str) -> bool:
    global _last
    status = _status(cluster)
    upgrade = status.get("upgrade") or {}
    _last = {
        "phase": status.get("phase"),
        "nodes": upgrade.get("nodes"),
        "ready": status.get("nodesReady"),
    }
    return (
        status.get("phase") == "Ready"
        and status.get("nodesReady") == f"{nodes}/{nodes}"
        and bool(upgrade.get("complete"))
        and (mode != "dra" or status.get("operands", {}).get("devicePlugin") is None)
    )


def cli_command(cluster: DevCluster, command: str) -> list[str]:
    """`gpuforge <command> -o json` against the cluster, as a user runs it."""
    return [sys.executable, "-m", "gpuforge", command, "-o", "json", "--kubeconfig", str(cluster.kubeconfig)]


def cli_timing(cluster: DevCluster, command: str) -> dict[str, float]:
    """`gpuforge <command>` (status or plan) as a user runs it against the cluster: its wall time and its
    own CPU-seconds (user + system of the process)."""
    started = time.monotonic()
    process = subprocess.Popen(
        cli_command(cluster, command),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - started
    if os.waitstatus_to_exitcode(status) != 0:
        error = process.stderr.read().decode() if process.stderr else ""
        raise RuntimeError(f"gpuforge {command} failed: {error}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime}


def cli_profile(cluster: DevCluster, command: str, out: Path) -> None:
    """`gpuforge <command>` sampled by py-spy at 250 Hz, idle time included (it waits for the API server
    too), as collapsed stacks in `out`."""
    subprocess.run(
        [
            str(Path(sys.executable).with_name("py-spy")),
            "record",
            "--format",
            "raw",
            "--idle",
            "--rate",
            "250",
            "--output",
            str(out),
            "--",
            *cli_command(cluster, command),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,  # py-spy can lose the race to reap a quick child ("No child process") once done
    )
    if not out.exists() or out.stat().st_size == 0:
        raise RuntimeError(f"py-spy recorded nothing of gpuforge {command}")


def measure(
    nodes: int, log: Path | None = None, profile: Path | None = None, fleet_nice: int = 0
) -> dict[str, Any]:
    """One migration of `nodes` simulated nodes from the device plugin to DRA; the raw readings."""
    timings: dict[str, float] = {}
    with cluster_with_operator(
        "bench-upgrade", nodes, keep_log=log, timings=timings, fleet_nice=fleet_nice
    ) as (cluster, process):
        stack = {
            "apiVersion": "gpuforge.io/v1alpha1",
            "kind": "GpuStack",
            "metadata": {"name": "gpus"},
            "spec": {
                "mode": "devicePlugin",
                "upgradePolicy": {
                    "maxUnavailable": f"{MAX_UNAVAILABLE_PERCENT}%",
                    "maxParallel": 0,
                },
            },
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(stack))
        _wait(
            "the device plugin on every node",
            lambda: _done(cluster, nodes, "devicePlugin"),
            600 + nodes / 5,
            cluster,
        )
        time.sleep(2)
        before = _readings(process)
        rss_before = rss_mib(process.pid)
        profiler = None
        if profile:
            profiler = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("py-spy")),
                    "record",
                    "--pid",
                    str(process.pid),
                    "--format",
                    "raw",
                    "--gil",  # only the thread holding the GIL: where the operator's CPU goes
                    "--rate",
                    "25",
                    "--output",
                    str(profile),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        load = os.getloadavg()[0]
        cluster_cpu_before = control_plane_cpu_seconds(cluster)
        go_profiles = contextlib.ExitStack()
        if profile:
            for port_name, component in (("apiserver", "kube-apiserver"), ("kcm", "kube-controller-manager")):
                go_profiles.enter_context(
                    GoProfiles(cluster, port_name, profile.with_name(f"{profile.stem}-{component}"))
                )
        with go_profiles:
            started = time.monotonic()
            cluster.kubectl("patch", "gpustack", "gpus", "--type=merge", "-p", '{"spec":{"mode":"dra"}}')
            _wait("every node on DRA", lambda: _done(cluster, nodes, "dra"), 1800 + nodes / 2, cluster)
            wall = time.monotonic() - started
            load = max(load, os.getloadavg()[0])
            after = _readings(process)
            cluster_cpu = {
                component: round(used - cluster_cpu_before[component], 1)
                for component, used in control_plane_cpu_seconds(cluster).items()
                if component in cluster_cpu_before
            }
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(timeout=60)
        if log:  # the operator's metrics at the end, next to its log
            log.with_suffix(".metrics").write_text(process.metrics())
        peak = peak_rss_mib(process.pid)
        violations = len(cluster.violations())
        cli = {command: cli_timing(cluster, command) for command in ("status", "plan")}
        if profile:  # once more each, sampled (py-spy's own time stays out of the timings above)
            for command in ("status", "plan"):
                cli_profile(cluster, command, profile.with_name(f"{profile.stem}-{command}{profile.suffix}"))
        control_plane = control_plane_peaks_mib(cluster)
    return {
        "before": before,
        "after": after,
        "wall": wall,
        "load": load,
        "peak": peak,
        "rss_before": rss_before,
        "violations": violations,
        "up": timings["up"],
        "control_plane": control_plane,
        "control_plane_cpu": cluster_cpu,
        "cli": cli,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--log", type=Path, help="keep the operator's log here")
    parser.add_argument(
        "--profile",
        type=Path,
        help="sample the operator's Python CPU with py-spy during the migration into this file (collapsed"
        " stacks, for flame graphs; py-spy is a dev dependency); next to it, the API server's and the"
        " controller-manager's CPU profiles during the migration (pprof, in 30 s pieces) and `status` and"
        " `plan` sampled once each",
    )
    args = parser.parse_args()
    rows = upgrade_rows(args.nodes, measure(args.nodes, args.log, args.profile))
    write_rows(args.out, rows)
    for row in rows:
        print(f"{row['name']}: {row['value']} {row['unit']}")


def upgrade_rows(nodes: int, measured: dict[str, Any]) -> list[dict[str, Any]]:
    """The benchmark's rows from one measured migration."""
    batches = math.ceil(100 / MAX_UNAVAILABLE_PERCENT)
    before, after = measured["before"], measured["after"]
    wall, load, peak, violations = (
        measured["wall"],
        measured["load"],
        measured["peak"],
        measured["violations"],
    )
    diff = {name: after[name] - before[name] for name in SUMS}
    requests, operator_seconds, passes = diff["requests"], diff["passes_seconds"], diff["passes"]
    wake_delay, quick = diff["wake_delay"], diff["quick"]
    reaction, steps = diff["reaction"], diff["steps"]
    phases = {phase: diff[f"phase {phase}"] for phase in PHASES}
    operator_cpu = after["cpu"] - before["cpu"]
    by_step = {
        step: (
            total - before["by_step"].get(step, (0.0, 0.0))[0],
            n - before["by_step"].get(step, (0.0, 0.0))[1],
        )
        for step, (total, n) in after["by_step"].items()
    }
    added_per_batch = reaction / nodes  # a node cycle per batch: see the module docstring
    busy_per_batch = (operator_seconds + quick) / batches

    def mean(what: str) -> float:
        return diff[f"{what} sum"] / max(diff[f"{what} count"], 1)

    in_states = mean("in wait-old-gone") + mean("in validation-required")
    per_node = requests / nodes
    rows = [
        {
            "name": f"migration wall time, {nodes} nodes",
            "value": round(wall, 1),
            "unit": "s",
        },
        {
            "name": f"wall time per batch of {nodes // batches}",
            "value": round(wall / batches, 2),
            "unit": "s",
        },
        {
            "name": f"operator time added per batch of {nodes // batches}",
            "value": round(added_per_batch, 2),
            "unit": "s",
            "target": 2,
            "ok": added_per_batch < 2,
            "note": f"{int(steps)} steps, {reaction / max(steps, 1):.2f} s each on average",
        },
        *(
            {
                "name": f"  steps into {step}: {int(n)}, each on average",
                "value": round(total / max(n, 1), 2),
                "unit": "s",
            }
            for step, (total, n) in sorted(by_step.items())
            if n
        ),
        {
            "name": "  a node patch's round trip, on average",
            "value": round(mean("patch"), 3),
            "unit": "s",
            "note": f"{int(diff['patch count'])} node patches",
        },
        {
            "name": "  an event's round trip, on average (in the background)",
            "value": round(mean("event"), 3),
            "unit": "s",
        },
        {
            "name": "node cycle: time in wait-old-gone + validation-required, on average",
            "value": round(in_states, 2),
            "unit": "s",
            "note": "plus the admission's time, about the wall time per batch",
        },
        {
            "name": f"operator busy per batch of {nodes // batches} (whole passes + quick steps)",
            "value": round(busy_per_batch, 2),
            "unit": "s",
        },
        {
            "name": "  of which: whole passes",
            "value": round(operator_seconds / batches, 2),
            "unit": "s",
        },
        {
            "name": "  of which: quick steps (nodes that changed, planned and queued)",
            "value": round(quick / batches, 2),
            "unit": "s",
        },
        {
            "name": "  changes waiting for a whole pass (debounce, while nothing is in flight)",
            "value": round(wake_delay / batches, 2),
            "unit": "s",
        },
        *(
            {"name": f"  passes' {phase} phase", "value": round(seconds / batches, 2), "unit": "s"}
            for phase, seconds in phases.items()
        ),
        {
            "name": "reconcile passes during the migration",
            "value": int(passes),
            "unit": "passes",
        },
        {
            "name": f"operator CPU time per batch of {nodes // batches}",
            "value": round(operator_cpu / batches, 2),
            "unit": "s",
        },
        {
            "name": "API requests per node migrated",
            "value": round(per_node, 1),
            "unit": "requests",
            "target": 30,
            "ok": per_node < 30,
        },
        {"name": "operator peak memory", "value": round(peak, 1), "unit": "MiB"},
        {
            "name": "machine load (1-minute average, highest at the start or end of the migration)",
            "value": round(load, 1),
            "unit": "",
            "note": f"{os.cpu_count()} cores, shared with the control plane",
        },
        {
            "name": "moments a node advertised through both stacks",
            "value": violations,
            "unit": "moments",
            "target": 0,
            "ok": violations == 0,
        },
    ]
    return rows


if __name__ == "__main__":
    main()
