#!/usr/bin/env python3
"""Benchmark of the gpuforge.nodes collection: bootstrapping real Debian hosts with playbooks/site.yml.

Hosts are the test lab's podman containers (tests/ansible/lab.py) against the imitation NVIDIA repositories,
so the numbers measure Ansible, apt, dpkg and systemd work, not downloads. Measured:

- bootstrap of one node (wall time of site.yml);
- bootstrap of ten nodes in one run (target: under 2x one node, thanks to forks and SSH pipelining);
- an idempotent re-run on the ten nodes (target: under 30 s; it must also report no change).

Wall times depend on what else runs on the machine, so every run also reports figures that do not: CPU
seconds of the controller (ansible-playbook and its forks, ssh) and of the hosts (their containers' cgroups),
and the tasks that ran something on each host (tests/ansible/callback_plugins/gpuforge_work.py). From the
CPU seconds follows the fastest a ten-node run can be on this machine's cores; the ratio row says when that
floor, not Ansible, is what keeps the target out of reach.

    python bench/bench_ansible.py --out bench/results/ansible.json [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "tests/ansible/lab.py"
CALLBACKS = ROOT / "tests/ansible/callback_plugins"
BIN = Path(sys.executable).parent
HARDWARE = ("h100:8,nvswitch:4", "a100:2", "l40s:4", "l4:1", "t4:1")
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class Result:
    name: str
    value: float
    unit: str
    target: str | None = None
    ok: bool | None = None
    note: str | None = None


@dataclass
class Run:
    seconds: float
    changed: int
    failed: int
    controller_cpu: float  # CPU seconds of ansible-playbook, its forks and ssh
    host_cpu: float  # CPU seconds of all the hosts' containers together
    remote_runs: dict[str, int]  # per host: task results (loop items one by one) that ran on the host
    task_seconds: dict[str, float]

    @property
    def remote_runs_per_node(self) -> float:
        return sum(self.remote_runs.values()) / max(len(self.remote_runs), 1)


def lab(*args: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, str(LAB), *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out) if out.strip() else {}


def container_cpu_seconds(container: str) -> float:
    """CPU seconds a podman container used so far (its cgroup, descendants included; cgroup v1 or v2)."""
    path = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.CgroupPath}}", container],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    cpuacct = CGROUP_ROOT / "cpuacct" / path.lstrip("/") / "cpuacct.usage"
    if cpuacct.is_file():
        return int(cpuacct.read_text()) / 1e9
    for base in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        stat = base / path.lstrip("/") / "cpu.stat"
        if stat.is_file():
            usage = re.search(r"^usage_usec (\d+)", stat.read_text(), re.M)
            if usage:
                return int(usage.group(1)) / 1e6
    raise SystemExit(f"bench_ansible: no CPU accounting found for {container} ({path})")


def site(inventory: str, containers: list[str], work_dir: Path, label: str) -> Run:
    report = work_dir / f"{label}.work.json"
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "ANSIBLE_CALLBACK_PLUGINS": str(CALLBACKS),
        "ANSIBLE_CALLBACKS_ENABLED": "gpuforge_work",
        "GPUFORGE_WORK_REPORT": str(report),
    }
    hosts_before = sum(container_cpu_seconds(c) for c in containers)
    cpu_before = _children_cpu()
    start = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", inventory, "playbooks/site.yml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - start
    controller_cpu = _children_cpu() - cpu_before
    host_cpu = sum(container_cpu_seconds(c) for c in containers) - hosts_before
    (work_dir / f"{label}.log").write_text(proc.stdout + proc.stderr)
    recap = re.findall(r"changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout)
    if proc.returncode != 0 or not recap:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
        raise SystemExit(f"bench_ansible: site.yml failed (rc {proc.returncode})")
    work = json.loads(report.read_text())
    return Run(
        seconds=seconds,
        changed=sum(int(c) for c, _, _ in recap),
        failed=sum(int(u) + int(f) for _, u, f in recap),
        controller_cpu=controller_cpu,
        host_cpu=host_cpu,
        remote_runs=work["remote_runs"],
        task_seconds=work["task_seconds"],
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bootstrap(name: str, count: int, rerun: bool, work_dir: Path) -> tuple[Run, Run | None]:
    hosts = [f"--host={name}-{i + 1:02d}={HARDWARE[i % len(HARDWARE)]}" for i in range(count)]
    try:
        started = lab("up", "--name", name, *hosts)
        inventory = str(started["inventory"])
        containers = [str(h["container"]) for h in started["hosts"]]  # type: ignore[attr-defined]
        first = site(inventory, containers, work_dir, f"{name}-first")
        second = site(inventory, containers, work_dir, f"{name}-again") if rerun else None
        return first, second
    finally:
        lab("down", "--name", name)


def ratio_note(one: Run, ten: Run, cores: int) -> tuple[float, str]:
    """The best ten-vs-one ratio these cores allow, from CPU seconds only, and a sentence saying so.

    One node's run is a chain (controller fork, ssh, Python on the host, back) with little waiting, so on an
    idle machine it takes about its own CPU seconds; ten nodes need ten times the CPU spread over the cores.
    Both sides come from CPU seconds, so the floor does not move with the load of the machine.
    """
    one_cpu = one.controller_cpu + one.host_cpu
    cpu_per_node = (ten.controller_cpu + ten.host_cpu) / 10
    floor_ratio = 10 * cpu_per_node / cores / one_cpu
    note = (
        f"{cpu_per_node:.1f} CPU-s per node in the ten-node run ({ten.controller_cpu / 10:.1f} controller + "
        f"{ten.host_cpu / 10:.1f} host): ten nodes need >= {10 * cpu_per_node / cores:.0f} s on {cores} "
        f"cores, one node alone about its {one_cpu:.1f} CPU-s (it ran in {one.seconds:.0f} s): "
        f"best ratio on this machine {floor_ratio:.1f}x"
    )
    return floor_ratio, note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write the results to")
    parser.add_argument("--work-dir", type=Path, help="keep the playbook logs and work reports here")
    args = parser.parse_args(argv)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-ansible-"))
    work_dir.mkdir(parents=True, exist_ok=True)

    subprocess.run([sys.executable, str(LAB), "image"], check=True, stdout=subprocess.DEVNULL)
    # Context for reading the wall times: the hosts share this machine's cores with everything else running.
    load_before = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    one, _ = bootstrap("bench-one", 1, rerun=False, work_dir=work_dir)
    ten, again = bootstrap("bench-ten", 10, rerun=True, work_dir=work_dir)
    assert again is not None
    load_after = os.getloadavg()[0]
    ratio = ten.seconds / one.seconds
    floor_ratio, floor_note = ratio_note(one, ten, cores)
    ratio_ok = ratio < 2.0
    rerun_ok = again.seconds < 30 and again.changed == 0
    rerun_floor = (again.controller_cpu + again.host_cpu) / cores
    rerun_note = (
        f"{(again.controller_cpu + again.host_cpu) / 10:.1f} CPU-s per node "
        f"({again.remote_runs_per_node:.0f} module runs); at least {rerun_floor:.0f} s on {cores} idle "
        f"cores, load average {load_after:.1f} at the end"
    )
    results = [
        Result("ansible_bootstrap_one_node", round(one.seconds, 1), "s"),
        Result("ansible_bootstrap_ten_nodes", round(ten.seconds, 1), "s", "< 2x one node", ratio_ok),
        Result(
            "ansible_ten_vs_one_ratio",
            round(ratio, 2),
            "x",
            "< 2",
            ratio_ok,
            None if ratio_ok else f"not met: {floor_note}",
        ),
        Result("ansible_ten_vs_one_ratio_floor", round(floor_ratio, 2), "x", note=floor_note),
        Result(
            "ansible_idempotent_rerun_ten_nodes",
            round(again.seconds, 1),
            "s",
            "< 30 s, no change",
            rerun_ok,
            None if rerun_ok else f"not met: {rerun_note}",
        ),
        Result("ansible_idempotent_rerun_floor", round(rerun_floor, 1), "s", note=rerun_note),
        Result("ansible_idempotent_rerun_changes", again.changed, "tasks", "0", again.changed == 0),
        Result("ansible_bootstrap_one_node_controller_cpu", round(one.controller_cpu, 1), "cpu-s"),
        Result("ansible_bootstrap_one_node_host_cpu", round(one.host_cpu, 1), "cpu-s"),
        Result("ansible_bootstrap_ten_nodes_controller_cpu", round(ten.controller_cpu, 1), "cpu-s"),
        Result("ansible_bootstrap_ten_nodes_host_cpu", round(ten.host_cpu, 1), "cpu-s"),
        Result("ansible_rerun_ten_nodes_controller_cpu", round(again.controller_cpu, 1), "cpu-s"),
        Result("ansible_rerun_ten_nodes_host_cpu", round(again.host_cpu, 1), "cpu-s"),
        Result("ansible_bootstrap_remote_runs_per_node", round(ten.remote_runs_per_node, 1), "runs"),
        Result("ansible_rerun_remote_runs_per_node", round(again.remote_runs_per_node, 1), "runs"),
        Result("ansible_cpu_cores", float(cores), "cores"),
        Result("ansible_loadavg_at_start", round(load_before, 1), "load"),
        Result("ansible_loadavg_at_end", round(load_after, 1), "load"),
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    for r in results:
        print(f"{r.name:44} {r.value:>8} {r.unit:6} {r.target or '':20} {'' if r.ok is None else r.ok}")
    print(f"\nratio: {floor_note}")
    print(f"playbook logs and per-task times: {work_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
