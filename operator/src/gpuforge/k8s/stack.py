"""Reconcile and clean up one GpuStack: read the cluster, ask the pure core, write the result.

The shell around `gpuforge.render` and `gpuforge.upgrade`: every decision is made by `place` (which
nodes the stack serves), the upgrade planner (what each node runs and when it moves; applied by
`gpuforge.k8s.upgrade`), `render` and `compute_status`, from what is read here once per pass, so running
it again (after a crash, on a timer) converges on the same state.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from gpuforge import compat as compat_data
from gpuforge.api import conditions as c
from gpuforge.api.cluster import NodeFacts
from gpuforge.api.convert import ModelError, from_dict, to_dict
from gpuforge.api.gpustack import Condition, GpuStack, GpuStackStatus, Mode, status_to_dict
from gpuforge.constants import (
    COMPONENT_DRA_KUBELET_PLUGIN,
    COMPONENT_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    OPENSHIFT_SCC_GROUP,
    RELEASED_ANNOTATION,
    STACK_LABEL,
)
from gpuforge.k8s.cache import ClusterCache
from gpuforge.k8s.client import (
    ApiError,
    Kube,
    Ref,
    node_facts,
    operand_pods,
    plugin_nodes,
    slices_per_node,
)
from gpuforge.k8s.memory import AppliedDigests, RenderCache, StackMemory
from gpuforge.k8s.quota_deploy import QuotaOutcome, reconcile_quota, remove_quota
from gpuforge.k8s.upgrade import (
    NOTHING,
    Applied,
    ClusterView,
    Mark,
    StepContext,
    Stepper,
    apply_plan,
    desired_of,
    failures,
    in_flight,
    labels_after,
    read_cluster,
    snapshot_of,
    upgrade_status,
)
from gpuforge.render.manifests import (
    COMPONENT_STACK,
    RENDERED_COMPONENTS,
    Manifest,
    ObjectKey,
    RenderInput,
    held_elsewhere,
    object_key,
    render,
)
from gpuforge.render.placement import NodeState as PlacementState
from gpuforge.render.placement import Placement, Problem, operands_in_use, place, release
from gpuforge.render.status import compute_status
from gpuforge.upgrade.convert import ConversionMemo, PolicyError, policy_from_spec
from gpuforge.upgrade.model import NodeState, Plan
from gpuforge.upgrade.planner import plan as upgrade_plan

log = logging.getLogger(__name__)


# While the rendered objects stay the same they are applied and pruned again at most every 25 s, and not
# while nodes are in flight (a rollout's passes stay short); a settled stack's passes correct drift.
RESYNC_SECONDS = 25.0


@dataclass(frozen=True)
class Outcome:
    status: GpuStackStatus
    placement: Placement
    applied: int
    pruned: int
    labelled: int
    plan: Plan | None = None
    upgrade: Applied | None = None
    phases: Mapping[str, float] = dataclasses.field(default_factory=dict)  # seconds per part of the pass
    steps: StepContext | None = None  # for quick steps until the next pass; None when no node is in flight

    @property
    def settled(self) -> bool:
        """Nothing is moving: the next look can wait longer."""
        return self.status.conditions[1].status == "False"


class _Stopwatch:
    """Wall time per phase of a pass (read, plan, nodes, operands, status), for the metrics."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _previous_conditions(body: Mapping[str, Any]) -> tuple[Condition, ...]:
    out = []
    for raw in (body.get("status") or {}).get("conditions") or []:
        try:
            out.append(from_dict(Condition, raw))
        except ModelError:
            continue
    return tuple(out)


def _facts(
    memo: ConversionMemo, item: Mapping[str, Any], slices: Mapping[str, int], with_plugin: Collection[str]
) -> NodeFacts:
    """`node_facts`, converted again only when the Node, its slice count or its plugin pod changed."""
    name = item["metadata"]["name"]
    tag = ("facts", slices.get(name, 0), name in with_plugin)
    return memo.get(item, tag, partial(node_facts, item, slices, with_plugin))


def _with_claims(kube: Kube, nodes: Sequence[NodeFacts], names: Sequence[str]) -> list[NodeFacts]:
    wanted = set(names)
    return [
        dataclasses.replace(n, claim_pods=kube.count_claim_pods(n.name)) if n.name in wanted else n
        for n in nodes
    ]


