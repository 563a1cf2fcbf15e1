"""The GpuQuota CRD's own rules (CEL, x-kubernetes-validations) on the real local control plane: with
the webhook stopped and its configurations removed, the API server still refuses a key no quota can
count and a change of spec.parent, naming the field."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import GPU, Quotas, WebhookProcess, kubectl

pytestmark = pytest.mark.cluster


@pytest.fixture
def webhook_down(quota_webhook: WebhookProcess) -> Iterator[None]:
    quota_webhook.stop()  # SIGTERM: it removes its ValidatingWebhookConfigurations
    try:
        yield
    finally:
        quota_webhook.start()


def apply(dev_cluster: Any, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*kubectl(dev_cluster), "apply", "-f", "-"],
        input=json.dumps(obj),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def quota_object(name: str, hard: dict[str, str], parent: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": name},
        "spec": {"parent": parent, "hard": hard},
    }


def test_keys_and_parent_are_checked_with_the_webhook_down(
    quotas: Quotas, dev_cluster: Any, webhook_down: None
) -> None:
    configurations = subprocess.run(
        [*kubectl(dev_cluster), "get", "validatingwebhookconfigurations", "-o", "name"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "gpuforge-quota-test" not in configurations  # nothing but the API server decides

    bad = apply(dev_cluster, quota_object(quotas.name("bad"), {GPU: "4", "nvidia.com/gpus": "2"}))
    assert bad.returncode != 0
    assert "spec.hard" in bad.stderr and "a GpuQuota cannot count key nvidia.com/gpus" in bad.stderr

    good = {
        GPU: "4",
        f"{GPU}.H100": "2",
        "cash/requests.cpu": "100",
        "count/resourceclaims.resource.k8s.io": "3",
    }
    root, other = quotas.name("root"), quotas.name("other")
    for name in (root, other):
        assert apply(dev_cluster, quota_object(name, good)).returncode == 0
        quotas.created.append(name)
    child = quotas.name("child")
    assert apply(dev_cluster, quota_object(child, {GPU: "1"}, parent=root)).returncode == 0
    quotas.created.append(child)

    moved = apply(dev_cluster, quota_object(child, {GPU: "1"}, parent=other))
    assert moved.returncode != 0
    assert "spec.parent" in moved.stderr and "immutable" in moved.stderr
    assert quotas.get("child")["spec"]["parent"] == root
