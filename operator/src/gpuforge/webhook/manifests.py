"""The webhook's view of its ValidatingWebhookConfigurations; they live in the pure core
(`gpuforge.render.webhook_configurations`) so that the operator can render them too."""

from __future__ import annotations

from gpuforge.render.webhook_configurations import (
    DEFAULT_NAME,
    DEFAULT_TIMEOUT_SECONDS,
    QUOTAS_PATH,
    SCALE_PATH,
    SYSTEM_NAMESPACES,
    WORKLOADS_PATH,
    ClientTarget,
    FailurePolicy,
    render_webhook_configurations,
)

__all__ = [
    "DEFAULT_NAME",
    "DEFAULT_TIMEOUT_SECONDS",
    "QUOTAS_PATH",
    "SCALE_PATH",
    "SYSTEM_NAMESPACES",
    "WORKLOADS_PATH",
    "ClientTarget",
    "FailurePolicy",
    "render_webhook_configurations",
]