def _render_all(
    renders: RenderCache,
    stack: GpuStack,
    operands: frozenset[Mode],
    dra_api: str | None,
    pinned: frozenset[tuple[Mode, str]] = frozenset(),
    openshift_scc: bool = False,
) -> list[Manifest]:
    """`render` is pure; the same inputs (the stack's spec, not its status) give the same manifests."""
    key = repr((stack, sorted(operands), dra_api, sorted(pinned), openshift_scc))
    return renders.get(
        key,
        lambda: render(
            RenderInput(stack, operands, dra_api, compat_data.load(), pinned, openshift_scc=openshift_scc)
        ),
    )


def _others_rendered(
    renders: RenderCache, stack: GpuStack, stacks: Sequence[GpuStack], dra_api: str | None
) -> list[tuple[GpuStack, list[Manifest]]]:
    out = []
    for other in stacks:
        if other.name == stack.name:
            continue
        try:
            out.append((other, _render_all(renders, other, frozenset({other.spec.mode}), dra_api)))
        except compat_data.UnknownRelease:
            continue  # that stack reports its own problem
    return out


@dataclass(frozen=True)
class _Upgrade:
    """The upgrade engine's part of one pass."""

    plan: Plan
    applied: Applied
    problems: tuple[Problem, ...]
    status: dict[str, Any]
    progress: str  # for the Progressing condition; "" when nothing moves
    steps: StepContext | None = None  # for quick steps; None when no node is in flight


def _upgrade(
    kube: Kube,
    stack: GpuStack,
    body: Mapping[str, Any],
    view: ClusterView,
    placement: Placement,
    cache: ClusterCache | None,
    stepper: tuple[Stepper, Mark] | None,
    dra_api: str | None,
    woken_at: float | None,
    watch: _Stopwatch,
    conversions: ConversionMemo,
) -> _Upgrade | None:
    """Plan the node moves of the stack and carry them out (with a stepper: queue them, and fill the
    slots through it); None when the spec cannot be planned."""
    if not _renderable(placement):
        return None
    try:
        policy = policy_from_spec((body.get("spec") or {}).get("upgradePolicy"))
    except PolicyError as err:
        return _Upgrade(Plan(()), NOTHING, (Problem(c.UPGRADE_FAILED, str(err)),), {}, "")
    now = datetime.now(UTC)
    snapshot = snapshot_of(view, stack.name, placement.planned, now, conversions)
    desired = desired_of(stack, placement.planned, compat_data.load())
    plan = upgrade_plan(snapshot, desired, policy)
    watch.lap("plan")
    moving = in_flight(plan)
    waiting = plan.counts().get(NodeState.UPGRADE_REQUIRED, 0)
    flying = bool(moving or plan.admitted)
    context = StepContext.of(plan, desired, policy, dra_api, view.served)
    applied = NOTHING
    if stepper is None:
        applied = apply_plan(kube, plan, snapshot, cache, woken_at, view.changed_at)
    else:
        engine, mark = stepper
        engine.use(context if flying else None, mark)
        engine.whole_pass(plan, snapshot, mark, woken_at, view.changed_at)
    watch.lap("nodes")
    failed = failures(plan, snapshot)
    problems = []
    if failed:
        named = "; ".join(f"{name}: {why}" if why else name for name, why in sorted(failed.items())[:10])
        problems.append(
            Problem(
                c.UPGRADE_FAILED, f"{len(failed)} node(s) failed on {plan.target}: {named}", tuple(failed)
            )
        )
    progress = ""
    if moving or any(t.changes_state for t in plan.transitions):
        shown = ", ".join(f"{n} ({plan.states[n]})" for n in moving[:5])
        more = f" and {len(moving) - 5} more" if len(moving) > 5 else ""
        progress = f"{len(moving)} node(s) in progress: {shown}{more}; {waiting} waiting"
        progress += "".join(f"; {f.message}" for f in plan.forward_only)
    steps = context if flying else None
    return _Upgrade(plan, applied, tuple(problems), upgrade_status(plan, failed), progress, steps)


