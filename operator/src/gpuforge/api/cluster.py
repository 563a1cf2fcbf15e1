"""Typed facts read from the cluster, the input of the pure decisions in `gpuforge.render`. No I/O.

`gpuforge.k8s` builds these from API objects; tests build them by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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
