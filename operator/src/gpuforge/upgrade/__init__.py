"""Ordered upgrades and migrations of the GPU stacks on nodes: a pure planner over typed snapshots. No I/O.

`plan(snapshot, desired, policy)` decides what to do next; `gpuforge.upgrade.convert` builds its inputs
from plain Kubernetes objects (dicts). Executing the plan is `gpuforge.k8s`'s job.
"""

from gpuforge.upgrade.planner import advance, plan

__all__ = ["advance", "plan"]
