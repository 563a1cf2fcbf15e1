"""Typed facts read from the cluster, the input of the pure decisions in `gpuforge.render`. No I/O.

`gpuforge.k8s` builds these from API objects; tests build them by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpuforge.compat import Minor, parse_minor


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    kubelet_version: str = ""  # "v1.33.2" from status.nodeInfo.kubeletVersion
    ready: bool = True
    unschedulable: bool = False
    # What the node advertises: nvidia.com/gpu capacity (device plugin) and ResourceSlices of gpu.nvidia.com.
    gpu_capacity: int = 0
    dra_slices: int = 0
    # GPU resources (nvidia.com/gpu, .shared, mig-*) with allocatable above 0: what a running device
    # plugin offers. Capacity outlives a stopped plugin (kubelet keeps it for its 5-minute grace period,
    # with allocatable 0), so only allocatable says that some plugin serves the node now.
    gpu_allocatable: Mapping[str, int] = field(default_factory=dict)
    # Whether a plugin pod of any GpuStack (Ready or not, being deleted or not) is bound to the node.
    gpuforge_plugin: bool = False
    # When gpuforge last released the node from a GpuStack (annotation gpuforge.io/released-at).
    released_at: datetime | None = None
    # Pods on the node, not finished, that hold a ResourceClaim; None when not looked up (the operator
    # only looks where it is about to remove the DRA kubelet plugin).
    claim_pods: int | None = None

    @property
    def kubelet_minor(self) -> Minor | None:
        return parse_minor(self.kubelet_version) if self.kubelet_version else None


@dataclass(frozen=True)
class OperandPod:
    """A plugin pod of some GpuStack, as seen by the operator."""

    name: str
    node: str
    stack: str
    component: str
    ready: bool
