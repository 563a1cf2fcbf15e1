"""What an operator of the cluster sees of GpuQuotas on the real local control plane: a status
stamped at every resync."""

from __future__ import annotations

import pytest

from .conftest import GPU, Quotas, wait_for

pytestmark = pytest.mark.cluster


def test_each_resync_stamps_last_reconcile_time(quotas: Quotas) -> None:
    """The session's webhook resyncs every 5 s; an idle quota's status is written at each one."""
    quotas.create("idle", {GPU: 4})
    wait_for(
        lambda: bool((quotas.get("idle").get("status") or {}).get("lastReconcileTime")),
        message="a first reconcile",
    )
    first = quotas.get("idle")["status"]["lastReconcileTime"]
    wait_for(
        lambda: quotas.get("idle")["status"]["lastReconcileTime"] > first,
        timeout=30,
        message="the next resync to stamp lastReconcileTime though nothing changed",
    )
    assert quotas.used("idle") == "0"
