"""The operator deploys the GpuQuota webhook when a GpuStack sets `quota.enabled`, on the real local
control plane, running as its own ServiceAccount with the shipped rbac.yaml and rbac-quota.yaml.

Service mode: the local control plane's pods do not really run (kwok marks them Ready), so the webhook
Deployment is checked as objects: CRD, Deployment, PDB, Service, Secrets, configurations whose caBundle
verifies the serving certificate; an expiring certificate is replaced; disabling removes it all but the
CRD. URL mode is end to end: `gpuforge webhook run` on loopback serves a certificate issued here, the
operator registers it, and the API server asks it over TLS about GpuQuotas and a labelled Deployment.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpuforge.render import quota_webhook as q
from gpuforge.render.certs import (
    KeyPair,
    covers_hosts,
    generate_ca,
    issue_serving_cert,
    needs_rotation,
    signed_by,
)
from gpuforge_lab.devcluster.pools import Pool
from gpuforge_lab.workloads import gpu_deployment

from ..operator_process import (
    DEPLOY,
    Operator,
    condition,
    free_port,
    kube_json,
    operator_factory,
    stack_status,
    wait_for,
)

__all__ = ["operator_factory"]  # a fixture, used by name

pytestmark = pytest.mark.cluster

GPU = "requests.nvidia.com/gpu"
CONFIG_KINDS = "validatingwebhookconfigurations"


@pytest.fixture(scope="module")
def cluster(cluster_factory: Callable[..., Any]) -> Any:
    # CPU nodes only: the GpuStack selects none (Ready, NoNodesSelected); the webhook replicas spread.
    return cluster_factory(profile="1.36", pools=[Pool(name="cpu", count=3, gpu=None)], name="quota-deploy")


@pytest.fixture(scope="module")
def operator(cluster: Any, operator_factory: Callable[[Any], Operator]) -> Operator:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(DEPLOY / "rbac-quota.yaml"))
    return operator_factory(cluster)


def gpustack(name: str, namespace: str, quota: dict[str, Any]) -> str:
    body = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": name},
        "spec": {"namespace": namespace, "quota": quota},
    }
    return yaml.safe_dump(body)


def exists(cluster: Any, *args: str) -> bool:
    return bool(cluster.kubectl("get", *args, check=False).returncode == 0)


def quota_condition(cluster: Any, stack: str) -> dict[str, Any]:
    return condition(stack_status(cluster, stack), q.CONDITION)


def secret_pem(cluster: Any, namespace: str, name: str, key: str) -> bytes:
    data = kube_json(cluster, "secret", "-n", namespace, name)["data"]
    return base64.b64decode(data[key])


def events(cluster: Any, reason: str) -> list[str]:
    items = kube_json(cluster, "events", "-n", "default", "--field-selector", f"reason={reason}")["items"]
    return [str(e["message"]) for e in items]


def handshake(cert_pem: bytes, key_pem: bytes, ca_bundle: bytes, server_name: str) -> bytes:
    """A TLS handshake as the API server makes it (trusting only `ca_bundle`, checking `server_name`)
    with a server presenting `cert_pem`; returns the certificate presented, as PEM."""
    with tempfile.TemporaryDirectory() as scratch:
        cert, key = Path(scratch) / "tls.crt", Path(scratch) / "tls.key"
        cert.write_bytes(cert_pem)
        key.write_bytes(key_pem)
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with contextlib.suppress(ssl.SSLError, OSError), server_context.wrap_socket(conn, server_side=True):
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    client = ssl.create_default_context(cadata=ca_bundle.decode())
    try:
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            client.wrap_socket(raw, server_hostname=server_name) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    finally:
        thread.join(timeout=10)
        listener.close()
    assert der is not None
    return x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)


def delete_stack(cluster: Any, name: str) -> None:
    cluster.kubectl("delete", "gpustack", name, "--wait=false", "--ignore-not-found")
    wait_for(f"GpuStack {name} to be gone", lambda: not exists(cluster, "gpustack", name), timeout=120)


# --- service mode ------------------------------------------------------------------------------------


def test_service_mode_deploys_rotates_and_removes(cluster: Any, operator: Operator) -> None:
    ns = "gpuforge-quota-svc"
    cluster.kubectl("apply", "-f", "-", input=gpustack("svc", ns, {"enabled": True}))
    try:
        wait_for("the GpuQuota CRD", lambda: exists(cluster, "crd", "gpuquotas.gpuforge.io"))
        wait_for("the webhook Deployment", lambda: exists(cluster, "deploy", "-n", ns, q.NAME))
        deployment = kube_json(cluster, "deploy", "-n", ns, q.NAME)
        assert deployment["spec"]["replicas"] == 2
        pod = deployment["spec"]["template"]["spec"]
        anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert pod["containers"][0]["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        pdb = kube_json(cluster, "pdb", "-n", ns, q.NAME)
        assert pdb["spec"]["maxUnavailable"] == 1
        assert kube_json(cluster, "service", "-n", ns, q.NAME)["spec"]["ports"][0]["port"] == 443

        # Registered once a replica is available (kwok marks the pods Ready).
        wait_for(
            "QuotaWebhookReady=True",
            lambda: quota_condition(cluster, "svc").get("status") == "True",
            timeout=120,
        )
        configurations = {
            c["metadata"]["name"]: c
            for c in kube_json(cluster, CONFIG_KINDS)["items"]
            if c["metadata"]["name"] in q.CONFIGURATIONS
        }
        assert set(configurations) == set(q.CONFIGURATIONS)
        serving = secret_pem(cluster, ns, q.TLS_SECRET, "tls.crt")
        ca = secret_pem(cluster, ns, q.CA_SECRET, q.CA_CERT_KEY)
        assert covers_hosts(serving, [f"{q.NAME}.{ns}.svc"])
        for configuration in configurations.values():
            for hook in configuration["webhooks"]:
                config = hook["clientConfig"]
                assert config["service"]["name"] == q.NAME and config["service"]["namespace"] == ns
                bundle = base64.b64decode(config["caBundle"])
                assert bundle.startswith(ca) and signed_by(serving, bundle)
        assert any(q.NAME in m for m in events(cluster, q.EVENT_CERT_ISSUED))
        key = secret_pem(cluster, ns, q.TLS_SECRET, "tls.key")
        served = handshake(serving, key, bundle, f"{q.NAME}.{ns}.svc")
        assert served == serving, "the API server's view: the Service name verifies against caBundle"

        # Once every replica comes from a template that labels its pod, the Service selects the replica
        # taking calls (the leader; kwok's pods keep the template's "true").
        wait_for(
            "the Service to route to the leader",
            lambda: (
                kube_json(cluster, "service", "-n", ns, q.NAME)["spec"]["selector"].get(
                    "gpuforge.io/quota-webhook-endpoint"
                )
                == "true"
            ),
            timeout=90,
        )
        assert kube_json(cluster, "role", "-n", ns, q.ENDPOINT_ROLE)["rules"][0]["verbs"] == ["patch"]

        # A serving certificate past two thirds of its life (written by hand) is replaced.
        ca_pair = KeyPair(ca, secret_pem(cluster, ns, q.CA_SECRET, q.CA_KEY_KEY))
        now = datetime.now(UTC)
        expiring = issue_serving_cert(
            ca_pair, q.serving_hosts(ns), now - timedelta(hours=2), validity=timedelta(hours=3)
        )
        assert needs_rotation(expiring.cert_pem, now)
        patch = {"data": {"tls.crt": base64.b64encode(expiring.cert_pem).decode()}}
        patch["data"]["tls.key"] = base64.b64encode(expiring.key_pem).decode()
        cluster.kubectl("patch", "secret", "-n", ns, q.TLS_SECRET, "--type=merge", "-p", json.dumps(patch))

        def replaced() -> bool:
            current = secret_pem(cluster, ns, q.TLS_SECRET, "tls.crt")
            return current != expiring.cert_pem and not needs_rotation(current, datetime.now(UTC))

        wait_for("the expiring certificate to be replaced", replaced, timeout=90)
        rotated = secret_pem(cluster, ns, q.TLS_SECRET, "tls.crt")
        assert signed_by(rotated, ca) and rotated != serving  # same CA, new certificate
        wait_for("a rotation event", lambda: events(cluster, q.EVENT_CERT_ROTATED))

        # A killed operator resumes from the Secrets: same CA, same certificate, nothing reissued.
        tls_before = secret_pem(cluster, ns, q.TLS_SECRET, "tls.crt")
        operator.kill()
        operator.start()
        wait_for("two passes of the restarted operator", lambda: operator.passes("svc") >= 2, timeout=120)
        assert secret_pem(cluster, ns, q.CA_SECRET, q.CA_CERT_KEY) == ca
        assert secret_pem(cluster, ns, q.TLS_SECRET, "tls.crt") == tls_before
        assert quota_condition(cluster, "svc")["status"] == "True"

        # Disabling removes the webhook, configurations included, and keeps the CRD.
        cluster.kubectl(
            "patch", "gpustack", "svc", "--type=merge", "-p", '{"spec":{"quota":{"enabled":false}}}'
        )

        def removed() -> bool:
            names = {c["metadata"]["name"] for c in kube_json(cluster, CONFIG_KINDS)["items"]}
            return not names & set(q.CONFIGURATIONS) and not any(
                exists(cluster, kind, "-n", ns, name)
                for kind, name in (
                    ("deploy", q.NAME),
                    ("pdb", q.NAME),
                    ("service", q.NAME),
                    ("secret", q.TLS_SECRET),
                    ("secret", q.CA_SECRET),
                    ("serviceaccount", q.NAME),
                )
            )

        wait_for("the quota webhook to be removed", removed, timeout=90)
        assert not exists(cluster, "clusterrolebinding", q.CLUSTER_ROLE)
        assert not exists(cluster, "clusterrole", q.CLUSTER_ROLE)
        assert exists(cluster, "crd", "gpuquotas.gpuforge.io"), "the CRD holds every user's GpuQuotas"
        wait_for("the condition to go", lambda: not quota_condition(cluster, "svc"))
    finally:
        delete_stack(cluster, "svc")


def test_switch_to_an_external_url_then_delete(cluster: Any, operator: Operator) -> None:
    ns = "gpuforge-quota-del"
    cluster.kubectl("apply", "-f", "-", input=gpustack("del", ns, {"enabled": True}))
    try:
        wait_for(
            "QuotaWebhookReady=True",
            lambda: quota_condition(cluster, "del").get("status") == "True",
            timeout=120,
        )
        # Pointing the configurations at an external webhook removes what ran in the cluster.
        external = {"enabled": True, "webhook": {"url": "https://127.0.0.1:9"}}
        cluster.kubectl("apply", "-f", "-", input=gpustack("del", ns, external))

        def moved() -> bool:
            hooks = [
                hook
                for c in kube_json(cluster, CONFIG_KINDS)["items"]
                if c["metadata"]["name"] in q.CONFIGURATIONS
                for hook in c["webhooks"]
            ]
            return bool(hooks) and all("url" in h["clientConfig"] for h in hooks)

        wait_for("the configurations to point at the url", moved, timeout=90)
        wait_for(
            "the in-cluster webhook to be removed",
            lambda: (
                not any(
                    exists(cluster, *args)
                    for args in (
                        ("deploy", "-n", ns, q.NAME),
                        ("service", "-n", ns, q.NAME),
                        ("secret", "-n", ns, q.CA_SECRET),
                        ("clusterrolebinding", q.CLUSTER_ROLE),
                        ("clusterrole", q.CLUSTER_ROLE),
                    )
                )
            ),
            timeout=90,
        )
        assert quota_condition(cluster, "del")["reason"] == q.EXTERNAL
    finally:
        delete_stack(cluster, "del")
    names = {c["metadata"]["name"] for c in kube_json(cluster, CONFIG_KINDS)["items"]}
    assert not names & set(q.CONFIGURATIONS), "deleting the stack unregisters the webhook"
    assert exists(cluster, "crd", "gpuquotas.gpuforge.io")


# --- url mode, end to end --------------------------------------------------------------------------


@pytest.fixture
def external_webhook(cluster: Any, tmp_path: Path) -> Iterator[tuple[str, bytes]]:
    """`gpuforge webhook run` on loopback (not registering itself) with a certificate issued here."""
    now = datetime.now(UTC)
    ca = generate_ca(now)
    pair = issue_serving_cert(ca, ["127.0.0.1"], now)
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    port = free_port()
    log = tmp_path / "webhook.log"
    command = [
        sys.executable, "-m", "gpuforge", "webhook", "run",
        "--host", "127.0.0.1", "--port", str(port),
        "--cert", str(tmp_path / "tls.crt"), "--key", str(tmp_path / "tls.key"),
        "--kubeconfig", str(cluster.kubeconfig), "--resync", "5",
        "--no-leader-elect",  # the only replica: it leads without a Lease
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        # It admits once an earlier process's admissions could be visible: 10 s after it starts.
        wait_for(
            "the webhook to admit",
            lambda: process.poll() is None and b"admitting GpuQuota requests" in log.read_bytes(),
            timeout=60,
        )
        yield f"https://127.0.0.1:{port}", ca.cert_pem
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        sys.stderr.write(f"\n--- webhook log tail ---\n{log.read_text(errors='replace')[-3000:]}\n")


def labelled_deployment(name: str, namespace: str, quota: str, replicas: int) -> str:
    return json.dumps(
        gpu_deployment(name, quota, replicas=replicas, namespace=namespace, requests={"nvidia.com/gpu": "1"})
    )


def gpuquota(name: str, parent: str, gpus: int, namespaces: Sequence[str] = ()) -> str:
    body = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": name},
        "spec": {"parent": parent, "hard": {GPU: str(gpus)}, "namespaces": list(namespaces)},
    }
    return json.dumps(body)


def test_url_mode_end_to_end(cluster: Any, operator: Operator, external_webhook: tuple[str, bytes]) -> None:
    url, ca_pem = external_webhook
    quota = {"enabled": True, "webhook": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()}}
    cluster.kubectl("apply", "-f", "-", input=gpustack("url", "gpuforge-quota-url", quota))
    workloads = "t-quota-url"
    cluster.kubectl("create", "namespace", workloads)
    try:
        wait_for("QuotaWebhookReady=True", lambda: quota_condition(cluster, "url").get("status") == "True")
        assert quota_condition(cluster, "url")["reason"] == q.EXTERNAL
        hooks = [
            hook
            for c in kube_json(cluster, CONFIG_KINDS)["items"]
            if c["metadata"]["name"] in q.CONFIGURATIONS
            for hook in c["webhooks"]
        ]
        assert hooks and all(h["clientConfig"]["url"].startswith(url + "/validate-") for h in hooks)
        assert not exists(cluster, "deploy", "-n", "gpuforge-quota-url", q.NAME)  # nothing runs in-cluster

        # A second stack with quota enabled is told which stack holds the webhook, and changes nothing.
        cluster.kubectl("apply", "-f", "-", input=gpustack("url2", "gpuforge-quota-url2", quota))
        wait_for(
            "url2 to report the holder", lambda: quota_condition(cluster, "url2").get("reason") == q.ELSEWHERE
        )
        held = quota_condition(cluster, "url2")
        assert held["status"] == "False" and "GpuStack url " in held["message"]
        for c in kube_json(cluster, CONFIG_KINDS)["items"]:
            if c["metadata"]["name"] in q.CONFIGURATIONS:
                assert c["metadata"]["labels"]["gpuforge.io/stack"] == "url"
        delete_stack(cluster, "url2")
        assert all(exists(cluster, CONFIG_KINDS, name) for name in q.CONFIGURATIONS)

        # The tree webhook (over TLS, through the API server): a child cannot take more than its parent.
        cluster.kubectl("apply", "-f", "-", input=gpuquota("url-org", "", 4))
        refused = cluster.kubectl("apply", "-f", "-", input=gpuquota("url-big", "url-org", 5), check=False)
        assert refused.returncode != 0 and "url-org" in refused.stderr, refused.stderr
        cluster.kubectl("apply", "-f", "-", input=gpuquota("url-team", "url-org", 2, [workloads]))

        # Workload admission: 3 GPUs over a quota of 2 are denied, naming the quota; 2 are admitted.
        over = cluster.kubectl(
            "apply", "-f", "-", input=labelled_deployment("over", workloads, "url-team", 3), check=False
        )
        assert over.returncode != 0, over.stdout
        assert "url-team" in over.stderr and GPU in over.stderr, over.stderr
        cluster.kubectl("apply", "-f", "-", input=labelled_deployment("within", workloads, "url-team", 2))
        assert exists(cluster, "deploy", "-n", workloads, "within")
    finally:
        cluster.kubectl("delete", "namespace", workloads, "--wait=true", "--timeout=60s", check=False)
        for name in ("url-team", "url-big", "url-org"):  # leaves first: the webhook refuses the rest
            cluster.kubectl("delete", "gpuquota", name, "--ignore-not-found", "--timeout=60s", check=False)
        delete_stack(cluster, "url2")
        delete_stack(cluster, "url")
    names = {c["metadata"]["name"] for c in kube_json(cluster, CONFIG_KINDS)["items"]}
    assert not names & set(q.CONFIGURATIONS), "deleting the stack unregisters the webhook"


# --- RBAC: every permission in rbac-quota.yaml is used ------------------------------------------------


def exercise_every_mode(cluster: Any) -> None:
    """One stack through every mode of the quota webhook: in the cluster until registered, then at an
    external URL (what ran in the cluster removed), then disabled (everything removed)."""
    ns = "gpuforge-quota-rbac"
    cluster.kubectl("apply", "-f", "-", input=gpustack("rbac", ns, {"enabled": True}))
    try:
        wait_for(
            "QuotaWebhookReady=True",
            lambda: quota_condition(cluster, "rbac").get("status") == "True",
            timeout=120,
        )
        external = {"enabled": True, "webhook": {"url": "https://127.0.0.1:9"}}
        cluster.kubectl("apply", "-f", "-", input=gpustack("rbac", ns, external))
        wait_for(
            "the in-cluster webhook to be removed",
            lambda: (
                quota_condition(cluster, "rbac").get("reason") == q.EXTERNAL
                and not exists(cluster, "deploy", "-n", ns, q.NAME)
            ),
            timeout=90,
        )
        cluster.kubectl(
            "patch", "gpustack", "rbac", "--type=merge", "-p", '{"spec":{"quota":{"enabled":false}}}'
        )
        wait_for("the condition to go", lambda: not quota_condition(cluster, "rbac"), timeout=90)
    finally:
        delete_stack(cluster, "rbac")


def test_every_quota_permission_is_used(cluster: Any, operator: Operator) -> None:
    """Runs every mode itself (the counters of this operator process are its input), so it holds
    whichever tests run before it, or none."""
    exercise_every_mode(cluster)
    docs = list(yaml.safe_load_all((DEPLOY / "rbac-quota.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    shipped = {(v, r) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    rules = (*q.WEBHOOK_RULES, *q.ENDPOINT_RULES)
    delegated = {(v, r) for rule in rules for r in rule["resources"] for v in rule["verbs"]}
    used: set[tuple[str, str]] = set()
    for line in operator.metrics().splitlines():
        match = re.match(r"gpuforge_api_requests_total\{(.*)\} ([0-9.e+]+)$", line)
        if match and float(match[2]) > 0:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match[1]))
            used.add((labels["verb"], labels["resource"]))
    used |= {("create", r) for verb, r in set(used) if verb == "patch"}  # apply creates, too
    unused = shipped - used - delegated
    assert not unused, f"rbac-quota.yaml permissions never used: {sorted(unused)}"
