"""The webhook's certificates; the functions live in the pure core (`gpuforge.render.certs`) so that the
operator, which issues and rotates them, can use them too."""

from __future__ import annotations

from gpuforge.render.certs import (
    CA_VALIDITY,
    ROTATE_AFTER,
    SERVING_VALIDITY,
    CertPlan,
    KeyPair,
    covers_hosts,
    first_host,
    generate_ca,
    issue_serving_cert,
    needs_rotation,
    plan_certificates,
    service_dns_names,
    signed_by,
)

__all__ = [
    "CA_VALIDITY",
    "ROTATE_AFTER",
    "SERVING_VALIDITY",
    "CertPlan",
    "KeyPair",
    "covers_hosts",
    "first_host",
    "generate_ca",
    "issue_serving_cert",
    "needs_rotation",
    "plan_certificates",
    "service_dns_names",
    "signed_by",
]
