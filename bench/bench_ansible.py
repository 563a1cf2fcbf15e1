#!/usr/bin/env python3
"""Benchmark of the gpuforge.nodes collection: bootstrapping real Debian hosts with playbooks/site.yml.

Hosts are the test lab's podman containers (tests/ansible/lab.py) against the imitation NVIDIA repositories,
so the numbers measure Ansible, apt, dpkg and systemd work, not downloads. For each fleet size (default 1, 2,
5 and 10 nodes, each on fresh hosts) it bootstraps the nodes in one run and then runs site.yml again. Targets:

- ten nodes in one run: under 2x the time of one node (thanks to forks and SSH pipelining);
- the idempotent re-run on ten nodes: under 30 s, with no change.

Wall times depend on what else runs on the machine, so every run also reports figures that do not: CPU
seconds of the controller (ansible-playbook and its forks, ssh) and of the hosts (their containers' cgroups),
the module runs and the tasks per node (tests/ansible/callback_plugins/gpuforge_work.py). The lab's hosts
share this machine's cores with the controller, so from the CPU seconds follow the fastest a run can be here
(the floors), how busy the cores were with our work (busy share: near 1 means CPU-bound, nothing waits in
series), and a model of the ten-vs-one ratio for hosts that bring their own CPUs, as in a real fleet.

    python bench/bench_ansible.py --out bench/results/ansible.json [--nodes 1,10] [--work-dir DIR] [--mitogen]
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
from dataclasses import dataclass
from pathlib import Path

from report import Result, write_results

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "tests/ansible/lab.py"
CALLBACKS = ROOT / "tests/ansible/callback_plugins"
BIN = Path(sys.executable).parent
HARDWARE = ("h100:8,nvswitch:4", "a100:2", "l40s:4", "l4:1", "t4:1")
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class Run:
    nodes: int
    seconds: float
    changed: int
    failed: int
    controller_cpu: float  # CPU seconds of ansible-playbook, its forks and ssh
    host_cpu: float  # CPU seconds of all the hosts' containers together
    remote_runs: dict[str, int]  # per host: task results (loop items one by one) that ran on the host
    tasks: dict[str, int]  # per host: tasks the controller evaluated, skipped ones included
    task_seconds: dict[str, float]

    @property
    def cpu(self) -> float:
        return self.controller_cpu + self.host_cpu

    @property
    def remote_runs_per_node(self) -> float:
        return sum(self.remote_runs.values()) / max(len(self.remote_runs), 1)

    @property
    def tasks_per_node(self) -> float:
        return sum(self.tasks.values()) / max(len(self.tasks), 1)

    def busy_share(self, cores: int) -> float:
        """Share of the cores' time this run's own work filled (1: CPU-bound, nothing waited in series)."""
        return self.cpu / (self.seconds * cores)

    def summary(self, cores: int) -> str:
        return (
            f"{self.nodes} node(s) in {self.seconds:.1f} s: "
            f"{self.controller_cpu / self.nodes:.2f} controller + "
            f"{self.host_cpu / self.nodes:.2f} host CPU-s, "
            f"{self.remote_runs_per_node:.0f} module runs and {self.tasks_per_node:.0f} tasks per node; "
            f"busy share of {cores} cores {self.busy_share(cores):.2f}"
        )


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


def mitogen_env() -> dict[str, str]:
    """Settings that run the playbooks under the Mitogen strategy: an optional accelerator, no dependency."""
    try:
        import ansible_mitogen  # type: ignore[import-not-found]
    except ImportError:
        raise SystemExit("bench_ansible: --mitogen needs the mitogen package (pip install mitogen)") from None
    strategies = Path(ansible_mitogen.__file__).parent / "plugins/strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": str(strategies), "ANSIBLE_STRATEGY": "mitogen_linear"}


def site(inventory: str, containers: list[str], work_dir: Path, label: str, extra_env: dict[str, str]) -> Run:
    report = work_dir / f"{label}.work.json"
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "ANSIBLE_CALLBACK_PLUGINS": str(CALLBACKS),
        "ANSIBLE_CALLBACKS_ENABLED": "gpuforge_work",
        "GPUFORGE_WORK_REPORT": str(report),
        **extra_env,
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
        nodes=len(containers),
        seconds=seconds,
        changed=sum(int(c) for c, _, _ in recap),
        failed=sum(int(u) + int(f) for _, u, f in recap),
        controller_cpu=controller_cpu,
        host_cpu=host_cpu,
        remote_runs=work["remote_runs"],
        tasks=work["tasks"],
        task_seconds=work["task_seconds"],
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bootstrap(count: int, work_dir: Path, extra_env: dict[str, str]) -> tuple[Run, Run]:
    """Bootstrap `count` fresh nodes in one run, then run site.yml on them again."""
    name = f"bench-{count}"
    hosts = [f"--host={name}-{i + 1:02d}={HARDWARE[i % len(HARDWARE)]}" for i in range(count)]
    try:
        started = lab("up", "--name", name, *hosts)
        inventory = str(started["inventory"])
        containers = [str(h["container"]) for h in started["hosts"]]  # type: ignore[attr-defined]
        first = site(inventory, containers, work_dir, f"{name}-first", extra_env)
        again = site(inventory, containers, work_dir, f"{name}-again", extra_env)
        return first, again
    finally:
        lab("down", "--name", name)


def ratio_floor(one: Run, ten: Run, cores: int) -> tuple[float, str]:
    """The best ten-vs-one ratio these cores allow, from CPU seconds only, and a sentence saying so.

    One node's run is a chain (controller fork, ssh, Python on the host, back) with little waiting, so on an
    idle machine it takes about its own CPU seconds; ten nodes need ten times the CPU spread over the cores.
    Both sides come from CPU seconds, so the floor does not move with the load of the machine.
    """
    floor_ratio = ten.cpu / cores / one.cpu
    note = (
        f"{ten.cpu / 10:.1f} CPU-s per node in the ten-node run ({ten.controller_cpu / 10:.1f} controller + "
        f"{ten.host_cpu / 10:.1f} host): ten nodes need >= {ten.cpu / cores:.0f} s on {cores} cores, "
        f"one node alone about its {one.cpu:.1f} CPU-s (it ran in {one.seconds:.0f} s): "
        f"best ratio here {floor_ratio:.1f}x"
    )
    return floor_ratio, note


def ratio_fleet_model(one: Run, ten: Run, cores: int) -> tuple[float, str]:
    """Model (not a measurement) of the ratio when every host does its own work on its own CPUs.

    In a fleet the hosts' work runs in parallel on their own machines; only the controller is shared. Ten
    nodes then take one node's time plus the controller CPU the nine extra nodes add, spread over the
    controller's cores (here this machine's). Conservative: nothing of that extra work is assumed to overlap
    with the hosts' work or with waiting.
    """
    extra = max(ten.controller_cpu - one.controller_cpu, 0.0) / cores
    model = (one.seconds + extra) / one.seconds
    note = (
        f"model, not a measurement: one node's {one.seconds:.0f} s + the controller CPU of nine more nodes "
        f"({ten.controller_cpu - one.controller_cpu:.1f} CPU-s) over {cores} controller cores = "
        f"{one.seconds + extra:.0f} s, {model:.2f}x; assumes each host works on its own CPUs as in a fleet"
    )
    return model, note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write the results to")
    parser.add_argument("--work-dir", type=Path, help="keep the playbook logs and work reports here")
    parser.add_argument(
        "--nodes",
        default="1,2,5,10",
        help="fleet sizes to bootstrap, comma-separated; 1 and 10 give the target rows (default: 1,2,5,10)",
    )
    parser.add_argument(
        "--mitogen",
        action="store_true",
        help="run the playbooks under the Mitogen strategy (needs mitogen installed)",
    )
    args = parser.parse_args(argv)
    sizes = sorted({int(n) for n in args.nodes.split(",")})
    if not {1, 10} <= set(sizes):
        parser.error("--nodes must include 1 and 10")
    extra_env = mitogen_env() if args.mitogen else {}
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-ansible-"))
    work_dir.mkdir(parents=True, exist_ok=True)

    subprocess.run([sys.executable, str(LAB), "image"], check=True, stdout=subprocess.DEVNULL)
    # Context for reading the wall times: the hosts share this machine's cores with everything else running.
    load_before = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    runs = {n: bootstrap(n, work_dir, extra_env) for n in sizes}
    load_after = os.getloadavg()[0]
    (one, _), (ten, again) = runs[1], runs[10]

    ratio = ten.seconds / one.seconds
    floor, floor_note = ratio_floor(one, ten, cores)
    model, model_note = ratio_fleet_model(one, ten, cores)
    ratio_ok = ratio < 2.0
    rerun_ok = again.seconds < 30 and again.changed == 0
    rerun_floor = again.cpu / cores
    rerun_note = (
        f"{again.cpu / 10:.1f} CPU-s per node ({again.controller_cpu / 10:.2f} controller + "
        f"{again.host_cpu / 10:.2f} host; {again.remote_runs_per_node:.0f} module runs, "
        f"{again.tasks_per_node:.0f} tasks); at least {rerun_floor:.0f} s on {cores} idle cores, "
        f"load average {load_after:.1f} at the end"
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
            None if ratio_ok else floor_note,
        ),
        Result("ansible_ten_vs_one_ratio_floor", round(floor, 2), "x", note=floor_note),
        Result("ansible_ten_vs_one_ratio_fleet_model", round(model, 2), "x", note=model_note),
        Result(
            "ansible_idempotent_rerun_ten_nodes",
            round(again.seconds, 1),
            "s",
            "< 30 s, no change",
            rerun_ok,
            rerun_note,
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
        Result("ansible_bootstrap_tasks_per_node", round(ten.tasks_per_node, 1), "tasks"),
        Result("ansible_rerun_remote_runs_per_node", round(again.remote_runs_per_node, 1), "runs"),
        Result("ansible_rerun_tasks_per_node", round(again.tasks_per_node, 1), "tasks"),
    ]
    # The scaling curve: wall time and CPU per node for each fleet size, first run and re-run.
    for n, (first, rerun) in runs.items():
        for label, run in (("bootstrap", first), ("rerun", rerun)):
            prefix = f"ansible_scaling_{label}_{n}_nodes"
            results += [
                Result(prefix, round(run.seconds, 1), "s", note=run.summary(cores)),
                Result(f"{prefix}_cpu_per_node", round(run.cpu / n, 2), "cpu-s"),
                Result(f"{prefix}_busy_share", round(run.busy_share(cores), 2), "share"),
            ]
    results += [
        Result("ansible_cpu_cores", float(cores), "cores"),
        Result("ansible_mitogen", float(args.mitogen), "bool"),
        Result("ansible_loadavg_at_start", round(load_before, 1), "load"),
        Result("ansible_loadavg_at_end", round(load_after, 1), "load"),
    ]
    write_results(args.out, results)
    for r in results:
        print(f"{r.name:52} {r.value:>8} {r.unit:6} {r.target or '':20} {'' if r.ok is None else r.ok}")
    print()
    for first, rerun in runs.values():
        print(f"bootstrap {first.summary(cores)}\nre-run    {rerun.summary(cores)}")
    print(f"\nratio: {floor_note}\nfleet: {model_note}")
    print(f"playbook logs and per-task times: {work_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
