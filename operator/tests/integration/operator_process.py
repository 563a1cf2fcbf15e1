"""The operator as its tests run it: `gpuforge operator run` as a subprocess with the credentials of its own
ServiceAccount (a TokenRequest token), bound to exactly the shipped RBAC (operator/deploy/rbac.yaml), so
a missing permission fails the tests. Shared by the operator's and the upgrade engine's integration tests.

Kept under tests/ rather than in the `gpuforge_lab.testing` plugin: only tests use it (the benchmarks run the
operator with the admin kubeconfig and measure the process themselves), and the shipped package should
not carry test plumbing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.clock import wait_for  # one for the whole suite: imported from here by the tests
from gpuforge_lab.devcluster.cluster import free_ports

OPERATOR_DIR = Path(__file__).parents[2]
DEPLOY = OPERATOR_DIR / "deploy"
GPUFORGE = Path(sys.executable).with_name("gpuforge")
SHIPPED_MANIFESTS = ("crds/gpustacks.gpuforge.io.yaml", "namespace.yaml", "serviceaccount.yaml", "rbac.yaml")


def free_port() -> int:
    return free_ports(1)[0]


# --- reading the cluster through kubectl ------------------------------------------------------------


def kube_json(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def stack_status(cluster: Any, name: str) -> dict[str, Any]:
    """The GpuStack's status, {} if it (or its status) does not exist."""
    result = cluster.kubectl("get", "gpustack", name, "-o", "json", check=False)
    return json.loads(result.stdout).get("status", {}) if result.returncode == 0 else {}


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


# --- the operator's credentials and process ---------------------------------------------------------


def service_account_kubeconfig(cluster: Any, path: Path) -> Path:
    """Install the shipped CRD, namespace, ServiceAccount and RBAC; return a kubeconfig of that account.

    `--force-conflicts`: the shipped manifests win over any earlier apply of them (a test that applied
    the CRD alone, or a cluster reused by several modules)."""
    for name in SHIPPED_MANIFESTS:
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
    """`gpuforge operator run` as a subprocess. `start()` waits for its liveness endpoint; `kill()` is
    SIGKILL (no clean shutdown: what a crash or an OOM kill does); `start()` again resumes it. The log of
    every start is appended to `log`."""

    kubeconfig: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    liveness_port: int = 0
    starts: int = 0

    def start(self) -> Operator:
        self.metrics_port, self.liveness_port = free_ports(2)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBECONFIG", None)
        command = [
            str(GPUFORGE),
            "operator",
            "run",
            f"--kubeconfig={self.kubeconfig}",
            "--bind=127.0.0.1",
            f"--metrics-port={self.metrics_port}",
            f"--liveness-port={self.liveness_port}",
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.starts += 1
        process, healthz = self.process, f"http://127.0.0.1:{self.liveness_port}/healthz"

        def alive() -> bool:
            assert process.poll() is None, f"operator exited:\n{self.log_tail()}"
            try:
                urllib.request.urlopen(healthz, timeout=2).close()
            except OSError:
                return False
            return True

        wait_for("the operator's liveness endpoint", alive, timeout=60)
        return self

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

    def passes(self, stack: str) -> float:
        """Whole passes over GpuStack `stack` this process has finished (gpuforge_reconciles_total)."""
        total = 0.0
        for line in self.metrics().splitlines():
            match = re.match(r"gpuforge_reconciles_total\{(.*)\} ([0-9.e+]+)$", line)
            if match and dict(re.findall(r'(\w+)="([^"]*)"', match[1])) == {"stack": stack, "result": "ok"}:
                total += float(match[2])
        return total

    def log_tail(self, lines: int = 60) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


# The name test_gpustack.py used for the handle.
OperatorProcess = Operator


def start_operator(kubeconfig: Path, log: Path) -> Operator:
    return Operator(kubeconfig, log).start()


def stop_operator(handle: Operator) -> None:
    handle.stop()


@contextmanager
def running_operator(cluster: Any, workdir: Path) -> Iterator[Operator]:
    """The operator with its ServiceAccount's credentials on `cluster` for the `with` block; its log's
    tail goes to stderr afterwards."""
    handle = start_operator(service_account_kubeconfig(cluster, workdir / "kubeconfig"), workdir / "op.log")
    try:
        yield handle
    finally:
        handle.stop()
        sys.stderr.write(f"\n--- operator log tail ---\n{handle.log_tail(30)}\n")


@pytest.fixture(scope="module")
def operator_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[Any], Operator]]:
    """`operator_factory(cluster)` starts an operator on `cluster`; every one is stopped with the module."""
    started: list[Operator] = []

    def make(cluster: Any) -> Operator:
        workdir = tmp_path_factory.mktemp("operator")
        kubeconfig = service_account_kubeconfig(cluster, workdir / "kubeconfig")
        handle = Operator(kubeconfig, workdir / "op.log")
        started.append(handle)
        return handle.start()

    yield make
    for handle in started:
        handle.stop()
        sys.stderr.write(f"\n--- operator log tail ---\n{handle.log_tail(30)}\n")
