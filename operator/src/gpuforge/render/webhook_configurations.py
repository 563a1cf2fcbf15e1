"""The quota webhook's ValidatingWebhookConfigurations, as plain dicts. Pure, no I/O.

The operator calls `render_webhook_configurations` when a GpuStack sets `quota.enabled` (with a Service
client config), and `gpuforge webhook run --register` with a URL on loopback. Scope is kept narrow so a
fail-closed webhook can only block what it governs: system namespaces are excluded, matchConditions pass
only objects labelled gpuforge.io/quota (on themselves or their pod template) that no workload controller
owns (and, from namespaces labelled gpuforge.io/quota-required=true or gpuforge.io/default-quota, those
naming no quota, and there with a default quota the resize of any pod naming none), and scales
that grow, never a scale-down; the timeout is short. An outage so refuses only growth of labelled
workloads (and any `kubectl scale` up: a Scale carries no labels).
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from gpuforge.api.workloadkinds import WORKLOAD_KINDS, WorkloadKind, plurals_by_group
from gpuforge.constants import (
    DEFAULT_QUOTA_LABEL,
    GROUP,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    QUOTA_LABEL,
    QUOTA_REQUIRED_LABEL,
)

WORKLOADS_PATH: Final = "/validate-workloads"
SCALE_PATH: Final = "/validate-scale"
QUOTAS_PATH: Final = "/validate-gpuquotas"
DEFAULT_NAME: Final = "gpuforge-quota"
DEFAULT_TIMEOUT_SECONDS: Final = 5
SYSTEM_NAMESPACES: Final = ("kube-system", "kube-public", "kube-node-lease")

FailurePolicy = Literal["Fail", "Ignore"]


@dataclass(frozen=True)
class ClientTarget:
    """Where the API server reaches the webhook: a Service, or a URL (a webhook outside the cluster)."""

    ca_bundle: bytes
    url: str = ""  # e.g. https://127.0.0.1:8443; path is appended
    service_name: str = ""
    service_namespace: str = ""
    service_port: int = 443

    def client_config(self, path: str) -> dict[str, Any]:
        config: dict[str, Any] = {"caBundle": base64.b64encode(self.ca_bundle).decode()}
        if self.url:
            config["url"] = self.url.rstrip("/") + path
        elif self.service_name and self.service_namespace:
            config["service"] = {
                "name": self.service_name,
                "namespace": self.service_namespace,
                "path": path,
                "port": self.service_port,
            }
        else:
            raise ValueError("a webhook target needs a url or a service name and namespace")
        return config


# CEL: only objects labelled on themselves or on one of their pod templates (gpuforge.api.workloadkinds;
# Jobs of a CronJob: on the Job template or its pod template), and not those a workload controller made
# (charged to their owner), by group and kind. Pods always come: the webhook checks that the controller a
# pod names exists.
def _has_steps(base: str, path: str) -> list[str]:
    """CEL tests that each field on `path` below `base` is set: selecting an absent field is an error
    (and an error in a matchCondition fails the request)."""
    parts = path.split(".") if path else []
    return [f"has({'.'.join([base, *parts[: index + 1]])})" for index in range(len(parts))]


def _labelled_at(base: str, path: str, depth: int = 0) -> str:
    """CEL: the template at `path` below `base` carries the quota label. `[]` in the path walks each
    item of a list, `{}` each value of a map."""
    cut = min((path.find(marker) for marker in ("[]", "{}") if marker in path), default=-1)
    if cut < 0:
        target = f"{base}.{path}" if path else base
        steps = _has_steps(base, f"{path}.metadata.labels" if path else "metadata.labels")
        return f"({' && '.join(steps)} && '{QUOTA_LABEL}' in {target}.metadata.labels)"
    head, marker, rest = path[:cut], path[cut : cut + 2], path[cut + 2 :].removeprefix(".")
    collection, var = f"{base}.{head}", f"i{depth}"
    item = var if marker == "[]" else f"{collection}[{var}]"
    inner = _labelled_at(item, rest, depth + 1)
    return f"({' && '.join(_has_steps(base, head))} && {collection}.exists({var}, {inner}))"


def _label_paths(kinds: tuple[WorkloadKind, ...]) -> list[str]:
    paths: list[str] = [""]  # the object itself
    for kind in kinds:
        for path in (*kind.template_paths(), *kind.label_paths):
            if path not in paths:
                paths.append(path)
    return paths


_LABELLED = " || ".join(_labelled_at("object", path) for path in _label_paths(WORKLOAD_KINDS))


def _controllers(kinds: tuple[WorkloadKind, ...]) -> str:
    """CEL: an owner reference `o` names a workload controller (group and kind both)."""
    groups: dict[str, list[str]] = {}
    for kind in kinds:
        if kind.controls:
            groups.setdefault(kind.group, []).append(f"'{kind.kind}'")
    return " || ".join(
        f"({_in_group(group)} && o.kind in [{', '.join(names)}])" for group, names in groups.items()
    )


def _in_group(group: str) -> str:
    """CEL: the owner reference `o` is of `group` (the core group's apiVersion is just `v1`)."""
    return f"o.apiVersion.startsWith('{group}/')" if group else "!o.apiVersion.contains('/')"


_NOT_CONTROLLED = (
    "request.resource.resource == 'pods' || "
    "!has(object.metadata.ownerReferences) || !object.metadata.ownerReferences.exists(o, "
    f"has(o.controller) && o.controller && ({_controllers(WORKLOAD_KINDS)}))"
)
# The same without the exception for pods: an unlabelled pod that a controller made is checked as its
# controller was.
_NOT_CONTROLLED_AT_ALL = _NOT_CONTROLLED.removeprefix("request.resource.resource == 'pods' || ")
_RESIZE = "(has(request.subResource) && request.subResource == 'resize')"
# A pod's update matters only when it moves the pod to another quota, or resizes it (`pods/resize`).
_POD_RELABELLED = (
    "request.resource.resource != 'pods' || request.operation != 'UPDATE' || "
    f"{_RESIZE} || "
    "!has(oldObject.metadata.labels) || !('" + QUOTA_LABEL + "' in oldObject.metadata.labels) || "
    "oldObject.metadata.labels['" + QUOTA_LABEL + "'] != object.metadata.labels['" + QUOTA_LABEL + "']"
)


def _scaled_spec_fields(kinds: tuple[WorkloadKind, ...]) -> list[str]:
    """The spec fields holding the pod templates of kinds scaled by `spec.replicas` (`spec.template`,
    LeaderWorkerSet's `spec.leaderWorkerTemplate`): the condition below reads that field."""
    fields: list[str] = []
    for kind in kinds:
        if kind.scale_path == "spec.replicas":
            for path in kind.template_paths():
                top = ".".join(path.replace("[]", "").replace("{}", "").split(".")[:2])
                if top not in fields:
                    fields.append(top)
    return fields


def _unchanged_or(field: str) -> str:
    new, old = f"object.{field}", f"oldObject.{field}"
    return f"(has({new}) ? {new} : {{}}) != (has({old}) ? {old} : {{}})"


# An update that only lowers replicas (pod templates and labels as they were) takes nothing more: it
# need not reach the webhook, so an outage never holds up a scale-down. Pods, Jobs and CronJobs have
# no spec.replicas and always come.
_NOT_A_SCALE_DOWN = " || ".join(
    (
        "request.operation != 'UPDATE' || !has(object.spec.replicas) || !has(oldObject.spec.replicas)",
        "object.spec.replicas >= oldObject.spec.replicas",
        *(_unchanged_or(field) for field in (*_scaled_spec_fields(WORKLOAD_KINDS), "metadata.labels")),
    )
)
# A Scale object carries no labels, so every scale comes to the webhook, but only one that raises the
# replicas (a Scale with 0 replicas omits the field).
_SCALE_UP = (
    "request.operation != 'UPDATE' || !has(oldObject.spec) || "
    "((has(object.spec) && has(object.spec.replicas)) ? object.spec.replicas : 0) > "
    "(has(oldObject.spec.replicas) ? oldObject.spec.replicas : 0)"
)


def _namespace_selector(
    excluded: Sequence[str], *, expressions: Sequence[dict[str, Any]] = (), **match_labels: str
) -> dict[str, Any]:
    selector: dict[str, Any] = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": sorted(set(excluded))},
            *expressions,
        ]
    }
    if match_labels:
        selector["matchLabels"] = match_labels
    return selector


