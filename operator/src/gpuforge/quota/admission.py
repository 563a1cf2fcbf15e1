"""Admission decisions for workloads and for the quota tree: Allowed(new status) or Denied(message).
Stateless and deterministic: every decision comes from its inputs. No I/O.

The carve-out rule makes one quota enough: a child's `hard` is already counted in its parent's `used`,
so admitting a workload only touches the quota it names, and creating a child only its parent. Decisions
about one quota must be made one after the other, each from the status the previous one returned: the
leader's ledger (gpuforge.quota.ledger) does that in memory; then no two requests can both take the last
GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from gpuforge.api.gpuquota import (
    CASH_PREFIX,
    KIND,
    GpuQuota,
    GpuQuotaStatus,
    Reservation,
    ResourceList,
    is_cash_key,
)
from gpuforge.constants import QUOTA_LABEL
from gpuforge.quota.devicemodels import device_proof_problem
from gpuforge.quota.keys import hard_key_problems
from gpuforge.quota.models import Placement, model_key, proof_problem, restrict_to_keys
from gpuforge.quota.quantity import format_quantity
from gpuforge.quota.usage import (
    WorkloadError,
    add,
    is_controlled_by_workload,
    labels_of,
    restrict,
    workload_controller,
    workload_ref,
    workload_usage,
)

ZERO = Decimal(0)


@dataclass(frozen=True)
class Allowed:
    """The request may proceed; write `status` to `quota` first (None: nothing to write)."""

    quota: str = ""
    status: GpuQuotaStatus | None = None
    message: str = ""


@dataclass(frozen=True)
class Denied:
    message: str
    quota: str = ""
    key: str = ""
    asked: Decimal | None = None
    left: Decimal | None = None
    reason: str = "Forbidden"  # "Forbidden" (quota), "Invalid" (bad object), "NotFound" (no such quota)
    code: int = 403


Decision = Allowed | Denied


@dataclass(frozen=True)
class WorkloadAsk:
    """One admission request for a workload: what it adds and what the workload then holds in total."""

    uid: str
    workload: str  # "<Kind>/<namespace>/<name>"
    delta: ResourceList
    expected: ResourceList
    generation: int = 0  # metadata.generation the object has once this request is persisted
    object_uid: str = ""  # metadata.uid of that object (the API server sets it before validation)
    # Per key (`limits.cpu`, ...), the containers that leave it unset (gpuforge.quota.limitranges).
    unset: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Where the workload's pods may land: what proves the models of per-model keys.
    placement: Placement = field(default_factory=Placement)
    # A Deployment's rolling update: the pods it runs above spec.replicas (maxSurge), and what they take
    # (part of `expected`; a refusal says when they are what does not fit).
    surge_pods: int = 0
    surge: ResourceList = field(default_factory=dict)


def _surge_note(ask: WorkloadAsk, key: str, denied: Denied) -> Denied:
    """A refusal that says so when the rolling update's surge is what does not fit."""
    surge = restrict_to_keys(ask.surge, [key]).get(key, ZERO)
    if not ask.surge_pods or surge <= 0 or denied.asked is None or denied.left is None:
        return denied
    if denied.asked - surge > denied.left:
        return denied  # it would not fit without the surge either
    pods = f"{ask.surge_pods} pod{'s' if ask.surge_pods != 1 else ''}"
    return replace(
        denied,
        message=(
            f"{denied.message}, of which {key}={format_quantity(surge)} is its rolling update's surge "
            f"({pods} above spec.replicas while old pods are replaced, maxSurge); the surge would exceed "
            "hard: set spec.strategy.rollingUpdate.maxSurge to 0 (and maxUnavailable to at least 1) to "
            "replace pods without it"
        ),
    )


def quota_ref(name: str) -> str:
    return f"{KIND}//{name}"


def _amount(values: Mapping[str, Decimal], key: str) -> Decimal:
    return values.get(key, ZERO)


