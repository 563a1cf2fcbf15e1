"""Small builders for planner inputs, so each table row says only what matters to it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta

from gpuforge.constants import GFD_COUNT_LABEL, NODE_STATE_LABEL
from gpuforge.upgrade.model import (
    DEPLOY_LABELS,
    DEPLOY_ON,
    FROM_ANNOTATION,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    STATE_SINCE_ANNOTATION,
    Desired,
    GpuNode,
    Mode,
    NodeState,
    OperandPod,
    PodRef,
    Snapshot,
    WorkloadPod,
    format_time,
)

DP, DRA = Mode.DEVICE_PLUGIN, Mode.DRA
VERSIONS = {DP: "v0.17.0", DRA: "v25.12.0"}
NOW = datetime(2026, 8, 1, 12, 0, tzinfo=UTC)


def ago(seconds: int) -> str:
    return format_time(NOW - timedelta(seconds=seconds))


def gpu_pod(name: str, **kwargs: object) -> WorkloadPod:
    return WorkloadPod(PodRef("jobs", name), uses_gpu=True, **kwargs)  # type: ignore[arg-type]


def node(
    name: str = "n1",
    mode: Mode | None = DP,
    version: str | None = None,
    *,
    state: NodeState | None = None,
    since: int | None = 0,
    held: bool | None = None,  # None: not held; True/False: initial-unschedulable recorded as such
    origin: str | None = None,
    unschedulable: bool = False,
    ready: bool = True,
    gpus: int = 4,
    operand: bool = True,
    operand_ready: bool = True,
    operand_deleting: bool = False,
    advertising: bool = True,
    value: str = DEPLOY_ON,
    pods: Iterable[WorkloadPod] = (),
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    kubelet: str = "v1.36.0",
) -> GpuNode:
    """A node running `mode` (None: nothing) at `version` (default: the main DaemonSet's)."""
    all_labels = {GFD_COUNT_LABEL: str(gpus)}
    all_annotations: dict[str, str] = {}
    operands: tuple[OperandPod, ...] = ()
    capacity = 0
    slices: dict[str, tuple[int, int]] = {}
    if mode is not None:
        all_labels[DEPLOY_LABELS[mode]] = value
        release = version or VERSIONS[mode]
        if operand:
            ref = PodRef("gpuforge", f"{mode}-{name}")
            operands = (OperandPod(ref, mode, release, ready=operand_ready, deleting=operand_deleting),)
        if advertising:
            if mode is DP:
                capacity = gpus
            else:
                slices = {"gpu.nvidia.com": (1, gpus)}
    if state is not None:
        all_labels[NODE_STATE_LABEL] = state.value
        if since is not None:
            all_annotations[STATE_SINCE_ANNOTATION] = ago(since)
    if held is not None:
        all_annotations[INITIAL_UNSCHEDULABLE_ANNOTATION] = "true" if held else "false"
    if origin is not None:
        all_annotations[FROM_ANNOTATION] = origin
    all_labels.update(labels or {})
    all_annotations.update(annotations or {})
    return GpuNode(
        name=name,
        labels=all_labels,
        annotations=all_annotations,
        kubelet_version=kubelet,
        ready=ready,
        unschedulable=unschedulable,
        gpu_capacity=capacity,
        gpu_allocatable=capacity,
        slices=slices,
        operands=operands,
        pods=tuple(pods),
    )


def desired(mode: Mode = DRA, names: Iterable[str] = ("n1",), **kwargs: object) -> Desired:
    return Desired(
        mode=mode, versions=dict(kwargs.pop("versions", VERSIONS)), selected=frozenset(names), **kwargs
    )  # type: ignore[arg-type]


def snapshot(*nodes: GpuNode, served: Iterable[str] = ("v1",)) -> Snapshot:
    return Snapshot(tuple(nodes), NOW, frozenset(served))
