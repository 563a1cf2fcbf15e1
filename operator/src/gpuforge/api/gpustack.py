"""Typed model of the GpuStack custom resource (gpustacks.gpuforge.io/v1alpha1). No I/O.

The dataclasses here are the single description of the spec and status: `gpuforge.api.crd` builds the
CRD's OpenAPI schema next to them and a unit test checks that both list the same fields with the same
defaults. Field names are snake_case here and camelCase in the resource (see `gpuforge.api.convert`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gpuforge.api.convert import from_dict, to_dict
from gpuforge.constants import NFD_PCI_NVIDIA_LABELS, NFD_TEGRA_LABEL

KIND = "GpuStack"
PLURAL = "gpustacks"
SINGULAR = "gpustack"
SHORT_NAMES = ("gst",)

# Operand releases written into the CRD defaults; `gpuforge.compat` checks they are known releases.
DEFAULT_DEVICE_PLUGIN_VERSION = "v0.20.0"
DEFAULT_DRA_DRIVER_VERSION = "v0.4.0"
DEFAULT_NAMESPACE = "gpuforge-operands"
DEFAULT_PRIORITY_CLASS = "system-node-critical"
DEVICE_CLASS_GPU = "gpu.nvidia.com"
DEVICE_CLASS_MIG = "mig.nvidia.com"
DEVICE_CLASS_VFIO = "vfio.gpu.nvidia.com"
# A release string: v<major>.<minor>.<patch> with an optional pre-release/build suffix.
VERSION_PATTERN = r"^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$"


class Mode(enum.StrEnum):
    DEVICE_PLUGIN = "devicePlugin"
    DRA = "dra"


class MigStrategy(enum.StrEnum):
    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


class SelectorOperator(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


class TolerationOperator(enum.StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class OnFailure(enum.StrEnum):
    HALT = "halt"
    ROLLBACK = "rollback"


class FailurePolicy(enum.StrEnum):
    FAIL = "Fail"
    IGNORE = "Ignore"


class Phase(enum.StrEnum):
    PENDING = "Pending"
    PROGRESSING = "Progressing"
    READY = "Ready"
    DEGRADED = "Degraded"


# --- spec ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSelectorRequirement:
    key: str
    operator: SelectorOperator
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeSelectorTerm:
    """All expressions must match (AND)."""

    match_expressions: tuple[NodeSelectorRequirement, ...]


@dataclass(frozen=True)
class NodeSelector:
    """A node matches when any term matches (OR), as in a pod's required node affinity."""

    node_selector_terms: tuple[NodeSelectorTerm, ...]


def _nfd_nvidia_selector() -> NodeSelector:
    tegra_label, tegra_vendor = NFD_TEGRA_LABEL
    return NodeSelector(
        (
            *(
                NodeSelectorTerm((NodeSelectorRequirement(label, SelectorOperator.IN, ("true",)),))
                for label in NFD_PCI_NVIDIA_LABELS
            ),
            NodeSelectorTerm((NodeSelectorRequirement(tegra_label, SelectorOperator.IN, (tegra_vendor,)),)),
        )
    )


@dataclass(frozen=True)
class TimeSlicing:
    # NVIDIA's plugin refuses a config with fewer than 2 replicas (api/config/v1/replicas.go).
    replicas: int = 2
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False


@dataclass(frozen=True)
class Sharing:
    time_slicing: TimeSlicing | None = None


@dataclass(frozen=True)
class DevicePluginConfig:
    sharing: Sharing = field(default_factory=Sharing)


@dataclass(frozen=True)
class DevicePluginSpec:
    version: str = DEFAULT_DEVICE_PLUGIN_VERSION
    # Image repository without tag; empty means the release's repository from the compatibility data.
    image: str = ""
    config: DevicePluginConfig = field(default_factory=DevicePluginConfig)
    mig_strategy: MigStrategy = MigStrategy.NONE
    # The RuntimeClass the plugin pods run under, so they reach NVML where nvidia is not containerd's
    # default runtime (gpuforge's toolkit role leaves runc the default); the operator creates it with
    # handler of the same name. Empty: no RuntimeClass (nvidia is the default runtime on every node).
    runtime_class_name: str = "nvidia"


@dataclass(frozen=True)
class DraSpec:
    version: str = DEFAULT_DRA_DRIVER_VERSION
    image: str = ""
    device_classes: tuple[str, ...] = (DEVICE_CLASS_GPU,)
    # Let pods asking for nvidia.com/gpu be served by gpu.nvidia.com devices (KEP-5004), so unchanged
    # workloads keep scheduling on DRA nodes. Written only where the DeviceClass API has the field (v1).
    extended_resource_mapping: bool = True
    # The ComputeDomain (multi-node NVLink/IMEX) controller; off unless asked for.
    compute_domains: bool = False


@dataclass(frozen=True)
class Toleration:
    key: str | None = None
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str | None = None
    effect: TaintEffect | None = None
    toleration_seconds: int | None = None


DEFAULT_TOLERATIONS = (
    Toleration("nvidia.com/gpu", TolerationOperator.EXISTS, None, TaintEffect.NO_SCHEDULE),
)


@dataclass(frozen=True)
class Resources:
    requests: Mapping[str, int | str] = field(default_factory=dict)
    limits: Mapping[str, int | str] = field(default_factory=dict)


@dataclass(frozen=True)
class WaitForCompletion:
    pod_selector: str = ""
    timeout_seconds: int = 0  # 0: wait forever


@dataclass(frozen=True)
class Drain:
    enable: bool = False
    force: bool = False
    timeout_seconds: int = 300
    pod_selector: str = ""
    delete_empty_dir: bool = False


@dataclass(frozen=True)
class PodDeletion:
    enable: bool = True
    force: bool = False
    timeout_seconds: int = 300
    delete_empty_dir: bool = False


