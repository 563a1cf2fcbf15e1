"""A small simulated cluster for planner tests: applies a plan's actions and lets the world move on.

What it simulates (and only this): the two plugin DaemonSets (OnDelete for the main one; a pinned
DaemonSet per release for rolled-back nodes), plugin pods becoming Ready a tick after creation (never on
a broken node/release), advertisement that follows a Ready plugin with one tick of lag (like the
kubelet), GPU jobs that finish after a while, evictions (refused for pods behind a PodDisruptionBudget),
and a scheduler that puts new GPU pods on schedulable nodes advertising GPUs. Time moves by `tick_seconds`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from gpuforge.constants import GFD_COUNT_LABEL
from gpuforge.upgrade.model import (
    DEPLOY_LABELS,
    DEPLOY_ON,
    Cordon,
    DeletePods,
    Desired,
    EvictPods,
    GpuNode,
    Mode,
    OperandPod,
    Plan,
    PodRef,
    SetAnnotations,
    SetLabels,
    Snapshot,
    Transition,
    Uncordon,
    WorkloadPod,
)

START = datetime(2026, 8, 1, 12, 0, tzinfo=UTC)
DRIVER = "gpu.nvidia.com"


@dataclass
class SimOperand:
    ref: PodRef
    mode: Mode
    version: str
    owner_value: str  # the deploy label value of the DaemonSet that made it ("true" or a pinned release)
    ready: bool = False
    deleting: bool = False
    ready_in: int = 0  # ticks until Ready
    terminating_for: int = 0  # ticks spent terminating


@dataclass
class SimPod:
    ref: PodRef
    alloc_mode: Mode  # the stack its GPUs came from
    labels: dict[str, str] = field(default_factory=dict)
    finishes_in: int | None = None  # ticks until it completes by itself; None: runs until evicted
    pdb_blocked: bool = False
    deleting: bool = False
    terminating_for: int = 0  # ticks spent terminating


@dataclass
class SimNode:
    name: str
    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    kubelet_version: str = "v1.36.0"
    ready: bool = True
    unschedulable: bool = False
    gpus: int = 4
    # Releases whose plugin never becomes Ready on this node.
    broken: set[str] = field(default_factory=set)
    operands: list[SimOperand] = field(default_factory=list)
    pods: list[SimPod] = field(default_factory=list)
    advert: dict[Mode, int] = field(default_factory=dict)
    linger: dict[Mode, int] = field(default_factory=dict)  # ticks the advertisement outlives its plugin
    # Whether the scheduler saw the node schedulable on the last ticks: it acts on a stale view, so a pod
    # can still land on a node just cordoned (the race the planner must survive).
    seen_schedulable: list[bool] = field(default_factory=lambda: [True, True])

    def deploy_value(self, mode: Mode) -> str | None:
        value = self.labels.get(DEPLOY_LABELS[mode])
        return None if value in (None, "", "false") else value


class World:
    def __init__(
        self,
        nodes: list[SimNode],
        desired: Desired,
        *,
        tick_seconds: int = 30,
        seed: int = 0,
        new_pod_rate: float = 0.0,
        bad_versions: frozenset[str] = frozenset(),
    ) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.desired = desired
        self.now = START
        self.tick_seconds = tick_seconds
        self.random = random.Random(seed)
        self.new_pod_rate = new_pod_rate
        self.bad_versions = bad_versions
        self.counter = 0

    # --- observing --------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return Snapshot(tuple(self._node(n) for n in self.nodes.values()), self.now)

    def _node(self, node: SimNode) -> GpuNode:
        dp = node.advert.get(Mode.DEVICE_PLUGIN, 0)
        dra = node.advert.get(Mode.DRA, 0)
        return GpuNode(
            name=node.name,
            labels=dict(node.labels),
            annotations=dict(node.annotations),
            kubelet_version=node.kubelet_version,
            ready=node.ready,
            unschedulable=node.unschedulable,
            gpu_capacity=dp,
            gpu_allocatable=dp,
            slices={DRIVER: (1, dra)} if dra else {},
            operands=tuple(
                OperandPod(o.ref, o.mode, o.version, ready=o.ready, deleting=o.deleting)
                for o in node.operands
            ),
            pods=tuple(
                WorkloadPod(
                    p.ref,
                    labels=dict(p.labels),
                    uses_gpu=True,
                    holds_claim=p.alloc_mode is Mode.DRA,
                    deleting=p.deleting,
                )
                for p in node.pods
            ),
        )

    def advertises_both(self, name: str) -> bool:
        node = self.nodes[name]
        return node.advert.get(Mode.DEVICE_PLUGIN, 0) > 0 and node.advert.get(Mode.DRA, 0) > 0

    def double_allocation(self, name: str) -> bool:
        """A pod holding GPUs from one stack while the other stack advertises the same GPUs."""
        node = self.nodes[name]
        return any(node.advert.get(_other(p.alloc_mode), 0) > 0 for p in node.pods)

    # --- acting -------------------------------------------------------------------------------------

    def apply(self, transition: Transition, *, pod_actions: bool = True) -> None:
        node = self.nodes[transition.node]
        for action in transition.actions:
            if isinstance(action, SetLabels):
                _update(node.labels, action.values)
            elif isinstance(action, SetAnnotations):
                _update(node.annotations, action.values)
            elif isinstance(action, Cordon):
                node.unschedulable = True
            elif isinstance(action, Uncordon):
                node.unschedulable = False
            elif not pod_actions:
                continue
            elif isinstance(action, EvictPods):
                for pod in node.pods:
                    if pod.ref in action.pods and not pod.pdb_blocked:
                        pod.deleting = True
            elif isinstance(action, DeletePods):
                for operand in node.operands:
                    if operand.ref in action.pods:
                        operand.deleting = True

    def apply_plan(self, plan: Plan, *, crash_after: int | None = None) -> None:
        """Apply the plan; with `crash_after`, only that many transitions, the last one without its pod
        actions (the operator died between the node patch and the pod calls)."""
        for index, transition in enumerate(plan.transitions):
            if crash_after is not None and index >= crash_after:
                self.apply(transition, pod_actions=False)
                return
            self.apply(transition)

    def tick(self) -> None:
        self.now += timedelta(seconds=self.tick_seconds)
        for node in self.nodes.values():
            self._tick_node(node)

    def _tick_node(self, node: SimNode) -> None:
        rnd = self.random
        # Terminating pods take a random while to go, but at most MAX_TERMINATING_TICKS (their grace period):
        # an unbounded random wait would outlast any step timeout now and then and fail a healthy node.
        for item in [*node.operands, *node.pods]:
            item.terminating_for += item.deleting
        node.operands = [o for o in node.operands if not (o.deleting and _gone(rnd.random() < 0.5, o))]
        node.pods = [p for p in node.pods if not (p.deleting and _gone(rnd.random() < 0.6, p))]
        for pod in node.pods:
            if pod.finishes_in is not None and not pod.deleting:
                pod.finishes_in -= 1
                if pod.finishes_in <= 0:
                    pod.deleting = True
        # Plugins become Ready after a random delay (never when broken); the DaemonSets react to labels.
        for operand in node.operands:
            if not operand.ready and node.ready and not self._broken(node, operand):
                operand.ready_in -= 1
                operand.ready = operand.ready_in < 0
        for mode in (Mode.DEVICE_PLUGIN, Mode.DRA):
            value = node.deploy_value(mode)
            mine = [o for o in node.operands if o.mode is mode]
            for operand in mine:
                if operand.owner_value != value:  # the DaemonSet that made it no longer selects the node
                    operand.deleting = True
            if value is not None and node.ready and not any(o.owner_value == value for o in mine):
                version = self.desired.versions[mode] if value == DEPLOY_ON else value
                self.counter += 1
                ref = PodRef("gpuforge", f"{mode}-{node.name}-{self.counter}")
                node.operands.append(SimOperand(ref, mode, version, value, ready_in=rnd.randint(0, 2)))
        # A Ready plugin advertises at once; a gone plugin's advertisement lingers a random while (the
        # kubelet keeps a stopped device plugin's capacity; slices are deleted asynchronously).
        for mode in (Mode.DEVICE_PLUGIN, Mode.DRA):
            if any(o.mode is mode and o.ready for o in node.operands):
                node.advert[mode] = node.gpus
                node.linger[mode] = rnd.randint(0, 3)
            elif node.linger.get(mode, 0) > 0:
                node.linger[mode] -= 1
            else:
                node.advert.pop(mode, None)
        if (
            self.new_pod_rate
            and node.seen_schedulable[0]
            and node.ready
            and node.advert
            and rnd.random() < self.new_pod_rate
        ):
            mode = sorted(node.advert)[0]
            self.counter += 1
            node.pods.append(
                SimPod(PodRef("jobs", f"job-{self.counter}"), mode, finishes_in=rnd.randint(1, 6))
            )
        node.seen_schedulable = [*node.seen_schedulable[1:], not node.unschedulable]

    def _broken(self, node: SimNode, operand: SimOperand) -> bool:
        return operand.version in node.broken or operand.version in self.bad_versions


MAX_TERMINATING_TICKS = 4


def _gone(lucky: bool, item: SimOperand | SimPod) -> bool:
    return lucky or item.terminating_for >= MAX_TERMINATING_TICKS


def _other(mode: Mode) -> Mode:
    return Mode.DRA if mode is Mode.DEVICE_PLUGIN else Mode.DEVICE_PLUGIN


def _update(target: dict[str, str], values: object) -> None:
    assert isinstance(values, dict) or hasattr(values, "items")
    for key, value in values.items():  # type: ignore[attr-defined]
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value


def settled_node(
    name: str,
    mode: Mode,
    version: str,
    *,
    gpus: int = 4,
    value: str = DEPLOY_ON,
    **kwargs: object,
) -> SimNode:
    """A node running `mode` at `version`, Ready and advertising its GPUs."""
    node = SimNode(name, {DEPLOY_LABELS[mode]: value, GFD_COUNT_LABEL: str(gpus)}, gpus=gpus, **kwargs)  # type: ignore[arg-type]
    node.operands.append(SimOperand(PodRef("gpuforge", f"{mode}-{name}-0"), mode, version, value, ready=True))
    node.advert = {mode: gpus}
    return node


def with_state(node: GpuNode, **changes: object) -> GpuNode:
    return replace(node, **changes)  # type: ignore[arg-type]
