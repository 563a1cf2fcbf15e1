"""The upgrade and migration planner: `plan(snapshot, desired, policy) -> Plan`. Pure, no I/O.

Stateless and idempotent: every decision comes from the snapshot (the node state label, the annotations
the planner wrote earlier, what runs and what is advertised now), so a restarted operator plans exactly
what the previous one would have, and planning twice from one snapshot gives the same plan.

One node's path, forward (see `NodeState` for when each state is set):

    upgrade-required -> (admit: record origin and cordon state, cordon) wait-for-jobs-required
      (when no pod has to finish or leave, the admission goes on at once to the change below, written
      in the same node patch as the cordon)
      -> drain-required (only when pods must leave: a mode change, or drain enabled)
      -> version upgrade: delete the outdated operand pod -> operand-restart-required
         mode change:     old deploy label off -> wait-old-gone -> (old pod, old advertisement and GPU
                          pods all gone) new deploy label on
      -> validation-required -> (new plugin Ready, GPUs advertised) uncordon if we cordoned -> upgrade-done

A node that runs nothing yet (a new node) gets its deploy label at once, without a slot. A failing step
sends the node to upgrade-failed, or with onFailure rollback back to its previous mode/version through
rollback-required, rollback-validation-required and rolled-back. Per node, every step first asks what the
node needs now, so a target that changes mid-way (a new version, a mode switched back) is followed from
wherever the node is, and the two deploy labels are never on together.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from gpuforge.compat.operands import DRA_KUBELET_PLUGIN, UnsupportedRelease, load_operands, rollback_problem
from gpuforge.constants import NODE_STATE_LABEL, RELEASED_ANNOTATION, STACK_LABEL
from gpuforge.upgrade.model import (
    COMPONENTS,
    DEPLOY_LABELS,
    DEPLOY_ON,
    FAILED_TARGET_ANNOTATION,
    FAILURE_ANNOTATION,
    FAILURE_STATES,
    FROM_ANNOTATION,
    IN_FLIGHT_STATES,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    STATE_SINCE_ANNOTATION,
    Action,
    Cordon,
    DeletePods,
    Desired,
    DraDriverSupport,
    EvictPods,
    ForwardOnly,
    GpuNode,
    Hold,
    HoldReason,
    Mode,
    NodeState,
    OnFailure,
    Plan,
    PodRef,
    Policy,
    Refusal,
    RefusalReason,
    SetAnnotations,
    SetLabels,
    Snapshot,
    Transition,
    Uncordon,
    WorkloadPod,
    format_time,
)

DRA_API_VERSIONS = ("v1", "v1beta2", "v1beta1")
_PRE_CHANGE_STATES = frozenset({NodeState.WAIT_FOR_JOBS_REQUIRED, NodeState.DRAIN_REQUIRED})
_MAX_CHAIN = 6  # steps one node may take on one snapshot; the longest real chain is 3


def other(mode: Mode) -> Mode:
    return Mode.DRA if mode is Mode.DEVICE_PLUGIN else Mode.DEVICE_PLUGIN


@dataclass(frozen=True, slots=True)
class Placement:
    """What a node runs: a stack at a release; mode None means no stack."""

    mode: Mode | None
    version: str

    def __str__(self) -> str:
        return f"{self.mode}@{self.version}" if self.mode else "none"

    @classmethod
    def parse(cls, text: str | None) -> Placement | None:
        if not text:
            return None
        if text == "none":
            return cls(None, "")
        mode, sep, version = text.partition("@")
        try:
            return cls(Mode(mode), version) if sep and version else None
        except ValueError:
            return None


def _rollback_refused(target: Placement, origin: Placement) -> str | None:
    """Why a node that started on `target` must not go back to `origin`: a DRA driver release whose
    checkpoint the older release cannot read (NVIDIA documents those upgrades as forward-only)."""
    if target.mode is not Mode.DRA or origin.mode is not Mode.DRA:
        return None
    try:
        return rollback_problem(load_operands(), DRA_KUBELET_PLUGIN, target.version, origin.version)
    except UnsupportedRelease:
        return None


class Change(enum.Enum):
    NONE = "none"  # deploy labels and operand pods match the target
    RESTART = "restart"  # right deploy label, outdated operand pod: delete it (OnDelete DaemonSet)
    MOVE = "move"  # deploy labels differ: turn the old one off, wait until it is gone, turn the new one on
    INSTALL = "install"  # nothing runs or is advertised on the node: just turn the target on


# --- the outcome of one step, merged along a chain -------------------------------------------------


@dataclass
class _Step:
    state: NodeState | None
    labels: dict[str, str | None] = field(default_factory=dict)
    annotations: dict[str, str | None] = field(default_factory=dict)
    cordon: bool | None = None
    pod_actions: list[EvictPods | DeletePods] = field(default_factory=list)
    message: str = ""
    failure: str | None = None
    chain: bool = (
        False  # the next state's step may run on the same snapshot (it does not depend on our actions)
    )
    holds: list[tuple[HoldReason, str]] = field(default_factory=list)  # why the node waits, for the status


class PlanContext:
    """Per-plan facts shared by all nodes."""

    def __init__(self, snapshot: Snapshot, desired: Desired, policy: Policy) -> None:
        self.snapshot = snapshot
        self.desired = desired
        self.policy = policy
        self.now: datetime = snapshot.now
        self.now_text = format_time(snapshot.now)
        self.target = Placement(desired.mode, desired.versions[desired.mode])
        revision = desired.revisions.get(desired.mode, "")
        self.fingerprint = f"{self.target}#{revision}" if revision else str(self.target)
        self.served_dra = [v for v in DRA_API_VERSIONS if v in snapshot.served_resource_versions]
        self.support: dict[str, DraDriverSupport] = {s.version: s for s in desired.dra_support}

    # --- what a deploy label value runs -----------------------------------------------------------

    def label_value(self, placement: Placement) -> str:
        """Deploy label value that makes a node run `placement`: "true" for the main DaemonSet's release,
        else the release itself (a pinned node, served by a DaemonSet of that release)."""
        assert placement.mode is not None
        return (
            DEPLOY_ON if placement.version == self.desired.versions.get(placement.mode) else placement.version
        )

    def runs_version(self, mode: Mode, value: str) -> str:
        return self.desired.versions.get(mode, "") if value == DEPLOY_ON else value

    def current(self, node: GpuNode) -> Placement:
        """The mode and release the node runs now (for the origin annotation)."""
        on = [m for m in (Mode.DEVICE_PLUGIN, Mode.DRA) if node.deploy_value(m) is not None]
        if len(on) != 1:
            return Placement(None, "")
        mode = on[0]
        pods = sorted(
            (p for p in node.operands if p.mode is mode and not p.deleting),
            key=lambda p: (not p.ready, p.ref.name),
        )
        value = node.deploy_value(mode)
        assert value is not None
        return Placement(mode, pods[0].version if pods else self.runs_version(mode, value))

    # --- classification ---------------------------------------------------------------------------

    def outdated(self, node: GpuNode, target: Placement) -> list[PodRef]:
        assert target.mode is not None
        revision = (
            self.desired.revisions.get(target.mode, "") if self.label_value(target) == DEPLOY_ON else ""
        )
        return [
            p.ref
            for p in node.operands
            if p.mode is target.mode
            and not p.deleting
            and (p.version != target.version or (revision and p.revision and p.revision != revision))
        ]

    def classify(self, node: GpuNode, target: Placement) -> Change:
        assert target.mode is not None
        value, other_value = node.deploy_value(target.mode), node.deploy_value(other(target.mode))
        if value == self.label_value(target) and other_value is None:
            return Change.RESTART if self.outdated(node, target) else Change.NONE
        if (
            value is None
            and other_value is None
            and not node.operands
            and not advertises(node, Mode.DEVICE_PLUGIN, self.desired.dra_driver)
            and not advertises(node, Mode.DRA, self.desired.dra_driver)
        ):
            return Change.INSTALL
        return Change.MOVE

    def mode_change(self, node: GpuNode, target: Placement) -> bool:
        """The node's GPUs move from one stack to the other (so pods holding them must leave first)."""
        assert target.mode is not None
        old = other(target.mode)
        origin = Placement.parse(node.annotations.get(FROM_ANNOTATION))
        return (
            (origin is not None and origin.mode not in (None, target.mode))
            or node.deploy_value(old) is not None
            or any(p.mode is old for p in node.operands)
            or advertises(node, old, self.desired.dra_driver)
        )

    def labels_to_turn_off(self, node: GpuNode, target: Placement) -> dict[str, str | None]:
        assert target.mode is not None
        off: dict[str, str | None] = {}
        for mode in (Mode.DEVICE_PLUGIN, Mode.DRA):
            value = node.deploy_value(mode)
            if value is not None and not (mode is target.mode and value == self.label_value(target)):
                off[DEPLOY_LABELS[mode]] = None
        return off

    def timed_out(self, since: datetime | None, seconds: int) -> bool:
        return seconds > 0 and since is not None and (self.now - since).total_seconds() >= seconds

    # --- DRA compatibility ----------------------------------------------------------------------------

    def dra_refusal(self, node: GpuNode) -> tuple[RefusalReason, str] | None:
        """Why `node` must not be moved to the target DRA driver, or None."""
        if self.target.mode is not Mode.DRA:
            return None
        if not self.served_dra:
            served = ", ".join(sorted(self.snapshot.served_resource_versions)) or "none"
            return RefusalReason.NO_DRA_API, (
                f"the API server serves no resource.k8s.io version the DRA driver can use (served: {served})"
            )
        minor = node.kubelet_minor
        if minor is None:
            return None
        support = self.support.get(self.target.version)
        if support is not None and minor not in support.kubelet_minors:
            others = self.releases_serving({minor})
            hint = (
                f"releases that serve it: {', '.join(others)}"
                if others
                else "no DRA driver release serves it; keep these nodes on the device plugin"
            )
            return RefusalReason.KUBELET_UNSUPPORTED, (
                f"DRA driver {self.target.version} cannot talk to kubelet 1.{minor} ({hint})"
            )
        if minor in (32, 33) and "v1beta1" not in self.served_dra:
            return RefusalReason.KUBELET_NEEDS_V1BETA1, (
                f"kubelet 1.{minor} reads ResourceClaims through resource.k8s.io/v1beta1, which the API "
                "server does not serve (enable it with --runtime-config=resource.k8s.io/v1beta1=true)"
            )
        return None

    def releases_serving(self, minors: set[int]) -> list[str]:
        """DRA driver releases that can talk to every kubelet minor in `minors`, newest first."""
        fits = [s.version for s in self.desired.dra_support if minors <= s.kubelet_minors]
        return sorted(fits, key=_release_key, reverse=True)


