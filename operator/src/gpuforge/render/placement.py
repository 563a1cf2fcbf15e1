"""Which selected node runs which operand of a GpuStack, and which nodes the stack must let go. No I/O.

Stateless and idempotent: every decision comes from the GpuStacks and the node facts, so an operator
restarted at any moment decides the same again. A node belongs to a stack through two labels the
operator writes on it: `gpuforge.io/stack=<name>` and one per-node deploy label (device plugin or DRA
kubelet plugin) that the operand DaemonSets select on.

Rules:
- Two GpuStacks selecting one node: the older one (creation time, then name) gets it; the younger reports
  a conflict naming the node and the other stack, and lets go of the node if it held it.
- A node where NVIDIA's GPU Operator deploys its own device plugin or DRA driver is left to it (named in
  a condition; a node the stack held is released): two plugins would advertise the same GPUs twice. So
  is a node that already advertises GPUs (allocatable `nvidia.com/gpu`, `.shared`, `mig-*`, or
  ResourceSlices of `gpu.nvidia.com`) while gpuforge neither marks it (stack label, a deploy label on)
  nor runs a plugin pod there: some other installation serves it. A node gpuforge marks is its own,
  whatever it advertises: while the upgrade engine moves it, the old advertisement lingers. So is a node
  released less than `RELEASE_GRACE` ago (annotation `gpuforge.io/released-at`): kubelet has not
  withdrawn its departed plugin's advertisement yet. The upgrade engine writes the stack label with
  every state it gives a node, so an upgrade-state label alone is a deleted GpuStack's leftover, no mark.
- A node whose kubelet (or the API server) cannot work with the operand is refused, named in a condition;
  a node already running the operand is left running.
- Which operand runs on a node (the deploy labels) is decided node by node by the upgrade engine
  (`gpuforge.upgrade`); here a node is only observed (`observe`) for the status, and `planned` names the
  nodes that engine may move.
- The DRA kubelet plugin leaves a node only once no pod on it holds a ResourceClaim: without the plugin
  those pods could not be unprepared and would hang in Terminating.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuforge.api import conditions as c
from gpuforge.api.cluster import NodeFacts, OperandPod
from gpuforge.api.gpustack import (
    DEVICE_CLASS_VFIO,
    GpuStack,
    Mode,
    NodeSelector,
    NodeSelectorRequirement,
    SelectorOperator,
)
from gpuforge.compat import Compat, Minor, UnknownRelease
from gpuforge.compat.operands import DRA_KUBELET_PLUGIN, OperandContract, load_operands
from gpuforge.constants import (
    COMPONENT_DEVICE_PLUGIN,
    COMPONENT_DRA_KUBELET_PLUGIN,
    DEPLOY_DEVICE_PLUGIN_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    DRA_DRIVER_GPU,
    GPU_OPERATOR_DEPLOY_LABELS,
    STACK_LABEL,
)

LabelPatch = Mapping[str, str | None]  # value None removes the label


class NodeState(enum.StrEnum):
    READY = "ready"  # the mode's plugin is Ready on the node and the node advertises GPUs through it
    PENDING = "pending"  # labelled (or about to be); waiting for the plugin and its advertisement
    SWITCHING = "switching"  # the other mode's operand is leaving the node
    REFUSED = "refused"  # the spec cannot work on this node (kubelet, API versions)
    CONFLICT = "conflict"  # an older GpuStack selects the node
    ELSEWHERE = "elsewhere"  # another stack (NVIDIA's GPU Operator) serves the node's GPUs


DEPLOY_LABEL = {Mode.DEVICE_PLUGIN: DEPLOY_DEVICE_PLUGIN_LABEL, Mode.DRA: DEPLOY_DRA_KUBELET_PLUGIN_LABEL}
COMPONENT = {Mode.DEVICE_PLUGIN: COMPONENT_DEVICE_PLUGIN, Mode.DRA: COMPONENT_DRA_KUBELET_PLUGIN}
# How long after its release a node's advertisement may still be gpuforge's departed plugin's: kubelet
# deletes a DRA driver's ResourceSlices some 30 s after its plugin unregisters (so that a restarting
# plugin keeps them), and reports a stopped device plugin's devices unhealthy (allocatable 0) on its next
# node status update (every 10 s). Twice that, for a loaded kubelet.
RELEASE_GRACE = timedelta(seconds=90)


def other_mode(mode: Mode) -> Mode:
    return Mode.DRA if mode is Mode.DEVICE_PLUGIN else Mode.DEVICE_PLUGIN


@dataclass(frozen=True)
class NodeStep:
    node: str
    state: NodeState
    labels: LabelPatch = field(default_factory=dict)  # to apply now; empty: nothing to change
    detail: str = ""


@dataclass(frozen=True)
class Problem:
    """Something the spec cannot do, for a condition and an event."""

    reason: str
    message: str
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    steps: tuple[NodeStep, ...]  # one per selected node
    releases: tuple[NodeStep, ...]  # nodes the stack holds but no longer serves
    problems: tuple[Problem, ...]
    dra_api_version: str | None  # resource.k8s.io version for DeviceClasses (None: not served)
    operands: frozenset[
        Mode
    ]  # operand DaemonSets to keep: the mode's, plus the other while nodes still run it
    # Selected nodes the upgrade engine moves (not another stack's; DRA refusals are the engine's own).
    planned: frozenset[str] = frozenset()
    # (mode, release) of nodes pinned to a release other than the stack's (rolled back): DaemonSets to keep.
    pinned: frozenset[tuple[Mode, str]] = frozenset()


# --- selection ---------------------------------------------------------------------------------------


def _requirement_matches(req: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    value = labels.get(req.key)
    match req.operator:
        case SelectorOperator.IN:
            return value is not None and value in req.values
        case SelectorOperator.NOT_IN:
            return value is None or value not in req.values
        case SelectorOperator.EXISTS:
            return value is not None
        case SelectorOperator.DOES_NOT_EXIST:
            return value is None
        case SelectorOperator.GT | SelectorOperator.LT:
            try:
                number, bound = int(value or ""), int(req.values[0])
            except ValueError:
                return False
            return number > bound if req.operator is SelectorOperator.GT else number < bound


def selects(selector: NodeSelector, labels: Mapping[str, str]) -> bool:
    """Terms are ORed, expressions inside a term ANDed (as in required node affinity)."""
    return any(
        all(_requirement_matches(req, labels) for req in term.match_expressions)
        for term in selector.node_selector_terms
    )


# --- one node, one operand -----------------------------------------------------------------------------


def _advertises(node: NodeFacts, mode: Mode) -> bool:
    # Allocatable, not capacity: capacity outlives a stopped device plugin by kubelet's grace period.
    return bool(node.gpu_allocatable) if mode is Mode.DEVICE_PLUGIN else node.dra_slices > 0


def _claim_wait(node: NodeFacts) -> str | None:
    if node.claim_pods is None:
        return "checking for pods holding ResourceClaims"
    if node.claim_pods > 0:
        return f"{node.claim_pods} pod(s) still hold ResourceClaims"
    return None


def observe(node: NodeFacts, mode: Mode, plugin_ready: bool) -> NodeStep:
    """Where `node` stands with `mode`'s operand, for status only: the labels are the upgrade engine's
    (`gpuforge.upgrade`), which moves nodes between operands and releases one by one."""
    target, old = DEPLOY_LABEL[mode], DEPLOY_LABEL[other_mode(mode)]
    if node.labels.get(old, "") not in ("", "false"):
        return NodeStep(node.name, NodeState.SWITCHING, detail=f"{old} still on")
    if _advertises(node, other_mode(mode)):
        return NodeStep(node.name, NodeState.SWITCHING, detail="waiting for the old advertisement to go")
    if node.labels.get(target, "") in ("", "false"):
        return NodeStep(node.name, NodeState.PENDING, detail=f"{target} not set yet")
    if plugin_ready and _advertises(node, mode):
        return NodeStep(node.name, NodeState.READY)
    return NodeStep(node.name, NodeState.PENDING, detail="waiting for the plugin")


def release(node: NodeFacts) -> NodeStep:
    """Take a node away from the stack: plugin labels off (DRA only when claim-free), then the stack label."""
    patch: dict[str, str | None] = {}
    detail = ""
    if DEPLOY_DEVICE_PLUGIN_LABEL in node.labels:
        patch[DEPLOY_DEVICE_PLUGIN_LABEL] = None
    if DEPLOY_DRA_KUBELET_PLUGIN_LABEL in node.labels:
        if wait := _claim_wait(node):
            detail = wait
        else:
            patch[DEPLOY_DRA_KUBELET_PLUGIN_LABEL] = None
    if not detail and STACK_LABEL in node.labels:
        patch[STACK_LABEL] = None
    return NodeStep(node.name, NodeState.SWITCHING, patch, detail or "releasing")


def needs_claim_check(stack: GpuStack, nodes: Iterable[NodeFacts], stacks: Sequence[GpuStack]) -> list[str]:
    """Nodes where the stack may remove the DRA kubelet plugin; only these need their pods looked at."""
    out = []
    for node in nodes:
        if node.labels.get(STACK_LABEL) != stack.name or DEPLOY_DRA_KUBELET_PLUGIN_LABEL not in node.labels:
            continue
        if (
            stack.spec.mode is not Mode.DRA
            or _older_owner(stack, node, stacks)
            or not selects(stack.spec.node_selector, node.labels)
        ):
            out.append(node.name)
    return out


def gpuforge_serves(node: NodeFacts, now: datetime | None = None) -> bool:
    """gpuforge placed the node (or is moving or releasing it): one of its labels is on the node, a
    plugin pod of a GpuStack is bound to it, or (given `now`) it was released less than RELEASE_GRACE
    ago. Whatever such a node advertises is gpuforge's own."""
    recently_released = (
        now is not None and node.released_at is not None and now - node.released_at < RELEASE_GRACE
    )
    deploy_on = any(node.labels.get(label, "") not in ("", "false") for label in DEPLOY_LABEL.values())
    return node.gpuforge_plugin or recently_released or STACK_LABEL in node.labels or deploy_on