def _webhook(
    name: str,
    target: ClientTarget,
    path: str,
    rules: list[dict[str, Any]],
    failure_policy: FailurePolicy,
    timeout_seconds: int,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": target.client_config(path),
        "rules": rules,
        "failurePolicy": failure_policy,
        "matchPolicy": "Equivalent",
        # Admission writes reservations into GpuQuota status, but never on dry-run.
        "sideEffects": "NoneOnDryRun",
        "timeoutSeconds": timeout_seconds,
        **extra,
    }


def render_webhook_configurations(
    target: ClientTarget,
    *,
    name: str = DEFAULT_NAME,
    failure_policy: FailurePolicy = "Fail",
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
    excluded_namespaces: Sequence[str] = (),
    labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Two ValidatingWebhookConfigurations: `<name>-workloads` (namespaced workloads, pods/resize, the
    scale subresource, and workloads naming no quota in namespaces that require one) and `<name>-tree`
    (GpuQuota objects, cluster-scoped).

    `excluded_namespaces` adds to the system namespaces; pass the webhook's own namespace so it can
    never block itself. The scale webhook cannot see the workload's labels (a Scale object carries
    none), so it receives every scale up in non-system namespaces and allows unlabelled ones at once;
    scale-downs, by either path, never reach the webhook.
    """
    if not 1 <= timeout_seconds <= 30:
        raise ValueError(f"timeoutSeconds must be 1..30, got {timeout_seconds}")
    metadata_labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, **(labels or {})}
    excluded = [*SYSTEM_NAMESPACES, *excluded_namespaces]
    workloads = _webhook(
        f"workloads.quota.{GROUP}",
        target,
        WORKLOADS_PATH,
        [
            *_workload_rules(["CREATE", "UPDATE"]),
            _rule("", ["pods"], ["CREATE", "UPDATE"]),  # UPDATE: a relabel to another quota
            _rule("", ["pods/resize"], ["UPDATE"]),  # requests changed in place
        ],
        failure_policy,
        timeout_seconds,
        namespaceSelector=_namespace_selector(excluded),
        matchConditions=[
            {"name": "labelled-for-quota", "expression": _LABELLED},
            {"name": "not-owned-by-a-workload", "expression": _NOT_CONTROLLED},
            {"name": "pod-quota-changed", "expression": _POD_RELABELLED},
            {"name": "not-a-scale-down", "expression": _NOT_A_SCALE_DOWN},
        ],
    )
    unlabelled_rules = [
        *_workload_rules(["CREATE", "UPDATE"]),
        _rule("", ["pods"], ["CREATE"]),
    ]
    unlabelled_conditions = [
        {"name": "names-no-quota", "expression": f"!({_LABELLED})"},
        {"name": "not-owned-by-a-workload", "expression": _NOT_CONTROLLED_AT_ALL},
    ]
    # A default quota also checks the resize of an unlabelled pod (any pod: one a controller made grows
    # beyond its owner's template), as the labelled pods' webhook does.
    defaulted_rules = [*copy.deepcopy(unlabelled_rules), _rule("", ["pods/resize"], ["UPDATE"])]
    defaulted_conditions = [
        unlabelled_conditions[0],
        {"name": "not-owned-by-a-workload", "expression": f"{_RESIZE} || {_NOT_CONTROLLED_AT_ALL}"},
    ]
    no_default = {"key": DEFAULT_QUOTA_LABEL, "operator": "DoesNotExist"}
    # Namespaces that require a quota: workloads naming none come too, and are refused if they take
    # GPUs. A webhook of its own, so that elsewhere unlabelled objects never reach the webhook.
    required = _webhook(
        f"required.quota.{GROUP}",
        target,
        WORKLOADS_PATH,
        copy.deepcopy(unlabelled_rules),
        failure_policy,
        timeout_seconds,
        namespaceSelector=_namespace_selector(
            excluded, expressions=[no_default], **{QUOTA_REQUIRED_LABEL: "true"}
        ),
        matchConditions=copy.deepcopy(unlabelled_conditions),
    )
    # Namespaces with a default quota: workloads naming none come too, and are charged to it if they
    # take GPUs (such a namespace need not require a quota as well: the default one is charged).
    defaulted = _webhook(
        f"default.quota.{GROUP}",
        target,
        WORKLOADS_PATH,
        defaulted_rules,
        failure_policy,
        timeout_seconds,
        namespaceSelector=_namespace_selector(
            excluded, expressions=[{"key": DEFAULT_QUOTA_LABEL, "operator": "Exists"}]
        ),
        matchConditions=defaulted_conditions,
    )
    scale = _webhook(
        f"scale.quota.{GROUP}",
        target,
        SCALE_PATH,
        [
            _rule(group, [f"{plural}/scale" for plural in plurals], ["UPDATE"])
            for group, plurals in plurals_by_group(tuple(kind for kind in WORKLOAD_KINDS if kind.scale_path))
        ],
        failure_policy,
        timeout_seconds,
        namespaceSelector=_namespace_selector(excluded),
        matchConditions=[{"name": "scale-up", "expression": _SCALE_UP}],
    )
    tree = _webhook(
        f"gpuquotas.quota.{GROUP}",
        target,
        QUOTAS_PATH,
        [_rule(GROUP, ["gpuquotas"], ["CREATE", "UPDATE", "DELETE"], scope="Cluster")],
        failure_policy,
        timeout_seconds,
    )
    return [
        _configuration(f"{name}-workloads", metadata_labels, [workloads, required, defaulted, scale]),
        _configuration(f"{name}-tree", metadata_labels, [tree]),
    ]


def _workload_rules(operations: list[str]) -> list[dict[str, Any]]:
    """One rule per API group of the workload kinds but pods (whose rules differ per webhook)."""
    return [_rule(group, plurals, operations) for group, plurals in plurals_by_group() if group]


def _rule(
    group: str, resources: list[str], operations: list[str], scope: str = "Namespaced"
) -> dict[str, Any]:
    return {
        "apiGroups": [group],
        "apiVersions": ["*"],
        "resources": resources,
        "operations": list(operations),
        "scope": scope,
    }


def _configuration(name: str, labels: dict[str, str], webhooks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": dict(labels)},
        "webhooks": webhooks,
    }