def _shortfall(quota: GpuQuota, key: str, asked: Decimal, what: str) -> Denied | None:
    hard = quota.hard[key]
    used = _amount(quota.status.used, key)
    left = hard - used
    if asked <= left:
        return None
    shown_left = max(left, ZERO)
    return Denied(
        message=(
            f'GpuQuota "{quota.name}": {what} asks {key}={format_quantity(asked)} but only '
            f"{format_quantity(shown_left)} is left ({format_quantity(used)} of {format_quantity(hard)} used)"
        ),
        quota=quota.name,
        key=key,
        asked=asked,
        left=shown_left,
    )


def _with_reservation(
    quota: GpuQuota, charged: ResourceList, reservation: Reservation, *, self_usage: bool
) -> GpuQuotaStatus:
    used = dict(quota.status.used)
    add(used, charged)
    self_used = dict(quota.status.self_used)
    if self_usage:
        add(self_used, charged)
    return replace(
        quota.status,
        hard=dict(quota.hard),
        used=used,
        self_used=self_used,
        reservations=(*quota.status.reservations, reservation),
    )


def spent_budgets(quota: GpuQuota) -> list[str]:
    """The `cash/` keys whose budget is used up."""
    return sorted(
        key
        for key, hard in quota.hard.items()
        if is_cash_key(key) and _amount(quota.status.used, key) >= hard
    )


def _without_rivals(
    quota: GpuQuota, workload: str, generation: int, uid: str, charged: dict[str, Decimal]
) -> tuple[GpuQuota, dict[str, Decimal]]:
    """Only one request can produce generation G of an object, so reservations for the same object and
    generation (an earlier attempt whose answer was lost, e.g. to a timeout or a webhook restart, and is
    now retried; or the same request asked twice, same uid) are alternatives, not additions: they are
    replaced by one reservation holding the larger amount per key. Without this, every retry would hold
    usage that no object will ever have until the controller settles it."""
    rivals = [item for item in quota.status.reservations if _is_rival(item, workload, generation, uid)]
    if not rivals:
        return quota, charged
    used, self_used, merged = dict(quota.status.used), dict(quota.status.self_used), dict(charged)
    for rival in rivals:
        add(used, rival.delta, -1)
        if not rival.workload.startswith(f"{KIND}//"):  # a child's carve-out is not the parent's own use
            add(self_used, rival.delta, -1)
        for key, amount in rival.delta.items():
            merged[key] = max(merged.get(key, ZERO), amount)
    kept = tuple(item for item in quota.status.reservations if item not in rivals)
    status = replace(quota.status, used=used, self_used=self_used, reservations=kept)
    return replace(quota, status=status), merged


def _is_rival(item: Reservation, workload: str, generation: int, uid: str) -> bool:
    return item.workload == workload and (
        (generation > 0 and item.generation == generation) or item.uid == uid
    )


def _object_uids(rivals: list[str], newest: str) -> tuple[str, ...]:
    """The uids that may settle a merged reservation, this request's last. A retried create gets a new
    uid from the API server, yet its first attempt's object may be the one that persisted."""
    if not newest:  # without this request's uid the name decides, as for older reservations
        return ()
    return (*dict.fromkeys(uid for uid in rivals if uid != newest), newest)


def _unset_denied(quota: GpuQuota, ask: WorkloadAsk, what: str) -> Denied | None:
    """ResourceQuota's rule: a quota that limits a compute resource needs every container to set it,
    else the container would take it unchecked (nothing is counted for an unset value)."""
    limited = {_generic(key) for key in quota.hard if not is_cash_key(key)}
    for key in sorted({ALIASES.get(key, key) for key in limited}):
        containers = ask.unset.get(key)
        if containers:
            return Denied(
                message=(
                    f'GpuQuota "{quota.name}" limits {key}: {what} must specify {key} for: '
                    f"{', '.join(containers)}"
                ),
                quota=quota.name,
                key=key,
            )
    return None