def served_elsewhere(node: NodeFacts, now: datetime | None = None) -> str | None:
    """Why another stack serves this node's GPUs, or None. `now`: to tell a node gpuforge has just
    released (see `gpuforge_serves`); without it, a release mark counts for nothing."""
    for label in GPU_OPERATOR_DEPLOY_LABELS:
        # "true", or "paused-for-driver-upgrade" while its driver upgrade holds the plugin off the node
        # (it puts "true" back afterwards); absent or "false": the GPU Operator leaves the node alone.
        value = node.labels.get(label, "")
        if value not in ("", "false"):
            return f"NVIDIA's GPU Operator deploys its plugin here ({label}={value})"
    if gpuforge_serves(node, now):
        return None
    if node.gpu_allocatable:
        resources = ", ".join(sorted(node.gpu_allocatable))
        return f"a device plugin gpuforge did not deploy advertises {resources}"
    if node.dra_slices > 0:
        return f"a DRA driver gpuforge did not deploy publishes ResourceSlices of {DRA_DRIVER_GPU}"
    return None


def _older_owner(stack: GpuStack, node: NodeFacts, stacks: Sequence[GpuStack]) -> GpuStack | None:
    older = [s for s in stacks if s.age_key < stack.age_key and selects(s.spec.node_selector, node.labels)]
    return min(older, key=lambda s: s.age_key) if older else None