def _release_key(version: str) -> tuple[int, ...]:
    out = []
    for part in version.lstrip("v").split("-", 1)[0].split("."):
        out.append(int(part) if part.isdigit() else 0)
    return tuple(out)


def advertises(node: GpuNode, mode: Mode, dra_driver: str) -> bool:
    """Whether the scheduler may place GPU pods on `node` through `mode`. For the device plugin that is
    allocatable: kubelet keeps a stopped plugin's devices in capacity for five minutes
    (`endpointStopGracePeriod`, pkg/kubelet/cm/devicemanager) but drops them from allocatable at once."""
    if mode is Mode.DEVICE_PLUGIN:
        return node.gpu_allocatable > 0
    return node.dra_slices(dra_driver) > 0 or node.dra_devices(dra_driver) > 0


def not_serving(node: GpuNode, target: Placement, dra_driver: str) -> str | None:
    """What is missing before `node` serves its GPUs through `target`; None when it does."""
    assert target.mode is not None
    component = COMPONENTS[target.mode]
    pods = [
        p for p in node.operands if p.mode is target.mode and not p.deleting and p.version == target.version
    ]
    if not pods:
        return f"no {component} pod at {target.version} on the node yet"
    if not any(p.ready for p in pods):
        return f"{component} pod {pods[0].ref.name} is not Ready"
    old = other(target.mode)
    if any(p.mode is old for p in node.operands) or advertises(node, old, dra_driver):
        return f"the node still runs or advertises the {COMPONENTS[old]}"
    expected = node.expected_gpus
    if target.mode is Mode.DEVICE_PLUGIN:
        if node.gpu_allocatable < expected:
            # nvidia.com/gpu, its .shared replicas and MIG devices all count (constants.is_gpu_resource)
            return f"the node advertises {node.gpu_allocatable} of {expected} GPU devices"
    elif node.dra_devices(dra_driver) < expected:
        return f"ResourceSlices of {dra_driver} list {node.dra_devices(dra_driver)} of {expected} GPUs"
    return None


def _names(names: Iterable[str], limit: int = 10) -> str:
    ordered = sorted(names)
    shown = ", ".join(ordered[:limit])
    return shown + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


# --- workloads on a node --------------------------------------------------------------------------


def _leaving(node: GpuNode, mode_change: bool, policy: Policy) -> list[WorkloadPod]:
    """Pods that must be gone before the node changes (DaemonSet pods never are)."""
    return [
        p
        for p in node.pods
        if not p.daemonset
        and (
            (mode_change and p.uses_gpu)
            or (policy.drain.enable and policy.drain.pod_selector.matches(p.labels))
        )
    ]


def _may_evict(pod: WorkloadPod, mode_change: bool, policy: Policy) -> bool:
    deletion, drain = policy.pod_deletion, policy.drain
    by_deletion = (
        mode_change
        and pod.uses_gpu
        and deletion.enable
        and (pod.controlled or deletion.force)
        and (not pod.empty_dir or deletion.delete_empty_dir)
    )
    by_drain = (
        drain.enable
        and drain.pod_selector.matches(pod.labels)
        and (pod.controlled or drain.force)
        and (not pod.empty_dir or drain.delete_empty_dir)
    )
    return by_deletion or by_drain


REFUSED = "eviction refused: a PodDisruptionBudget allows no disruption now"


def _why_blocked(pod: WorkloadPod) -> str:
    if not pod.controlled:
        return f"{pod.ref} (no controller; needs force)"
    if pod.empty_dir:
        return f"{pod.ref} (emptyDir; needs deleteEmptyDir)"
    return str(pod.ref)