def _generic(key: str) -> str:
    """`limits.cpu.A4` limits what `limits.cpu` does, for A4 CPUs: it needs the value set all the same."""
    split = model_key(key)
    return split.generic if split is not None else key


# ResourceQuota's aliases: `cpu` limits what `requests.cpu` does.
ALIASES = {
    "cpu": "requests.cpu",
    "memory": "requests.memory",
    "ephemeral-storage": "requests.ephemeral-storage",
}


def admit_workload(quota: GpuQuota, ask: WorkloadAsk, now: datetime) -> Decision:
    """Charge `ask.delta` to `quota` if every key it touches has room and no budget it needs is spent."""
    kind = ask.workload.split("/", 1)[0]
    what = f"{kind} {ask.workload.split('/', 1)[-1]}"
    unset = _unset_denied(quota, ask, what)
    if unset is not None:
        return unset
    unproven = proof_problem(quota.hard, ask.expected, ask.placement) or device_proof_problem(
        quota.hard, ask.expected
    )
    if unproven is not None:
        key, why = unproven
        return Denied(message=f'GpuQuota "{quota.name}": {what}: {why}', quota=quota.name, key=key)
    for key in spent_budgets(quota):
        resource = key.removeprefix(CASH_PREFIX)
        asked = restrict_to_keys(ask.delta, [resource]).get(resource, ZERO)
        if asked > 0:
            return Denied(
                message=(
                    f'GpuQuota "{quota.name}": budget {key} is spent '
                    f"({format_quantity(_amount(quota.status.used, key))} of "
                    f"{format_quantity(quota.hard[key])} hours used); {what} asks "
                    f"{resource}={format_quantity(asked)}"
                ),
                quota=quota.name,
                key=key,
                asked=asked,
                left=ZERO,
            )
    counted = [key for key in quota.hard if not is_cash_key(key)]
    charged = {key: amount for key, amount in restrict_to_keys(ask.delta, counted).items() if amount > 0}
    rival_uids = [
        uid
        for item in quota.status.reservations
        if _is_rival(item, ask.workload, ask.generation, ask.uid)
        for uid in item.object_uids
    ]
    quota, charged = _without_rivals(quota, ask.workload, ask.generation, ask.uid, charged)
    for key in sorted(charged):
        denied = _shortfall(quota, key, charged[key], what)
        if denied is not None:
            return _surge_note(ask, key, denied)
    if not charged:
        return Allowed(quota=quota.name)
    reservation = Reservation(
        uid=ask.uid,
        workload=ask.workload,
        delta=charged,
        expected=restrict_to_keys(ask.expected, counted),
        created=now,
        generation=ask.generation,
        object_uids=_object_uids(rival_uids, ask.object_uid),
    )
    return Allowed(
        quota=quota.name,
        status=_with_reservation(quota, charged, reservation, self_usage=True),
        message=f'charged to GpuQuota "{quota.name}"',
    )


# --- Tree rules -------------------------------------------------------------------------------------


def hard_keys_denied(new: GpuQuota, old: GpuQuota | None) -> Denied | None:
    """Refuse keys in `spec.hard` nothing is ever counted under (a typo would limit nothing); keys the
    stored quota already holds are left alone so that it stays editable."""
    problems = hard_key_problems(new.hard, old.hard if old is not None else ())
    if not problems:
        return None
    return Denied(
        message=f'GpuQuota "{new.name}": spec.hard.{"; spec.hard.".join(problems)}',
        quota=new.name,
        key=problems[0].split(":", 1)[0],
        reason="Invalid",
        code=422,
    )


def _missing_parent_keys(child: GpuQuota, parent: GpuQuota) -> Denied | None:
    missing = sorted(set(parent.hard) - set(child.hard))
    if not missing:
        return None
    return Denied(
        message=(
            f'GpuQuota "{child.name}" must hold every key of its parent "{parent.name}"; '
            f"missing: {', '.join(missing)}"
        ),
        quota=child.name,
        key=missing[0],
        reason="Invalid",
        code=422,
    )