def reconcile(
    kube: Kube,
    name: str,
    memory: StackMemory,
    cache: ClusterCache | None = None,
    woken_at: float | None = None,
    stepper: Stepper | None = None,
) -> Outcome | None:
    """One level-based pass over GpuStack `name`; None when it is gone or being deleted. Nodes, pods,
    slices and claims come from `cache` where it has synced (every decision is still made from one
    snapshot of them), the GpuStacks and served versions from the API. `woken_at`: when the change this
    pass reacts to arrived (time.monotonic), None for a timer's pass. With `stepper` (the operator), node
    steps are queued rather than waited for, and the stepper gets the pass's context for quick steps.
    `memory` is what passes remember between them (what was applied, renders, conversions)."""
    watch = _Stopwatch()
    # One read gives this GpuStack and the others, whose nodes and operands it must leave alone.
    bodies = kube.list_stack_bodies()
    body = next((item for item in bodies if item["metadata"]["name"] == name), None)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    stack = GpuStack.from_body(body)
    compat = compat_data.load()
    stacks = [stack if item is body else GpuStack.from_body(item) for item in bodies]
    served = kube.served_versions()
    # OpenShift: the SecurityContextConstraints API is served (discovery, as NVIDIA's charts check it)
    openshift_scc = bool(kube.served_versions(OPENSHIFT_SCC_GROUP))
    dra_api = compat.best_resource_api(served)
    mark = stepper.writer.mark() if stepper is not None else None  # before the view: see Writer
    view = read_cluster(kube, dra_api, served, cache)
    slices = slices_per_node(view.slices)
    with_plugin = plugin_nodes(view.pods)
    memory.facts.next_snapshot()
    nodes = [_facts(memory.facts, item, slices, with_plugin) for item in view.nodes]
    pods = operand_pods(view.pods, stack.name)
    placement = place(stack, nodes, stacks, pods, served, compat, datetime.now(UTC))
    watch.lap("read")

    applied = pruned = labelled = 0
    error = None
    upgrade: _Upgrade | None = None
    try:
        engine = (stepper, mark) if stepper is not None and mark is not None else None
        upgrade = _upgrade(
            kube, stack, body, view, placement, cache, engine, dra_api, woken_at, watch, memory.conversions
        )
        if stepper is not None and (upgrade is None or upgrade.steps is None):
            stepper.use(None)  # nothing in flight, or a spec that cannot be planned: no quick step
        if upgrade is not None:
            labelled = len(upgrade.plan.transitions)
            after = labels_after(view.nodes, upgrade.plan)
            held = [dataclasses.replace(n, labels=after.get(n.name, n.labels)) for n in nodes]
            operands, pinned = operands_in_use(stack, [n for n in held if n.labels.get(STACK_LABEL) == name])
            placement = dataclasses.replace(
                placement,
                operands=operands,
                pinned=pinned,
                problems=placement.problems + upgrade.problems,
            )
        desired = (
            _render_all(
                memory.renders,
                stack,
                placement.operands,
                placement.dra_api_version,
                placement.pinned,
                openshift_scc,
            )
            if _renderable(placement)
            else []
        )
        shared = held_elsewhere(stack, desired, _others_rendered(memory.renders, stack, stacks, dra_api))
        digest = hashlib.sha256(json.dumps([desired, sorted(shared)], sort_keys=True).encode()).hexdigest()
        moving = upgrade is not None and upgrade.steps is not None  # nodes in flight: no drift resync
        if memory.operands.due(stack.uid or name, digest, RESYNC_SECONDS, may_resync=not moving):
            for obj in desired:
                if object_key(obj) not in shared:
                    kube.apply(obj)
                    applied += 1
            keep = {object_key(o) for o in desired}
            for ref in _prune_order(kube.list_owned(stack.name, RENDERED_COMPONENTS, dra_api)):
                if _key(ref) not in keep and kube.delete(ref):
                    pruned += 1
                    log.info("pruned %s %s/%s of GpuStack %s", ref.kind, ref.namespace, ref.name, stack.name)
            memory.operands.applied(stack.uid or name, digest)
    except ApiError as err:
        error = str(err)
        memory.operands.forget(stack.uid or name)
        log.warning("GpuStack %s: %s", stack.name, error)
    watch.lap("operands")

    quota = _quota_pass(kube, stack, body, stacks, memory.quota)
    status = compute_status(
        stack, placement, _previous_conditions(body), _now(), error, upgrade.progress if upgrade else ""
    )
    patch = status_to_dict(status)
    if quota.condition is not None:
        patch["conditions"].append(to_dict(quota.condition))
    if upgrade is not None and upgrade.status:
        patch["upgrade"] = upgrade.status
    kube.patch_stack_status(stack.name, patch)
    # One event per reason: the Kube client repeats none whose message is unchanged, so problems sharing
    # a reason (nodes left elsewhere for different reasons) must not take turns.
    messages: dict[str, list[str]] = {}
    for problem in placement.problems:
        messages.setdefault(problem.reason, []).append(problem.message)
    for reason, said in messages.items():
        kube.emit_event(stack, "Warning", reason, "; ".join(said))
    for step in placement.steps:
        if step.state is PlacementState.ELSEWHERE:
            message = f"GpuStack {stack.name} runs no gpuforge plugin here: {step.detail}"
            kube.emit_node_event(step.node, "Warning", c.SERVED_ELSEWHERE, message, once=True)
    if upgrade is not None:
        for refusal in upgrade.plan.refusals:
            kube.emit_event(stack, "Warning", refusal.reason.value, refusal.message)
        if upgrade.plan.forward_only:  # said while nodes wait for the move, so before it starts
            forward = "; ".join(f.message for f in upgrade.plan.forward_only)
            kube.emit_event(stack, "Warning", c.FORWARD_ONLY_UPGRADE, forward)
    if error:
        kube.emit_event(stack, "Warning", c.RECONCILE_FAILED, error)
    for kind, reason, message in quota.events:
        kube.emit_event(stack, kind, reason, message)
    watch.lap("status")
    return Outcome(
        status,
        placement,
        applied,
        pruned,
        labelled,
        upgrade.plan if upgrade else None,
        upgrade.applied if upgrade else None,
        watch.phases,
        upgrade.steps if upgrade and not error else None,
    )