# --- the planner ----------------------------------------------------------------------------------


class _NodePlanner:
    def __init__(self, ctx: PlanContext, node: GpuNode) -> None:
        self.ctx = ctx
        self.node = node
        self.policy = ctx.policy

    # --- entry points -----------------------------------------------------------------------------

    def run(self, state: NodeState, since: datetime | None) -> _Step:
        """Advance an in-flight node as far as this snapshot allows."""
        steps: list[_Step] = []
        current, current_since = state, since
        for _ in range(_MAX_CHAIN):
            step = self.step(current, current_since)
            steps.append(step)
            if not step.chain or step.state is None or step.state == current:
                break
            current, current_since = step.state, None  # a state entered now has not waited yet
        return _merge(steps)

    def step(self, state: NodeState, since: datetime | None) -> _Step:
        match state:
            case NodeState.WAIT_FOR_JOBS_REQUIRED:
                return self.wait_for_jobs(since)
            case NodeState.DRAIN_REQUIRED:
                return self.drain(since)
            case NodeState.WAIT_OLD_GONE:
                return self.wait_old_gone(since)
            case NodeState.OPERAND_RESTART_REQUIRED:
                return self.operand_restart(since)
            case NodeState.VALIDATION_REQUIRED:
                return self.validate(since)
            case NodeState.ROLLBACK_REQUIRED:
                return self.rollback(since)
            case NodeState.ROLLBACK_VALIDATION_REQUIRED:
                return self.rollback_validate(since)
            case _:
                raise AssertionError(f"not an in-flight state: {state}")

    # --- forward path -----------------------------------------------------------------------------

    def _must_clear(self, change: Change) -> bool:
        """Pods must leave before this change: GPU pods before a mode change, all pods if drain is on."""
        if self.policy.drain.enable:
            return True
        return change in (Change.MOVE, Change.INSTALL) and self.ctx.mode_change(self.node, self.ctx.target)

    def _route(self, change: Change, here: NodeState) -> _Step:
        """Where a node whose change is `change` goes next from a state that no longer fits it."""
        if change is Change.NONE:
            return _Step(NodeState.VALIDATION_REQUIRED, message="node matches the target", chain=True)
        if (
            here not in _PRE_CHANGE_STATES
            and self._must_clear(change)
            and _leaving(self.node, self.ctx.mode_change(self.node, self.ctx.target), self.policy)
        ):
            return _Step(NodeState.DRAIN_REQUIRED, message="pods must leave the node first", chain=True)
        return self.change(change)

    def change(self, change: Change) -> _Step:
        """Make the change itself: restart the outdated pod, or turn the old stack off."""
        target = self.ctx.target
        if change is Change.RESTART:
            assert target.mode is not None
            pods = tuple(self.ctx.outdated(self.node, target))
            return _Step(
                NodeState.OPERAND_RESTART_REQUIRED,
                pod_actions=[DeletePods(pods)],
                message=f"deleting outdated {COMPONENTS[target.mode]} pod(s) {_names(map(str, pods))}"
                f" so they come back at {target.version}",
            )
        off = self.ctx.labels_to_turn_off(self.node, target)
        if off:
            return _Step(
                NodeState.WAIT_OLD_GONE,
                labels=off,
                message=f"turned off {', '.join(sorted(off))}",
                chain=False,
            )
        return _Step(NodeState.WAIT_OLD_GONE, message="old stack already off", chain=True)

    def wait_for_jobs(self, since: datetime | None) -> _Step:
        change = self.ctx.classify(self.node, self.ctx.target)
        if change is Change.NONE or not self._must_clear(change):
            return self._route(change, NodeState.WAIT_FOR_JOBS_REQUIRED)
        selector = self.policy.wait_for_completion.pod_selector
        mode_change = self.ctx.mode_change(self.node, self.ctx.target)
        waiting = (
            []
            if selector.empty
            else [p for p in _leaving(self.node, mode_change, self.policy) if selector.matches(p.labels)]
        )
        if waiting and not self.ctx.timed_out(since, self.policy.wait_for_completion.timeout_seconds):
            return self._stay(
                NodeState.WAIT_FOR_JOBS_REQUIRED,
                since,
                f"waiting for {len(waiting)} pod(s) matching {selector} to finish: "
                + _names(str(p.ref) for p in waiting),
            )
        message = "waited long enough for jobs" if waiting else "no jobs to wait for"
        return _Step(NodeState.DRAIN_REQUIRED, message=message, chain=True)

    def drain(self, since: datetime | None) -> _Step:
        change = self.ctx.classify(self.node, self.ctx.target)
        if change is Change.NONE or not self._must_clear(change):
            return self._route(change, NodeState.DRAIN_REQUIRED)
        mode_change = self.ctx.mode_change(self.node, self.ctx.target)
        leaving = _leaving(self.node, mode_change, self.policy)
        if not leaving:
            return self.change(change)
        timeout = (
            self.policy.drain.timeout_seconds
            if self.policy.drain.enable
            else self.policy.pod_deletion.timeout_seconds
        )
        blocked = [p for p in leaving if not p.deleting and not _may_evict(p, mode_change, self.policy)]
        # Evictions are sent on entering this state and on every pass after. An evictable pod that is still
        # there, not terminating, on a later pass was refused by the eviction API: a PodDisruptionBudget
        # allows no disruption now (an accepted eviction sets deletionTimestamp at once).
        tried = since is not None and self.ctx.now > since
        refused = [p for p in leaving if tried and not p.deleting and p not in blocked]
        if self.ctx.timed_out(since, timeout):
            stuck = [
                _why_blocked(p) if p in blocked else f"{p.ref} ({REFUSED})" if p in refused else str(p.ref)
                for p in leaving
            ]
            return self.fail(
                f"{len(leaving)} pod(s) still on the node after {timeout}s: {_names(stuck)}",
                NodeState.DRAIN_REQUIRED,
            )
        evict = tuple(p.ref for p in leaving if not p.deleting and p not in blocked)
        message = f"evicting {len(evict)} pod(s), {len(leaving) - len(evict)} more to finish or terminate"
        if refused:
            message += f"; {REFUSED} for {_names(str(p.ref) for p in refused)}"
        step = self._stay(NodeState.DRAIN_REQUIRED, since, message)
        if refused:
            step.holds.append(
                (
                    HoldReason.EVICTION_BLOCKED,
                    f"{REFUSED}; evictions are retried until the timeout (drain.timeoutSeconds, or "
                    "podDeletion.timeoutSeconds), then the node fails and, unchanged, is given back",
                )
            )
        if evict:
            step.pod_actions.append(EvictPods(evict))
        return step

    def wait_old_gone(self, since: datetime | None) -> _Step:
        ctx, node, target = self.ctx, self.node, self.ctx.target
        change = ctx.classify(node, target)
        if change in (Change.NONE, Change.RESTART):
            return self._route(change, NodeState.WAIT_OLD_GONE)
        off = ctx.labels_to_turn_off(node, target)
        if off:  # someone turned it back on
            return _Step(
                NodeState.WAIT_OLD_GONE, labels=off, message=f"turned off {', '.join(sorted(off))} again"
            )
        mode_change = ctx.mode_change(node, target)
        if mode_change and _leaving(node, True, self.policy):
            return _Step(
                NodeState.DRAIN_REQUIRED, message="GPU pods appeared; they must leave first", chain=True
            )
        assert target.mode is not None
        target_on = node.deploy_value(target.mode) is not None
        lingering = [p.ref.name for p in node.operands if p.mode is not target.mode or not target_on]
        old_advert = advertises(node, other(target.mode), ctx.desired.dra_driver)
        refusal = ctx.dra_refusal(node)
        if not lingering and not old_advert and refusal is None:
            value = ctx.label_value(target)
            return _Step(
                NodeState.VALIDATION_REQUIRED,
                labels={DEPLOY_LABELS[target.mode]: value},
                message=f"old stack gone; turned on {COMPONENTS[target.mode]} {target.version}",
            )
        if lingering:
            waiting = f"waiting for pod(s) {_names(lingering)} to go"
        elif old_advert:
            waiting = (
                f"waiting until the node stops advertising GPUs through the {COMPONENTS[other(target.mode)]}"
            )
        else:
            assert refusal is not None
            waiting = f"not turning the DRA driver on: {refusal[1]}"
        if ctx.timed_out(since, self.policy.timeouts.wait_old_gone):
            return self.fail(f"{waiting} for {self.policy.timeouts.wait_old_gone}s", NodeState.WAIT_OLD_GONE)
        return self._stay(NodeState.WAIT_OLD_GONE, since, waiting)

    def operand_restart(self, since: datetime | None) -> _Step:
        change = self.ctx.classify(self.node, self.ctx.target)
        if change is not Change.RESTART:
            return self._route(change, NodeState.OPERAND_RESTART_REQUIRED)
        if self.ctx.timed_out(since, self.policy.timeouts.operand_restart):
            return self.fail(
                f"outdated operand pod still there after {self.policy.timeouts.operand_restart}s",
                NodeState.OPERAND_RESTART_REQUIRED,
            )
        pods = tuple(self.ctx.outdated(self.node, self.ctx.target))
        step = self._stay(
            NodeState.OPERAND_RESTART_REQUIRED, since, f"deleting outdated pod(s) {_names(map(str, pods))}"
        )
        step.pod_actions.append(DeletePods(pods))
        return step

    def validate(self, since: datetime | None) -> _Step:
        change = self.ctx.classify(self.node, self.ctx.target)
        if change is not Change.NONE:
            return self._route(change, NodeState.VALIDATION_REQUIRED)
        missing = not_serving(self.node, self.ctx.target, self.ctx.desired.dra_driver)
        if missing is None:
            return self.finish(NodeState.UPGRADE_DONE, f"serving through {self.ctx.target}")
        if self.ctx.timed_out(since, self.policy.timeouts.validation):
            return self.fail(
                f"not serving after {self.policy.timeouts.validation}s: {missing}",
                NodeState.VALIDATION_REQUIRED,
            )
        return self._stay(NodeState.VALIDATION_REQUIRED, since, missing)

    # --- finishing and failing --------------------------------------------------------------------

    def finish(self, state: NodeState, message: str, keep_failure: bool = False) -> _Step:
        """Leave the node: uncordon only if we cordoned it, drop the annotations of the attempt."""
        step = _Step(state, message=message)
        step.annotations = {INITIAL_UNSCHEDULABLE_ANNOTATION: None, FROM_ANNOTATION: None}
        if not keep_failure:
            step.annotations |= {FAILED_TARGET_ANNOTATION: None, FAILURE_ANNOTATION: None}
        if self.node.cordoned_by_us and self.node.unschedulable:
            step.cordon = False
            step.message += "; uncordoned"
        return _clean(step, self.node)

    def fail(self, reason: str, state: NodeState) -> _Step:
        node, policy = self.node, self.policy
        record = {FAILED_TARGET_ANNOTATION: self.ctx.fingerprint, FAILURE_ANNOTATION: reason}
        origin = Placement.parse(node.annotations.get(FROM_ANNOTATION))
        untouched = (
            state in _PRE_CHANGE_STATES
            and origin is not None
            and origin.mode is not None
            and node.deploy_value(origin.mode) is not None
            and node.deploy_value(other(origin.mode)) is None
        )
        if untouched:
            # Nothing changed on the node yet: it keeps serving on its old stack, so give it back.
            step = self.finish(
                NodeState.UPGRADE_FAILED, f"failed before any change: {reason}", keep_failure=True
            )
        elif (
            policy.on_failure is OnFailure.ROLLBACK
            and origin is not None
            and origin.mode is not None
            and (refused := _rollback_refused(self.ctx.target, origin))
        ):
            step = _Step(NodeState.UPGRADE_FAILED, message=f"failed: {reason}; not rolled back: {refused}")
        elif policy.on_failure is OnFailure.ROLLBACK and origin is not None and origin.mode is not None:
            step = _Step(
                NodeState.ROLLBACK_REQUIRED, message=f"failed: {reason}; rolling back to {origin}", chain=True
            )
        else:
            step = _Step(NodeState.UPGRADE_FAILED, message=f"failed: {reason}")
        step.annotations |= record
        step.failure = reason
        return step

    # --- rollback ---------------------------------------------------------------------------------

    def _origin(self) -> Placement | None:
        origin = Placement.parse(self.node.annotations.get(FROM_ANNOTATION))
        return origin if origin is not None and origin.mode is not None else None

    def rollback(self, since: datetime | None) -> _Step:
        ctx, node = self.ctx, self.node
        origin = self._origin()
        if origin is None:
            return _Step(
                NodeState.UPGRADE_FAILED, message="cannot roll back: the node's origin is not recorded"
            )
        assert origin.mode is not None
        change = ctx.classify(node, origin)
        if change is Change.NONE:
            return _Step(NodeState.ROLLBACK_VALIDATION_REQUIRED, message=f"back on {origin}", chain=True)
        if change is Change.RESTART:
            pods = tuple(ctx.outdated(node, origin))
            return _Step(
                NodeState.ROLLBACK_VALIDATION_REQUIRED,
                pod_actions=[DeletePods(pods)],
                message=f"deleting pod(s) {_names(map(str, pods))} to return to {origin.version}",
            )
        off = ctx.labels_to_turn_off(node, origin)
        if off:
            return self._stay(
                NodeState.ROLLBACK_REQUIRED, since, f"turned off {', '.join(sorted(off))}", labels=off
            )
        mode_change = ctx.mode_change(node, origin)
        leaving = _leaving(node, mode_change, self.policy) if mode_change else []
        target_on = node.deploy_value(origin.mode) is not None
        lingering = [p.ref.name for p in node.operands if p.mode is not origin.mode or not target_on]
        old_advert = advertises(node, other(origin.mode), ctx.desired.dra_driver)
        if not leaving and not lingering and not old_advert:
            return _Step(
                NodeState.ROLLBACK_VALIDATION_REQUIRED,
                labels={DEPLOY_LABELS[origin.mode]: ctx.label_value(origin)},
                message=f"turned {COMPONENTS[origin.mode]} {origin.version} back on",
            )
        if ctx.timed_out(since, self.policy.timeouts.rollback):
            return _Step(
                NodeState.UPGRADE_FAILED,
                message="rollback failed: the failed stack did not go",
                annotations={FAILURE_ANNOTATION: "rollback failed: the failed stack did not go"},
                failure="rollback failed",
            )
        step = self._stay(
            NodeState.ROLLBACK_REQUIRED,
            since,
            f"rolling back to {origin}: waiting for the failed stack to go",
        )
        evict = tuple(p.ref for p in leaving if not p.deleting and _may_evict(p, True, self.policy))
        if evict:
            step.pod_actions.append(EvictPods(evict))
        return step

    def rollback_validate(self, since: datetime | None) -> _Step:
        origin = self._origin()
        if origin is None:
            return _Step(
                NodeState.UPGRADE_FAILED, message="cannot roll back: the node's origin is not recorded"
            )
        change = self.ctx.classify(self.node, origin)
        if change is not Change.NONE:
            return _Step(NodeState.ROLLBACK_REQUIRED, message="rollback not complete", chain=True)
        missing = not_serving(self.node, origin, self.ctx.desired.dra_driver)
        if missing is None:
            return self.finish(NodeState.ROLLED_BACK, f"rolled back to {origin}", keep_failure=True)
        if self.ctx.timed_out(since, self.policy.timeouts.rollback):
            reason = f"rollback failed: {missing}"
            return _Step(
                NodeState.UPGRADE_FAILED,
                message=reason,
                annotations={FAILURE_ANNOTATION: reason},
                failure=reason,
            )
        return self._stay(NodeState.ROLLBACK_VALIDATION_REQUIRED, since, f"rolling back: {missing}")

    # --- helpers ----------------------------------------------------------------------------------

    def _stay(
        self,
        state: NodeState,
        since: datetime | None,
        message: str,
        labels: dict[str, str | None] | None = None,
    ) -> _Step:
        step = _Step(state, message=message, labels=dict(labels or {}))
        if since is None and self.node.state is state:
            step.annotations[STATE_SINCE_ANNOTATION] = self.ctx.now_text  # the timer was lost: start it now
        return step


