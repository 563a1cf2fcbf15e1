"""Helpers for the upgrade engine's tests: the operator as a subprocess with its own ServiceAccount's
credentials (the shipped RBAC), restartable and killable, and a sampler checking the invariants.

The sampler reads the real cluster every few hundred milliseconds while a rollout runs and records every
moment an invariant is broken; the simulated node agent records, on its side, every moment a node
advertised through both stacks (`DevCluster.violations()`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

OPERATOR_DIR = Path(__file__).parents[3]
DEPLOY = OPERATOR_DIR / "deploy"
GPUFORGE = Path(sys.executable).with_name("gpuforge")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r:.800})")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def service_account_kubeconfig(cluster: Any, path: Path) -> Path:
    """Install the shipped CRD, namespace, ServiceAccount and RBAC; return a kubeconfig of that account."""
    for name in ("crds/gpustacks.gpuforge.io.yaml", "namespace.yaml", "serviceaccount.yaml", "rbac.yaml"):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(DEPLOY / name))
    cluster.kubectl("wait", "--for=condition=Established", "crd/gpustacks.gpuforge.io", "--timeout=60s")
    token = cluster.kubectl(
        "create", "token", "gpuforge-operator", "-n", "gpuforge-system", "--duration=3h"
    ).stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    server = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [server],
        "users": [{"name": "gpuforge-operator", "user": {"token": token}}],
        "contexts": [
            {"name": "operator", "context": {"cluster": server["name"], "user": "gpuforge-operator"}}
        ],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Operator:
    """`gpuforge operator run` as a subprocess; `kill()` is SIGKILL (no clean shutdown), `start()` again."""

    kubeconfig: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    starts: int = 0

    def start(self) -> None:
        self.metrics_port, liveness_port = _free_port(), _free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBECONFIG", None)
        command = [
            str(GPUFORGE),
            "operator",
            "run",
            f"--kubeconfig={self.kubeconfig}",
            "--bind=127.0.0.1",
            f"--metrics-port={self.metrics_port}",
            f"--liveness-port={liveness_port}",
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.starts += 1

        def alive() -> bool:
            assert self.process is not None and self.process.poll() is None, self.log_tail()
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{liveness_port}/healthz", timeout=2).close()
            except OSError:
                return False
            return True

        wait_for("the operator's liveness endpoint", alive, timeout=60)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def operator_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Any], Operator]]:
    started: list[Operator] = []

    def make(cluster: Any) -> Operator:
        workdir = tmp_path_factory.mktemp("upgrade-operator")
        handle = Operator(service_account_kubeconfig(cluster, workdir / "kubeconfig"), workdir / "op.log")
        handle.start()
        started.append(handle)
        return handle

    yield make
    for handle in started:
        handle.stop()
        sys.stderr.write(f"\n--- operator log tail ---\n{handle.log_tail(20)}\n")


# --- reading the cluster ------------------------------------------------------------------------------


def kube_json(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def stack_status(cluster: Any, name: str) -> dict[str, Any]:
    result = cluster.kubectl("get", "gpustack", name, "-o", "json", check=False)
    return json.loads(result.stdout).get("status", {}) if result.returncode == 0 else {}


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def apply(cluster: Any, document: dict[str, Any] | str) -> None:
    text = document if isinstance(document, str) else yaml.safe_dump(document)
    cluster.kubectl("apply", "-f", "-", input=text)


def merge_patch_stack(cluster: Any, name: str, patch: dict[str, Any]) -> None:
    cluster.kubectl("patch", "gpustack", name, "--type=merge", "-p", json.dumps(patch))


@dataclass
class NodeSample:
    unschedulable: bool
    gpus: int  # nvidia.com/gpu allocatable
    slices: int  # gpu.nvidia.com ResourceSlices
    labels: dict[str, str]

    @property
    def advertises(self) -> bool:
        return self.gpus > 0 or self.slices > 0


def sample_nodes(api_client: Any) -> dict[str, NodeSample]:
    from kubernetes import client

    core: Any = client.CoreV1Api(api_client)
    custom: Any = client.CustomObjectsApi(api_client)
    slices: dict[str, int] = {}
    for version in ("v1", "v1beta2", "v1beta1"):
        try:
            items = custom.list_cluster_custom_object("resource.k8s.io", version, "resourceslices")["items"]
        except client.ApiException:
            continue
        for item in items:
            if item["spec"].get("driver") == "gpu.nvidia.com" and item["spec"].get("nodeName"):
                slices[item["spec"]["nodeName"]] = slices.get(item["spec"]["nodeName"], 0) + 1
        break
    out = {}
    for node in core.list_node().items:
        allocatable = (node.status.allocatable or {}).get("nvidia.com/gpu", "0")
        out[node.metadata.name] = NodeSample(
            bool(node.spec.unschedulable),
            int(allocatable),
            slices.get(node.metadata.name, 0),
            dict(node.metadata.labels or {}),
        )
    return out


@dataclass
class Sampler:
    """Checks the invariants at every sampled moment of a rollout, in a background thread."""

    cluster: Any
    nodes: set[str]
    max_unavailable: int
    cordoned_by_others: set[str] = field(default_factory=set)
    interval: float = 0.3
    samples: int = 0
    broken: list[str] = field(default_factory=list)
    peak_out_of_service: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with self.cluster.api_client() as api_client:
            while not self._stop.is_set():
                try:
                    self.check(sample_nodes(api_client))
                except Exception as error:  # the control plane may be restarting: try again
                    self.errors.append(str(error))
                self._stop.wait(self.interval)

    def check(self, view: dict[str, NodeSample]) -> None:
        self.samples += 1
        moment = time.strftime("%H:%M:%S")
        mine = {n: s for n, s in view.items() if n in self.nodes}
        both = sorted(n for n, s in mine.items() if s.gpus > 0 and s.slices > 0)
        if both:
            self.broken.append(f"{moment}: nodes advertise through both stacks: {both}")
        out = sorted(n for n, s in mine.items() if s.unschedulable or not s.advertises)
        self.peak_out_of_service = max(self.peak_out_of_service, len(out))
        if len(out) > self.max_unavailable:
            self.broken.append(
                f"{moment}: {len(out)} nodes out of service (max {self.max_unavailable}): {out}"
            )
        for name in self.cordoned_by_others:
            if not mine[name].unschedulable:
                self.broken.append(f"{moment}: {name}, cordoned by someone else, was uncordoned")

    def assert_kept(self) -> None:
        assert self.samples > 10, f"too few samples ({self.samples})"
        assert not self.broken, "\n".join(self.broken[:20])
