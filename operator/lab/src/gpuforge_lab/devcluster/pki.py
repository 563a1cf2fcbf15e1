"""Certificates and kubeconfigs for the local control plane: a CA, the API server's serving certificate,
client certificates per component, and the service-account signing key. Written once per cluster state dir.
"""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuforge.render.certs import subject_alt_names

VALIDITY = dt.timedelta(days=365)
# Service IP of `kubernetes.default` inside the simulated cluster's service CIDR (10.96.0.0/16).
KUBERNETES_SERVICE_IP = "10.96.0.1"


@dataclass(frozen=True)
class ClientIdentity:
    file_stem: str
    common_name: str
    organizations: tuple[str, ...] = ()


ADMIN = ClientIdentity("admin", "gpuforge-admin", ("system:masters",))
CONTROLLER_MANAGER = ClientIdentity("controller-manager", "system:kube-controller-manager")
SCHEDULER = ClientIdentity("scheduler", "system:kube-scheduler")
# kwok plays every kubelet; it needs to write node and pod status cluster-wide, like an admin.
KWOK = ClientIdentity("kwok", "gpuforge-kwok", ("system:masters",))
# The API server's own client identity towards webhooks is not needed: webhooks here verify nothing of it.
CLIENTS = (ADMIN, CONTROLLER_MANAGER, SCHEDULER, KWOK)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _issue(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server_names: tuple[str, ...] = (),
    client: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [ExtendedKeyUsageOID.SERVER_AUTH]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if server_names:
        builder = builder.add_extension(subject_alt_names(server_names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_pki(pki_dir: Path) -> None:
    """Create the CA, serving and client certificates and the SA key under pki_dir (idempotent)."""
    if (pki_dir / "ca.crt").exists():
        return
    pki_dir.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("gpuforge-local-ca")
    ca_cert = _issue(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True)
    files: dict[str, bytes] = {"ca.key": _pem_key(ca_key), "ca.crt": _pem_cert(ca_cert)}

    serving_key = _key()
    serving = _issue(
        _name("kube-apiserver"),
        serving_key.public_key(),
        ca_name,
        ca_key,
        server_names=(
            "127.0.0.1",
            "localhost",
            KUBERNETES_SERVICE_IP,
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
    )
    files["apiserver.key"] = _pem_key(serving_key)
    files["apiserver.crt"] = _pem_cert(serving)

    for identity in CLIENTS:
        key = _key()
        cert = _issue(
            _name(identity.common_name, identity.organizations),
            key.public_key(),
            ca_name,
            ca_key,
            client=True,
        )
        files[f"{identity.file_stem}.key"] = _pem_key(key)
        files[f"{identity.file_stem}.crt"] = _pem_cert(cert)

    sa_key = _key()
    files["sa.key"] = _pem_key(sa_key)
    files["sa.pub"] = sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for name, content in files.items():
        path = pki_dir / name
        path.write_bytes(content)
        path.chmod(0o600 if name.endswith(".key") else 0o644)


def node_identity(node_name: str) -> ClientIdentity:
    """A real kubelet's identity: the Node authorizer and NodeRestriction key on this name and group."""
    return ClientIdentity(f"node-{node_name}", f"system:node:{node_name}", ("system:nodes",))


def issue_client(pki_dir: Path, identity: ClientIdentity) -> None:
    """Sign a client certificate for `identity` with the cluster's CA (for joiners after `write_pki`)."""
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    key = _key()
    cert = _issue(
        _name(identity.common_name, identity.organizations),
        key.public_key(),
        ca_cert.subject,
        ca_key,
        client=True,
    )
    (pki_dir / f"{identity.file_stem}.key").write_bytes(_pem_key(key))
    (pki_dir / f"{identity.file_stem}.key").chmod(0o600)
    (pki_dir / f"{identity.file_stem}.crt").write_bytes(_pem_cert(cert))


def kubeconfig(pki_dir: Path, identity: ClientIdentity, server: str, cluster_name: str) -> str:
    def b64(name: str) -> str:
        return base64.b64encode((pki_dir / name).read_bytes()).decode()

    user = identity.file_stem
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(f"{identity.file_stem}.crt"),
                    "client-key-data": b64(f"{identity.file_stem}.key"),
                },
            }
        ],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": user}}],
        "current-context": cluster_name,
    }
    return yaml.safe_dump(document, sort_keys=False)