def _clean(step: _Step, node: GpuNode) -> _Step:
    """Drop annotation removals for annotations the node does not have (fewer, smaller patches)."""
    step.annotations = {k: v for k, v in step.annotations.items() if v is not None or k in node.annotations}
    return step


def _merge(steps: list[_Step]) -> _Step:
    out = _Step(steps[-1].state)
    messages = []
    for step in steps:
        out.labels.update(step.labels)
        out.annotations.update(step.annotations)
        if step.cordon is not None:
            out.cordon = step.cordon
        out.pod_actions.extend(step.pod_actions)
        out.failure = step.failure or out.failure
        out.holds.extend(step.holds)
        if step.message:
            messages.append(step.message)
    out.message = "; ".join(messages)
    return out


def _transition(ctx: PlanContext, node: GpuNode, step: _Step) -> Transition | None:
    """Turn a step into a Transition (None if it does nothing): state label, timer, stack label, actions."""
    labels = dict(step.labels)
    annotations = dict(step.annotations)
    if step.state != node.state:
        labels[NODE_STATE_LABEL] = step.state.value if step.state else None
        if step.state is not None:
            annotations[STATE_SINCE_ANNOTATION] = ctx.now_text
    if step.state is not None and ctx.desired.stack and node.labels.get(STACK_LABEL) != ctx.desired.stack:
        labels[STACK_LABEL] = ctx.desired.stack
    labels = {k: v for k, v in labels.items() if node.labels.get(k) != v}
    annotations = {k: v for k, v in annotations.items() if node.annotations.get(k) != v}
    actions: list[Action] = []
    if labels:
        actions.append(SetLabels(labels))
    if annotations:
        actions.append(SetAnnotations(annotations))
    if step.cordon is True and not node.unschedulable:
        actions.append(Cordon())
    elif step.cordon is False and node.unschedulable:
        actions.append(Uncordon())
    actions.extend(a for a in step.pod_actions if a.pods)
    if not actions:
        return None
    return Transition(node.name, node.state, step.state, tuple(actions), step.message, step.failure)


