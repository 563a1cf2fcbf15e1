"""The webhook reloads its serving certificate the way a Secret volume changes it: the kubelet writes the
new files into a fresh timestamped directory and swaps the `..data` symlink atomically; `tls.crt` and
`tls.key` are symlinks through `..data` and never change themselves."""

from __future__ import annotations

import os
import socket
import ssl
import threading
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509

from gpuforge.render.certs import KeyPair, generate_ca, issue_serving_cert
from gpuforge.webhook.server import CertReloader


def _project(volume: Path, version: str, pair: KeyPair) -> None:
    """Write `pair` as the kubelet's atomic writer does."""
    target = volume / f"..{version}"
    target.mkdir()
    (target / "tls.crt").write_bytes(pair.cert_pem)
    (target / "tls.key").write_bytes(pair.key_pem)
    link = volume / "..data_tmp"
    link.symlink_to(target.name)
    os.replace(link, volume / "..data")  # the atomic swap
    for name in ("tls.crt", "tls.key"):
        if not (volume / name).is_symlink():
            (volume / name).symlink_to(f"..data/{name}")


def _served_serial(context: ssl.SSLContext, ca_pem: bytes) -> int:
    """Handshake with a server using `context`; the serial number of the certificate it presents."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def accept() -> None:
        conn, _ = server.accept()
        try:
            with context.wrap_socket(conn, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    client = ssl.create_default_context(cadata=ca_pem.decode())
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    thread.join()
    server.close()
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_reload_after_a_secret_volume_swap(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    ca = generate_ca(now)
    first, second = (issue_serving_cert(ca, ["127.0.0.1"], now) for _ in range(2))
    _project(tmp_path, "2026_01_01_00_00_00.1", first)
    reloader = CertReloader(tmp_path / "tls.crt", tmp_path / "tls.key", interval=0.1)
    assert (
        _served_serial(reloader.context, ca.cert_pem)
        == x509.load_pem_x509_certificate(first.cert_pem).serial_number
    )
    assert not reloader.reload_if_changed()
    _project(tmp_path, "2026_02_01_00_00_00.2", second)
    assert reloader.reload_if_changed()
    served = _served_serial(reloader.context, ca.cert_pem)
    assert served == x509.load_pem_x509_certificate(second.cert_pem).serial_number
