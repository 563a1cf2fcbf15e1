"""Credentials of a process in a pod: the service-account token, CA and KUBERNETES_SERVICE_HOST/PORT."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes.config import incluster_config, kube_config

from gpuforge.k8s.client import Kube
from gpuforge.k8s.transport import ApiTransport, TokenFile, load_credentials
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
    assert credentials.authorization() == {"Authorization": f"Bearer {in_a_pod}"}


def test_operator_client_logs_kopf_in_with_the_service_account_token(in_a_pod: str) -> None:
    info = Kube.from_kubeconfig().connection_info()
    assert info["server"] == "https://10.96.0.1:443"
    assert (info["scheme"].lower(), info["token"]) == ("bearer", in_a_pod)
    assert Kube.from_kubeconfig().credentials().authorization() == {"Authorization": f"Bearer {in_a_pod}"}


def test_kubeconfig_token_gets_a_bearer_scheme(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: abc}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    assert load_credentials(kubeconfig).authorization() == {"Authorization": "Bearer abc"}


def rotate(token_file: Path, token: str) -> None:
    """As the kubelet rotates a projected token: a new file swapped in under the same name."""
    fresh = token_file.with_name("token.new")
    fresh.write_text(token)
    os.replace(fresh, token_file)


def test_a_rotated_service_account_token_is_sent_from_the_next_request(in_a_pod: str, tmp_path: Path) -> None:
    credentials = load_credentials()
    assert credentials.authorization() == {"Authorization": f"Bearer {in_a_pod}"}
    rotate(tmp_path / "token", "rotated.token")
    assert credentials.authorization() == {"Authorization": "Bearer rotated.token"}
    info = Kube.from_kubeconfig().connection_info()
    assert info["token"] == "rotated.token"


def test_token_file_is_read_again_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    token = TokenFile(path)
    assert token.read() == "first"
    reads: list[Path] = []
    original = Path.read_text

    def counted(self: Path, *args: object, **kwargs: object) -> str:
        reads.append(self)
        return original(self)

    monkeypatch.setattr(Path, "read_text", counted)
    assert token.read() == "first"
    assert reads == []
    rotate(path, "second")
    assert token.read() == "second"
    assert reads == [path]


async def test_requests_carry_the_token_current_when_they_are_sent(in_a_pod: str, tmp_path: Path) -> None:
    """The aiohttp side of the transport sends what the token file holds at each request."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    seen: list[str] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/api", echo)
    async with TestServer(app) as server:
        credentials = load_credentials()
        plain = type(credentials)(str(server.make_url("")), False, credentials.headers, credentials.authorize)
        transport = ApiTransport(plain)
        try:
            assert (await transport.request("GET", "/api"))[0] == 200
            rotate(tmp_path / "token", "rotated.token")
            assert (await transport.request("GET", "/api"))[0] == 200
        finally:
            await transport.close()
    assert seen == [f"Bearer {in_a_pod}", "Bearer rotated.token"]