# --- the whole cluster: each node classified, then free slots admitted -------------------------------


class NodeClass(enum.Enum):
    """What one node needs from this plan, before slots are counted (see `classify_node`)."""

    OTHERS = "others"  # not selected, and not ours to release (another stack's, or under maintenance)
    RELEASE = "release"  # not selected but still marked by us: take everything of ours off it
    MAINTENANCE = "maintenance"  # selected but under maintenance: not touched until it ends
    IN_FLIGHT = "in-flight"  # started earlier: its next step
    FAILED = "failed"  # failed on this very target: stays so (or recovers) until someone relabels it
    IN_SYNC = "in-sync"  # runs the target already
    INSTALL = "install"  # runs nothing yet: the target is turned on at once, without a slot
    REFUSED = "refused"  # the target cannot serve it (DRA compatibility): waits, named in the refusals
    CANDIDATE = "candidate"  # needs a change that takes a slot: admission decides when


class Classified(NamedTuple):
    """One node's class, and what the class depends on."""

    node: GpuNode
    kind: NodeClass
    change: Change | None = None
    refusal: tuple[RefusalReason, str] | None = None
    hold: tuple[HoldReason, str] | None = None  # why an INSTALL or CANDIDATE node may not start now


def start_hold(node: GpuNode, policy: Policy) -> tuple[HoldReason, str] | None:
    """Why `node` itself may not be started, whatever the slots: the skip label, or NotReady."""
    if policy.skip_label and node.labels.get(policy.skip_label) == "true":
        return HoldReason.SKIPPED, f"nodes labelled {policy.skip_label}=true are left alone"
    if not node.ready:
        return HoldReason.NOT_READY, "NotReady nodes are not started"
    return None


def classify_node(ctx: PlanContext, node: GpuNode) -> Classified:
    """The class of one node, from that node alone and the plan's target. Pure."""
    policy = ctx.policy
    if node.name not in ctx.desired.selected:
        ours = not _under_maintenance(node, policy) and _marked_by_us(ctx, node)
        return Classified(node, NodeClass.RELEASE if ours else NodeClass.OTHERS)
    if _under_maintenance(node, policy):
        return Classified(node, NodeClass.MAINTENANCE)
    state = node.state
    if state in IN_FLIGHT_STATES:
        return Classified(node, NodeClass.IN_FLIGHT)
    change = ctx.classify(node, ctx.target)
    if state in FAILURE_STATES and node.annotations.get(FAILED_TARGET_ANNOTATION) == ctx.fingerprint:
        return Classified(node, NodeClass.FAILED, change)
    if change is Change.NONE:
        return Classified(node, NodeClass.IN_SYNC, change)
    refusal = ctx.dra_refusal(node)
    if refusal is not None:
        return Classified(node, NodeClass.REFUSED, change, refusal)
    kind = NodeClass.INSTALL if change is Change.INSTALL and not node.held_by_us else NodeClass.CANDIDATE
    return Classified(node, kind, change, hold=start_hold(node, policy))


