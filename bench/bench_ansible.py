#!/usr/bin/env python3
"""Benchmark of the gpuforge.nodes collection: bootstrapping real Debian hosts with playbooks/site.yml.

Hosts are the test lab's podman containers (tests/ansible/lab.py) against the imitation NVIDIA repositories,
so the numbers measure Ansible, apt, dpkg and systemd work, not downloads. Measured:

- bootstrap of one node (wall time of site.yml);
- bootstrap of ten nodes in one run (target: under 2x one node, thanks to forks and SSH pipelining);
- an idempotent re-run on the ten nodes (target: under 30 s; it must also report no change).

    python bench/bench_ansible.py --out bench/results/ansible.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "tests/ansible/lab.py"
BIN = Path(sys.executable).parent
HARDWARE = ("h100:8,nvswitch:4", "a100:2", "l40s:4", "l4:1", "t4:1")


@dataclass
class Result:
    name: str
    value: float
    unit: str
    target: str | None = None
    ok: bool | None = None


@dataclass
class Run:
    seconds: float
    changed: int
    failed: int
    controller_cpu: float  # CPU seconds of ansible-playbook and its forks (not of the hosts)


def lab(*args: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, str(LAB), *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out) if out.strip() else {}


def site(inventory: str) -> Run:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}
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
    recap = re.findall(r"changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout)
    if proc.returncode != 0 or not recap:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
        raise SystemExit(f"bench_ansible: site.yml failed (rc {proc.returncode})")
    return Run(
        seconds=seconds,
        changed=sum(int(c) for c, _, _ in recap),
        failed=sum(int(u) + int(f) for _, u, f in recap),
        controller_cpu=_children_cpu() - cpu_before,
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bootstrap(name: str, count: int, rerun: bool) -> tuple[Run, Run | None]:
    hosts = [f"--host={name}-{i + 1:02d}={HARDWARE[i % len(HARDWARE)]}" for i in range(count)]
    try:
        inventory = str(lab("up", "--name", name, *hosts)["inventory"])
        first = site(inventory)
        second = site(inventory) if rerun else None
        return first, second
    finally:
        lab("down", "--name", name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write the results to")
    args = parser.parse_args(argv)

    subprocess.run([sys.executable, str(LAB), "image"], check=True, stdout=subprocess.DEVNULL)
    # Context for reading the numbers: the hosts share this machine's cores with everything else running.
    load_before = os.getloadavg()[0]
    one, _ = bootstrap("bench-one", 1, rerun=False)
    ten, again = bootstrap("bench-ten", 10, rerun=True)
    assert again is not None
    ratio = ten.seconds / one.seconds
    results = [
        Result("ansible_bootstrap_one_node", round(one.seconds, 1), "s"),
        Result("ansible_bootstrap_ten_nodes", round(ten.seconds, 1), "s", "< 2x one node", ratio < 2.0),
        Result("ansible_ten_vs_one_ratio", round(ratio, 2), "x", "< 2", ratio < 2.0),
        Result(
            "ansible_idempotent_rerun_ten_nodes",
            round(again.seconds, 1),
            "s",
            "< 30 s, no change",
            again.seconds < 30 and again.changed == 0,
        ),
        Result("ansible_idempotent_rerun_changes", again.changed, "tasks", "0", again.changed == 0),
        Result("ansible_ten_nodes_controller_cpu", round(ten.controller_cpu, 1), "cpu-s"),
        Result("ansible_cpu_cores", float(os.cpu_count() or 0), "cores"),
        Result("ansible_loadavg_at_start", round(load_before, 1), "load"),
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    for r in results:
        print(f"{r.name:40} {r.value:>8} {r.unit:6} {r.target or '':20} {'' if r.ok is None else r.ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
