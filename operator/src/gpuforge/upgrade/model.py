"""Typed input and output of the upgrade planner: what it sees, what it wants, what it decides. No I/O.

Input is a `Snapshot` of the GPU nodes (their labels, annotations, readiness, operand pods, what they
advertise, the pods using GPUs on them), the stack's `Desired` state and the `Policy` from
`spec.upgradePolicy`. Output is a `Plan`: per-node `Transition`s, each with the actions that move the
node to its next state, plus the holds and refusals that explain what is not happening and on which nodes.

Every durable fact the planner relies on lives on the Node (the state label and the annotations below),
so a restarted operator reads the same snapshot and makes the same decisions.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from gpuforge.api.gpustack import Mode
from gpuforge.constants import (
    COMPONENT_DEVICE_PLUGIN,
    COMPONENT_DRA_KUBELET_PLUGIN,
    DEPLOY_DEVICE_PLUGIN_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    DRA_DRIVER_GPU,
    GFD_COUNT_LABEL,
    GROUP,
    MAINTENANCE_ANNOTATION,
    NODE_STATE_LABEL,
    UPGRADE_SKIP_LABEL,
)
from gpuforge.upgrade.labelselector import LabelSelector

__all__ = ["Mode"]

# --- Node annotations owned by the upgrade engine ------------------------------------------------
# When the node entered its current upgrade state (RFC 3339, UTC); every step timeout counts from it.
STATE_SINCE_ANNOTATION: Final = f"{GROUP}/upgrade-state-since"
# "true"/"false": whether the node was unschedulable when we started working on it. Present exactly while
# we hold the node; we uncordon at the end only if it says "false" (a cordon by someone else is kept).
INITIAL_UNSCHEDULABLE_ANNOTATION: Final = f"{GROUP}/upgrade.initial-unschedulable"
# "<mode>@<version>" the node ran when we started; where a rollback returns it to.
FROM_ANNOTATION: Final = f"{GROUP}/upgrade.from"
# The target ("<mode>@<version>[#<revision>]") the node failed on; it is not retried until the target changes.
FAILED_TARGET_ANNOTATION: Final = f"{GROUP}/upgrade.failed-target"
# Why the node failed, in words, for `kubectl describe node` and `gpuforge status`.
FAILURE_ANNOTATION: Final = f"{GROUP}/upgrade.failure"

OWNED_ANNOTATIONS: Final = (
    STATE_SINCE_ANNOTATION,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    FROM_ANNOTATION,
    FAILED_TARGET_ANNOTATION,
    FAILURE_ANNOTATION,
)

DEPLOY_LABELS: Final[Mapping[Mode, str]] = {
    Mode.DEVICE_PLUGIN: DEPLOY_DEVICE_PLUGIN_LABEL,
    Mode.DRA: DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
}
COMPONENTS: Final[Mapping[Mode, str]] = {
    Mode.DEVICE_PLUGIN: COMPONENT_DEVICE_PLUGIN,
    Mode.DRA: COMPONENT_DRA_KUBELET_PLUGIN,
}
# A deploy label with this value runs the stack's desired version. Any other value except "false" is a
# version: the node is pinned to that release (a rolled-back node), served by a DaemonSet of that version.
DEPLOY_ON: Final = "true"
DEPLOY_OFF_VALUES: Final = frozenset({"", "false"})


class NodeState(enum.StrEnum):
    """Value of the node label `gpuforge.io/upgrade-state`. Steps whose action is one node patch (cordon,
    flipping a deploy label, uncordon) are written together with the state that follows them, so they
    have no state of their own; a crash can never leave a half-done step behind."""

    # The node does not run the target mode/version and waits for a slot (maxUnavailable, maxParallel).
    UPGRADE_REQUIRED = "upgrade-required"
    # Admitted: initial cordon state and origin recorded, node cordoned; waiting for the pods matching
    # waitForCompletion.podSelector to finish (or its timeout).
    WAIT_FOR_JOBS_REQUIRED = "wait-for-jobs-required"
    # Evicting (eviction API, PodDisruptionBudgets honoured) the pods that must leave: GPU pods before a
    # mode change, every drainable pod when drain is enabled; until none is left or the timeout.
    DRAIN_REQUIRED = "drain-required"
    # Mode (or pinned version) change: the old stack's deploy label is off; waiting until its pod is gone
    # and the node no longer advertises through it (nvidia.com/gpu allocatable 0, no ResourceSlices).
    WAIT_OLD_GONE = "wait-old-gone"
    # Version upgrade in place: the outdated operand pod was deleted; waiting for the OnDelete DaemonSet to
    # recreate it at the current revision.
    OPERAND_RESTART_REQUIRED = "operand-restart-required"
    # The target stack is on; waiting until its pod is Ready and the node advertises its GPUs through it.
    VALIDATION_REQUIRED = "validation-required"
    # In sync with the target; uncordoned if (and only if) we cordoned it.
    UPGRADE_DONE = "upgrade-done"
    # A step failed or timed out (reason in the failure annotation). With onFailure halt the node is left
    # as it failed for a person to look at; a failure before the node was changed uncordons it.
    UPGRADE_FAILED = "upgrade-failed"
    # A step failed after the node was changed and onFailure is rollback: the failed stack is off; waiting
    # until it is gone before the previous mode/version is turned back on.
    ROLLBACK_REQUIRED = "rollback-required"
    # The previous mode/version is on again; waiting until it is Ready and advertising.
    ROLLBACK_VALIDATION_REQUIRED = "rollback-validation-required"
    # Back on the previous mode/version and uncordoned; not retried until the target changes.
    ROLLED_BACK = "rolled-back"


# States in which we are working on the node (we hold it; the initial-unschedulable annotation is set).
_NODE_STATES: dict[str, NodeState] = {state.value: state for state in NodeState}  # label -> state
IN_FLIGHT_STATES: Final = frozenset(
    {
        NodeState.WAIT_FOR_JOBS_REQUIRED,
        NodeState.DRAIN_REQUIRED,
        NodeState.WAIT_OLD_GONE,
        NodeState.OPERAND_RESTART_REQUIRED,
        NodeState.VALIDATION_REQUIRED,
        NodeState.ROLLBACK_REQUIRED,
        NodeState.ROLLBACK_VALIDATION_REQUIRED,
    }
)
# States that count as a failure against the current target (for maxFailures).
FAILURE_STATES: Final = frozenset(
    {
        NodeState.UPGRADE_FAILED,
        NodeState.ROLLBACK_REQUIRED,
        NodeState.ROLLBACK_VALIDATION_REQUIRED,
        NodeState.ROLLED_BACK,
    }
)


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def kubelet_minor(version: str) -> int | None:
    """`v1.34.2` (or `v1.34.2-kwok`) -> 34; None if it does not look like a Kubernetes 1.x version."""
    parts = version.lstrip("v").split(".")
    if len(parts) < 2 or parts[0] != "1":
        return None
    digits = ""
    for char in parts[1]:
        if not char.isdigit():
            break
        digits += char
    return int(digits) if digits else None


# --- Snapshot --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class OperandPod:
    """A device-plugin or DRA kubelet-plugin pod on the node."""

    ref: PodRef
    mode: Mode
    version: str  # the operand release the pod runs (from its image tag or version label)
    revision: str = ""  # controller-revision-hash; "" if unknown
    ready: bool = False
    phase: str = "Running"
    deleting: bool = False  # deletionTimestamp is set


@dataclass(frozen=True, slots=True)
class WorkloadPod:
    """A non-terminal pod on the node other than our operands (terminal pods are left out of snapshots)."""

    ref: PodRef
    labels: Mapping[str, str] = field(default_factory=dict)
    uses_gpu: bool = (
        False  # requests nvidia.com/gpu (or nvidia.com/mig-*) or has an allocated gpu.nvidia.com claim
    )
    holds_claim: bool = False  # has an allocated ResourceClaim of gpu.nvidia.com
    daemonset: bool = False  # owned by a DaemonSet: never evicted, as kubectl drain does
    controlled: bool = True  # owned by a controller that recreates it; bare pods go only with force
    empty_dir: bool = False  # has emptyDir volumes (data lost on eviction)
    deleting: bool = False


@dataclass(frozen=True, slots=True)
class GpuNode:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    kubelet_version: str = ""
    ready: bool = True
    unschedulable: bool = False
    # Device-plugin advertisement: nvidia.com/gpu plus nvidia.com/mig-* in status.capacity / allocatable.
    gpu_capacity: int = 0
    gpu_allocatable: int = 0
    # DRA advertisement: per driver name, (ResourceSlices for this node, devices in them).
    slices: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    operands: tuple[OperandPod, ...] = ()
    pods: tuple[WorkloadPod, ...] = ()

    @property
    def state(self) -> NodeState | None:
        """The upgrade state label; None if absent or not a value we know (then it is derived again)."""
        return _NODE_STATES.get(self.labels.get(NODE_STATE_LABEL) or "")

    @property
    def state_since(self) -> datetime | None:
        return parse_time(self.annotations.get(STATE_SINCE_ANNOTATION))

    @property
    def held_by_us(self) -> bool:
        return INITIAL_UNSCHEDULABLE_ANNOTATION in self.annotations

    @property
    def cordoned_by_us(self) -> bool:
        """We cordoned it: it was schedulable when we started. Only then do we uncordon."""
        return self.annotations.get(INITIAL_UNSCHEDULABLE_ANNOTATION) == "false"

    @property
    def expected_gpus(self) -> int:
        """GPUs GPU Feature Discovery counted on the node; 1 if unknown (then any advertisement will do)."""
        try:
            return max(1, int(self.labels.get(GFD_COUNT_LABEL, "1")))
        except ValueError:
            return 1

    @property
    def kubelet_minor(self) -> int | None:
        return kubelet_minor(self.kubelet_version)

    def deploy_value(self, mode: Mode) -> str | None:
        """The deploy label's value if that stack is on for the node, else None."""
        value = self.labels.get(DEPLOY_LABELS[mode])
        return None if value is None or value in DEPLOY_OFF_VALUES else value

    def dra_devices(self, driver: str) -> int:
        return self.slices.get(driver, (0, 0))[1]

    def dra_slices(self, driver: str) -> int:
        return self.slices.get(driver, (0, 0))[0]


