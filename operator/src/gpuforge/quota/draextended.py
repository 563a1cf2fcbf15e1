"""DRA's extended resource mapping, charged both ways as ResourceQuota charges it. Pure, no I/O.

A DeviceClass may name an extended resource (`spec.extendedResourceName`, e.g. `nvidia.com/gpu`); a
pod asking for that resource, or for the class's implicit name `deviceclass.resource.kubernetes.io/
<class>`, may then be served by a device of the class, through a ResourceClaim the scheduler makes for
the pod. ResourceQuota (pkg/quota/v1/evaluator/core/resource_claims.go, feature DRAExtendedResource)
therefore counts:

- a claim's devices of a class under `<class>.deviceclass.resource.k8s.io/devices` and
  `requests.deviceclass.resource.kubernetes.io/<class>`, and, when the class names an extended
  resource, under `requests.<that resource>` too;
- a pod's request for a mapped resource under `requests.<resource>` (like any extended resource) and,
  through the claim made for it, under the class's two keys (its `requests.<resource>` is not counted
  twice), and that claim under `count/resourceclaims.resource.k8s.io`.

Where two classes name the same resource, the newer one (by creation time, then the lower name) is
the one that serves it, as the scheduler's extended resource cache picks it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from gpuforge.api.gpuquota import DEVICE_CLASS_KEY_SUFFIX, RESOURCE_CLAIMS_COUNT_KEY

# The implicit extended resource name of every DeviceClass (resource.k8s.io ResourceDeviceClassPrefix).
IMPLICIT_PREFIX: Final = "deviceclass.resource.kubernetes.io/"


@dataclass(frozen=True)
class DeviceClassMap:
    """Which DeviceClass serves which extended resource, and back."""

    # class name -> the extended resource it names (classes naming none are absent)
    extended: Mapping[str, str] = field(default_factory=dict)
    # extended resource name -> the class serving it (explicit names only; implicit ones map themselves)
    serving: Mapping[str, str] = field(default_factory=dict)

    def class_serving(self, resource: str) -> str:
        """The DeviceClass a pod's request for `resource` may be served by ("" : none)."""
        if resource.startswith(IMPLICIT_PREFIX):
            return resource.removeprefix(IMPLICIT_PREFIX)
        return self.serving.get(resource, "")


def device_class_map(classes: Iterable[Mapping[str, Any]]) -> DeviceClassMap:
    """The mapping from DeviceClass objects (resource.k8s.io v1)."""
    extended: dict[str, str] = {}
    newest: dict[str, tuple[str, str]] = {}  # resource -> (creationTimestamp, name) of its class
    for item in classes:
        metadata = item.get("metadata") or {}
        name = str(metadata.get("name") or "")
        resource = (item.get("spec") or {}).get("extendedResourceName")
        if not name or not isinstance(resource, str) or not resource:
            continue
        extended[name] = resource
        created = str(metadata.get("creationTimestamp") or "")  # RFC 3339 in UTC: orders as text
        held = newest.get(resource)
        if held is None or created > held[0] or (created == held[0] and name < held[1]):
            newest[resource] = (created, name)
    return DeviceClassMap(extended, {resource: name for resource, (_, name) in newest.items()})


def implicit_key(device_class: str) -> str:
    return f"requests.{IMPLICIT_PREFIX}{device_class}"


def claim_charges(usage: Mapping[str, Decimal], classes: DeviceClassMap) -> dict[str, Decimal]:
    """What a claim's devices (`<class>.deviceclass.resource.k8s.io/devices` keys) add to its usage."""
    extra: dict[str, Decimal] = {}
    for key, amount in usage.items():
        device_class = key.removesuffix(DEVICE_CLASS_KEY_SUFFIX)
        if device_class == key or not device_class:
            continue
        extra[implicit_key(device_class)] = extra.get(implicit_key(device_class), Decimal(0)) + amount
        resource = classes.extended.get(device_class)
        if resource:
            extra[f"requests.{resource}"] = extra.get(f"requests.{resource}", Decimal(0)) + amount
    return extra


def pod_charges(requests: Mapping[str, Decimal], classes: DeviceClassMap) -> dict[str, Decimal]:
    """What a pod's requests for DRA-served extended resources add, through the claim made for it."""
    extra: dict[str, Decimal] = {}
    for resource, amount in requests.items():
        device_class = classes.class_serving(resource)
        if not device_class or amount <= 0:
            continue
        claim = claim_charges({f"{device_class}{DEVICE_CLASS_KEY_SUFFIX}": amount}, classes)
        claim[f"{device_class}{DEVICE_CLASS_KEY_SUFFIX}"] = amount
        claim.pop(f"requests.{resource}", None)  # the pod counts its own request already
        for key, value in claim.items():
            extra[key] = extra.get(key, Decimal(0)) + value
    if extra:
        extra[RESOURCE_CLAIMS_COUNT_KEY] = Decimal(1)  # one claim per pod, for all its mapped requests
    return extra
