"""The operator image, run under podman the way a pod runs it, against the real local control plane.

Each container gets what the kubelet gives a pod: a ServiceAccount token (TokenRequest), the cluster CA
and the namespace mounted at /var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST/PORT
naming the API server; it runs as the image's unprivileged user on a read-only root filesystem, on the
host network (the only one here). The operator's account holds exactly the shipped RBAC (operator/deploy);
the webhook's holds the rules the operator grants it (render.quota_webhook.WEBHOOK_RULES).

The image is built once (`make image`) and reused while its sources are unchanged.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.render.quota_webhook import TLS_DIR, WEBHOOK_RULES
from gpuforge.render.webhook_configurations import ClientTarget, render_webhook_configurations
from gpuforge.webhook.certs import generate_ca, issue_serving_cert
from gpuforge_lab.devcluster import image as operator_image
from gpuforge_lab.workloads import gpu_deployment

from ..operator_process import DEPLOY, condition, free_port, stack_status, wait_for

REPO = DEPLOY.parents[1]
EXAMPLES = REPO / "examples"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
NAMESPACE = "gpuforge-system"
WEBHOOK_ACCOUNT = "gpuforge-quota-webhook-image"
# runc and explicit ulimits, as the Ansible lab runs its containers (tests/ansible/lab.py).
PODMAN_RUN_COMPAT = ("--runtime", "runc", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=1024:1024")

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("podman") is None or shutil.which("debootstrap") is None:
        pytest.skip("podman and debootstrap are needed (make ansible-deps)")
    return operator_image.ensure_image().ref


def _server_and_ca(cluster: Any) -> tuple[str, bytes]:
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    entry = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
    if "certificate-authority-data" in entry:
        return entry["server"], base64.b64decode(entry["certificate-authority-data"])
    return entry["server"], Path(entry["certificate-authority"]).read_bytes()


def mount_service_account(cluster: Any, account: str, directory: Path) -> Path:
    """What the kubelet projects into a pod of `account`: token, ca.crt, namespace (world-readable, as
    the image's user is not the owner of these files)."""
    _, ca = _server_and_ca(cluster)
    token = cluster.kubectl("create", "token", account, "-n", NAMESPACE, "--duration=1h").stdout.strip()
    directory.mkdir(parents=True)
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes(ca)
    (directory / "namespace").write_text(NAMESPACE)
    for path in (directory, *directory.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return directory


@dataclass
class Container:
    name: str

    def logs(self) -> str:
        result = subprocess.run(["podman", "logs", self.name], capture_output=True, text=True, check=False)
        return result.stdout + result.stderr

    def running(self) -> bool:
        result = subprocess.run(
            ["podman", "inspect", "--format", "{{.State.Running}}", self.name],
            capture_output=True,
            text=True,
            check=False,
        )
        return result.stdout.strip() == "true"

    def inspect(self) -> dict[str, Any]:
        out = subprocess.run(["podman", "inspect", self.name], capture_output=True, text=True, check=True)
        return dict(json.loads(out.stdout)[0])


@contextmanager
def pod_container(
    cluster: Any, image: str, account_dir: Path, name: str, args: list[str], mounts: tuple[str, ...] = ()
) -> Iterator[Container]:
    server, _ = _server_and_ca(cluster)
    host, _, port = server.removeprefix("https://").rpartition(":")
    subprocess.run(["podman", "rm", "--force", "--time", "0", name], capture_output=True, check=False)
    command = [
        "podman",
        "run",
        "--detach",
        "--name",
        name,
        *PODMAN_RUN_COMPAT,
        "--network=host",
        "--read-only",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        f"--volume={account_dir}:{SERVICE_ACCOUNT_DIR}:ro",
        *(f"--volume={mount}" for mount in mounts),
        f"--env=KUBERNETES_SERVICE_HOST={host.strip('[]')}",
        f"--env=KUBERNETES_SERVICE_PORT={port}",
        image,
        *args,
    ]
    subprocess.run(command, check=True, capture_output=True, text=True)
    container = Container(name)
    try:
        yield container
    finally:
        print(f"\n--- {name} log tail ---\n" + "\n".join(container.logs().splitlines()[-30:]))
        subprocess.run(["podman", "rm", "--force", "--time", "5", name], capture_output=True, check=False)


def test_image_is_labelled_and_runs_unprivileged(image: str) -> None:
    inspected = json.loads(
        subprocess.run(
            ["podman", "image", "inspect", image], capture_output=True, text=True, check=True
        ).stdout
    )[0]
    labels = inspected["Labels"]
    assert labels["org.opencontainers.image.version"] == operator_image.__version__
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.source"].startswith("https://")
    assert inspected["Config"]["User"] == "65532:65532"
    version = subprocess.run(
        ["podman", "run", "--rm", *PODMAN_RUN_COMPAT, "--read-only", image, "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert operator_image.__version__ in version


def test_image_ships_the_runtime_alone(image: str) -> None:
    """No module of the lab (gpuforge-lab), under its own name or the one it had in gpuforge."""
    modules = [path.rstrip("/").removesuffix(".py").replace("/", ".") for path in operator_image.LAB_PATHS]
    assert "gpuforge.sim" in modules and "gpuforge_lab" in modules
    probe = (
        "import importlib.metadata as md, importlib.util, json, sys\n"
        "found = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None]\n"
        "found += [d.name for d in md.distributions() if d.name == 'gpuforge-lab']\n"
        "print(json.dumps(found))"
    )
    result = subprocess.run(
        ["podman", "run", "--rm", *PODMAN_RUN_COMPAT, "--read-only", "--entrypoint", "python3", image,
         "-c", probe, *modules],
        capture_output=True,
        text=True,
        check=True,
    )  # fmt: skip
    assert json.loads(result.stdout) == []


def test_operator_in_the_image_reconciles_a_gpustack(
    dev_cluster: Any, image: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    cluster = dev_cluster
    for manifest in ("crds/gpustacks.gpuforge.io.yaml", "namespace.yaml", "serviceaccount.yaml"):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(DEPLOY / manifest))
    for manifest in ("rbac.yaml", "rbac-quota.yaml"):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(DEPLOY / manifest))
    cluster.kubectl("wait", "--for=condition=Established", "crd/gpustacks.gpuforge.io", "--timeout=60s")
    account = mount_service_account(cluster, "gpuforge-operator", tmp_path / "operator-account")
    liveness, metrics = free_port(), free_port()
    args = [
        "operator",
        "run",
        "--log-format=json",
        "--bind=127.0.0.1",
        f"--liveness-port={liveness}",
        f"--metrics-port={metrics}",
    ]
    with pod_container(cluster, image, account, f"gpuforge-image-operator-{liveness}", args) as container:

        def healthy() -> bool:
            assert container.running(), f"the operator container exited:\n{container.logs()}"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=2).close()
            except OSError:
                return False
            return True

        wait_for("the containerised operator's liveness endpoint", healthy, timeout=90)
        assert container.inspect()["Config"]["User"] == "65532:65532"
        cluster.kubectl("apply", "-f", str(EXAMPLES / "gpustack-device-plugin.yaml"))
        try:
            status = wait_for(
                "GpuStack gpus Ready",
                lambda: (s := stack_status(cluster, "gpus")).get("phase") == "Ready" and s,
                timeout=180,
            )
            assert condition(status, "Ready")["status"] == "True"
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as answer:
                assert b"gpuforge" in answer.read()
        finally:
            cluster.kubectl("delete", "gpustack", "gpus", "--wait=false", "--ignore-not-found")
            wait_for(
                "GpuStack gpus to be gone",
                lambda: cluster.kubectl("get", "gpustack", "gpus", check=False).returncode != 0,
                timeout=120,
            )


def _webhook_account(cluster: Any) -> None:
    """A ServiceAccount with the webhook's rules, as the operator grants them when it deploys quota."""
    role = f"gpuforge:{WEBHOOK_ACCOUNT}"
    documents: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": WEBHOOK_ACCOUNT, "namespace": NAMESPACE},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [dict(rule) for rule in WEBHOOK_RULES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": WEBHOOK_ACCOUNT, "namespace": NAMESPACE}],
        },
    ]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))