@dataclass(frozen=True)
class Snapshot:
    """Everything the planner looks at, read at one moment. Nodes are the GPU nodes the stack selects plus
    any node still carrying our labels."""

    nodes: tuple[GpuNode, ...]
    now: datetime
    # resource.k8s.io versions the API server serves ("v1", "v1beta2", ...).
    served_resource_versions: frozenset[str] = frozenset({"v1"})


# --- Desired state ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DraDriverSupport:
    """Compatibility fact: the kubelet minors (1.x) a DRA driver release can talk to (gRPC versions)."""

    version: str
    kubelet_minors: frozenset[int]


@dataclass(frozen=True)
class Desired:
    mode: Mode
    # The release each stack's main DaemonSet runs (its deploy label "true"); both, as the stack not
    # selected by `mode` keeps running on nodes not yet moved.
    versions: Mapping[Mode, str]
    # Names of the nodes the stack selects.
    selected: frozenset[str]
    # controller-revision-hash of each main DaemonSet's current template, if known: a pod with another
    # hash is outdated even at the same version (configuration change).
    revisions: Mapping[Mode, str] = field(default_factory=dict)
    # Compatibility facts for DRA driver releases; empty: no kubelet checks.
    dra_support: tuple[DraDriverSupport, ...] = ()
    # The Kubernetes minor the nodes' kubelets are about to be upgraded to, if an upgrade is planned:
    # nodes whose running DRA driver cannot talk to it are held, naming a release that serves both.
    kubelet_upgrade_minor: int | None = None
    # The GpuStack's name: written as gpuforge.io/stack on the nodes it holds; only nodes carrying it are
    # released when no longer selected ("" in tests: any node with our labels).
    stack: str = ""
    dra_driver: str = DRA_DRIVER_GPU