def _node_step(ctx: PlanContext, item: Classified) -> _Step | None:
    """The step of a node whose class decides it alone (all but CANDIDATE and MAINTENANCE)."""
    node = item.node
    if item.kind is NodeClass.RELEASE:
        step, claims_wait = _release(ctx, node)
        if claims_wait:
            step.holds.append(
                (
                    HoldReason.CLAIMS_HELD,
                    "the DRA kubelet plugin stays on released nodes "
                    "until no pod there holds a GPU ResourceClaim",
                )
            )
        return step
    planner = _NodePlanner(ctx, node)
    if item.kind is NodeClass.IN_FLIGHT:
        assert node.state is not None
        return planner.run(node.state, node.state_since)
    if item.kind is NodeClass.FAILED:
        assert node.state is not None
        missing = (
            not_serving(node, ctx.target, ctx.desired.dra_driver) if item.change is Change.NONE else "differs"
        )
        if node.state is NodeState.UPGRADE_FAILED and missing is None:
            return planner.finish(NodeState.UPGRADE_DONE, "recovered: serving through the target")
        return _Step(node.state)
    if item.kind is NodeClass.IN_SYNC:
        if node.held_by_us:  # an attempt was interrupted after the node got there: finish it properly
            return planner.run(NodeState.VALIDATION_REQUIRED, None)
        done = _Step(
            NodeState.UPGRADE_DONE,
            message="in sync",
            annotations={FAILED_TARGET_ANNOTATION: None, FAILURE_ANNOTATION: None},
        )
        return _clean(done, node)
    if item.kind is NodeClass.REFUSED:
        assert item.refusal is not None
        return _Step(NodeState.UPGRADE_REQUIRED, message=item.refusal[1])
    if item.kind is NodeClass.INSTALL:
        if item.hold is not None:
            return _Step(NodeState.UPGRADE_REQUIRED, holds=[item.hold])
        assert ctx.target.mode is not None
        return _Step(
            NodeState.VALIDATION_REQUIRED,
            labels={DEPLOY_LABELS[ctx.target.mode]: ctx.label_value(ctx.target)},
            message="nothing runs on the node yet: turned on "
            f"{COMPONENTS[ctx.target.mode]} {ctx.target.version}",
        )
    return None  # OTHERS: nothing; MAINTENANCE and CANDIDATE: see `plan`


@dataclass(frozen=True, slots=True)
class Slots:
    """What admission counts, over the nodes that `weighs_on_admission` (so a snapshot of those nodes and
    of some waiting ones admits exactly what the whole one does among them)."""

    max_unavailable: int  # resolved against every node the stack selects
    unavailable: int  # selected nodes cordoned or NotReady now
    in_progress: int  # selected nodes we hold in flight
    failed: tuple[str, ...]  # selected nodes failed on this target, sorted

    @classmethod
    def of_counts(cls, ctx: PlanContext, counts: AdmissionCounts) -> Slots:
        return cls(
            max_unavailable=ctx.policy.max_unavailable.resolve(len(ctx.desired.selected)),
            unavailable=counts.unavailable,
            in_progress=counts.in_progress,
            failed=tuple(name for target, name in counts.failed if target == ctx.fingerprint),
        )

    @classmethod
    def count(cls, ctx: PlanContext, selected: Iterable[GpuNode], failed: Iterable[str]) -> Slots:
        nodes = list(selected)
        return cls(
            max_unavailable=ctx.policy.max_unavailable.resolve(len(ctx.desired.selected)),
            unavailable=sum(1 for n in nodes if n.unschedulable or not n.ready),
            in_progress=sum(1 for n in nodes if n.held_by_us and n.state in IN_FLIGHT_STATES),
            failed=tuple(sorted(failed)),
        )


class Admission(NamedTuple):
    """Admission's answer for one candidate: start it (hold None), or why it waits."""

    node: GpuNode
    hold: tuple[HoldReason, str] | None
    queued: bool  # in `Plan.queue`: admitted, or held back only by a slot


def admission_order(candidates: Iterable[Classified]) -> list[Classified]:
    """Already cordoned nodes first (they cost no slot), then those with fewer GPU pods, then by name."""
    return sorted(
        candidates,
        key=lambda c: (not c.node.unschedulable, sum(1 for p in c.node.pods if p.uses_gpu), c.node.name),
    )


def admit(policy: Policy, target: str, slots: Slots, candidates: Iterable[Classified]) -> list[Admission]:
    """Which candidates start now, in `admission_order`, given maxUnavailable, maxParallel, maxFailures,
    pause and what is out already. Pure; `target` names the plan's target in the halt message."""
    budget = slots.max_unavailable - slots.unavailable
    in_progress = slots.in_progress
    halted = policy.max_failures > 0 and len(slots.failed) >= policy.max_failures
    out: list[Admission] = []
    for item in admission_order(candidates):
        node = item.node
        if item.hold is not None:
            out.append(Admission(node, item.hold, queued=False))
        elif policy.paused:
            out.append(Admission(node, (HoldReason.PAUSED, "the upgrade policy is paused"), queued=False))
        elif halted:
            message = (
                f"{len(slots.failed)} node(s) failed on {target}: {_names(slots.failed)}; "
                "fix or relabel them (state upgrade-required) to go on"
            )
            out.append(Admission(node, (HoldReason.HALTED, message), queued=False))
        elif policy.max_parallel and in_progress >= policy.max_parallel:
            message = f"{in_progress} of at most {policy.max_parallel} node(s) in progress"
            out.append(Admission(node, (HoldReason.MAX_PARALLEL, message), queued=True))
        elif not node.unschedulable and budget < 1:
            message = (
                f"{slots.max_unavailable - budget} of at most {slots.max_unavailable} node(s) unavailable "
                f"(maxUnavailable {policy.max_unavailable})"
            )
            out.append(Admission(node, (HoldReason.MAX_UNAVAILABLE, message), queued=True))
        else:
            out.append(Admission(node, None, queued=True))
            in_progress += 1
            budget -= 0 if node.unschedulable else 1
    return out


class _Collector:
    """Gathers one plan's parts node by node: transitions, holds, states and failures."""

    def __init__(self, ctx: PlanContext) -> None:
        self.ctx = ctx
        self.progress: list[Transition] = []
        self.admitted: list[Transition] = []
        self.holds: dict[HoldReason, list[str]] = {}
        self.hold_text: dict[HoldReason, str] = {}
        self.refusals: dict[tuple[RefusalReason, str], list[str]] = {}
        self.states: dict[str, NodeState] = {}
        self.failed: list[str] = []
        self.queue: list[str] = []

    def hold(self, reason: HoldReason, name: str, message: str) -> None:
        self.holds.setdefault(reason, []).append(name)
        self.hold_text.setdefault(reason, message)

    def add(self, node: GpuNode, step: _Step) -> None:
        transition = _transition(self.ctx, node, step)
        if transition is not None:
            self.progress.append(transition)
        for reason, message in step.holds:
            self.hold(reason, node.name, message)
        if step.state is not None and node.name in self.ctx.desired.selected:
            self.states[node.name] = step.state
            failed_target = step.annotations.get(
                FAILED_TARGET_ANNOTATION, node.annotations.get(FAILED_TARGET_ANNOTATION)
            )
            if step.state in FAILURE_STATES and failed_target == self.ctx.fingerprint:
                self.failed.append(node.name)

    def start(self, node: GpuNode) -> None:
        step = _admit(self.ctx, node)
        if _nothing_to_wait_for(self.ctx, node):
            # Skip ahead in the same patch as the cordon (one node write and one pass fewer). Safe: a GPU
            # pod that lands before the cordon is caught in wait-old-gone, which sends the node back to
            # drain before the new stack is turned on.
            step = _merge([step, _NodePlanner(self.ctx, node).run(NodeState.WAIT_FOR_JOBS_REQUIRED, None)])
        transition = _transition(self.ctx, node, step)
        assert transition is not None
        self.admitted.append(transition)
        self.states[node.name] = step.state or NodeState.WAIT_FOR_JOBS_REQUIRED


