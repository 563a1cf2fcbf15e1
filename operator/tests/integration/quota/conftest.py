"""Fixtures for the GpuQuota integration tests: the webhook as a real process on the host, registered
with the local control plane (whose API server calls it over TLS), and helpers to create workloads.

The session's webhook is one process (`--register`: always the leader). Tests of several replicas stop
it and run their own, electing a leader through a Lease, with one certificate and CA between them.

`dev_cluster` and `namespace` come from the gpuforge_lab.testing pytest plugin.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import gpuforge.clock
from gpuforge.webhook.certs import generate_ca, issue_serving_cert
from gpuforge_lab.devcluster.cluster import free_ports
from gpuforge_lab.workloads import gpu_deployment

REPO = Path(__file__).resolve().parents[4]
CRD = REPO / "operator" / "deploy" / "crds" / "gpuquotas.gpuforge.io.yaml"
GPU = "requests.nvidia.com/gpu"
LEASE_SECONDS = 6
ADMITTING = "admitting GpuQuota requests"


@dataclass(frozen=True)
class Certificates:
    """One serving certificate (for 127.0.0.1) and its CA, shared by replicas of one webhook."""

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def issue(cls, directory: Path) -> Certificates:
        now = datetime.now(UTC)
        ca = generate_ca(now)
        pair = issue_serving_cert(ca, ["127.0.0.1", "localhost"], now)
        result = cls(directory / "tls.crt", directory / "tls.key", directory / "ca.crt")
        result.cert.write_bytes(pair.cert_pem)
        result.key.write_bytes(pair.key_pem)
        result.ca.write_bytes(ca.cert_pem)
        return result


class WebhookProcess:
    """`gpuforge webhook run` as a child process; restartable on the same port.

    Alone (`elect=False`, registered) it is the leader; replicas (`elect=True`) elect one through a
    Lease, and only the registered one is what the API server calls."""

    def __init__(
        self,
        kubeconfig: Path,
        log_dir: Path,
        *,
        register: bool = True,
        tag: str = "webhook",
        elect: bool = False,
        certificates: Certificates | None = None,
        lease_name: str = "",
        route: str = "none",
        env: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.kubeconfig = kubeconfig
        self.extra_args = extra_args  # after the defaults, so they win (e.g. a longer --accrual)
        [self.port] = free_ports(1)
        self.log_dir = log_dir
        self.register = register
        self.tag = tag
        self.elect = elect
        self.certificates = certificates
        self.lease_name = lease_name
        self.route = route
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, *, wait_admitting: bool = True) -> None:
        """Start; with `wait_admitting`, until this process admits (a leader past its wait)."""
        self.starts += 1
        log = self.log_path.open("wb")
        command = [
            sys.executable,
            "-m",
            "gpuforge",
            "webhook",
            "run",
            "--register" if self.register else "--no-register",
            "--port",
            str(self.port),
            "--kubeconfig",
            str(self.kubeconfig),
            "--crd",
            str(CRD),
            "--name",
            "gpuforge-quota-test",
            "--resync",
            "5",
            "--accrual",
            "1",
            "--speedup",
            "3600",
            "--timeout",
            "5",
            # Replicas elect one leader; a short Lease keeps failover after a SIGKILL quick.
            "--lease-duration",
            str(LEASE_SECONDS),
        ]
        command += self.extra_args
        if self.elect:
            command.append("--leader-elect")
        if self.lease_name:
            command += ["--lease-name", self.lease_name]
        if self.route != "none":
            command += ["--route", self.route]
        if self.certificates is not None:
            certs = self.certificates
            command += ["--cert", str(certs.cert), "--key", str(certs.key), "--ca", str(certs.ca)]
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )
        self.wait_log("serving on", 60)
        if wait_admitting:
            # Its first wait: the previous process's admissions (10 s), or a new Lease's (16 s).
            self.wait_log(ADMITTING, 90)

    def wait_log(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if text.encode() in self.log_path.read_bytes():
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"webhook exited: {self.log_path.read_text()}")
            time.sleep(0.1)
        raise RuntimeError(f"webhook did not log {text!r} in {timeout} s: {self.log_path.read_text()}")

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.tag}-{self.starts}.log"

    def metric(self, series: str) -> float | None:
        """A sample of this process's /metrics, by its whole series (`name` or `name{label="v"}`); the
        serving certificate is not verified."""
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        url = f"https://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, context=context, timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.rsplit(" ", 1)[0] == series:
                    return float(line.rsplit(" ", 1)[1])
        return None

    def role(self) -> str:
        """follower, waiting, syncing, admitting or stopping (from gpuforge_quota_role)."""
        for role in ("follower", "waiting", "syncing", "admitting", "stopping"):
            if self.metric(f'gpuforge_quota_role{{role="{role}"}}') == 1.0:
                return role
        return "unknown"

    def stop(self, *, crash: bool = False) -> None:
        """SIGTERM unregisters; a crash (SIGKILL) leaves the configurations, so requests fail closed."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
        self.process.wait(timeout=30)
        self.process = None

    def restart(self, *, wait_admitting: bool = True) -> None:
        self.stop(crash=True)
        self.start(wait_admitting=wait_admitting)


