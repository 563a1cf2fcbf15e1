"""The pure helpers around the planner in gpuforge.k8s.upgrade: what the plan means for the rendered
DaemonSets, the GpuStack status and the compatibility facts handed to the planner."""

from __future__ import annotations

from typing import Any

import pytest

from gpuforge import compat
from gpuforge.constants import DEPLOY_DEVICE_PLUGIN_LABEL, DEPLOY_DRA_KUBELET_PLUGIN_LABEL
from gpuforge.k8s.upgrade import dra_support, labels_after, upgrade_status
from gpuforge.upgrade.model import (
    Hold,
    HoldReason,
    NodeState,
    Plan,
    SetLabels,
    Transition,
)


def _node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


@pytest.mark.parametrize(
    ("before", "change", "after"),
    [
        ({DEPLOY_DEVICE_PLUGIN_LABEL: "true"}, {DEPLOY_DEVICE_PLUGIN_LABEL: None}, {}),
        ({}, {DEPLOY_DRA_KUBELET_PLUGIN_LABEL: "true"}, {DEPLOY_DRA_KUBELET_PLUGIN_LABEL: "true"}),
        (
            {DEPLOY_DRA_KUBELET_PLUGIN_LABEL: "true"},
            {DEPLOY_DRA_KUBELET_PLUGIN_LABEL: "v0.4.0"},
            {DEPLOY_DRA_KUBELET_PLUGIN_LABEL: "v0.4.0"},
        ),
    ],
)
def test_labels_after_applies_the_plans_label_changes(
    before: dict[str, str], change: dict[str, str | None], after: dict[str, str]
) -> None:
    transition = Transition("g1", None, None, (SetLabels(change),), "")
    result = labels_after([_node("g1", before), _node("g2", {"x": "y"})], Plan((transition,)))
    assert result == {"g1": after, "g2": {"x": "y"}}


def test_upgrade_status_nulls_absent_states_and_caps_node_lists() -> None:
    names = tuple(f"n{i:02d}" for i in range(30))
    plan = Plan(
        (),
        holds=(Hold(HoldReason.MAX_UNAVAILABLE, names, "3 of at most 3"),),
        states={"n00": NodeState.UPGRADE_DONE, "n01": NodeState.UPGRADE_FAILED},
        failed=("n01",),
        target="dra@v0.4.0",
    )
    status = upgrade_status(plan, {"n01": "validation timed out"}, limit=5)
    assert status["nodes"]["upgrade-done"] == 1 and status["nodes"]["upgrade-failed"] == 1
    assert status["nodes"]["wait-old-gone"] is None  # a merge patch removes a stale count
    assert status["failed"] == [{"node": "n01", "reason": "validation timed out"}]
    (hold,) = status["holds"]
    assert hold["nodes"] == list(names[:5]) and hold["nodeCount"] == 30
    assert status["target"] == "dra@v0.4.0" and status["complete"] is False


def test_dra_support_from_the_compat_data() -> None:
    support = {s.version: s.kubelet_minors for s in dra_support(compat.load())}
    assert 31 not in support["v0.4.0"] and {32, 34, 36} <= support["v0.4.0"]
    assert 34 in support["v25.8.0"]