def plan(snapshot: Snapshot, desired: Desired, policy: Policy, counts: AdmissionCounts | None = None) -> Plan:
    """The transitions to make now, and what waits or is refused (naming the nodes).

    Stateless and idempotent; O(nodes + pods). Each node is classified on its own (`classify_node`);
    the candidates then get the free slots (`admit`). Transitions are ordered: nodes in flight and
    releases first (by node name), then waiting candidates and newly admitted nodes (by admission order).
    With `counts` (every selected node that weighs on admission, counted elsewhere), the slots come from
    them and not from the snapshot (whose nodes are not counted again), which then need hold only the
    candidates to weigh: so freed slots are filled by planning a few waiting nodes, however many nodes
    are out.
    """
    ctx = PlanContext(snapshot, desired, policy)
    nodes = sorted(snapshot.nodes, key=lambda n: n.name)
    out = _Collector(ctx)
    candidates: list[Classified] = []
    for item in (classify_node(ctx, node) for node in nodes):
        if item.refusal is not None:
            out.refusals.setdefault(item.refusal, []).append(item.node.name)
        if item.kind is NodeClass.CANDIDATE:
            candidates.append(item)
        elif item.kind is NodeClass.MAINTENANCE:
            out.hold(
                HoldReason.MAINTENANCE,
                item.node.name,
                "nodes under maintenance are not touched until it ends",
            )
            if item.node.state is not None:
                out.states[item.node.name] = item.node.state
        else:
            step = _node_step(ctx, item)
            if step is not None:
                out.add(item.node, step)

    selected_nodes = [n for n in nodes if n.name in desired.selected]
    slots = Slots.count(ctx, selected_nodes, out.failed) if counts is None else Slots.of_counts(ctx, counts)
    for admission in admit(policy, ctx.fingerprint, slots, candidates):
        if admission.queued:
            out.queue.append(admission.node.name)
        if admission.hold is None:
            out.start(admission.node)
        else:
            waiting = _Step(NodeState.UPGRADE_REQUIRED, message=f"waiting: {admission.hold[1]}")
            waiting.holds.append(admission.hold)
            out.add(admission.node, waiting)

    hold_list = [
        Hold(reason, tuple(sorted(names)), out.hold_text[reason]) for reason, names in out.holds.items()
    ]
    # Kubelet compatibility of nodes already on DRA: now, and for a planned kubelet upgrade.
    hold_list.extend(_kubelet_holds(ctx, selected_nodes))
    refusal_list = [
        Refusal(reason, tuple(sorted(names)), f"{message}: nodes {_names(names)}")
        for (reason, message), names in sorted(out.refusals.items())
    ]
    refused = {name for names in out.refusals.values() for name in names}
    moving = [n for n in selected_nodes if out.states.get(n.name) in _MOVING_STATES and n.name not in refused]
    return Plan(
        transitions=tuple(out.progress) + tuple(out.admitted),
        holds=tuple(sorted(hold_list, key=lambda h: (h.reason.value, h.message))),
        refusals=tuple(refusal_list),
        forward_only=_forward_only(ctx, moving),
        states=out.states,
        failed=slots.failed,
        target=ctx.fingerprint,
        admitted=tuple(t.node for t in out.admitted),
        queue=tuple(out.queue),
    )


# Nodes that are still to move to the target, or are moving: a forward-only move is announced for these.
_MOVING_STATES = IN_FLIGHT_STATES | {NodeState.UPGRADE_REQUIRED}


def _forward_only(ctx: PlanContext, nodes: Iterable[GpuNode]) -> tuple[ForwardOnly, ...]:
    """The nodes whose move to the target cannot be rolled back, by the release they leave."""
    if ctx.target.mode is not Mode.DRA:
        return ()
    refused: dict[Placement, str | None] = {}  # per release left: few, however many nodes
    by_origin: dict[Placement, list[str]] = {}
    for node in nodes:
        origin = Placement.parse(node.annotations.get(FROM_ANNOTATION)) or ctx.current(node)
        if origin not in refused:
            refused[origin] = _rollback_refused(ctx.target, origin) if origin != ctx.target else None
        if refused[origin]:
            by_origin.setdefault(origin, []).append(node.name)
    out = []
    for origin, names in sorted(by_origin.items(), key=lambda item: str(item[0])):
        why = refused[origin]
        message = (
            f"{origin} -> {ctx.target} is forward-only: {why}. Rollback to {origin.version} will be "
            f"refused (whatever onFailure says): a node that fails stays on {ctx.target.version}, "
            "upgrade-failed"
        )
        out.append(ForwardOnly(str(origin), tuple(sorted(names)), message))
    return tuple(out)


def weighs_on_admission(node: GpuNode) -> bool:
    """Does `plan` count this node when it decides who starts (against maxUnavailable, maxParallel or
    maxFailures)? True for cordoned, NotReady, held, in-flight and failed nodes. A snapshot of every such
    node plus a prefix of `Plan.queue` admits what the whole snapshot admits among those nodes, so the
    operator can fill freed slots without planning every node of the cluster."""
    return (
        node.unschedulable
        or not node.ready
        or node.held_by_us
        or node.state in IN_FLIGHT_STATES
        or node.state in FAILURE_STATES
    )


class Weight(NamedTuple):
    """What admission counts of one node that weighs on it (`weighs_on_admission`): small and hashable,
    so the operator's cache keeps one per such node, updated as the node changes, instead of the node."""

    unavailable: bool  # cordoned or NotReady
    in_progress: bool  # held by us in flight
    failed_on: str  # the target it failed on ("" when it has not failed)


def weight_of(node: GpuNode) -> Weight | None:
    """The node's `Weight`; None when it does not weigh on admission."""
    if not weighs_on_admission(node):
        return None
    failed_on = node.annotations.get(FAILED_TARGET_ANNOTATION, "") if node.state in FAILURE_STATES else ""
    return Weight(
        unavailable=node.unschedulable or not node.ready,
        in_progress=node.held_by_us and node.state in IN_FLIGHT_STATES,
        failed_on=failed_on,
    )


@dataclass(frozen=True, slots=True)
class AdmissionCounts:
    """The selected nodes that weigh on admission, counted: what `plan` needs of every node that is not
    in its snapshot to admit as the whole snapshot would. Built from `Weight`s by `count_weights`."""

    unavailable: int = 0
    in_progress: int = 0
    failed: tuple[tuple[str, str], ...] = ()  # (target failed on, node), sorted


