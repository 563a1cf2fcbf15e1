"""Real kubelet nodes: how long one takes to join, and what it costs in memory.

Join: `DevCluster.up` with one kwok node and one real node, from the call to the real node Ready (the
control plane's own start included, as `gpuforge dev cluster up --real-nodes 1` takes it), median of
repeated runs with warm caches. Memory: resident set of the node's kubelet, containerd, containerd shims,
the pretend device plugin (registered, advertising) and the pause containers, read from the host's
/proc. Skipped (no rows) where rootful podman cannot boot hosts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from harness import install_crd, operator

from gpuforge_lab.devcluster import realnodes
from gpuforge_lab.devcluster.build import build_nodes
from gpuforge_lab.devcluster.cluster import DevCluster
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

# Process names counted as the node's Kubernetes stack, as /proc's comm gives them (15 characters at most).
STACK = ("kubelet", "containerd", "containerd-shim", "gpu-device-plug", "pause")


def plugin_pod(binaries_image: str) -> dict[str, object]:
    def host_path(name: str, path: str) -> dict[str, object]:
        return {"name": name, "hostPath": {"path": path}}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "device-plugin", "namespace": "default"},
        "spec": {
            "nodeSelector": {realnodes.REAL_NODE_LABEL: "true"},
            "runtimeClassName": "nvidia",
            "containers": [
                {
                    "name": "plugin",
                    "image": binaries_image,
                    "imagePullPolicy": "Never",
                    "env": [{"name": "DEVICE_LIST_STRATEGY", "value": "cdi-cri"}],
                    "volumeMounts": [
                        {"name": "plugins", "mountPath": "/var/lib/kubelet/device-plugins"},
                        {"name": "cdi", "mountPath": "/var/run/cdi"},
                    ],
                }
            ],
            "volumes": [
                host_path("plugins", "/var/lib/kubelet/device-plugins"),
                host_path("cdi", "/var/run/cdi"),
            ],
        },
    }


def node_processes(container: str) -> list[tuple[str, int]]:
    """(comm, RSS KiB) of every process in the host container."""
    out = subprocess.run(
        ["podman", "exec", container, "ps", "-eo", "comm=,rss="],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            rows.append((" ".join(parts[:-1]), int(parts[-1])))
    return rows


def switch_seconds(cluster: DevCluster, log: Path) -> tuple[float, float, str]:
    """The operator's GpuStack moves the real node from the device plugin to DRA: seconds from the mode
    change to the node offering its GPUs through DRA alone and uncordoned, the seconds of that spent with
    neither stack offering them, and the node's nvidia.com/gpu capacity at the end (the kubelet keeps a
    stopped plugin's devices in capacity for its grace period; the switch does not wait for it)."""
    stack = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": "switch"},
        "spec": {
            "mode": "devicePlugin",
            "namespace": "gpuforge-switch",
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": realnodes.REAL_NODE_LABEL, "operator": "Exists"}]}]},
            "devicePlugin": {"version": "v0.20.0", "image": realnodes.DEVICE_PLUGIN_REPOSITORY},
            "dra": {"version": "v25.12.0", "image": realnodes.DRA_PLUGIN_REPOSITORY},
            "upgradePolicy": {"maxUnavailable": 1},
        },
    }  # fmt: skip

    def node() -> tuple[str, int, bool, str]:
        got = json.loads(cluster.kubectl("get", "node", "real-0", "-o", "json").stdout)
        slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
        mine = sum(1 for item in slices if item["spec"].get("nodeName") == "real-0")
        status = got["status"]
        return (
            (status.get("allocatable") or {}).get("nvidia.com/gpu", "0"),
            mine,
            bool(got["spec"].get("unschedulable")),
            (status.get("capacity") or {}).get("nvidia.com/gpu", "0"),
        )

    install_crd(cluster)
    with operator(cluster, log):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(stack))
        deadline = time.monotonic() + 300
        while node()[:3] != ("2", 0, False):
            if time.monotonic() > deadline:
                raise SystemExit("the device plugin did not serve the real node within 300 s")
            time.sleep(0.5)
        patch = json.dumps({"spec": {"mode": "dra"}})
        started = time.monotonic()
        cluster.kubectl("patch", "gpustack", "switch", "--type", "merge", "-p", patch)
        dark = 0.0
        last = started
        while True:
            allocatable, slices, cordoned, capacity = node()
            now = time.monotonic()
            if allocatable == "0" and slices == 0:
                dark += now - last
            last = now
            if allocatable == "0" and slices and not cordoned:
                return now - started, dark, capacity
            if now - started > 300:
                raise SystemExit("the real node did not move to DRA within 300 s")
            time.sleep(0.25)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    if realnodes.can_boot_hosts() is not None:
        args.out.write_text(json.dumps(rows, indent=2))
        return
    load = Path("/proc/loadavg").read_text().split()[0]
    pools = [Pool("sim", 1), Pool("real", 1, GpuSpec(product="NVIDIA L4", count=2), real=True)]
    with tempfile.TemporaryDirectory() as root:
        joins = []
        for index in range(args.repeat):
            cluster = DevCluster(f"bench-real-{index}", Path(root))
            try:
                joins.append(cluster.up("1.36", pools))
            finally:
                if index < args.repeat - 1:
                    cluster.down()
        join = statistics.median(joins)
        rows.append(
            {
                "name": f"up to real node Ready (1 kwok + 1 real node, median of {args.repeat})",
                "value": round(join, 2),
                "unit": "s",
                "note": f"load average {load} at the start",
            }
        )
        try:
            image = realnodes.program_image_ref(build_nodes(), "gpu-device-plugin")
            # The operator would create the RuntimeClass; the node's containerd has the handler.
            runtime_class = {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": "nvidia"},
                "handler": "nvidia",
            }
            cluster.kubectl("apply", "-f", "-", input=json.dumps(runtime_class))
            deadline = time.monotonic() + 60
            # the namespace's default ServiceAccount appears a moment after the cluster is up
            while cluster.kubectl(
                "apply", "-f", "-", input=json.dumps(plugin_pod(image)), check=False
            ).returncode:
                if time.monotonic() > deadline:
                    raise SystemExit("the device plugin pod was not admitted within 60 s")
                time.sleep(1)
            deadline = time.monotonic() + 180
            jsonpath = "jsonpath={.status.allocatable.nvidia\\.com/gpu}"
            while cluster.kubectl("get", "node", "real-0", "-o", jsonpath).stdout != "2":
                if time.monotonic() > deadline:
                    raise SystemExit("the device plugin did not register within 180 s")
                time.sleep(0.5)
            processes = node_processes(realnodes.container_name(cluster.name, "real-0"))
            cluster.kubectl("delete", "pod", "-n", "default", "--all", "--wait=false")
            switch, dark, capacity = switch_seconds(cluster, Path(root) / "operator.log")
            rows.append(
                {
                    "name": "real node device plugin -> DRA switch, mode change to serving through DRA",
                    "value": round(switch, 1),
                    "unit": "s",
                    "target": 30,
                    "ok": switch < 30,
                    "note": f"{round(dark, 1)} s of it with neither stack offering GPUs; capacity still "
                    f"{capacity} at the end (the kubelet's grace, not waited for)",
                }
            )
        finally:
            cluster.down()
    stack = [p for p in processes if p[0].startswith(STACK)]
    for name in STACK:
        mine = [p for p in stack if p[0].startswith(name) and (name != "containerd" or p[0] == name)]
        rows.append(
            {
                "name": f"resident memory: {name} ({len(mine)} process{'es' if len(mine) != 1 else ''})",
                "value": round(sum(p[1] for p in mine) / 1024, 1),
                "unit": "MiB",
            }
        )
    rows.append(
        {
            "name": "resident memory: the node's kubelet, runtime and plugin together",
            "value": round(sum(p[1] for p in stack) / 1024, 1),
            "unit": "MiB",
            "note": "host systemd, journald and sshd not counted",
        }
    )
    args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