def _carve(child: GpuQuota, parent: GpuQuota, grown: ResourceList, uid: str, now: datetime) -> Decision:
    carved = {key: amount for key, amount in restrict(grown, parent.hard).items() if amount > 0}
    # A retried create (or raise) of the same child at the same generation holds its carve-out once.
    parent, carved = _without_rivals(parent, quota_ref(child.name), child.generation, uid, carved)
    for key in sorted(carved):
        denied = _shortfall(parent, key, carved[key], f'child GpuQuota "{child.name}"')
        if denied is not None:
            return denied
    if not carved:
        return Allowed(quota=parent.name)
    reservation = Reservation(
        uid=uid,
        workload=quota_ref(child.name),
        delta=carved,
        expected=restrict(child.hard, parent.hard),
        created=now,
        generation=child.generation,
    )
    return Allowed(
        quota=parent.name,
        status=_with_reservation(parent, carved, reservation, self_usage=False),
        message=f'carved from GpuQuota "{parent.name}"',
    )


def _no_such_parent(child: GpuQuota) -> Denied:
    return Denied(
        message=f'GpuQuota "{child.name}": parent GpuQuota "{child.parent}" does not exist',
        quota=child.name,
        reason="NotFound",
        code=404,
    )


def admit_quota_create(child: GpuQuota, parent: GpuQuota | None, uid: str, now: datetime) -> Decision:
    """A new quota: a root is always fine; a child needs its parent, all its keys, and room in it."""
    if not child.parent:
        return Allowed(quota=child.name)
    if child.parent == child.name:
        return Denied(
            f'GpuQuota "{child.name}" cannot be its own parent', child.name, reason="Invalid", code=422
        )
    if parent is None:
        return _no_such_parent(child)
    if child.generation <= 0:  # the API server creates every object at generation 1
        child = replace(child, generation=1)
    return _missing_parent_keys(child, parent) or _carve(child, parent, child.hard, uid, now)


def charged_to_parent(child: GpuQuota, used: ResourceList | None = None) -> dict[str, Decimal]:
    """What a child holds of its parent, per key: its `hard`, or its `used` where that is larger (a
    child whose `hard` was lowered below what runs in it keeps charging its parent for what runs, so
    lowering a busy child's `hard` gives nothing back that is still in use). `used` defaults to the
    child's status."""
    used = child.status.used if used is None else used
    return {key: max(amount, _amount(used, key)) for key, amount in child.hard.items()}


def _children_lacking(new: GpuQuota, old: GpuQuota, children: Sequence[GpuQuota]) -> Denied | None:
    """A key added to a parent must already be in every child: a child without it would hold none of
    it (and could not be given any without editing both at once)."""
    added = sorted(set(new.hard) - set(old.hard))
    if not added:
        return None
    lacking = sorted(child.name for child in children if any(key not in child.hard for key in added))
    if not lacking:
        return None
    return Denied(
        message=(
            f'GpuQuota "{new.name}": cannot add {", ".join(added)} to spec.hard before every child '
            f"holds it; add it to the children first: {', '.join(lacking)}"
        ),
        quota=new.name,
        key=added[0],
        reason="Invalid",
        code=422,
    )


