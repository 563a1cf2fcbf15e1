#!/usr/bin/env python3
"""The cluster side of the day-2 driver upgrade scenario and benchmark: start or stop a local control plane.

One pool `gpu` of simulated nodes gpu-0..gpu-N-1 (two L4 each, no taints), the Node twins of the lab hosts of
the same names. State lives under --root (not the user's ~/.local/state), so a scenario owns its cluster:

    cluster.py up --root DIR --name day2 --nodes 4     # prints the kubeconfig path
    cluster.py down --root DIR --name day2             # idempotent
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuforge_lab.devcluster.cluster import DevCluster
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

# The lab hosts' hardware (`lab.py up --host gpu-0=l4:2`), so a Node advertises the GPUs its host has.
L4_PAIR = GpuSpec(
    product="NVIDIA L4",
    count=2,
    memory_mib=23034,
    driver_version="570.172.08",
    cuda_version="12.8",
    compute_capability="8.9",
    architecture="Ada Lovelace",
    mig_capable=False,
)


def up(root: Path, name: str, nodes: int) -> Path:
    cluster = DevCluster(name, root)
    cluster.up("1.36", [Pool(name="gpu", count=nodes, gpu=L4_PAIR)])
    return cluster.kubeconfig


def down(root: Path, name: str) -> None:
    DevCluster(name, root).down()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--root", type=Path, required=True, help="state directory of the scenario's clusters")
    parser.add_argument("--name", default="day2")
    parser.add_argument("--nodes", type=int, default=4)
    args = parser.parse_args(argv)
    if args.command == "up":
        print(up(args.root, args.name, args.nodes))
    else:
        down(args.root, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