def count_weights(weights: Iterable[tuple[str, Weight]], selected: Collection[str]) -> AdmissionCounts:
    """The counts of the (node name, weight) pairs whose node is in `selected`."""
    unavailable = in_progress = 0
    failed: list[tuple[str, str]] = []
    for name, weight in weights:
        if name not in selected:
            continue
        unavailable += weight.unavailable
        in_progress += weight.in_progress
        if weight.failed_on:
            failed.append((weight.failed_on, name))
    return AdmissionCounts(unavailable, in_progress, tuple(sorted(failed)))


def _admit(ctx: PlanContext, node: GpuNode) -> _Step:
    """Start working on a node: remember how we found it, cordon it, wait for its jobs."""
    annotations: dict[str, str | None] = {FAILED_TARGET_ANNOTATION: None, FAILURE_ANNOTATION: None}
    if not node.held_by_us:  # a retry keeps what the first attempt found
        annotations[INITIAL_UNSCHEDULABLE_ANNOTATION] = "true" if node.unschedulable else "false"
        annotations[FROM_ANNOTATION] = str(ctx.current(node))
    step = _Step(NodeState.WAIT_FOR_JOBS_REQUIRED, annotations=annotations, cordon=True)
    step.message = "started: cordoned" if not node.unschedulable else "started (node was already cordoned)"
    return _clean(step, node)


def advance(snapshot: Snapshot, desired: Desired, policy: Policy) -> tuple[Transition, ...]:
    """The next step of each node of `snapshot` that is already in flight: exactly what `plan` gives those
    nodes, without looking at any other node. Never starts a node (admission weighs every node against
    maxUnavailable and maxParallel, so only `plan` admits). Lets the operator act on one node's change at
    once, between whole-cluster plans; `snapshot` may hold just the nodes that changed."""
    ctx = PlanContext(snapshot, desired, policy)
    out = []
    for node in sorted(snapshot.nodes, key=lambda n: n.name):
        if (
            node.name not in desired.selected
            or node.state not in IN_FLIGHT_STATES
            or _under_maintenance(node, policy)
        ):
            continue
        transition = _transition(ctx, node, _NodePlanner(ctx, node).run(node.state, node.state_since))
        if transition is not None:
            out.append(transition)
    return tuple(out)


def _nothing_to_wait_for(ctx: PlanContext, node: GpuNode) -> bool:
    """No pod has to finish or leave before the change: the admitted node need not wait a pass for its
    cordon to be seen. Not with drain or waitForCompletion, whose pods must be looked at after the cordon."""
    policy = ctx.policy
    return (
        not policy.drain.enable
        and policy.wait_for_completion.pod_selector.empty
        and not _leaving(node, ctx.mode_change(node, ctx.target), policy)
    )


def _under_maintenance(node: GpuNode, policy: Policy) -> bool:
    value = node.annotations.get(policy.maintenance_annotation)
    return value is not None and value.lower() not in ("", "false")


def _marked_by_us(ctx: PlanContext, node: GpuNode) -> bool:
    """Does a node the stack does not select still carry our labels or annotations?"""
    if node.labels.get(STACK_LABEL) != ctx.desired.stack and ctx.desired.stack:
        return False  # another stack's node (or nobody's): not ours to touch
    return (
        NODE_STATE_LABEL in node.labels
        or any(label in node.labels for label in DEPLOY_LABELS.values())
        or any(key in node.annotations for key in (INITIAL_UNSCHEDULABLE_ANNOTATION, FROM_ANNOTATION))
        or STACK_LABEL in node.labels
    )


def _release(ctx: PlanContext, node: GpuNode) -> tuple[_Step, bool]:
    """A node the stack no longer selects but still marks (`_marked_by_us`): take everything of ours off
    it. The DRA plugin goes only when no pod there holds a GPU claim (else those pods hang in Terminating)."""
    labels: dict[str, str | None] = {NODE_STATE_LABEL: None}
    labels[DEPLOY_LABELS[Mode.DEVICE_PLUGIN]] = None
    claims_wait = any(p.holds_claim for p in node.pods) and DEPLOY_LABELS[Mode.DRA] in node.labels
    if not claims_wait:
        labels[DEPLOY_LABELS[Mode.DRA]] = None
        labels[STACK_LABEL] = None
    step = _Step(None, labels=labels, message="released: no longer selected by the stack")
    step.annotations = {
        key: None
        for key in (
            STATE_SINCE_ANNOTATION,
            INITIAL_UNSCHEDULABLE_ANNOTATION,
            FROM_ANNOTATION,
            FAILED_TARGET_ANNOTATION,
            FAILURE_ANNOTATION,
        )
    }
    if node.cordoned_by_us and node.unschedulable:
        step.cordon = False
    step = _clean(step, node)
    step.labels = {k: v for k, v in step.labels.items() if k in node.labels}
    if STACK_LABEL in step.labels:
        # For a while its departing plugin's advertisement lingers: whoever selects the node next must
        # not take it for another installation's (gpuforge.render.placement).
        step.annotations[RELEASED_ANNOTATION] = ctx.now_text
    return step, claims_wait


def _kubelet_holds(ctx: PlanContext, nodes: list[GpuNode]) -> list[Hold]:
    """Nodes on DRA whose running driver cannot talk to their kubelet now or after the planned upgrade."""
    if not ctx.support:
        return []
    skew: dict[str, list[str]] = {}
    blocked: dict[str, list[str]] = {}
    minors_on_dra: set[int] = set()
    upgrade = ctx.desired.kubelet_upgrade_minor
    for node in nodes:
        value = node.deploy_value(Mode.DRA)
        minor = node.kubelet_minor
        if value is None or minor is None:
            continue
        minors_on_dra.add(minor)
        running = (
            ctx.current(node).version
            if ctx.current(node).mode is Mode.DRA
            else ctx.runs_version(Mode.DRA, value)
        )
        support = ctx.support.get(running)
        if support is None:
            continue
        if minor not in support.kubelet_minors:
            skew.setdefault(running, []).append(node.name)
        if upgrade is not None and upgrade not in support.kubelet_minors:
            blocked.setdefault(running, []).append(node.name)
    out: list[Hold] = []
    for running, names in sorted(skew.items()):
        fits = ctx.releases_serving(minors_on_dra)
        out.append(
            Hold(
                HoldReason.KUBELET_SKEW,
                tuple(sorted(names)),
                f"DRA driver {running} cannot talk to the kubelet on nodes {_names(names)}; "
                + (f"upgrade the driver to {fits[0]}" if fits else "no release serves all kubelets in use"),
            )
        )
    for running, names in sorted(blocked.items()):
        fits = ctx.releases_serving(minors_on_dra | {upgrade} if upgrade is not None else minors_on_dra)
        out.append(
            Hold(
                HoldReason.KUBELET_UPGRADE,
                tuple(sorted(names)),
                f"do not upgrade kubelets on nodes {_names(names)} to 1.{upgrade} yet: DRA driver {running} "
                "cannot talk to it; "
                + (
                    f"first upgrade the driver to {fits[0]}, which serves both"
                    if fits
                    else "no release serves both"
                ),
            )
        )
    return out