def admit_quota_update(
    old: GpuQuota,
    new: GpuQuota,
    parent: GpuQuota | None,
    uid: str,
    now: datetime,
    *,
    children: Sequence[GpuQuota] = (),
    used: ResourceList | None = None,
) -> Decision:
    """A changed quota: parent fixed; a key added only if every child holds it; raising `hard` is
    carved from the parent, lowering always allowed.

    `children` are the quota's children (for added keys); `used` is the quota's current usage (the
    ledger's; default: `old`'s status), which the parent already counts where it exceeds `hard`."""
    if old.parent != new.parent:
        return Denied(
            message=(
                f'GpuQuota "{new.name}": spec.parent is immutable (was "{old.parent}", now "{new.parent}"); '
                "delete and recreate the quota to move it"
            ),
            quota=new.name,
            key="spec.parent",
            reason="Invalid",
            code=422,
        )
    lacking = _children_lacking(new, old, children)
    if lacking is not None:
        return lacking
    if not new.parent:
        return Allowed(quota=new.name)
    if parent is None:
        return _no_such_parent(new)
    before = charged_to_parent(old, used)
    after = charged_to_parent(new, used)
    grown = {
        key: amount - before.get(key, ZERO) for key, amount in after.items() if amount > before.get(key, ZERO)
    }
    return _missing_parent_keys(new, parent) or _carve(new, parent, grown, uid, now)


def admit_quota_delete(quota: GpuQuota, children: Iterable[str], workloads: Iterable[str] = ()) -> Decision:
    """Only leaves go: deleting an inner quota would orphan a subtree. Nor a leaf that workloads still
    charge (`workloads`: their refs): their usage would vanish from the tree while they run, and its
    parent would hand the same GPUs out again."""
    names = sorted(children)
    if names:
        return Denied(
            message=(
                f'GpuQuota "{quota.name}" has children ({", ".join(names)}); only leaves can be deleted'
            ),
            quota=quota.name,
            reason="Forbidden",
        )
    running = sorted(set(workloads))
    if running:
        shown = ", ".join(running[:5]) + (", ..." if len(running) > 5 else "")
        return Denied(
            message=(
                f'GpuQuota "{quota.name}" is still charged by {len(running)} running '
                f"workload{'s' if len(running) != 1 else ''} ({shown}); delete or relabel them first"
            ),
            quota=quota.name,
            reason="Forbidden",
        )
    return Allowed(quota=quota.name)


def charging_workloads(quota: str, objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """Refs of the workloads among `objects` (each with its `kind`) that charge `quota` now: labelled
    for it, not made by a workload controller (charged to their owner), and holding something (a
    finished Pod or Job, or a workload scaled to zero, holds nothing)."""
    refs = []
    for obj in objects:
        if str(labels_of(obj).get(QUOTA_LABEL) or "") != quota:
            continue
        if obj.get("kind") != "Pod" and is_controlled_by_workload(obj):
            continue
        if obj.get("kind") == "Pod" and workload_controller(obj) is not None:
            continue  # a pod its controller made; the controller is counted
        try:
            usage = workload_usage(obj, strict_claims=False)
        except WorkloadError:
            usage = None  # cannot be counted, yet it is labelled and exists: it counts as running
        if usage is None or usage.replicas > 0:
            metadata = obj.get("metadata") or {}
            refs.append(
                workload_ref(
                    str(obj.get("kind")), str(metadata.get("namespace") or ""), str(metadata.get("name"))
                )
            )
    return sorted(refs)


# RBAC verb on gpuquotas that creating a root, or raising a root's `hard`, needs besides create/update.
ROOT_VERB = "root"


def needs_root_permission(old: GpuQuota | None, new: GpuQuota | None) -> bool:
    """A root has no parent to carve from: creating one, or raising its `hard`, hands out quota from
    nothing, so it takes a permission of its own (delegation: whoever may create quotas under a parent
    cannot mint a new tree)."""
    if new is None or new.parent:
        return False
    if old is None:
        return True
    return any(amount > old.hard.get(key, ZERO) for key, amount in new.hard.items())


def root_denied(quota: str, user: str, creating: bool) -> Denied:
    what = "creating root" if creating else "raising spec.hard of root"
    return Denied(
        message=(
            f'{what} GpuQuota "{quota}" needs the RBAC verb "{ROOT_VERB}" on gpuquotas.gpuforge.io'
            f"{f' (user {user})' if user else ''}"
        ),
        quota=quota,
    )
