"""CA and serving certificates for the quota webhook, and when to rotate them. Pure functions over
`cryptography`; no I/O (the caller stores the PEMs in a Secret or files).

The operator creates a CA once, stores it in a Secret and injects it as the webhook configurations'
caBundle; serving certificates are issued from it and rotated when two thirds of their life has passed,
so a webhook that reloads its files never serves an expired certificate. The CA itself is rotated the
same way, with the old and new CA both in the bundle for a day (`CA_OVERLAP`), so replicas still
serving a certificate of the old CA keep working until the kubelet has given them the new one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = timedelta(days=3650)
SERVING_VALIDITY = timedelta(days=90)
# Rotate once this fraction of the validity has passed.
ROTATE_AFTER = 2 / 3
# After a CA rotation the old CA stays trusted this long (the kubelet refreshes mounted Secrets within
# about a minute; a day leaves room for a node that was briefly unreachable).
CA_OVERLAP = timedelta(days=1)
# Certificates are valid from slightly before their issue time, for clocks that run a little behind.
NOT_BEFORE_SKEW = timedelta(minutes=5)


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def generate_ca(
    now: datetime, common_name: str = "gpuforge-quota-webhook-ca", validity: timedelta = CA_VALIDITY
) -> KeyPair:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - NOT_BEFORE_SKEW)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names the API server uses to reach a webhook Service."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def subject_alt_names(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    """The SAN extension naming `hosts`: an IP address entry for each address, a DNS name for the rest."""
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def issue_serving_cert(
    ca: KeyPair,
    hosts: Sequence[str],
    now: datetime,
    validity: timedelta = SERVING_VALIDITY,
) -> KeyPair:
    """A server certificate for `hosts` (DNS names or IP addresses) signed by `ca`."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key must be an EC key")
    key = _new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - NOT_BEFORE_SKEW)
        .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(subject_alt_names(hosts), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def needs_rotation(cert_pem: bytes, now: datetime, rotate_after: float = ROTATE_AFTER) -> bool:
    """True when the certificate is past `rotate_after` of its life (or unreadable: issue a new one)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= start + (end - start) * rotate_after


def covers_hosts(cert_pem: bytes, hosts: Sequence[str]) -> bool:
    """Does the certificate name every host? (A Service rename needs a new certificate.)"""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    present = {str(v) for v in sans.get_values_for_type(x509.DNSName)}
    present |= {str(v) for v in sans.get_values_for_type(x509.IPAddress)}
    return all(host in present for host in hosts)


def first_host(cert_pem: bytes) -> str:
    """The first name the certificate is for (a DNS name, else an IP address; "" if none): the replicas
    of the webhook serve one certificate, so one replica checks another against this name."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return ""
    names = [str(v) for v in sans.get_values_for_type(x509.DNSName)]
    names += [str(v) for v in sans.get_values_for_type(x509.IPAddress)]
    return names[0] if names else ""


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, Exception):  # InvalidSignature is not a ValueError
        return False
    return True


@dataclass(frozen=True)
class CertPlan:
    """What the operator should store: the CA (and the CA it replaced, while both are trusted), the
    bundle to inject as caBundle, and the serving pair to mount."""

    ca: KeyPair
    ca_bundle: bytes  # every CA a currently served certificate may chain to
    serving: KeyPair
    rotated_ca: bool
    rotated_serving: bool
    previous_ca_pem: bytes | None = None  # store it again next time; None once the overlap is over


def _valid_at(cert_pem: bytes, now: datetime) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return False
    return cert.not_valid_before_utc <= now < cert.not_valid_after_utc


def _issued_at(cert_pem: bytes) -> datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_before_utc + NOT_BEFORE_SKEW


def plan_certificates(
    now: datetime,
    hosts: Sequence[str],
    ca: KeyPair | None = None,
    serving: KeyPair | None = None,
    previous_ca_pem: bytes | None = None,
    ca_overlap: timedelta = CA_OVERLAP,
) -> CertPlan:
    """Keep, issue or rotate the CA and the serving certificate.

    The serving certificate is (re)issued when missing, past two thirds of its life, not naming every
    host, or not signed by the current CA. When the CA rotates, the CA it replaces stays in the bundle
    for `ca_overlap` after the new CA was made (and while it is valid): webhook replicas pick up a new
    serving certificate only when the kubelet refreshes the mounted Secret, and until then the API
    server must still trust the certificate they serve.
    """
    rotated_ca = ca is None or needs_rotation(ca.cert_pem, now)
    if rotated_ca:
        previous_ca_pem = ca.cert_pem if ca is not None and _valid_at(ca.cert_pem, now) else None
        ca = generate_ca(now)
    assert ca is not None
    if previous_ca_pem is not None and (
        not _valid_at(previous_ca_pem, now) or now >= _issued_at(ca.cert_pem) + ca_overlap
    ):
        previous_ca_pem = None
    rotated_serving = (
        serving is None
        or rotated_ca
        or needs_rotation(serving.cert_pem, now)
        or not covers_hosts(serving.cert_pem, hosts)
        or not signed_by(serving.cert_pem, ca.cert_pem)
    )
    if rotated_serving:
        serving = issue_serving_cert(ca, hosts, now)
    assert serving is not None
    bundle = ca.cert_pem + (previous_ca_pem or b"")
    return CertPlan(ca, bundle, serving, rotated_ca, rotated_serving, previous_ca_pem)