# --- Policy ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IntOrPercent:
    value: int
    percent: bool = False

    @classmethod
    def parse(cls, raw: int | str) -> IntOrPercent:
        if isinstance(raw, bool):
            raise ValueError(f"expected an integer or a percentage, got {raw!r}")
        if isinstance(raw, int):
            if raw < 0:
                raise ValueError(f"must not be negative, got {raw}")
            return cls(raw)
        text = raw.strip()
        if text.endswith("%") and text[:-1].isdigit():
            value = int(text[:-1])
            if value > 100:
                raise ValueError(f"a percentage must be at most 100%, got {raw!r}")
            return cls(value, percent=True)
        if text.isdigit():
            return cls(int(text))
        raise ValueError(f"expected an integer or a percentage such as '25%', got {raw!r}")

    def resolve(self, total: int) -> int:
        """Absolute count; a percentage rounds up and is at least 1 when above 0%, as for DaemonSets."""
        if not self.percent:
            return self.value
        if self.value == 0 or total == 0:
            return 0
        return max(1, math.ceil(total * self.value / 100))

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


class OnFailure(enum.StrEnum):
    # Leave a failed node as it failed (cordoned, for a person to look at).
    HALT = "halt"
    # Return a failed node to the mode/version it ran before and uncordon it.
    ROLLBACK = "rollback"


@dataclass(frozen=True, slots=True)
class WaitForCompletion:
    pod_selector: LabelSelector = field(default_factory=LabelSelector)  # empty: wait for nothing
    timeout_seconds: int = 0  # 0: wait as long as it takes