@pytest.fixture(scope="session")
def quota_webhook(dev_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    webhook = WebhookProcess(Path(dev_cluster.kubeconfig), tmp_path_factory.mktemp("quota-webhook"))
    webhook.start()
    yield webhook
    webhook.stop()


@pytest.fixture(scope="session")
def api_client(dev_cluster: Any) -> client.ApiClient:
    api: client.ApiClient = dev_cluster.api_client()
    api.configuration.connection_pool_maxsize = 64
    return api


class Quotas:
    """Create GpuQuotas with names unique to one test, and read their status."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace  # the namespace a quota admits unless told otherwise
        self.prefix = f"q{uuid.uuid4().hex[:6]}"
        self.created: list[str] = []

    def name(self, short: str) -> str:
        return f"{self.prefix}-{short}"

    def create(
        self,
        short: str,
        hard: dict[str, Any],
        parent: str = "",
        *,
        namespaces: list[str] | None = None,
        namespace_selector: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A quota admitting the test's namespace, or `namespaces` / `namespace_selector` when given."""
        spec: dict[str, Any] = {
            "parent": self.name(parent) if parent else "",
            "hard": {k: str(v) for k, v in hard.items()},
        }
        if namespace_selector is not None:
            spec["namespaceSelector"] = namespace_selector
        if namespaces is not None or namespace_selector is None:
            spec["namespaces"] = [self.namespace] if namespaces is None else namespaces
        body = {
            "apiVersion": "gpuforge.io/v1alpha1",
            "kind": "GpuQuota",
            "metadata": {"name": self.name(short)},
            "spec": spec,
        }
        result: dict[str, Any] = self.custom.create_cluster_custom_object(
            "gpuforge.io", "v1alpha1", "gpuquotas", body
        )
        self.created.append(self.name(short))
        return result

    def get(self, short: str) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.get_cluster_custom_object(
            "gpuforge.io", "v1alpha1", "gpuquotas", self.name(short)
        )
        return result

    def patch(self, short: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.patch_cluster_custom_object(
            "gpuforge.io", "v1alpha1", "gpuquotas", self.name(short), body
        )
        return result

    def delete(self, short: str) -> None:
        self.custom.delete_cluster_custom_object("gpuforge.io", "v1alpha1", "gpuquotas", self.name(short))

    def delete_workloads(self) -> None:
        """Delete the workloads, in any namespace, labelled for this test's quotas."""
        if not self.created:
            return
        selector = f"gpuforge.io/quota in ({','.join(self.created)})"
        api = self.custom.api_client
        apps, batch, core = client.AppsV1Api(api), client.BatchV1Api(api), client.CoreV1Api(api)
        kinds = [
            (apps.list_deployment_for_all_namespaces, apps.delete_namespaced_deployment),
            (apps.list_stateful_set_for_all_namespaces, apps.delete_namespaced_stateful_set),
            (apps.list_replica_set_for_all_namespaces, apps.delete_namespaced_replica_set),
            (batch.list_cron_job_for_all_namespaces, batch.delete_namespaced_cron_job),
            (batch.list_job_for_all_namespaces, batch.delete_namespaced_job),
            (core.list_pod_for_all_namespaces, core.delete_namespaced_pod),
        ]
        for list_all, delete in kinds:
            for item in list_all(label_selector=selector).items:
                with contextlib.suppress(client.ApiException):
                    delete(
                        item.metadata.name,
                        item.metadata.namespace,
                        propagation_policy="Background",
                        grace_period_seconds=0,
                    )

    def used(self, short: str, key: str = GPU) -> str:
        return str(((self.get(short).get("status") or {}).get("used") or {}).get(key, "0"))

    def cleanup(self) -> None:
        self.delete_workloads()  # a quota that running workloads charge cannot be deleted
        for name in reversed(self.created):  # leaves first
            with contextlib.suppress(client.ApiException):
                self.custom.delete_cluster_custom_object("gpuforge.io", "v1alpha1", "gpuquotas", name)


@pytest.fixture
def quotas(api_client: client.ApiClient, quota_webhook: WebhookProcess, namespace: str) -> Iterator[Quotas]:
    helper = Quotas(api_client, namespace)
    yield helper
    helper.cleanup()


# GPU Feature Discovery's product label on the lab's pools (examples/pools.yaml), by model.
PRODUCTS = {"H100": "NVIDIA-H100-80GB-HBM3", "A100": "NVIDIA-A100-SXM4-80GB", "L4": "NVIDIA-L4"}


def deployment(name: str, quota: str, gpus: int = 1, replicas: int = 1, model: str = "") -> dict[str, Any]:
    """A GPU Deployment; with `model`, labelled for it and held to its nodes (which proves the model)."""
    return gpu_deployment(
        name,
        quota,
        gpus=gpus,
        replicas=replicas,
        model=model,
        node_selector={"nvidia.com/gpu.product": PRODUCTS[model]} if model else None,
        requests={"cpu": "100m"},
        tolerations=[{"operator": "Exists"}],
        image="registry.example/work:1",
    )


# The one `wait_for`, polled more often than its default: admissions and status writes take
# milliseconds, and a quota test waits on them many times.
wait_for = partial(gpuforge.clock.wait_for, timeout=30.0, interval=0.2)


def kubectl(dev_cluster: Any) -> list[str]:
    path = getattr(dev_cluster, "kubectl_path", None) or os.environ.get("KUBECTL", "kubectl")
    return [str(path), f"--kubeconfig={dev_cluster.kubeconfig}"]


@pytest.fixture
def gpu_nodes(api_client: Any, namespace: str) -> list[str]:
    """Simulated device-plugin pods on every node, so the simulated nodes advertise nvidia.com/gpu. They run
    under RuntimeClass nvidia, as the operator renders them: the simulation, like the real plugin, cannot
    reach NVML under runc."""
    core = client.CoreV1Api(api_client)
    node_api = client.NodeV1Api(api_client)
    try:
        node_api.create_runtime_class({"metadata": {"name": "nvidia"}, "handler": "nvidia"})
    except client.ApiException as error:
        if error.status != 409:
            raise
    nodes = [n.metadata.name for n in core.list_node(label_selector="nvidia.com/gpu.present=true").items]
    for node in nodes:
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {
                    "name": f"device-plugin-{node}",
                    "labels": {"gpuforge.io/component": "device-plugin"},
                },
                "spec": {
                    "nodeName": node,
                    "runtimeClassName": "nvidia",
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}],
                },
            },
        )
    wait_for(
        "simulated GPUs to be advertised",
        lambda: all(
            int((core.read_node(n).status.allocatable or {}).get("nvidia.com/gpu", "0")) > 0 for n in nodes
        ),
    )
    return nodes
