"""What an operator of the cluster sees of GpuQuotas on the real local control plane: `kubectl get`
columns that show pressure, per-quota metrics, and a status stamped at every resync."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from kubernetes import client

from .conftest import GPU, Quotas, WebhookProcess, deployment, kubectl, wait_for

pytestmark = pytest.mark.cluster

BUDGET = f"cash/{GPU}"


def test_pressure_shows_in_kubectl_get_and_in_metrics(
    quotas: Quotas, namespace: str, api_client: Any, dev_cluster: Any, quota_webhook: WebhookProcess
) -> None:
    quotas.create("team", {GPU: 8, BUDGET: 1000})
    name = quotas.name("team")
    client.AppsV1Api(api_client).create_namespaced_deployment(
        namespace, deployment("w", name, gpus=1, replicas=2)
    )
    wait_for("the quota to count its Deployment", lambda: quotas.used("team") == "2")
    wait_for(
        "status.remaining to follow used",
        lambda: (quotas.get("team")["status"].get("remaining") or {}).get(GPU) == "6",
    )

    table = subprocess.run(
        [*kubectl(dev_cluster), "get", "gpuquota", name], capture_output=True, text=True, check=True
    ).stdout
    header, row = table.splitlines()
    assert header.split()[:8] == ["NAME", "PARENT", "GPUS", "USED", "GPUS", "HARD", "GPUS", "LEFT"]
    assert "GPU-HOURS LEFT" in header and "READY" in header
    columns = row.split()
    assert columns[:4] == [name, "2", "8", "6"]  # an empty parent prints nothing
    assert "True" in columns  # Ready: the usage controller recomputed it
    wide = subprocess.run(
        [*kubectl(dev_cluster), "get", "gpuquota", name, "-o", "wide"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "OVER QUOTA" in wide and "RECONCILED" in wide

    def series(metric: str, key: str) -> float | None:
        return quota_webhook.metric(f'{metric}{{key="{key}",quota="{name}"}}')  # labels sorted

    wait_for("the remaining metric", lambda: series("gpuforge_quota_remaining", GPU) == 6.0)
    assert series("gpuforge_quota_used", GPU) == 2.0 and series("gpuforge_quota_hard", GPU) == 8.0
    budget_left = series("gpuforge_quota_remaining", BUDGET)
    assert budget_left is not None and 0 < budget_left <= 1000.0
    assert quota_webhook.metric(f'gpuforge_quota_last_reconcile_timestamp_seconds{{quota="{name}"}}')


def test_each_resync_stamps_last_reconcile_time(quotas: Quotas) -> None:
    """The suite's webhook resyncs every 5 s; an idle quota's status is written at each one."""
    quotas.create("idle", {GPU: 4})
    wait_for(
        "a first reconcile",
        lambda: bool((quotas.get("idle").get("status") or {}).get("lastReconcileTime")),
    )
    first = quotas.get("idle")["status"]["lastReconcileTime"]
    wait_for(
        "the next resync to stamp lastReconcileTime though nothing changed",
        lambda: quotas.get("idle")["status"]["lastReconcileTime"] > first,
        timeout=30,
    )
    assert quotas.used("idle") == "0"


def test_the_leader_watches_pods_only_while_a_quota_holds_a_budget(
    quotas: Quotas, api_client: Any, quota_webhook: WebhookProcess
) -> None:
    def budgets_in_cluster() -> float:
        listed = client.CustomObjectsApi(api_client).list_cluster_custom_object(
            "gpuforge.io", "v1alpha1", "gpuquotas"
        )
        held = any(
            key.startswith("cash/") for item in listed["items"] for key in item["spec"].get("hard", {})
        )
        return 1.0 if held else 0.0

    watched = "gpuforge_quota_pods_watched"
    wait_for(
        "the pod watch to follow the budgets", lambda: quota_webhook.metric(watched) == budgets_in_cluster()
    )
    quotas.create("plain", {GPU: 2})
    wait_for("a pass to count the new quota", lambda: bool(quotas.get("plain").get("status")))
    assert quota_webhook.metric(watched) == budgets_in_cluster()
    quotas.create("metered", {GPU: 2, BUDGET: 10})
    wait_for("the pod watch to start with the first budget", lambda: quota_webhook.metric(watched) == 1.0)
    quotas.delete("metered")
    wait_for(
        "the pod watch to follow the budgets", lambda: quota_webhook.metric(watched) == budgets_in_cluster()
    )