def _quota_pass(
    kube: Kube, stack: GpuStack, body: Mapping[str, Any], stacks: Sequence[GpuStack], applied: AppliedDigests
) -> QuotaOutcome:
    """The quota webhook (gpuforge.k8s.quota_deploy), after the operands so the namespace exists."""
    return reconcile_quota(kube, stack, body, _previous_conditions(body), stacks, applied)


def _renderable(placement: Placement) -> bool:
    """An unknown release, or a device class the release cannot serve, cannot be rendered: keep what
    runs rather than prune it, and move no node onto it."""
    return not any(p.reason in (c.UNKNOWN_RELEASE, c.UNSUPPORTED_DEVICE_CLASS) for p in placement.problems)


def _key(ref: Ref) -> ObjectKey:
    return (ref.group, ref.kind, ref.namespace, ref.name)


def _prune_order(refs: Sequence[Ref]) -> list[Ref]:
    """Workloads first, shared and namespace objects last; the DRA kubelet plugin after other workloads."""

    def rank(ref: Ref) -> int:
        if ref.kind == "Namespace":
            return 9
        if ref.labels.get(COMPONENT_LABEL) == COMPONENT_STACK:
            return 8
        if ref.labels.get(COMPONENT_LABEL) == COMPONENT_DRA_KUBELET_PLUGIN:
            return 5 if ref.kind == "DaemonSet" else 6
        return 0 if ref.kind in ("DaemonSet", "Deployment") else 1

    return sorted(refs, key=rank)


@dataclass(frozen=True)
class Cleanup:
    done: bool
    waiting: str = ""


def cleanup(kube: Kube, body: Mapping[str, Any], memory: StackMemory) -> Cleanup:
    """Remove everything the GpuStack made. The DRA kubelet plugin (and what it needs) goes last, only
    once no pod on its nodes holds a ResourceClaim; objects another GpuStack also renders stay for it."""
    stack = GpuStack.from_body(body)
    # The quota webhook first: its configurations must not outlive the webhook they point at.
    remove_quota(kube, stack, _previous_conditions(body), memory.quota)
    stacks = [s for s in kube.list_stacks() if s.name != stack.name]
    held = kube.list_nodes({}, label_selector=f"{STACK_LABEL}={stack.name}")
    held = _with_claims(kube, held, [n.name for n in held if DEPLOY_DRA_KUBELET_PLUGIN_LABEL in n.labels])
    waiting = []
    for node in held:
        step = release(node)
        if STACK_LABEL in step.labels:  # see RELEASED_ANNOTATION
            patch = {"labels": dict(step.labels), "annotations": {RELEASED_ANNOTATION: _now()}}
            kube.patch_node(node.name, {"metadata": patch})
        elif step.labels:
            kube.patch_node_labels(node.name, step.labels)
        if STACK_LABEL not in step.labels:
            waiting.append(f"{node.name} ({step.detail})")

    dra_api = compat_data.load().best_resource_api(kube.served_versions())
    shared: set[ObjectKey] = set()
    for _, objects in _others_rendered(memory.renders, stack, stacks, dra_api):
        shared |= {object_key(o) for o in objects}
    for ref in _prune_order(kube.list_owned(stack.name, RENDERED_COMPONENTS, dra_api)):
        if _key(ref) in shared:
            continue
        last = ref.kind == "Namespace" or ref.labels.get(COMPONENT_LABEL) in (
            COMPONENT_DRA_KUBELET_PLUGIN,
            COMPONENT_STACK,
        )
        if waiting and last:
            continue
        kube.delete(ref)
    if waiting:
        message = f"waiting before removing the DRA kubelet plugin from {', '.join(waiting[:10])}"
        kube.emit_event(stack, "Normal", c.CLEANUP_WAITING, message)
        return Cleanup(False, message)
    return Cleanup(True)