@dataclass(frozen=True, slots=True)
class PodDeletion:
    """GPU pods that must leave a node (before a mode change) are evicted; if disabled we only wait."""

    enable: bool = True
    force: bool = False  # also remove pods no controller recreates
    timeout_seconds: int = 300  # 0: no limit
    delete_empty_dir: bool = False  # also remove pods with emptyDir volumes


@dataclass(frozen=True, slots=True)
class Drain:
    """Evict every pod on the node (DaemonSet pods excepted) before any change, like `kubectl drain`."""

    enable: bool = False
    force: bool = False
    pod_selector: LabelSelector = field(default_factory=LabelSelector)
    timeout_seconds: int = 300
    delete_empty_dir: bool = False


@dataclass(frozen=True, slots=True)
class StepTimeouts:
    """Seconds a node may spend in a waiting step before it fails; 0: no limit. The kubelet keeps a
    stopped device plugin's capacity for 5 minutes, so wait-old-gone needs more than that."""

    wait_old_gone: int = 600
    operand_restart: int = 600
    validation: int = 600
    rollback: int = 900


@dataclass(frozen=True)
class Policy:
    """`spec.upgradePolicy`; see docs/upgrades.md for what each field does."""

    max_unavailable: IntOrPercent = IntOrPercent(25, percent=True)
    max_parallel: int = 1  # 0: no limit besides maxUnavailable
    wait_for_completion: WaitForCompletion = WaitForCompletion()
    pod_deletion: PodDeletion = PodDeletion()
    drain: Drain = Drain()
    timeouts: StepTimeouts = StepTimeouts()
    on_failure: OnFailure = OnFailure.HALT
    # New nodes stop being started once this many nodes failed on the current target; 0: never stop.
    max_failures: int = 1
    paused: bool = False
    skip_label: str = UPGRADE_SKIP_LABEL
    maintenance_annotation: str = MAINTENANCE_ANNOTATION


# --- Plan ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cordon:
    pass


@dataclass(frozen=True, slots=True)
class Uncordon:
    pass


@dataclass(frozen=True, slots=True)
class SetLabels:
    """Set (str) or remove (None) node labels; includes deploy labels and the state label."""

    values: Mapping[str, str | None]


@dataclass(frozen=True, slots=True)
class SetAnnotations:
    values: Mapping[str, str | None]


@dataclass(frozen=True, slots=True)
class EvictPods:
    """Evict through the eviction API (PodDisruptionBudgets honoured); a 429 just means try again later."""

    pods: tuple[PodRef, ...]


@dataclass(frozen=True, slots=True)
class DeletePods:
    """Delete outdated operand pods so their OnDelete DaemonSet recreates them at the current revision."""

    pods: tuple[PodRef, ...]


NodeAction = Cordon | Uncordon | SetLabels | SetAnnotations
PodAction = EvictPods | DeletePods
Action = NodeAction | PodAction


@dataclass(frozen=True)
class Transition:
    """One step for one node. Apply `node_patch()` first (one PATCH of the Node: labels, annotations and
    spec.unschedulable together), then the pod actions in order. `to_state == from_state` means the node
    stays where it is and the actions keep it going (for example evicting the pods still there)."""

    node: str
    from_state: NodeState | None
    to_state: NodeState | None  # None: the state label is removed (node released)
    actions: tuple[Action, ...]
    message: str  # what happens and why, in words, for the node event
    failure: str | None = None  # set when the node fails in this step

    @property
    def changes_state(self) -> bool:
        return self.from_state != self.to_state

    @property
    def starts(self) -> bool:
        """The node is admitted: it enters an in-flight state from outside."""
        return self.from_state not in IN_FLIGHT_STATES and self.to_state in IN_FLIGHT_STATES

    @property
    def ends(self) -> bool:
        """The node leaves flight (done, failed, rolled back): its slot is free."""
        return self.from_state in IN_FLIGHT_STATES and self.to_state not in IN_FLIGHT_STATES

    @property
    def records_waiting(self) -> bool:
        """Only writes down that the node waits for a slot (state label upgrade-required and its timer):
        nothing on the node changes, so it may wait behind the steps that move nodes."""
        if self.to_state is not NodeState.UPGRADE_REQUIRED or self.from_state in IN_FLIGHT_STATES:
            return False
        for action in self.actions:
            if isinstance(action, SetLabels) and set(action.values) <= {NODE_STATE_LABEL}:
                continue
            if isinstance(action, SetAnnotations) and set(action.values) <= {STATE_SINCE_ANNOTATION}:
                continue
            return False
        return True

    @property
    def node_actions(self) -> tuple[NodeAction, ...]:
        return tuple(a for a in self.actions if isinstance(a, Cordon | Uncordon | SetLabels | SetAnnotations))

    @property
    def pod_actions(self) -> tuple[PodAction, ...]:
        return tuple(a for a in self.actions if isinstance(a, EvictPods | DeletePods))

    def node_patch(self) -> dict[str, Any] | None:
        """The merge patch for the Node carrying every node action, or None if there is none."""
        labels: dict[str, str | None] = {}
        annotations: dict[str, str | None] = {}
        unschedulable: bool | None = None
        for action in self.node_actions:
            if isinstance(action, SetLabels):
                labels.update(action.values)
            elif isinstance(action, SetAnnotations):
                annotations.update(action.values)
            elif isinstance(action, Cordon):
                unschedulable = True
            elif isinstance(action, Uncordon):
                unschedulable = False
        patch: dict[str, Any] = {}
        if labels or annotations:
            patch["metadata"] = {}
            if labels:
                patch["metadata"]["labels"] = labels
            if annotations:
                patch["metadata"]["annotations"] = annotations
        if unschedulable is not None:
            patch["spec"] = {"unschedulable": unschedulable}
        return patch or None


