"""Credentials of a process in a pod: the service-account token, CA and KUBERNETES_SERVICE_HOST/PORT."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes.config import incluster_config, kube_config

from gpuforge.k8s.client import Kube
from gpuforge.k8s.quota import load_credentials
from gpuforge.render.certs import generate_ca


@pytest.fixture
def in_a_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A pod's view: no kubeconfig anywhere, a mounted token and CA, the service's host and port."""
    token = "eyJhbGciOiJSUzI1NiJ9.payload.signature"
    (tmp_path / "token").write_text(token)
    (tmp_path / "ca.crt").write_bytes(generate_ca(datetime.now(UTC)).cert_pem)
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    return token


def test_quota_api_sends_the_service_account_token_with_one_scheme(in_a_pod: str) -> None:
    credentials = load_credentials()
    assert credentials.server == "https://10.96.0.1:443"
    assert credentials.headers == {"Authorization": f"Bearer {in_a_pod}"}


def test_operator_client_logs_kopf_in_with_the_service_account_token(in_a_pod: str) -> None:
    info = Kube.from_kubeconfig().connection_info()
    assert info["server"] == "https://10.96.0.1:443"
    assert (info["scheme"].lower(), info["token"]) == ("bearer", in_a_pod)
    assert Kube.from_kubeconfig().credentials().headers == {"Authorization": f"bearer {in_a_pod}"}


def test_kubeconfig_token_gets_a_bearer_scheme(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: abc}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    assert load_credentials(kubeconfig).headers == {"Authorization": "Bearer abc"}