# --- the whole stack -------------------------------------------------------------------------------------


def _compat_problem(
    stack: GpuStack, kubelet_minor: Minor | None, served: frozenset[str], compat: Compat
) -> str | None:
    if stack.spec.mode is Mode.DRA:
        return compat.dra_problem(stack.spec.dra.version, kubelet_minor, served)
    return compat.device_plugin_problem(stack.spec.device_plugin.version, kubelet_minor)


def unsupported_device_class(stack: GpuStack, contract: OperandContract) -> str | None:
    """Why the stack's DRA driver release cannot serve a class in spec.dra.deviceClasses, or None.
    vfio.gpu.nvidia.com needs the PassthroughSupport gate (operands.yaml draDriver passthrough): an
    older release publishes no vfio devices, so claims for the class would stay Pending."""
    version = stack.spec.dra.version
    if DEVICE_CLASS_VFIO not in stack.spec.dra.device_classes:
        return None
    if contract.release(DRA_KUBELET_PLUGIN, version).passthrough is not None:
        return None
    since = [
        v
        for v in contract.versions(DRA_KUBELET_PLUGIN)
        if contract.release(DRA_KUBELET_PLUGIN, v).passthrough
    ]
    return (
        f"spec.dra.deviceClasses: {DEVICE_CLASS_VFIO} needs the DRA driver's PassthroughSupport "
        f"feature gate, which release {version} does not have (from {since[0] if since else 'none known'})"
    )


