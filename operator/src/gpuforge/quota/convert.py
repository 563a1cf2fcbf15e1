"""GpuQuota objects (JSON as the API server sends them) to typed models and back. No I/O.

Every error names the field it came from, so an admission denial or a status condition can say
exactly what to fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from gpuforge.api.gpuquota import (
    API_VERSION,
    KIND,
    MIN_REFILL_PERIOD,
    SELECTOR_OPERATORS,
    BudgetRefill,
    Condition,
    GpuQuota,
    GpuQuotaStatus,
    LabelSelector,
    Reservation,
    ResourceList,
    SelectorRequirement,
)
from gpuforge.quota.quantity import (
    QuantityError,
    format_resource_list,
    parse_resource_list,
)


class QuotaSpecError(ValueError):
    """A GpuQuota whose spec or status cannot be read; the message names the field."""


def parse_time(value: object, field: str) -> datetime:
    if not isinstance(value, str):
        raise QuotaSpecError(f"{field}: expected an RFC 3339 time, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as error:
        raise QuotaSpecError(f"{field}: expected an RFC 3339 time, got {value!r}") from error
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise QuotaSpecError(f"{field}: expected an object, got {type(value).__name__}")
    return value


def _resources(value: object, field: str, *, allow_negative: bool = False) -> dict[str, Decimal]:
    try:
        parsed = parse_resource_list(_mapping(value, field), field)
    except QuantityError as error:
        raise QuotaSpecError(str(error)) from error
    if not allow_negative:
        for key, amount in parsed.items():
            if amount < 0:
                raise QuotaSpecError(f"{field}.{key}: must not be negative, got {amount}")
    return parsed


def _integer(value: object, field: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise QuotaSpecError(f"{field}: expected an integer, got {value!r}")
    return value


def _strings(value: object, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise QuotaSpecError(f"{field}: expected a list of non-empty strings, got {value!r}")
    return tuple(value)


def _selector(value: object, field: str) -> LabelSelector | None:
    """A LabelSelector, checked the way the API server checks one (In/NotIn need values, Exists and
    DoesNotExist take none)."""
    if value is None:
        return None
    raw = _mapping(value, field)
    labels = _mapping(raw.get("matchLabels"), f"{field}.matchLabels")
    for key, label in labels.items():
        if not isinstance(label, str):
            raise QuotaSpecError(f"{field}.matchLabels.{key}: expected a string, got {label!r}")
    expressions = raw.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise QuotaSpecError(f"{field}.matchExpressions: expected a list")
    requirements = []
    for index, item in enumerate(expressions):
        where = f"{field}.matchExpressions[{index}]"
        expression = _mapping(item, where)
        label_key, operator = expression.get("key"), expression.get("operator")
        if not isinstance(label_key, str) or not label_key:
            raise QuotaSpecError(f"{where}.key: expected a label key")
        if operator not in SELECTOR_OPERATORS:
            raise QuotaSpecError(f"{where}.operator: expected one of {', '.join(SELECTOR_OPERATORS)}")
        values = _strings(expression.get("values"), f"{where}.values")
        if operator in ("In", "NotIn") and not values:
            raise QuotaSpecError(f"{where}.values: {operator} needs at least one value")
        if operator in ("Exists", "DoesNotExist") and values:
            raise QuotaSpecError(f"{where}.values: {operator} takes no values")
        requirements.append(SelectorRequirement(label_key, str(operator), values))
    return LabelSelector(dict(labels), tuple(requirements))


# A Kubernetes duration of hours, minutes and seconds, as the CRD's pattern for spec.refill.period.
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(value: object, field: str) -> timedelta:
    match = _DURATION.match(value) if isinstance(value, str) and value else None
    if match is None:
        raise QuotaSpecError(f"{field}: expected a duration such as 168h or 90m, got {value!r}")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return timedelta(hours=hours, minutes=minutes, seconds=seconds)


def format_duration(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    text = (
        (f"{hours}h" if hours else "")
        + (f"{minutes}m" if minutes else "")
        + (f"{seconds}s" if seconds else "")
    )
    return text or "0s"


def _refill(value: object, field: str) -> BudgetRefill | None:
    if value is None:
        return None
    raw = _mapping(value, field)
    period = parse_duration(raw.get("period"), f"{field}.period")
    if period < MIN_REFILL_PERIOD:
        raise QuotaSpecError(f"{field}.period: must be at least {format_duration(MIN_REFILL_PERIOD)}")
    anchor = raw.get("anchor")
    return BudgetRefill(period, parse_time(anchor, f"{field}.anchor") if anchor is not None else None)


def refill_to_object(refill: BudgetRefill) -> dict[str, Any]:
    result: dict[str, Any] = {"period": format_duration(refill.period)}
    if refill.anchor is not None:
        result["anchor"] = format_time(refill.anchor)
    return result


def selector_to_object(selector: LabelSelector) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if selector.match_labels:
        result["matchLabels"] = dict(selector.match_labels)
    if selector.match_expressions:
        result["matchExpressions"] = [
            {
                "key": item.key,
                "operator": item.operator,
                **({"values": list(item.values)} if item.values else {}),
            }
            for item in selector.match_expressions
        ]
    return result


def quota_from_object(obj: Mapping[str, Any], *, with_status: bool = True) -> GpuQuota:
    """Read a GpuQuota object; raise QuotaSpecError naming the bad field. `with_status=False` reads
    spec and metadata only (an empty status), which is all a watch event tells the leader."""
    metadata = _mapping(obj.get("metadata"), "metadata")
    spec = _mapping(obj.get("spec"), "spec")
    parent = spec.get("parent") or ""
    if not isinstance(parent, str):
        raise QuotaSpecError(f"spec.parent: expected a string, got {parent!r}")
    status = _mapping(obj.get("status"), "status") if with_status else {}
    return GpuQuota(
        name=str(metadata.get("name", "")),
        parent=parent,
        hard=_resources(spec.get("hard"), "spec.hard"),
        status=_status_from_object(status) if with_status else GpuQuotaStatus(),
        resource_version=str(metadata.get("resourceVersion", "")),
        uid=str(metadata.get("uid", "")),
        generation=_integer(metadata.get("generation"), "metadata.generation"),
        namespaces=_strings(spec.get("namespaces"), "spec.namespaces"),
        namespace_selector=_selector(spec.get("namespaceSelector"), "spec.namespaceSelector"),
        refill=_refill(spec.get("refill"), "spec.refill"),
    )


def used_from_object(obj: Mapping[str, Any]) -> ResourceList:
    """status.used alone (what a follower shows), without reading the reservations."""
    return _resources(_mapping(obj.get("status"), "status").get("used"), "status.used", allow_negative=True)


def _status_from_object(status: Mapping[str, Any]) -> GpuQuotaStatus:
    reservations = []
    raw_reservations = status.get("reservations") or []
    if not isinstance(raw_reservations, Sequence):
        raise QuotaSpecError("status.reservations: expected a list")
    for index, raw in enumerate(raw_reservations):
        item = _mapping(raw, f"status.reservations[{index}]")
        reservations.append(
            Reservation(
                uid=str(item.get("uid", "")),
                workload=str(item.get("workload", "")),
                delta=_resources(item.get("delta"), f"status.reservations[{index}].delta"),
                expected=_resources(item.get("expected"), f"status.reservations[{index}].expected"),
                created=parse_time(item.get("created"), f"status.reservations[{index}].created"),
                generation=_integer(item.get("generation"), f"status.reservations[{index}].generation"),
                object_uids=tuple(str(uid) for uid in item.get("objectUids") or () if uid),
            )
        )
    conditions = []
    for index, raw in enumerate(status.get("conditions") or []):
        item = _mapping(raw, f"status.conditions[{index}]")
        conditions.append(
            Condition(
                type=str(item.get("type", "")),
                status=str(item.get("status", "Unknown")),
                reason=str(item.get("reason", "")),
                message=str(item.get("message", "")),
                last_transition_time=parse_time(
                    item.get("lastTransitionTime", "1970-01-01T00:00:00Z"),
                    f"status.conditions[{index}].lastTransitionTime",
                ),
            )
        )
    last = status.get("lastReconcileTime")
    refilled = status.get("lastRefillTime")
    return GpuQuotaStatus(
        hard=_resources(status.get("hard"), "status.hard"),
        used=_resources(status.get("used"), "status.used", allow_negative=True),
        self_used=_resources(status.get("selfUsed"), "status.selfUsed", allow_negative=True),
        reservations=tuple(reservations),
        last_reconcile_time=parse_time(last, "status.lastReconcileTime") if last else None,
        conditions=tuple(conditions),
        last_refill_time=parse_time(refilled, "status.lastRefillTime") if refilled else None,
    )


def remaining(hard: ResourceList, used: ResourceList) -> dict[str, Decimal]:
    """What is left of each key of `hard` (under `cash/`: the budget left, in hours); 0 when over."""
    return {key: max(amount - used.get(key, Decimal(0)), Decimal(0)) for key, amount in hard.items()}


def status_to_object(status: GpuQuotaStatus) -> dict[str, Any]:
    """The JSON of a status, for a status replace. `remaining` is derived from `hard` and `used`, for
    `kubectl get` (a printer column cannot subtract); it is never read back."""
    result: dict[str, Any] = {
        "hard": format_resource_list(status.hard),
        "used": format_resource_list(status.used),
        "selfUsed": format_resource_list(status.self_used),
        "remaining": format_resource_list(remaining(status.hard, status.used)),
    }
    if status.reservations:
        result["reservations"] = [
            {
                "uid": item.uid,
                "workload": item.workload,
                "delta": format_resource_list(item.delta),
                "expected": format_resource_list(item.expected),
                "created": format_time(item.created),
                "generation": item.generation,
                **({"objectUids": list(item.object_uids)} if item.object_uids else {}),
            }
            for item in status.reservations
        ]
    if status.last_reconcile_time is not None:
        result["lastReconcileTime"] = format_time(status.last_reconcile_time)
    if status.last_refill_time is not None:
        result["lastRefillTime"] = format_time(status.last_refill_time)
    if status.conditions:
        result["conditions"] = [
            {
                "type": item.type,
                "status": item.status,
                "reason": item.reason,
                "message": item.message,
                "lastTransitionTime": format_time(item.last_transition_time),
            }
            for item in status.conditions
        ]
    return result


def quota_to_object(quota: GpuQuota) -> dict[str, Any]:
    """A whole object (tests, examples, `quota tree --output yaml`)."""
    metadata: dict[str, Any] = {"name": quota.name}
    if quota.resource_version:
        metadata["resourceVersion"] = quota.resource_version
    spec: dict[str, Any] = {"parent": quota.parent, "hard": format_resource_list(quota.hard)}
    if quota.namespaces:
        spec["namespaces"] = list(quota.namespaces)
    if quota.namespace_selector is not None:
        spec["namespaceSelector"] = selector_to_object(quota.namespace_selector)
    if quota.refill is not None:
        spec["refill"] = refill_to_object(quota.refill)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": spec,
        "status": status_to_object(quota.status),
    }


def usage_summary(values: ResourceList) -> str:
    """`requests.nvidia.com/gpu=16, requests.cpu=500m`: for messages and printer columns."""
    return ", ".join(f"{key}={amount}" for key, amount in format_resource_list(values).items())