@dataclass(frozen=True)
class StepTimeouts:
    """Seconds a node may wait in a step; None: the upgrade engine's default (600, rollback 900)."""

    wait_old_gone: int | None = None
    operand_restart: int | None = None
    validation: int | None = None
    rollback: int | None = None


@dataclass(frozen=True)
class UpgradePolicy:
    """How the upgrade engine (gpuforge.upgrade) changes what runs on nodes; read only by it."""

    max_unavailable: int | str = "25%"
    max_parallel: int = 1  # 0: unlimited
    wait_for_completion: WaitForCompletion = field(default_factory=WaitForCompletion)
    drain: Drain = field(default_factory=Drain)
    pod_deletion: PodDeletion = field(default_factory=PodDeletion)
    on_failure: OnFailure = OnFailure.HALT
    max_failures: int = 1  # 0: never stop
    paused: bool = False
    step_timeout_seconds: int | None = None  # sets all of step_timeouts at once
    step_timeouts: StepTimeouts = field(default_factory=StepTimeouts)


@dataclass(frozen=True)
class QuotaWebhook:
    url: str = ""
    ca_bundle: str = ""


@dataclass(frozen=True)
class QuotaSpec:
    """The GpuQuota admission webhook (gpuforge.quota); its semantics belong to that package."""

    enabled: bool = False
    webhook: QuotaWebhook = field(default_factory=QuotaWebhook)
    failure_policy: FailurePolicy = FailurePolicy.FAIL
    replicas: int = 2
    image: str = ""


@dataclass(frozen=True)
class GpuStackSpec:
    mode: Mode = Mode.DEVICE_PLUGIN
    node_selector: NodeSelector = field(default_factory=_nfd_nvidia_selector)
    device_plugin: DevicePluginSpec = field(default_factory=DevicePluginSpec)
    dra: DraSpec = field(default_factory=DraSpec)
    namespace: str = DEFAULT_NAMESPACE
    # Where the NVIDIA driver lives on the nodes: "/" (installed on the host, as gpuforge's roles do),
    # "/run/nvidia/driver" (the GPU Operator's driver container) or GKE's "/home/kubernetes/bin/nvidia".
    driver_root: str = "/"
    tolerations: tuple[Toleration, ...] = DEFAULT_TOLERATIONS
    priority_class_name: str = DEFAULT_PRIORITY_CLASS
    image_pull_secrets: tuple[str, ...] = ()
    resources: Resources = field(default_factory=Resources)
    upgrade_policy: UpgradePolicy = field(default_factory=UpgradePolicy)
    quota: QuotaSpec = field(default_factory=QuotaSpec)

    @property
    def operand_version(self) -> str:
        return self.dra.version if self.mode is Mode.DRA else self.device_plugin.version


# --- status ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int = 0


@dataclass(frozen=True)
class NodeCounts:
    """Selected GPU nodes per state; see `gpuforge.render.placement.NodeState`."""

    total: int = 0
    ready: int = 0
    pending: int = 0
    switching: int = 0
    refused: int = 0  # the operand cannot serve them, or another stack (GPU Operator) does
    conflict: int = 0


@dataclass(frozen=True)
class ElsewhereNode:
    """A selected node whose GPUs another installation serves, and how gpuforge tells."""

    node: str
    reason: str


# Nodes listed in status.servedElsewhere at most (by name); the Degraded condition counts them all.
ELSEWHERE_LISTED: Final = 50


@dataclass(frozen=True)
class OperandVersions:
    device_plugin: str | None = None
    dra_driver: str | None = None


@dataclass(frozen=True)
class GpuStackStatus:
    observed_generation: int = 0
    phase: Phase = Phase.PENDING
    conditions: tuple[Condition, ...] = ()
    nodes: NodeCounts = field(default_factory=NodeCounts)
    # "ready/total" for the printer column.
    nodes_ready: str = "0/0"
    # The version of the operand the spec's mode selects.
    version: str = ""
    operands: OperandVersions = field(default_factory=OperandVersions)
    # resource.k8s.io/<version> the DeviceClasses are written in (DRA mode).
    dra_api_version: str | None = None
    # Selected nodes left to another installation (NVIDIA's GPU Operator, another plugin), with why.
    served_elsewhere: tuple[ElsewhereNode, ...] = ()
    # Owned by the upgrade engine (gpuforge.upgrade): per-node progress, failing nodes.
    upgrade: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class GpuStack:
    """One GpuStack object: identity plus its parsed spec."""

    name: str
    spec: GpuStackSpec
    generation: int = 1
    uid: str = ""
    creation_timestamp: str = ""  # RFC 3339; orders overlapping stacks (older wins)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> GpuStack:
        meta = body.get("metadata", {})
        return cls(
            name=str(meta["name"]),
            spec=from_dict(GpuStackSpec, body.get("spec") or {}, "spec"),
            generation=int(meta.get("generation", 1)),
            uid=str(meta.get("uid", "")),
            creation_timestamp=str(meta.get("creationTimestamp", "")),
        )

    @property
    def age_key(self) -> tuple[str, str]:
        """Sorts older stacks first; the name breaks ties between equal timestamps."""
        return (self.creation_timestamp, self.name)


def status_to_dict(status: GpuStackStatus) -> dict[str, Any]:
    """The status as a JSON merge patch: optional fields that are unset become null so that a stale value
    (an operand no longer deployed) is removed. `upgrade` is left out: the upgrade engine owns it."""
    out: dict[str, Any] = to_dict(status)
    out.setdefault("draApiVersion", None)
    for key in ("devicePlugin", "draDriver"):
        out["operands"].setdefault(key, None)
    out.pop("upgrade", None)
    return out
