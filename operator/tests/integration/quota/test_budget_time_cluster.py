"""GPU-hour budgets over time, on the real local control plane: a budget that starts afresh every
period (spec.refill), and the CRD's rules for it.

The session's webhook runs with --speedup 3600: a second of one running GPU counts as a GPU-hour, and a
refill period of 20h lasts 20 s."""

from __future__ import annotations

import subprocess
from datetime import datetime
from typing import Any

import pytest
from kubernetes import client

from .conftest import GPU, Quotas, kubectl, wait_for
from .test_workload_rules_cluster import cronjob

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
    # the session's webhook runs 3600 times fast).
    wait_for("the period to be recorded", lambda: bool(_status(quotas, "short").get("lastRefillTime")))
    start = datetime.fromisoformat(_status(quotas, "short")["lastRefillTime"].replace("Z", "+00:00"))
    anchor = datetime.fromisoformat("2026-11-23T00:00:00+00:00")
    assert round((start - anchor).total_seconds(), 3) % 168 == 0


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
