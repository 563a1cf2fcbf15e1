"""GPU-hour budgets over time, on the real local control plane: a budget that starts afresh every
period (spec.refill), and the CRD's rules for it; every GPU-hour charged, however short the pod (a pod
that runs between two passes, surge pods of a rolling update, pods orphaned by --cascade=orphan).

The webhooks run with --speedup 3600: a second of one running GPU counts as a GPU-hour, and a refill
period of 20h lasts 20 s."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from .conftest import GPU, Quotas, WebhookProcess, deployment, kubectl, wait_for
from .test_workload_rules_cluster import LABEL, cronjob, template_only

pytestmark = pytest.mark.cluster
CASH = f"cash/{GPU}"


def _status(quotas: Quotas, short: str) -> dict[str, Any]:
    return quotas.get(short).get("status") or {}


def _condition(quotas: Quotas, short: str, kind: str) -> str:
    return next(
        (c["status"] for c in _status(quotas, short).get("conditions") or () if c["type"] == kind), ""
    )


def test_the_api_server_checks_the_refill_schedule(quotas: Quotas) -> None:
    with pytest.raises(client.ApiException, match=r"spec.refill.period must be at least 1h"):
        quotas.create("short", {GPU: 1, CASH: 10})
        quotas.patch("short", {"spec": {"refill": {"period": "30m"}}})
    with pytest.raises(client.ApiException, match=r"spec.refill.period.*should match"):
        quotas.patch("short", {"spec": {"refill": {"period": "a week"}}})
    quotas.create("nobudget", {GPU: 1})
    with pytest.raises(client.ApiException, match=r"spec.refill starts cash/ budgets afresh"):
        quotas.patch("nobudget", {"spec": {"refill": {"period": "168h"}}})
    weekly = {"period": "168h", "anchor": "2026-11-23T00:00:00Z"}
    assert quotas.patch("short", {"spec": {"refill": weekly}})["spec"]["refill"] == weekly
    # The controller records the week the spending counts in: the anchor plus whole weeks (of 168 s:
    # the suite's shared webhook runs 3600 times fast).
    wait_for("the period to be recorded", lambda: bool(_status(quotas, "short").get("lastRefillTime")))
    start = datetime.fromisoformat(_status(quotas, "short")["lastRefillTime"].replace("Z", "+00:00"))
    anchor = datetime.fromisoformat("2026-11-23T00:00:00+00:00")
    assert round((start - anchor).total_seconds(), 3) % 168 == 0


def test_a_restarted_webhook_resumes_the_period_it_left(
    quotas: Quotas, namespace: str, api_client: Any, quota_webhook: WebhookProcess, gpu_nodes: list[str]
) -> None:
    # A 60h period lasts 60 s here. Right after a boundary, the webhook is killed and started again
    # (about 15 s): the new leader must find the same period in the status and neither refill nor
    # forget what was spent in it.
    quotas.create("resume", {GPU: 4, CASH: 100000})
    quotas.patch("resume", {"spec": {"refill": {"period": "60h"}}})
    client.CoreV1Api(api_client).create_namespaced_pod(namespace, _gpu_pod("steady", quotas.name("resume")))
    wait_for("the period to be recorded", lambda: bool(_status(quotas, "resume").get("lastRefillTime")))
    first = _status(quotas, "resume")["lastRefillTime"]
    wait_for("the next period", lambda: _status(quotas, "resume")["lastRefillTime"] != first, timeout=90)
    period = _status(quotas, "resume")["lastRefillTime"]
    wait_for("GPU-hours to accrue in it", lambda: _cash(quotas, "resume") >= 2)
    spent = _cash(quotas, "resume")
    quota_webhook.restart()  # SIGKILL, then a new process that waits out the old one's admissions
    wait_for("the new leader to recompute", lambda: _cash(quotas, "resume") > spent, timeout=20)
    assert _status(quotas, "resume")["lastRefillTime"] == period
    assert _cash(quotas, "resume") >= spent + 5  # carried on from what was spent, the gap included


def test_a_cronjobs_jobs_are_refused_once_the_budget_is_spent_and_admitted_after_the_refill(
    quotas: Quotas, namespace: str, api_client: Any, dev_cluster: Any, gpu_nodes: list[str]
) -> None:
    # A fifth of a GPU-hour every 20 (accelerated) hours; kwok runs a Job's pod for about a second,
    # an hour here, so one Job spends the budget.
    quotas.create("hours", {GPU: 4, CASH: "200m"})
    quotas.patch("hours", {"spec": {"refill": {"period": "20h"}}})
    wait_for("the first period to be recorded", lambda: bool(_status(quotas, "hours").get("lastRefillTime")))
    first_period = _status(quotas, "hours")["lastRefillTime"]
    batch = client.BatchV1Api(api_client)
    batch.create_namespaced_cron_job(namespace, cronjob("nightly", quotas.name("hours")))

    def create_job(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*kubectl(dev_cluster), "-n", namespace, "create", "job", name, "--from=cronjob/nightly"],
            capture_output=True,
            text=True,
            check=False,
        )

    first = create_job("first")
    assert first.returncode == 0, first.stderr
    wait_for(
        "the Job's GPU-hours to spend the budget",
        lambda: _condition(quotas, "hours", "BudgetExhausted") == "True",
        timeout=30,
        describe=lambda: _status(quotas, "hours"),
    )
    assert _status(quotas, "hours")["lastRefillTime"] == first_period  # spent within the first period
    late = create_job("late")
    assert late.returncode != 0 and "budget cash/requests.nvidia.com/gpu is spent" in late.stderr, late.stderr
    wait_for(
        "the budget to start afresh",
        lambda: (
            _status(quotas, "hours").get("lastRefillTime") != first_period
            and _condition(quotas, "hours", "BudgetExhausted") == "False"
        ),
        timeout=40,
        describe=lambda: _status(quotas, "hours"),
    )
    status = _status(quotas, "hours")
    refilled = datetime.fromisoformat(status["lastRefillTime"].replace("Z", "+00:00"))
    started = datetime.fromisoformat(first_period.replace("Z", "+00:00"))
    assert round((refilled - started).total_seconds(), 3) % 20 == 0  # a whole number of periods later
    assert float(status["used"][CASH]) < 0.2  # what the spent period used is not carried over
    again = create_job("again")
    assert again.returncode == 0, again.stderr


@pytest.fixture
def slow_passes(quota_webhook: WebhookProcess, dev_cluster: Any, tmp_path: Path) -> Iterator[WebhookProcess]:
    """The suite's shared webhook swapped for one that accrues and resyncs only every 120 s: a pass comes only
    on events, so what a pod that ran between two passes is charged comes from the pod journal alone."""
    quota_webhook.stop()
    webhook = WebhookProcess(
        Path(dev_cluster.kubeconfig), tmp_path, tag="slow", extra_args=("--accrual", "120", "--resync", "120")
    )
    try:
        webhook.start()
        yield webhook
    finally:
        webhook.stop()
        quota_webhook.start()


def _gpu_pod(name: str, quota: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {LABEL: quota}},
        "spec": {
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/work:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def _cash(quotas: Quotas, short: str) -> float:
    return float(quotas.used(short, CASH))


def _rate(quotas: Quotas, short: str, seconds: float = 8.0) -> float:
    """GPU-hours charged per wall second over `seconds` (GPUs running, at --speedup 3600)."""
    before, start = _cash(quotas, short), time.monotonic()
    time.sleep(seconds)
    return (_cash(quotas, short) - before) / (time.monotonic() - start)


def test_a_pod_that_runs_between_two_passes_is_charged_its_whole_run(
    slow_passes: WebhookProcess, quotas: Quotas, namespace: str, api_client: Any, gpu_nodes: list[str]
) -> None:
    quotas.create("short", {GPU: 4, CASH: 1000})
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, _gpu_pod("brief", quotas.name("short")))
    wait_for(
        "the pod to run",
        lambda: core.read_namespaced_pod("brief", namespace).status.start_time is not None,
    )
    started = core.read_namespaced_pod("brief", namespace).status.start_time
    time.sleep(3)
    core.delete_namespaced_pod("brief", namespace, grace_period_seconds=0)
    deleted = datetime.now(started.tzinfo)
    ran = (deleted - started).total_seconds()  # hours, at 3600x
    # The deletion is a pass (on the event); no periodic pass came while the pod ran.
    wait_for("the run to be charged", lambda: _cash(quotas, "short") >= ran - 1, timeout=20)
    assert _cash(quotas, "short") <= ran + 2


def test_surge_pods_of_a_rolling_update_are_charged_while_they_run(
    quotas: Quotas, namespace: str, api_client: Any, gpu_nodes: list[str]
) -> None:
    quotas.create("surge", {GPU: 4, CASH: 100000})
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    body = deployment("rolling", quotas.name("surge"))
    # The new pod counts as available only after 60 s: meanwhile the old one runs too (maxUnavailable 0).
    body["spec"]["minReadySeconds"] = 60
    body["spec"]["strategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    apps.create_namespaced_deployment(namespace, body)

    def running() -> int:
        pods = core.list_namespaced_pod(namespace, label_selector="app=rolling").items
        return sum(1 for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None)

    wait_for("the first pod to run", lambda: running() == 1)
    apps.patch_namespaced_deployment(
        "rolling", namespace, {"spec": {"template": {"metadata": {"annotations": {"rollout": "1"}}}}}
    )
    wait_for("the surge pod to run beside the old one", lambda: running() == 2)
    assert quotas.used("surge") == "1"  # counted against hard as the Deployment asks: one replica
    assert _rate(quotas, "surge") > 1.5  # charged for both pods: 2 GPU-hours a second


def test_orphaned_pods_stay_charged_until_they_end(
    quotas: Quotas, namespace: str, api_client: Any, dev_cluster: Any, gpu_nodes: list[str]
) -> None:
    quotas.create("orphans", {GPU: 4, CASH: 100000})
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    apps.create_namespaced_deployment(namespace, deployment("on-object", quotas.name("orphans")))
    apps.create_namespaced_deployment(namespace, template_only("on-template", quotas.name("orphans")))

    def running() -> int:
        pods = core.list_namespaced_pod(namespace).items
        return sum(1 for p in pods if p.status.phase == "Running" and p.metadata.name.startswith("on-"))

    wait_for("both pods to run", lambda: running() == 2)
    assert _rate(quotas, "orphans", 5) > 1.5  # both pods charged GPU-hours
    for name in ("on-object", "on-template"):
        subprocess.run(
            [*kubectl(dev_cluster), "-n", namespace, "delete", "deployment", name, "--cascade=orphan"],
            check=True,
            capture_output=True,
        )
    wait_for(
        "the ReplicaSets to be orphaned",
        lambda: all(
            not rs.metadata.owner_references for rs in apps.list_namespaced_replica_set(namespace).items
        ),
    )
    assert running() == 2
    assert _rate(quotas, "orphans") > 1.5  # both pods still charged GPU-hours
    # Against hard, the ReplicaSet whose template carries the label is a workload of its own now.
    assert quotas.used("orphans") == "1"
    for rs in apps.list_namespaced_replica_set(namespace).items:  # the pods end
        apps.delete_namespaced_replica_set(rs.metadata.name, namespace, propagation_policy="Background")
    wait_for("the pods to go", lambda: running() == 0)
    time.sleep(2)
    assert _rate(quotas, "orphans", 5) < 0.3  # nothing runs: nothing more is charged