def place(
    stack: GpuStack,
    nodes: Sequence[NodeFacts],
    stacks: Sequence[GpuStack],
    pods: Iterable[OperandPod],
    served_resource_versions: frozenset[str],
    compat: Compat,
    now: datetime | None = None,
) -> Placement:
    """Decide every node of `stack`. `stacks`: all GpuStacks (including this one); `pods`: its plugin pods;
    `now`: the moment of the snapshot (see `served_elsewhere`)."""
    mode = stack.spec.mode
    ready_plugins = {(p.node, p.component) for p in pods if p.ready and p.stack == stack.name}
    existing = {s.name for s in stacks}
    dra_api = compat.best_resource_api(served_resource_versions)
    problems: list[Problem] = []
    stack_refusal: str | None = None
    try:
        if mode is Mode.DRA:
            compat.dra_release(stack.spec.dra.version)
        else:
            compat.device_plugin_release(stack.spec.device_plugin.version)
    except UnknownRelease as err:
        stack_refusal = str(err)
        problems.append(Problem(c.UNKNOWN_RELEASE, str(err)))
    if stack_refusal is None and mode is Mode.DRA:
        stack_refusal = unsupported_device_class(stack, load_operands())
        if stack_refusal is not None:
            problems.append(Problem(c.UNSUPPORTED_DEVICE_CLASS, stack_refusal))
    if mode is Mode.DRA and dra_api is None:
        served = ", ".join(sorted(served_resource_versions)) or "none"
        stack_refusal = f"the API server serves no usable resource.k8s.io version (served: {served})"

    steps: list[NodeStep] = []
    releases: list[NodeStep] = []
    planned: set[str] = set()
    conflicts: dict[str, list[str]] = {}
    refusals: dict[str, list[str]] = {}
    foreign: dict[str, list[str]] = {}
    compat_problems: dict[Minor | None, str | None] = {}  # thousands of nodes, a few kubelet releases
    for node in nodes:
        held_by = node.labels.get(STACK_LABEL)
        if not selects(stack.spec.node_selector, node.labels):
            if held_by == stack.name:
                releases.append(release(node))
            continue
        if owner := _older_owner(stack, node, stacks):
            conflicts.setdefault(owner.name, []).append(node.name)
            if held_by == stack.name:
                releases.append(release(node))
            steps.append(
                NodeStep(node.name, NodeState.CONFLICT, detail=f"selected by older GpuStack {owner.name}")
            )
            continue
        if elsewhere := served_elsewhere(node, now):
            foreign.setdefault(elsewhere, []).append(node.name)
            if held_by == stack.name:
                releases.append(release(node))
            steps.append(NodeStep(node.name, NodeState.ELSEWHERE, detail=elsewhere))
            continue
        if held_by not in (None, stack.name) and held_by in existing:
            steps.append(NodeStep(node.name, NodeState.PENDING, detail=f"GpuStack {held_by} is releasing it"))
            continue
        runs_ours = held_by == stack.name and node.labels.get(DEPLOY_LABEL[mode], "") not in ("", "false")
        refusal = stack_refusal
        if refusal is None:
            minor = node.kubelet_minor
            if minor not in compat_problems:
                compat_problems[minor] = _compat_problem(stack, minor, served_resource_versions, compat)
            refusal = compat_problems[minor]
        if refusal is None or mode is Mode.DRA:
            planned.add(node.name)
        if refusal is not None and not runs_ours:
            refusals.setdefault(refusal, []).append(node.name)
            steps.append(NodeStep(node.name, NodeState.REFUSED, detail=refusal))
            continue
        steps.append(observe(node, mode, (node.name, COMPONENT[mode]) in ready_plugins))

    for owner_name, names in sorted(conflicts.items()):
        message = f"older GpuStack {owner_name} also selects nodes {_names(names)}"
        problems.append(Problem(c.NODE_CONFLICT, message, tuple(names)))
    for why, names in sorted(foreign.items()):
        message = f"{why}: gpuforge leaves nodes {_names(names)} to it"
        problems.append(Problem(c.SERVED_ELSEWHERE, message, tuple(names)))
    for refusal, names in sorted(refusals.items()):
        reason = c.DRA_API_NOT_SERVED if dra_api is None and mode is Mode.DRA else c.INCOMPATIBLE_KUBELET
        if refusal == stack_refusal and reason != c.DRA_API_NOT_SERVED:
            continue  # already reported once for the whole stack
        problems.append(Problem(reason, f"{refusal}: refused on nodes {_names(names)}", tuple(names)))

    operands, pinned = operands_in_use(stack, _held(stack, nodes))
    return Placement(
        tuple(steps), tuple(releases), tuple(problems), dra_api, operands, frozenset(planned), pinned
    )


def operands_in_use(
    stack: GpuStack, held: Iterable[NodeFacts]
) -> tuple[frozenset[Mode], frozenset[tuple[Mode, str]]]:
    """Keep an operand's DaemonSet while any node the stack holds carries its deploy label: "true" is the
    main DaemonSet, any other value a release the node is pinned to (one DaemonSet per release)."""
    operands = {stack.spec.mode}
    pinned: set[tuple[Mode, str]] = set()
    for node in held:
        for m, label in DEPLOY_LABEL.items():
            value = node.labels.get(label, "")
            if value == "true":
                operands.add(m)
            elif value not in ("", "false"):
                pinned.add((m, value))
    return frozenset(operands), frozenset(pinned)


def _held(stack: GpuStack, nodes: Iterable[NodeFacts]) -> list[NodeFacts]:
    return [n for n in nodes if n.labels.get(STACK_LABEL) == stack.name]


def _names(names: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