class HoldReason(enum.StrEnum):
    PAUSED = "Paused"  # spec.upgradePolicy.paused
    HALTED = "Halted"  # maxFailures nodes failed on the current target
    MAX_UNAVAILABLE = "MaxUnavailable"  # the unavailability budget is used up
    MAX_PARALLEL = "MaxParallel"  # maxParallel nodes are in progress
    SKIPPED = "Skipped"  # the node carries the skip label
    MAINTENANCE = "Maintenance"  # the node is under maintenance (day-2 Ansible); we keep off it
    NOT_READY = "NodeNotReady"  # not started while the node is NotReady
    CLAIMS_HELD = "ClaimsHeld"  # the DRA plugin stays until no pod on the node holds a GPU claim
    # A drain waits: the eviction API refused pods (a PodDisruptionBudget allows no disruption now).
    EVICTION_BLOCKED = "EvictionBlocked"
    KUBELET_UPGRADE = "KubeletUpgradeBlocked"  # the running DRA driver cannot talk to the coming kubelet
    KUBELET_SKEW = "KubeletUnsupported"  # the running DRA driver cannot talk to the node's kubelet now


class RefusalReason(enum.StrEnum):
    NO_DRA_API = "DRAAPINotServed"  # the API server serves no resource.k8s.io version we can use
    KUBELET_UNSUPPORTED = "KubeletUnsupported"  # the target DRA driver cannot talk to these kubelets
    KUBELET_NEEDS_V1BETA1 = "KubeletNeedsV1beta1"  # 1.32/1.33 kubelets read claims through v1beta1


@dataclass(frozen=True, slots=True)
class Hold:
    """Something that is waiting, and on which nodes (sorted). Waiting is normal; it ends by itself or by a
    person's action that the message names."""

    reason: HoldReason
    nodes: tuple[str, ...]
    message: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """A move the planner will not make because the node could not serve GPUs afterwards."""

    reason: RefusalReason
    nodes: tuple[str, ...]
    message: str


@dataclass(frozen=True, slots=True)
class ForwardOnly:
    """Nodes whose move to the target cannot be undone: the target DRA driver writes a checkpoint that
    the release they run now (`origin`) cannot read, so a node that fails is not rolled back. Said
    before the move starts, and for as long as it lasts."""

    origin: str  # "<mode>@<version>" the nodes run now (or ran when they started)
    nodes: tuple[str, ...]
    message: str  # names no node, so an event saying it is not repeated as nodes finish


@dataclass(frozen=True)
class Plan:
    transitions: tuple[Transition, ...]
    holds: tuple[Hold, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    forward_only: tuple[ForwardOnly, ...] = ()
    # Node name -> state after the transitions, for every node the stack selects.
    states: Mapping[str, NodeState] = field(default_factory=dict)
    # Nodes that failed on the current target, sorted.
    failed: tuple[str, ...] = ()
    target: str = ""  # "<mode>@<version>"
    # The nodes started under maxUnavailable/maxParallel by this plan (their transitions are among
    # `transitions`), and every node that only a slot holds back, in the order they get one (the
    # admitted ones first).
    admitted: tuple[str, ...] = ()
    queue: tuple[str, ...] = ()

    def counts(self) -> dict[NodeState, int]:
        out: dict[NodeState, int] = {}
        for state in self.states.values():
            out[state] = out.get(state, 0) + 1
        return out

    @property
    def complete(self) -> bool:
        """Every selected node is done and nothing is left to do."""
        return not self.transitions and all(s is NodeState.UPGRADE_DONE for s in self.states.values())
