"""The operator creates the quota webhook's ClusterRole, and Kubernetes refuses to let anyone grant a
permission they do not hold (RBAC escalation prevention): every rule the webhook gets must be held by the
operator's own ClusterRoles, for every resource and verb, without a resourceNames limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.render.quota_webhook import ENDPOINT_RULES, WEBHOOK_RULES

DEPLOY = Path(__file__).parents[3] / "deploy"


def operator_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for name in ("rbac.yaml", "rbac-quota.yaml"):
        for document in yaml.safe_load_all((DEPLOY / name).read_text()):
            if document and document.get("kind") == "ClusterRole":
                rules.extend(document.get("rules") or [])
    return rules


def held(group: str, resource: str, verb: str, rules: list[dict[str, Any]]) -> bool:
    return any(
        group in rule.get("apiGroups", [])
        and resource in rule.get("resources", [])
        and verb in rule.get("verbs", [])
        and not rule.get("resourceNames")
        for rule in rules
    )


@pytest.mark.parametrize(
    ("group", "resource", "verb"),
    [
        (group, resource, verb)
        for rule in (*WEBHOOK_RULES, *ENDPOINT_RULES)
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ],
)
def test_the_operator_holds_what_it_grants_the_webhook(group: str, resource: str, verb: str) -> None:
    assert held(group, resource, verb, operator_rules()), (
        f"operator/deploy grants the operator no {verb} on {resource or '?'} in group {group or 'core'!r}, "
        "so it cannot create the webhook's role that holds it"
    )
