"""docs/install.md against the code: the Argo CD health checks name only condition types and reasons the
operator and the quota webhook define, and handle every GpuStack and GpuQuota condition type; the values
table lists exactly the chart's values with their defaults."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
import yaml

from gpuforge.api import conditions as stack_conditions
from gpuforge.api import gpuquota
from gpuforge.constants import GROUP
from gpuforge.render import quota_webhook
from gpuforge_lab.devcluster.chart import CHART_DIR

from ..integration.argocd_health import INSTALL, health, health_checks

STACK_TYPES = {
    stack_conditions.READY,
    stack_conditions.PROGRESSING,
    stack_conditions.DEGRADED,
    quota_webhook.CONDITION,
}
QUOTA_TYPES = {
    gpuquota.CONDITION_RECONCILED,
    gpuquota.CONDITION_OVER_QUOTA,
    gpuquota.CONDITION_BUDGET_EXHAUSTED,
}


def _constants(module: Any, names: set[str] | None = None) -> set[str]:
    return {
        value
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str) and (names is None or name in names)
    }


def named_types(lua: str) -> set[str]:
    """Condition types the Lua looks up: condition("X") and the lists it loops over."""
    types = set(re.findall(r'condition\("(\w+)"\)', lua))
    for listed in re.findall(r"ipairs\(\{([^}]*)\}\)", lua):
        types |= set(re.findall(r'"(\w+)"', listed))
    return types


def test_health_checks_are_keyed_by_the_kinds_group() -> None:
    assert set(health_checks()) == {
        f"resource.customizations.health.{GROUP}_GpuStack",
        f"resource.customizations.health.{GROUP}_{gpuquota.KIND}",
    }


def test_gpustack_health_check_handles_exactly_its_condition_types() -> None:
    lua = health_checks()[f"resource.customizations.health.{GROUP}_GpuStack"]
    assert named_types(lua) == STACK_TYPES
    assert "observedGeneration" in lua and "metadata.generation" in lua
    reasons = set(re.findall(r'\.reason == "(\w+)"', lua))
    assert reasons and reasons <= _constants(quota_webhook) | _constants(stack_conditions)
    assert reasons == {quota_webhook.WAITING, quota_webhook.REMOVING}


def test_gpuquota_health_check_handles_exactly_its_condition_types() -> None:
    lua = health_checks()[f"resource.customizations.health.{GROUP}_{gpuquota.KIND}"]
    assert named_types(lua) == QUOTA_TYPES
    defined = {v for k, v in vars(gpuquota).items() if k.startswith("CONDITION_") and isinstance(v, str)}
    assert defined == QUOTA_TYPES, "a new GpuQuota condition type: decide its health in docs/install.md"


def test_every_gpustack_condition_type_is_handled() -> None:
    source = inspect.getsource(stack_conditions)
    section = source.split("# --- Condition types")[1].split("# --- Reasons")[0]
    defined = set(re.findall(r'^\w+: Final = "(\w+)"', section, re.MULTILINE)) | {quota_webhook.CONDITION}
    assert defined == STACK_TYPES, "a new GpuStack condition type: decide its health in docs/install.md"


def stack(generation: int, observed: int | None, *conditions: tuple[str, str, str]) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": "gpus", "generation": generation},
    }
    if observed is not None:
        obj["status"] = {
            "observedGeneration": observed,
            "conditions": [
                {"type": t, "status": s, "reason": r, "message": f"{t} says {r}"} for t, s, r in conditions
            ],
        }
    return obj


C, Q = stack_conditions, quota_webhook
SETTLED = (
    (C.READY, "True", C.ALL_NODES_READY),
    (C.PROGRESSING, "False", C.RECONCILED),
    (C.DEGRADED, "False", C.AS_EXPECTED),
)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (stack(1, None), "Progressing"),
        (stack(2, 1, *SETTLED), "Progressing"),  # the operator has not seen generation 2 yet
        (stack(2, 2, *SETTLED), "Healthy"),
        (stack(1, 1, (C.READY, "True", C.NO_NODES_SELECTED), *SETTLED[1:]), "Healthy"),
        (
            stack(
                1,
                1,
                (C.READY, "False", C.NODES_PENDING),
                (C.PROGRESSING, "True", C.NODES_PENDING),
                SETTLED[2],
            ),
            "Progressing",
        ),
        (stack(1, 1, SETTLED[0], (C.PROGRESSING, "True", C.UPGRADING), SETTLED[2]), "Progressing"),
        (stack(1, 1, *SETTLED[:2], (C.DEGRADED, "True", C.NODE_CONFLICT)), "Degraded"),
        (
            stack(
                1, 1, SETTLED[0], (C.PROGRESSING, "True", C.UPGRADING), (C.DEGRADED, "True", C.UPGRADE_FAILED)
            ),
            "Degraded",
        ),
        (stack(1, 1, *SETTLED, (Q.CONDITION, "True", Q.AVAILABLE)), "Healthy"),
        (stack(1, 1, *SETTLED, (Q.CONDITION, "True", Q.EXTERNAL)), "Healthy"),
        (stack(1, 1, *SETTLED, (Q.CONDITION, "False", Q.WAITING)), "Progressing"),
        (stack(1, 1, *SETTLED, (Q.CONDITION, "False", Q.REMOVING)), "Progressing"),
        (stack(1, 1, *SETTLED, (Q.CONDITION, "False", Q.UNAVAILABLE)), "Degraded"),
        (stack(1, 1, *SETTLED, (Q.CONDITION, "False", Q.ELSEWHERE)), "Degraded"),
        (stack(1, 1, *SETTLED, (Q.CONDITION, "False", Q.APPLY_FAILED)), "Degraded"),
        (
            stack(
                1,
                1,
                (C.READY, "False", C.DRA_API_NOT_SERVED),
                SETTLED[1],
                (C.DEGRADED, "True", C.DRA_API_NOT_SERVED),
            ),
            "Degraded",
        ),
    ],
)
def test_gpustack_health(obj: dict[str, Any], expected: str) -> None:
    status, message = health(obj)
    assert status == expected, message


def gpu_quota(*conditions: tuple[str, str]) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": gpuquota.API_VERSION,
        "kind": gpuquota.KIND,
        "metadata": {"name": "org"},
    }
    if conditions:
        obj["status"] = {
            "conditions": [{"type": t, "status": s, "message": f"{t} is {s}"} for t, s in conditions]
        }
    return obj


G = gpuquota
ACCOUNTED = (
    (G.CONDITION_RECONCILED, "True"),
    (G.CONDITION_OVER_QUOTA, "False"),
    (G.CONDITION_BUDGET_EXHAUSTED, "False"),
)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (gpu_quota(), "Progressing"),
        (gpu_quota(*ACCOUNTED), "Healthy"),
        (gpu_quota((G.CONDITION_RECONCILED, "False")), "Degraded"),
        (gpu_quota(ACCOUNTED[0], (G.CONDITION_OVER_QUOTA, "True"), ACCOUNTED[2]), "Degraded"),
        (gpu_quota(*ACCOUNTED[:2], (G.CONDITION_BUDGET_EXHAUSTED, "True")), "Degraded"),
    ],
)
def test_gpuquota_health(obj: dict[str, Any], expected: str) -> None:
    status, message = health(obj)
    assert status == expected, message


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat |= _flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return flat


def test_values_table_lists_the_charts_values() -> None:
    rows = re.findall(r"^\| `([\w.]+)` \| `([^`]*)` \|", INSTALL.read_text(), re.MULTILINE)
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert dict(rows) == _flatten(values)
