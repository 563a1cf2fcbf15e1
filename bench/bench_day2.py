#!/usr/bin/env python3
"""Benchmark of the day-2 driver upgrade: the per-node overhead of playbooks/upgrade-driver.yml beyond the
driver install itself.

Two lab hosts (real Debian podman containers, tests/ansible/lab.py) bootstrapped on branch 570, paired with
two simulated Nodes of a local control plane running a simulated device plugin and GPU work
(tests/ansible/day2/).
The upgrade to 580 runs one node at a time with the ansible.posix.json callback; the overhead is the wall time
of the whole run minus the time spent in the nvidia_driver role's tasks (install, reboot, checks), per node:
preflight, marking, cordon, eviction, CDI refresh, plugin restart, waiting for the GPUs, validation, uncordon.
Target: under 20 s per node.

    python bench/bench_day2.py --out bench/results/day2.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "tests/ansible/lab.py"
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "tests/ansible/day2"))

import cluster  # noqa: E402  (tests/ansible/day2/cluster.py)
from report import Result, write_results  # noqa: E402

NODES = 2
LAB_NAME = "bench-day2"
TARGET_OVERHEAD_S = 20.0
DRIVER_ROLE = "/roles/nvidia_driver/"  # task paths (tasks and handlers) of the driver role


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        **extra,
    }


def _playbook(inventory: str, playbook: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", inventory, playbook, *args],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        check=False,
    )


def _seconds(duration: dict[str, str]) -> float:
    start, end = (datetime.fromisoformat(duration[key]) for key in ("start", "end"))
    return (end - start).total_seconds()


def driver_role_seconds(report: dict[str, Any]) -> float:
    """Time spent in the nvidia_driver role's tasks and handlers (hosts run one at a time: serial 1)."""
    return sum(
        _seconds(task["task"]["duration"])
        for play in report["plays"]
        for task in play["tasks"]
        if DRIVER_ROLE in task["task"]["path"] and "end" in task["task"]["duration"]
    )


def slowest_overhead_tasks(report: dict[str, Any], count: int = 12) -> list[tuple[str, float]]:
    """Where the overhead goes: seconds per task name outside the driver role, slowest first."""
    totals: dict[str, float] = {}
    for play in report["plays"]:
        for task in play["tasks"]:
            info = task["task"]
            if DRIVER_ROLE not in info["path"] and "end" in info["duration"]:
                totals[info["name"]] = totals.get(info["name"], 0.0) + _seconds(info["duration"])
    return sorted(totals.items(), key=lambda item: -item[1])[:count]


def failures(stdout: str) -> list[str]:
    """The messages of the failed tasks in a json-callback report."""
    try:
        report = json.loads(stdout)
    except ValueError:
        return [stdout[-2000:]]
    return [
        f"{host}: {result.get('msg', '')}"
        for play in report["plays"]
        for task in play["tasks"]
        for host, result in task["hosts"].items()
        if result.get("failed") and not result.get("ignore_errors")
    ]


def apply_workloads(kubeconfig: Path) -> None:
    from kubernetes import client, config, utils

    k8s_config: Any = config  # the client's loaders are untyped
    k8s_utils: Any = utils
    api = k8s_config.new_client_from_config(str(kubeconfig))
    k8s_utils.create_from_yaml(api, str(ROOT / "tests/ansible/day2/workloads.yml"))
    core: Any = client.CoreV1Api(api)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        gpus = [(node.status.allocatable or {}).get("nvidia.com/gpu") for node in core.list_node().items]
        if gpus == ["2"] * NODES:
            return
        time.sleep(1)
    raise SystemExit(f"bench_day2: the simulated device plugin did not advertise the GPUs: {gpus}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    hosts = [f"--host=gpu-{index}=l4:2" for index in range(NODES)]
    with tempfile.TemporaryDirectory(prefix="gpuforge-bench-day2-") as root:
        try:
            lab = json.loads(
                subprocess.run(
                    [sys.executable, str(LAB), "up", "--name", LAB_NAME, *hosts],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            )
            inventory = str(lab["inventory"])
            kubeconfig = cluster.up(Path(root), "bench", NODES)
            boot = _playbook(inventory, "playbooks/site.yml", "-e", "nvidia_driver_branch=570")
            if boot.returncode != 0:
                raise SystemExit(f"bench_day2: bootstrap failed:\n{boot.stdout[-3000:]}")
            apply_workloads(kubeconfig)
            started = time.monotonic()
            run = _playbook(
                inventory,
                "playbooks/upgrade-driver.yml",
                *("-e", "nvidia_driver_branch=580", "-e", f"driver_upgrade_kubeconfig={kubeconfig}"),
                *("-e", "driver_upgrade_serial=1", "-e", "nvidia_driver_reboot_timeout=120"),
                # A lab host "boots" when podman restarts its container (see molecule/shared/vars/lab.yml).
                *("-e", json.dumps({"nvidia_driver_reboot_boot_time_command": "stat -c %Z /proc/1"})),
                ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
            )
            total = time.monotonic() - started
            if run.returncode != 0:
                problems = failures(run.stdout) or [run.stderr[-2000:]]
                raise SystemExit("bench_day2: the upgrade failed: " + "; ".join(problems))
        finally:
            cluster.down(Path(root), "bench")
            subprocess.run([sys.executable, str(LAB), "down", "--name", LAB_NAME], check=False)

    report = json.loads(run.stdout)
    driver = driver_role_seconds(report)
    overhead = (total - driver) / NODES
    results = [
        Result("day2_upgrade_run", round(total, 1), "s"),
        Result("day2_driver_role", round(driver, 1), "s"),
        Result(
            "day2_overhead_per_node",
            round(overhead, 1),
            "s",
            target=f"< {TARGET_OVERHEAD_S:.0f} s",
            ok=overhead < TARGET_OVERHEAD_S,
        ),
    ]
    write_results(args.out, results)
    for result in results:
        print(f"{result.name:28} {result.value:8.1f} {result.unit}  {result.target or ''}")
    print(f"slowest tasks outside the driver role ({NODES} nodes):")
    for name, seconds in slowest_overhead_tasks(report):
        print(f"  {seconds:6.1f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
