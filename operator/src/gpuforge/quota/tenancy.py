"""Which namespaces may charge a quota. No I/O.

A GpuQuota names the namespaces whose workloads it admits: `spec.namespaces` by name and/or
`spec.namespaceSelector` by the namespace's labels (either one admitting is enough). A quota that names
none admits no workload: open by default would let anyone who may create a Deployment anywhere spend any
team's quota by writing its name in a label. An ancestor that names namespaces narrows the set for its
whole subtree: a workload must be admitted by its quota and by every ancestor that names some.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpuforge.api.gpuquota import GpuQuota, LabelSelector, SelectorRequirement
from gpuforge.constants import DEFAULT_QUOTA_LABEL, QUOTA_LABEL, QUOTA_REQUIRED_LABEL
from gpuforge.quota.admission import Denied


def requirement_matches(requirement: SelectorRequirement, labels: Mapping[str, str]) -> bool:
    present = requirement.key in labels
    if requirement.operator == "Exists":
        return present
    if requirement.operator == "DoesNotExist":
        return not present
    if requirement.operator == "In":
        return present and labels[requirement.key] in requirement.values
    if requirement.operator == "NotIn":
        return not present or labels[requirement.key] not in requirement.values
    return False  # an operator the schema lets through but nobody defined matches nothing


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.match_labels.items()) and all(
        requirement_matches(requirement, labels) for requirement in selector.match_expressions
    )


def names_namespace(quota: GpuQuota, namespace: str, labels: Mapping[str, str]) -> bool:
    """Does `quota` itself name `namespace` (by name or by its labels)?"""
    if namespace in quota.namespaces:
        return True
    return quota.namespace_selector is not None and selector_matches(quota.namespace_selector, labels)


def lineage(name: str, quota_of: Callable[[str], GpuQuota | None]) -> list[GpuQuota]:
    """The quota `name` and its ancestors, nearest first, as `quota_of` knows them (a cycle or a
    missing ancestor ends it)."""
    chain: list[GpuQuota] = []
    while name and len(chain) < 64 and all(item.name != name for item in chain):
        quota = quota_of(name)
        if quota is None:
            break
        chain.append(quota)
        name = quota.parent
    return chain


def needs_labels(lineage: Sequence[GpuQuota]) -> bool:
    """Whether deciding for `lineage` reads the namespace's labels (some quota in it has a selector)."""
    return any(quota.namespace_selector is not None for quota in lineage)


def admit_namespace(
    lineage: Sequence[GpuQuota], namespace: str, labels: Mapping[str, str], what: str
) -> Denied | None:
    """None if a workload (`what`, e.g. "Deployment ns/w") in `namespace` may charge `lineage[0]`;
    `lineage` is that quota followed by its ancestors, nearest first."""
    quota, ancestors = lineage[0], lineage[1:]
    if not quota.names_namespaces:
        return _refused(
            quota.name, namespace, what, f'GpuQuota "{quota.name}" names no namespace, so it admits none'
        )
    if not names_namespace(quota, namespace, labels):
        return _refused(quota.name, namespace, what, _listing(quota))
    for ancestor in ancestors:
        if ancestor.names_namespaces and not names_namespace(ancestor, namespace, labels):
            return _refused(
                quota.name,
                namespace,
                what,
                f'its ancestor GpuQuota "{ancestor.name}" admits {_set(ancestor)}',
            )
    return None


def _set(quota: GpuQuota) -> str:
    parts = []
    if quota.namespaces:
        parts.append("namespaces " + ", ".join(quota.namespaces))
    if quota.namespace_selector is not None:
        parts.append("namespaces matching spec.namespaceSelector")
    return " and ".join(parts)


def _listing(quota: GpuQuota) -> str:
    return f'GpuQuota "{quota.name}" admits {_set(quota)}'


def _refused(quota: str, namespace: str, what: str, why: str) -> Denied:
    return Denied(
        message=f'namespace "{namespace}" may not charge GpuQuota "{quota}": {what}; {why}',
        quota=quota,
        key="spec.namespaces",
    )


def default_quota(labels: Mapping[str, str]) -> str:
    """The GpuQuota a namespace names for its workloads that take GPUs and name none ("" if none)."""
    return str(labels.get(DEFAULT_QUOTA_LABEL) or "")


def quota_required(namespace: str, labels: Mapping[str, str], what: str, takes_gpus: bool) -> Denied | None:
    """A namespace labelled `gpuforge.io/quota-required: "true"` refuses a workload that takes GPUs and
    names no quota: there nothing could charge it, and the GPUs would go unaccounted. A namespace with
    a default quota charges such workloads to it instead."""
    if not takes_gpus or labels.get(QUOTA_REQUIRED_LABEL) != "true" or default_quota(labels):
        return None
    return Denied(
        message=(
            f'namespace "{namespace}" requires a GpuQuota for workloads that take GPUs '
            f"({QUOTA_REQUIRED_LABEL}=true): {what} names none; label it (or its pod template) "
            f"{QUOTA_LABEL}=<quota>"
        ),
        key=QUOTA_LABEL,
    )
