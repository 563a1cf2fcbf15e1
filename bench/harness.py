"""What the operator benchmarks share (bench_operator, bench_upgrade): a local control plane with the
GpuStack CRD, the operator as a subprocess with its metrics on a free port, and readings of that process
(Prometheus metrics, peak memory, CPU time). Not a benchmark itself (run.py runs bench_*.py only).
"""

from __future__ import annotations

import base64
import os
import re
import socket
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import yaml

from gpuforge_lab.devcluster.cluster import DevCluster
from gpuforge_lab.devcluster.pools import uniform_pools

ROOT = Path(__file__).resolve().parents[1]
GPUFORGE = Path(sys.executable).with_name("gpuforge")
CRD = ROOT / "operator/deploy/crds/gpustacks.gpuforge.io.yaml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mib(pid: int) -> float:
    """The process's resident memory now (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def control_plane_peaks_mib(cluster: DevCluster) -> dict[str, float]:
    """Peak resident memory (VmHWM) of each process the cluster started, by component."""
    state = cluster.load_state()
    peaks: dict[str, float] = {}
    for component, record in (state.processes if state else {}).items():
        try:
            peaks[component] = round(peak_rss_mib(record.pid), 1)
        except OSError:
            continue
    return peaks


def control_plane_cpu_seconds(cluster: DevCluster) -> dict[str, float]:
    """CPU-seconds used so far by each process the cluster started, by component."""
    state = cluster.load_state()
    used: dict[str, float] = {}
    for component, record in (state.processes if state else {}).items():
        try:
            used[component] = cpu_seconds(record.pid)
        except OSError:
            continue
    return used


class GoProfiles:
    """CPU profiles (pprof) of one of the cluster's Go components while a `with` block runs, back to back
    in pieces of `piece` seconds: `<prefix>-1.pprof`, `-2`, ... The API server, the controller-manager and
    the scheduler serve /debug/pprof on their secure port to the admin's client certificate. Read them
    together: `go tool pprof -top <binary> <prefix>-*.pprof`."""

    def __init__(self, cluster: DevCluster, port_name: str, prefix: Path, piece: int = 30) -> None:
        state = cluster.load_state()
        if state is None:
            raise RuntimeError("no cluster state: the cluster is not up")
        self._component = port_name
        self._url = f"https://127.0.0.1:{state.ports[port_name]}/debug/pprof/profile?seconds={piece}"
        self._prefix = prefix
        self._piece = piece
        user = yaml.safe_load(cluster.kubeconfig.read_text())["users"][0]["user"]
        self._credentials = tempfile.TemporaryDirectory(prefix="gpuforge-pprof-")
        cert, key = Path(self._credentials.name, "client.crt"), Path(self._credentials.name, "client.key")
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        self._context = ssl.create_default_context()
        self._context.check_hostname = False  # loopback, self-signed serving certificate
        self._context.verify_mode = ssl.CERT_NONE
        self._context.load_cert_chain(cert, key)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.pieces: list[Path] = []
        self._errors: list[str] = []

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self._piece + 60)
        self._credentials.cleanup()
        if self._errors:  # a profile missing or short says why, not nothing
            print(
                f"{self._component} profile: {len(self._errors)} failed piece(s), last: {self._errors[-1]}",
                file=sys.stderr,
            )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self._url, context=self._context, timeout=self._piece + 60) as r:
                    data = r.read()
            except OSError as error:
                self._errors.append(str(error))
                self._stop.wait(5)
                continue
            piece = self._prefix.with_name(f"{self._prefix.name}-{len(self.pieces) + 1}.pprof")
            piece.write_bytes(data)
            self.pieces.append(piece)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def install_crd(cluster: DevCluster, timeout: float = 60) -> None:
    """Apply the GpuStack CRD and wait until it is served (`kubectl wait` can fail at once on a CRD the
    API server has only just stored: it is asked again)."""
    cluster.kubectl("apply", "--server-side", "-f", str(CRD))
    deadline = time.monotonic() + timeout
    while True:
        done = cluster.kubectl(
            "wait", "--for=condition=Established", "crd/gpustacks.gpuforge.io", "--timeout=10s", check=False
        )
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the GpuStack CRD is not served after {timeout:.0f}s: {done.stderr.strip()}")
        time.sleep(1)


@dataclass(frozen=True)
class Operator:
    """`gpuforge operator run` as a subprocess; its metrics on `metrics_port`."""

    process: subprocess.Popen[bytes]
    metrics_port: int

    @property
    def pid(self) -> int:
        return self.process.pid

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            return str(response.read().decode())

    def metric_sum(self, pattern: str, text: str | None = None) -> float:
        """The sum of the values captured by `pattern` (group 1) over the metrics (fetched unless given)."""
        text = self.metrics() if text is None else text
        return sum(float(m[1]) for m in re.finditer(pattern, text, re.MULTILINE))

    def requests(self) -> float:
        """The operator's own API requests (gpuforge_api_requests_total over every verb and resource)."""
        return self.metric_sum(r"^gpuforge_api_requests_total\{.*\} (\S+)$")


@contextmanager
def operator(cluster: DevCluster, log: Path) -> Iterator[Operator]:
    """Run the operator with the cluster's admin kubeconfig (not $KUBECONFIG) until the block ends; its
    output goes to `log`. Gives it 3 s to start its watches before the block begins."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(GPUFORGE),
                "operator",
                "run",
                f"--kubeconfig={cluster.kubeconfig}",
                "--bind=127.0.0.1",
                f"--metrics-port={port}",
                f"--liveness-port={free_port()}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        time.sleep(3)
        yield Operator(process, port)
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextmanager
def cluster_with_operator(
    name: str,
    nodes: int,
    keep_log: Path | None = None,
    timings: dict[str, float] | None = None,
    fleet_nice: int = 0,
) -> Iterator[tuple[DevCluster, Operator]]:
    """A local control plane of `nodes` uniform GPU nodes with the GpuStack CRD and the operator running;
    torn down when the block ends (the operator's log copied to `keep_log` first, if given). `timings`
    gets "up": the seconds from starting the control plane to every node Ready. `fleet_nice`: the
    simulated fleet's CPU priority (`DevCluster.up`)."""
    with tempfile.TemporaryDirectory(prefix=f"gpuforge-{name}-") as tmp:
        cluster = DevCluster(name, Path(tmp))
        up = cluster.up("1.36", uniform_pools(nodes), fleet_nice=fleet_nice)
        if timings is not None:
            timings["up"] = up
        log = Path(tmp) / "operator.log"
        try:
            install_crd(cluster)
            with operator(cluster, log) as process:
                yield cluster, process
        finally:
            try:
                if keep_log and log.exists():
                    keep_log.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(log, keep_log)
            finally:  # a log that cannot be kept must not leave the control plane running
                cluster.down()
