"""Typed model of the cluster-scoped GpuQuota custom resource (gpuquotas.gpuforge.io). Pure data, no I/O.

A GpuQuota is a node in a tree of quotas. `spec.hard` uses ResourceQuota's keys (`requests.cpu`,
`limits.memory`, `requests.nvidia.com/gpu`), per-model keys (`requests.nvidia.com/gpu.<model>`, which
are also counted against the generic key), DRA keys (`<device-class>.deviceclass.resource.k8s.io/devices`)
and budgets under `cash/` (`cash/requests.nvidia.com/gpu` is GPU-hours, `cash/requests.cpu` CPU-core-hours).

Tenancy: `spec.namespaces` and `spec.namespaceSelector` name the namespaces whose workloads may charge
a quota; a quota that names none admits no workload, and an ancestor that names some narrows the set
for its whole subtree (gpuforge.quota.tenancy).

A child's `hard` is carved out of its parent: the parent's `status.used` counts its children's `hard`
plus its own workloads (`status.selfUsed`). Parsing from and to JSON lives in gpuforge.quota.convert.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Final

from gpuforge.constants import GROUP, VERSION

KIND: Final = "GpuQuota"
PLURAL: Final = "gpuquotas"
SINGULAR: Final = "gpuquota"
SHORT_NAMES: Final = ("gq",)
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
API_VERSION: Final = f"{GROUP}/{VERSION}"

# Budgets: `cash/<key>` is `<key>` times hours, e.g. cash/requests.nvidia.com/gpu: 1000 is 1000 GPU-hours.
CASH_PREFIX: Final = "cash/"
# DRA devices of a DeviceClass, the same key ResourceQuota uses for ResourceClaims.
DEVICE_CLASS_KEY_SUFFIX: Final = ".deviceclass.resource.k8s.io/devices"
RESOURCE_CLAIMS_COUNT_KEY: Final = "count/resourceclaims.resource.k8s.io"

# The keys a GpuQuota can count, as a regular expression in the syntax both Python's `re` and RE2 (the
# CRD's CEL `matches`) read alike: what ResourceQuota counts for pods (`requests.<resource>`,
# `limits.<resource>`, the aliases `cpu`, `memory`, `ephemeral-storage`, and `pods`; `<resource>` a
# qualified resource name, `nvidia.com/gpu.H100` included), DRA devices of a DeviceClass (of one GPU
# model too: `<class>.deviceclass.resource.k8s.io/devices.H100`), ResourceClaims,
# and a `cash/` budget of any of them. The CRD rule on spec.hard carries the same text (a unit test
# compares them), so a key is refused by the API server even while the webhook is down.
# Loose on purpose where the webhook is exact (which vendor resources exist, `limits.` only for the
# standard ones): the CRD refuses what can never be a key, the webhook names the spelling meant.
_DNS_NAME: Final = r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?"
_RESOURCE_NAME: Final = rf"({_DNS_NAME}/)?[A-Za-z0-9][-A-Za-z0-9_.]*"
QUOTA_KEY_PATTERN: Final = (
    r"^(cash/)?(pods|cpu|memory|ephemeral-storage"
    rf"|(requests|limits)\.{_RESOURCE_NAME}"
    rf"|{_DNS_NAME}\.deviceclass\.resource\.k8s\.io/devices(\.[A-Za-z0-9][-A-Za-z0-9_.]*)?"
    r"|count/resourceclaims\.resource\.k8s\.io)$"
)

# Condition types on status.conditions.
# Set True when status.used was recomputed from the workloads that exist (False with the error if not).
CONDITION_RECONCILED: Final = "Reconciled"
# Set True while some `cash/` budget is spent; new workloads using that resource are denied.
CONDITION_BUDGET_EXHAUSTED: Final = "BudgetExhausted"
# Set True while used exceeds hard on some key (hard was lowered below usage); nothing more is admitted.
CONDITION_OVER_QUOTA: Final = "OverQuota"

# Event reasons.
REASON_BUDGET_EXHAUSTED: Final = "BudgetExhausted"
REASON_ADMISSION_DENIED: Final = "AdmissionDenied"

ResourceList = Mapping[str, Decimal]


@dataclass(frozen=True)
class Reservation:
    """Usage taken by an admitted request whose object the controller has not seen yet.

    Kept in status so that a recompute that races with a just-admitted create does not drop it; it
    goes when the controller sees the object at `generation` or later (the API server had bumped the
    generation before asking the webhook), or after a TTL (the request then failed).
    """

    uid: str  # the admission request's uid
    workload: str  # "<Kind>/<namespace>/<name>"
    delta: ResourceList  # what this request added to selfUsed
    expected: ResourceList  # the workload's whole usage once the request is persisted
    created: datetime
    generation: int = 0  # 0: settled as soon as the object exists
    # metadata.uid of the object the request creates or changes, newest last: besides this request's,
    # those of earlier attempts it replaced (a retried create whose first attempt may have persisted).
    # Any of them seen live settles it; a deletion settles it only if it is the newest (an object
    # deleted and created again under the same name does not settle the new one's reservation).
    # Empty (quota carve-outs, reservations of older webhooks): the name decides.
    object_uids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    last_transition_time: datetime


@dataclass(frozen=True)
class GpuQuotaStatus:
    hard: ResourceList = field(default_factory=dict)
    used: ResourceList = field(default_factory=dict)
    self_used: ResourceList = field(default_factory=dict)
    reservations: tuple[Reservation, ...] = ()
    last_reconcile_time: datetime | None = None
    conditions: tuple[Condition, ...] = ()
    # Start of the budget period the `cash/` spending counts in (with spec.refill); kept in status so
    # that a new leader knows whether a boundary passed while none was running.
    last_refill_time: datetime | None = None


# The shortest refill period (spec.refill.period); the CRD refuses shorter ones.
MIN_REFILL_PERIOD: Final = timedelta(hours=1)


@dataclass(frozen=True)
class BudgetRefill:
    """spec.refill: the `cash/` budgets start afresh every `period`, at `anchor + k * period` (from the
    quota's first refill time when no anchor is given). Unspent hours do not carry over."""

    period: timedelta
    anchor: datetime | None = None


# LabelSelector operators (metav1.LabelSelectorOperator).
SELECTOR_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class SelectorRequirement:
    key: str
    operator: str  # one of SELECTOR_OPERATORS
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabelSelector:
    """A Kubernetes LabelSelector; every label and every expression must match. Empty matches all."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[SelectorRequirement, ...] = ()


@dataclass(frozen=True)
class GpuQuota:
    name: str
    parent: str  # "" for a root
    hard: ResourceList
    status: GpuQuotaStatus = field(default_factory=GpuQuotaStatus)
    resource_version: str = ""
    uid: str = ""
    generation: int = 0
    # Namespaces whose workloads may charge this quota: listed by name, or matched by the selector.
    namespaces: tuple[str, ...] = ()
    namespace_selector: LabelSelector | None = None
    refill: BudgetRefill | None = None

    @property
    def is_root(self) -> bool:
        return not self.parent

    @property
    def names_namespaces(self) -> bool:
        return bool(self.namespaces) or self.namespace_selector is not None


def is_cash_key(key: str) -> bool:
    return key.startswith(CASH_PREFIX)


def is_quota_key(key: str) -> bool:
    """Whether `key` is one a GpuQuota can count (QUOTA_KEY_PATTERN)."""
    return re.fullmatch(QUOTA_KEY_PATTERN, key) is not None
