#!/usr/bin/env python3
"""Benchmark of the gpuforge.nodes collection: bootstrapping real Debian hosts with playbooks/site.yml.

Hosts are the test lab's podman containers (tests/ansible/lab.py) against the imitation NVIDIA repositories,
so the numbers measure Ansible, apt, dpkg and systemd work, not downloads. For each fleet size (default 1 and
10 nodes, each on fresh hosts) it bootstraps the nodes in one run and then runs site.yml again.

The figure that decides how large a fleet one controller can serve is the controller's CPU per node: its
process tree's CPU seconds (ansible-playbook, its forked workers, the ssh clients and the ssh ControlPersist
masters), not wall time, which on this shared machine mostly measures everything else running. Targets, from
the ten-node runs:

- controller CPU per node, bootstrap: < 8 CPU-s;
- controller CPU per node, idempotent re-run: < 2 CPU-s;
- the idempotent re-run on ten nodes: under 30 s, with no change.

From these a fleet model (labelled as a model, not a measurement) estimates the wall time of 1,000 nodes at
forks 50. The hosts' CPU (their containers' cgroups), module runs and tasks per node
(tests/ansible/callback_plugins/gpuforge_work.py) are reported beside them.

    python bench/bench_ansible.py --out bench/results/ansible.json [--nodes 1,10] [--work-dir DIR] [--mitogen]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import signal
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


def _proc_cpu_seconds(pid: str) -> float:
    """CPU seconds of a live process and of its children it waited for (/proc/<pid>/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime, stime, cutime, cstime: fields 14-17 of stat(5), 12-15 after the command name.
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def ssh_masters(control_dir: Path) -> list[str]:
    """PIDs of the ssh ControlPersist masters whose sockets live in control_dir."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"ssh") and any(str(control_dir).encode() in a for a in args):
            pids.append(cmdline.parent.name)
    return pids


def site(inventory: str, containers: list[str], work_dir: Path, label: str, extra_env: dict[str, str]) -> Run:
    """One ansible-playbook run of site.yml; the controller's CPU is its whole process tree's.

    That tree is ansible-playbook, its forked workers, the ssh clients they start and the ssh ControlPersist
    masters, which detach from it (so the kernel's children accounting misses them): each run gets its own
    ControlPath directory, and its masters' CPU is read before they are stopped at the end of the run.
    """
    report = work_dir / f"{label}.work.json"
    control_dir = Path(tempfile.mkdtemp(prefix="cp-", dir="/tmp"))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "ANSIBLE_CALLBACK_PLUGINS": str(CALLBACKS),
        "ANSIBLE_CALLBACKS_ENABLED": "gpuforge_work",
        "GPUFORGE_WORK_REPORT": str(report),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir),
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
    masters = ssh_masters(control_dir)
    controller_cpu = _children_cpu() - cpu_before + sum(_proc_cpu_seconds(pid) for pid in masters)
    for pid in masters:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGTERM)
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


FLEET_NODES = 1000
FLEET_FORKS = 50


def fleet_model(one: Run, ten: Run, controller_cores: int) -> tuple[float, str]:
    """Model (not a measurement): wall seconds for FLEET_NODES nodes at FLEET_FORKS forks.

    Two resources bound a run. The controller: every node costs it ten.controller_cpu / 10 CPU seconds,
    spread over its cores, whatever the forks. The hosts: in a fleet each host works on its own CPUs,
    FLEET_FORKS at a time, and a batch takes about one node's run alone (one.seconds, which includes that
    node's controller work, so it is an upper bound). The run takes at least the larger of the two; the model
    is that larger one (the other overlaps with it), and the note gives the sum, the bound with no overlap.
    """
    per_node = ten.controller_cpu / ten.nodes
    controller_bound = FLEET_NODES * per_node / controller_cores
    hosts_bound = -(-FLEET_NODES // FLEET_FORKS) * one.seconds
    model = max(controller_bound, hosts_bound)
    note = (
        f"model, not a measurement: {FLEET_NODES} nodes x {per_node:.2f} controller CPU-s over "
        f"{controller_cores} cores = {controller_bound:.0f} s; {FLEET_NODES // FLEET_FORKS} batches of "
        f"{FLEET_FORKS} forks x one node's {one.seconds:.0f} s = {hosts_bound:.0f} s; the larger "
        f"({'controller' if controller_bound >= hosts_bound else 'hosts'}), {model / 60:.0f} min; "
        f"no overlap at all: {(controller_bound + hosts_bound) / 60:.0f} min"
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
        default="1,10",
        help="fleet sizes to bootstrap, comma-separated; 1 and 10 give the target rows (default: 1,10)",
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

    boot_cpu = ten.controller_cpu / ten.nodes
    rerun_cpu = again.controller_cpu / again.nodes
    boot_model, boot_note = fleet_model(one, ten, cores)
    rerun_model, rerun_model_note = fleet_model(runs[1][1], again, cores)
    rerun_ok = again.seconds < 30 and again.changed == 0
    rerun_note = (
        f"{again.cpu / 10:.1f} CPU-s per node ({rerun_cpu:.2f} controller + {again.host_cpu / 10:.2f} host; "
        f"{again.remote_runs_per_node:.0f} module runs, {again.tasks_per_node:.0f} tasks); "
        f"load average {load_after:.1f} at the end"
    )
    boot_cpu_note = (
        f"ten nodes: {ten.controller_cpu:.1f} controller CPU-s in {ten.seconds:.0f} s "
        f"({ten.remote_runs_per_node:.0f} module runs, {ten.tasks_per_node:.0f} tasks per node); "
        f"one node alone: {one.controller_cpu:.1f}"
    )
    results = [
        Result(
            "ansible_controller_cpu_per_node_bootstrap",
            round(boot_cpu, 2),
            "cpu-s",
            "< 8",
            boot_cpu < 8,
            boot_cpu_note,
        ),
        Result(
            "ansible_controller_cpu_per_node_rerun",
            round(rerun_cpu, 2),
            "cpu-s",
            "< 2",
            rerun_cpu < 2,
            rerun_note,
        ),
        Result(
            "ansible_idempotent_rerun_ten_nodes",
            round(again.seconds, 1),
            "s",
            "< 30 s, no change",
            rerun_ok,
            rerun_note,
        ),
        Result("ansible_idempotent_rerun_changes", again.changed, "tasks", "0", again.changed == 0),
        Result(
            "ansible_fleet_model_1000_nodes_forks_50_bootstrap",
            round(boot_model / 60, 1),
            "min",
            note=boot_note,
        ),
        Result(
            "ansible_fleet_model_1000_nodes_forks_50_rerun",
            round(rerun_model / 60, 1),
            "min",
            note=rerun_model_note,
        ),
        Result("ansible_bootstrap_one_node", round(one.seconds, 1), "s"),
        Result("ansible_bootstrap_ten_nodes", round(ten.seconds, 1), "s"),
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
    print(f"\nfleet bootstrap: {boot_note}\nfleet re-run: {rerun_model_note}")
    print(f"playbook logs and per-task times: {work_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
