"""The Grafana dashboard in docs/dashboards/ queries only metrics the webhook exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gpuforge.webhook import metrics

DASHBOARD = Path(__file__).resolve().parents[4] / "docs" / "dashboards" / "gpuquota.json"
# The series a metric of each type exposes, by suffix (prometheus_client names a counter without _total).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
}


def exported_series() -> set[str]:
    return {
        family.name + suffix
        for family in metrics.REGISTRY.collect()
        for suffix in SUFFIXES.get(family.type, ("",))
    }


def expressions(dashboard: dict[str, Any]) -> list[str]:
    found = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            found.append(query.get("query", ""))
    return found


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {name for expr in expressions(dashboard) for name in re.findall(r"\bgpuforge_\w+", expr)}
    assert queried, "the dashboard queries no gpuforge metric"
    assert queried <= exported_series(), sorted(queried - exported_series())


def test_the_dashboard_shows_pressure_and_budgets_per_quota() -> None:
    queried = " ".join(expressions(json.loads(DASHBOARD.read_text())))
    for name in ("gpuforge_quota_used", "gpuforge_quota_hard", "gpuforge_quota_remaining"):
        assert name in queried


def test_the_check_catches_a_metric_that_is_not_exported() -> None:
    assert "gpuforge_quota_remaining" in exported_series()
    assert "gpuforge_quota_admissions_total" in exported_series()
    assert "gpuforge_quota_admission_duration_seconds_bucket" in exported_series()
    assert "gpuforge_quota_admissions" not in exported_series()  # a counter is queried as _total
