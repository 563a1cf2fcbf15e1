"""LimitRange defaults, applied to a pod template before it is counted, as the API server's LimitRanger
applies them to each pod it creates. Pure, no I/O.

A Deployment's template may leave cpu and memory unset; its pods get the namespace's LimitRange defaults
(`default` for limits, `defaultRequest` for requests) when they are created. Counting the template as
written would charge less than the pods take, and a quota on `limits.cpu` would refuse the workload for
a limit its pods will have. The stored LimitRange already carries the API server's defaulting
(`defaultRequest` from `default`, `default` from `max`), so only these two fields are read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

# Compute resources whose quota keys require every container to set them (ResourceQuota's rule).
REQUIRED_WHEN_LIMITED: Final = ("cpu", "memory", "ephemeral-storage")


@dataclass(frozen=True)
class ContainerDefaults:
    """What LimitRanger fills into a container that leaves a resource unset."""

    limits: Mapping[str, Any] = field(default_factory=dict)
    requests: Mapping[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.limits or self.requests)


def container_defaults(limit_ranges: Iterable[Mapping[str, Any]]) -> ContainerDefaults:
    """The defaults of a namespace's LimitRanges, by name order; as LimitRanger applies them one after
    the other, the first that sets a resource wins."""
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    ordered = sorted(limit_ranges, key=lambda item: str((item.get("metadata") or {}).get("name") or ""))
    for limit_range in ordered:
        for item in (limit_range.get("spec") or {}).get("limits") or ():
            if not isinstance(item, Mapping) or item.get("type") != "Container":
                continue
            for target, source in ((limits, item.get("default")), (requests, item.get("defaultRequest"))):
                if isinstance(source, Mapping):
                    for resource, amount in source.items():
                        target.setdefault(str(resource), amount)
    return ContainerDefaults(limits, requests)


def _with_defaults(container: Mapping[str, Any], defaults: ContainerDefaults) -> dict[str, Any]:
    resources = container.get("resources")
    resources = dict(resources) if isinstance(resources, Mapping) else {}
    limits = dict(resources.get("limits") or {}) if isinstance(resources.get("limits"), Mapping) else {}
    requests = dict(resources.get("requests") or {}) if isinstance(resources.get("requests"), Mapping) else {}
    for resource, amount in defaults.requests.items():
        # A container's own limit already defaulted its request (API defaulting runs first).
        if resource not in requests and resource not in limits:
            requests[resource] = amount
    for resource, amount in defaults.limits.items():
        limits.setdefault(resource, amount)
    resources.update({"limits": limits, "requests": requests})
    return {**container, "resources": resources}


def apply_defaults(pod_spec: Mapping[str, Any], defaults: ContainerDefaults) -> Mapping[str, Any]:
    """`pod_spec` with LimitRange defaults filled into its containers and init containers."""
    if not defaults:
        return pod_spec
    result = dict(pod_spec)
    for key in ("containers", "initContainers"):
        containers = pod_spec.get(key)
        if isinstance(containers, list):
            result[key] = [
                _with_defaults(item, defaults) if isinstance(item, Mapping) else item for item in containers
            ]
    return result


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def unset_resources(pod_spec: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Per quota key (`requests.cpu`, `limits.memory`, ...), the containers that leave it unset. A
    request defaults to its limit; pod-level resources set cpu and memory for every container."""
    pod_level = _map(pod_spec.get("resources"))
    pod_limits, pod_requests = _map(pod_level.get("limits")), _map(pod_level.get("requests"))
    unset: dict[str, list[str]] = {}
    containers = [*(pod_spec.get("containers") or ()), *(pod_spec.get("initContainers") or ())]
    for container in containers:
        if not isinstance(container, Mapping):
            continue
        resources = _map(container.get("resources"))
        limits, requests = _map(resources.get("limits")), _map(resources.get("requests"))
        name = str(container.get("name") or "")
        for resource in REQUIRED_WHEN_LIMITED:
            if resource not in limits and resource not in pod_limits:
                unset.setdefault(f"limits.{resource}", []).append(name)
            if all(resource not in values for values in (requests, limits, pod_requests, pod_limits)):
                unset.setdefault(f"requests.{resource}", []).append(name)
    return {key: tuple(names) for key, names in unset.items()}