def _serving_certificates(directory: Path) -> bytes:
    """What the operator's TLS Secret holds, for 127.0.0.1: tls.crt, tls.key and ca.crt."""
    now = datetime.now(UTC)
    ca = generate_ca(now)
    pair = issue_serving_cert(ca, ["127.0.0.1", "localhost"], now)
    directory.mkdir(parents=True)
    (directory / "tls.crt").write_bytes(pair.cert_pem)
    (directory / "tls.key").write_bytes(pair.key_pem)
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    for path in (directory, *directory.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return ca.cert_pem


# A namespace examples/quota-tree.yaml lets charge research-vision (its example Deployment lives there).
TEAM_NAMESPACE = "default"


def test_webhook_in_the_image_enforces_the_quota_tree(
    dev_cluster: Any, image: str, tmp_path: Path, namespace: str
) -> None:
    cluster = dev_cluster
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(DEPLOY / "crds/gpuquotas.gpuforge.io.yaml")
    )
    cluster.kubectl("wait", "--for=condition=Established", "crd/gpuquotas.gpuforge.io", "--timeout=60s")
    _webhook_account(cluster)
    account = mount_service_account(cluster, WEBHOOK_ACCOUNT, tmp_path / "webhook-account")
    ca_bundle = _serving_certificates(tmp_path / "tls")
    port = free_port()
    # The Deployment's arguments (render.quota_webhook), on a loopback port of the host network.
    args = [
        "webhook",
        "run",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--cert={TLS_DIR}/tls.crt",
        f"--key={TLS_DIR}/tls.key",
        f"--ca={TLS_DIR}/ca.crt",
        "--timeout=5",
        f"--lease-name=gpuforge-quota-image-{port}",
    ]
    mounts = (f"{tmp_path / 'tls'}:{TLS_DIR}:ro",)
    configurations = render_webhook_configurations(
        ClientTarget(ca_bundle=ca_bundle, url=f"https://127.0.0.1:{port}"), name=f"gpuforge-image-{port}"
    )
    quota_names = [
        d["metadata"]["name"] for d in yaml.safe_load_all((EXAMPLES / "quota-tree.yaml").read_text()) if d
    ]
    with pod_container(cluster, image, account, f"gpuforge-image-webhook-{port}", args, mounts) as container:

        def ready() -> bool:
            assert container.running(), f"the webhook container exited:\n{container.logs()}"
            return "admitting GpuQuota requests" in container.logs()

        wait_for("the containerised webhook to admit", ready, timeout=90)
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(configurations))
        try:
            wait_for(
                "the quota tree to be admitted",
                lambda: (
                    cluster.kubectl("apply", "-f", str(EXAMPLES / "quota-tree.yaml"), check=False).returncode
                    == 0
                ),
                timeout=60,
            )
            # research-vision holds an H100 key: its workloads prove their model by the product they select.
            not_h100 = {"nvidia.com/gpu.product": "NVIDIA-L4"}
            within = gpu_deployment(
                "within",
                "research-vision",
                gpus=2,
                replicas=1,
                requests={"cpu": "100m", "memory": "1Gi"},
                node_selector=not_h100,
            )
            beyond = gpu_deployment(
                "beyond",
                "research-vision",
                gpus=8,
                replicas=2,
                requests={"cpu": "100m", "memory": "1Gi"},
                node_selector=not_h100,
            )
            # The tree's research quotas admit namespaces default and ml only; the test's own namespace
            # may charge none of them.
            stray = cluster.kubectl(
                "apply", "-n", namespace, "-f", "-", input=json.dumps(within), check=False
            )
            assert stray.returncode != 0 and "may not charge" in stray.stderr, stray.stderr
            admitted = cluster.kubectl(
                "apply", "-n", TEAM_NAMESPACE, "-f", "-", input=json.dumps(within), check=False
            )
            assert admitted.returncode == 0, admitted.stderr
            refused = cluster.kubectl(
                "apply", "-n", TEAM_NAMESPACE, "-f", "-", input=json.dumps(beyond), check=False
            )
            assert refused.returncode != 0
            assert "research-vision" in refused.stderr and "denied" in refused.stderr, refused.stderr
        finally:
            for configuration in configurations:
                cluster.kubectl(
                    "delete",
                    configuration["kind"].lower(),
                    configuration["metadata"]["name"],
                    "--ignore-not-found",
                )
            cluster.kubectl(
                "delete", "deployment", "-n", TEAM_NAMESPACE, "within", "trainer", "--ignore-not-found",
                check=False,
            )  # fmt: skip
            cluster.kubectl(
                "delete", "gpuquota", *quota_names, "--ignore-not-found", "--wait=false", check=False
            )
