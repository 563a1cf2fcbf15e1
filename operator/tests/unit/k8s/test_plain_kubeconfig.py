"""Kubeconfigs read without the official client (short commands), and those left to it."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from gpuforge.k8s.transport import ApiTransport, read_plain_kubeconfig
from gpuforge.render.certs import KeyPair, generate_ca


@pytest.fixture(scope="module")
def ca() -> KeyPair:
    return generate_ca(datetime.now(UTC))


def write(path: Path, cluster: dict[str, object], user: dict[str, object]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "k", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [
                    {"name": "c", "context": {"cluster": "k", "user": "u"}},
                    {"name": "other", "context": {"cluster": "k", "user": "missing"}},
                ],
            }
        )
    )
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_client_certificate_from_data(tmp_path: Path, ca: KeyPair) -> None:
    path = write(
        tmp_path / "config",
        {"server": "https://127.0.0.1:6443/", "certificate-authority-data": b64(ca.cert_pem)},
        {"client-certificate-data": b64(ca.cert_pem), "client-key-data": b64(ca.key_pem)},
    )
    credentials = read_plain_kubeconfig(path)
    assert credentials is not None
    assert credentials.server == "https://127.0.0.1:6443"
    assert isinstance(credentials.ssl_context, ssl.SSLContext)
    assert credentials.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert len(credentials.ssl_context.get_ca_certs()) == 1
    assert credentials.authorization() == {}
    assert credentials.configuration is None


def test_files_relative_to_the_kubeconfig_and_a_fixed_token(tmp_path: Path, ca: KeyPair) -> None:
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_bytes(ca.cert_pem)
    path = write(
        tmp_path / "config",
        {"server": "https://api:6443", "certificate-authority": "pki/ca.crt"},
        {"token": "abc"},
    )
    credentials = read_plain_kubeconfig(path)
    assert credentials is not None
    assert credentials.authorization() == {"Authorization": "Bearer abc"}
    assert isinstance(credentials.ssl_context, ssl.SSLContext)


def test_insecure_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "config", {"server": "https://api", "insecure-skip-tls-verify": True}, {})
    monkeypatch.setenv("KUBECONFIG", str(path))
    credentials = read_plain_kubeconfig()
    assert credentials is not None
    assert credentials.ssl_context is False


@pytest.mark.parametrize(
    "user",
    [
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "get-token"}},
        {"auth-provider": {"name": "oidc"}},
        {"tokenFile": "/var/run/token"},
        {"username": "admin", "password": "secret"},
    ],
)
def test_other_users_are_left_to_the_official_loader(tmp_path: Path, user: dict[str, object]) -> None:
    assert read_plain_kubeconfig(write(tmp_path / "config", {"server": "https://api"}, user)) is None


def test_what_it_cannot_read_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "config", {"server": "https://api", "proxy-url": "http://proxy"}, {})
    assert read_plain_kubeconfig(path) is None  # a proxy
    path = write(tmp_path / "config", {"server": "https://api"}, {})
    assert read_plain_kubeconfig(path, context="other") is None  # its user is not there
    assert read_plain_kubeconfig(path, context="nowhere") is None
    assert read_plain_kubeconfig(tmp_path / "absent") is None
    (tmp_path / "broken").write_text("clusters: [")
    assert read_plain_kubeconfig(tmp_path / "broken") is None
    monkeypatch.setenv("KUBECONFIG", f"{path}:{path}")
    assert read_plain_kubeconfig() is None  # several files: merged by the official loader


def test_plain_falls_back_to_the_official_loader(tmp_path: Path) -> None:
    path = write(tmp_path / "config", {"server": "https://api"}, {"tokenFile": str(tmp_path / "token")})
    (tmp_path / "token").write_text("from-file")
    transport = ApiTransport.from_kubeconfig(path, plain=True)
    assert transport.credentials.configuration is not None


def test_a_plain_transport_never_imports_the_official_client(tmp_path: Path, ca: KeyPair) -> None:
    path = write(
        tmp_path / "config",
        {"server": "https://127.0.0.1:1", "certificate-authority-data": b64(ca.cert_pem)},
        {"token": "abc"},
    )
    program = (
        "import sys\n"
        "from gpuforge.k8s.client import Kube\n"
        f"kube = Kube.from_kubeconfig({str(path)!r}, plain=True)\n"
        "kube.transport._rest_client()\n"
        "assert 'kubernetes' not in sys.modules, 'kubernetes was imported'\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True)
