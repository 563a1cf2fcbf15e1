"""Reconcile and clean up one GpuStack: read the cluster, ask the pure core, write the result.

The shell around `gpuforge.render`: every decision is made by `place`, `render` and `compute_status`
from what is read here, so running it again (after a crash, on a timer) converges on the same state.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuforge import compat as compat_data
from gpuforge.api import conditions as c
from gpuforge.api.cluster import NodeFacts
from gpuforge.api.convert import ModelError, from_dict
from gpuforge.api.gpustack import Condition, GpuStack, GpuStackStatus, Mode, status_to_dict
from gpuforge.constants import (
    COMPONENT_DRA_KUBELET_PLUGIN,
    COMPONENT_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    STACK_LABEL,
)
from gpuforge.k8s.client import ApiError, Kube, Ref
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
from gpuforge.render.placement import Placement, needs_claim_check, place, release
from gpuforge.render.status import compute_status

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    status: GpuStackStatus
    placement: Placement
    applied: int
    pruned: int
    labelled: int

    @property
    def settled(self) -> bool:
        """Nothing is moving: the next look can wait longer."""
        return self.status.conditions[1].status == "False"


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


def _with_claims(kube: Kube, nodes: Sequence[NodeFacts], names: Sequence[str]) -> list[NodeFacts]:
    wanted = set(names)
    return [
        dataclasses.replace(n, claim_pods=kube.count_claim_pods(n.name)) if n.name in wanted else n
        for n in nodes
    ]


def _render_all(stack: GpuStack, operands: frozenset[Mode], dra_api: str | None) -> list[Manifest]:
    return render(RenderInput(stack, operands, dra_api, compat_data.load()))


def _others_rendered(
    stack: GpuStack, stacks: Sequence[GpuStack], dra_api: str | None
) -> list[tuple[GpuStack, list[Manifest]]]:
    out = []
    for other in stacks:
        if other.name == stack.name:
            continue
        try:
            out.append((other, _render_all(other, frozenset({other.spec.mode}), dra_api)))
        except compat_data.UnknownRelease:
            continue  # that stack reports its own problem
    return out


def reconcile(kube: Kube, name: str) -> Outcome | None:
    """One level-based pass over GpuStack `name`; None when it is gone or being deleted."""
    body = kube.get_stack(name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    stack = GpuStack.from_body(body)
    compat = compat_data.load()
    stacks = kube.list_stacks()
    served = kube.served_versions()
    dra_api = compat.best_resource_api(served)
    nodes = kube.list_nodes(kube.count_gpu_slices(dra_api))
    nodes = _with_claims(kube, nodes, needs_claim_check(stack, nodes, stacks))
    pods = kube.list_operand_pods(stack.name)
    placement = place(stack, nodes, stacks, pods, served, compat)

    applied = pruned = labelled = 0
    error = None
    try:
        desired = (
            _render_all(stack, placement.operands, placement.dra_api_version)
            if _renderable(placement)
            else []
        )
        shared = held_elsewhere(stack, desired, _others_rendered(stack, stacks, dra_api))
        for obj in desired:
            if object_key(obj) not in shared:
                kube.apply(obj)
                applied += 1
        keep = {object_key(o) for o in desired}
        for ref in _prune_order(kube.list_owned(stack.name, RENDERED_COMPONENTS, dra_api)):
            if _key(ref) not in keep and kube.delete(ref):
                pruned += 1
                log.info("pruned %s %s/%s of GpuStack %s", ref.kind, ref.namespace, ref.name, stack.name)
        for step in (*placement.steps, *placement.releases):
            if step.labels:
                kube.patch_node_labels(step.node, step.labels)
                labelled += 1
    except ApiError as err:
        error = str(err)
        log.warning("GpuStack %s: %s", stack.name, error)

    status = compute_status(stack, placement, _previous_conditions(body), _now(), error)
    kube.patch_stack_status(stack.name, status_to_dict(status))
    for problem in placement.problems:
        kube.emit_event(stack, "Warning", problem.reason, problem.message)
    if error:
        kube.emit_event(stack, "Warning", c.RECONCILE_FAILED, error)
    if labelled:
        kube.emit_event(
            stack, "Normal", c.NODE_LABELLED, f"labelled {labelled} node(s); {status.nodes_ready} ready"
        )
    return Outcome(status, placement, applied, pruned, labelled)


def _renderable(placement: Placement) -> bool:
    """An unknown release cannot be rendered: keep what runs rather than prune it."""
    return not any(p.reason == c.UNKNOWN_RELEASE for p in placement.problems)


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


def cleanup(kube: Kube, body: Mapping[str, Any]) -> Cleanup:
    """Remove everything the GpuStack made. The DRA kubelet plugin (and what it needs) goes last, only
    once no pod on its nodes holds a ResourceClaim; objects another GpuStack also renders stay for it."""
    stack = GpuStack.from_body(body)
    stacks = [s for s in kube.list_stacks() if s.name != stack.name]
    held = kube.list_nodes({}, label_selector=f"{STACK_LABEL}={stack.name}")
    held = _with_claims(kube, held, [n.name for n in held if DEPLOY_DRA_KUBELET_PLUGIN_LABEL in n.labels])
    waiting = []
    for node in held:
        step = release(node)
        if step.labels:
            kube.patch_node_labels(node.name, step.labels)
        if STACK_LABEL not in step.labels:
            waiting.append(f"{node.name} ({step.detail})")

    dra_api = compat_data.load().best_resource_api(kube.served_versions())
    shared: set[ObjectKey] = set()
    for _, objects in _others_rendered(stack, stacks, dra_api):
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
