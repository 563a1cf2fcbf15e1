"""GitOps on the real local control plane: a GpuStack example applied with `kubectl apply --server-side`
(as Argo CD or Flux apply it) and reconciled by the operator shows no drift afterwards: `kubectl diff
--server-side` of the same file exits 0. Whatever the operator writes (status, kopf's annotations and
finalizer, the API server's defaults) must stay out of the fields the GitOps tool owns, or every sync
would report the stack OutOfSync and fight the operator.

The operator runs with its ServiceAccount and the shipped RBAC, rbac-quota.yaml included, so the quota
example deploys its webhook too (registered once kwok marks a replica Ready).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuforge.render import quota_webhook as q
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

from ..argocd_health import health
from ..operator_process import (
    DEPLOY,
    OPERATOR_DIR,
    Operator,
    condition,
    kube_json,
    operator_factory,
    wait_for,
)

__all__ = ["operator_factory"]  # a fixture, used by name

pytestmark = pytest.mark.cluster

EXAMPLES = OPERATOR_DIR.parent / "examples"
MANAGER = "gitops"
STACK = "gpus"  # the name every GpuStack example uses
POOLS = (
    Pool(name="h100", count=2, gpu=GpuSpec(product="NVIDIA H100 80GB HBM3", memory_mib=81559)),
    Pool(name="cpu", count=2, gpu=None),
)


@pytest.fixture(scope="module")
def cluster(cluster_factory: Callable[..., Any]) -> Any:
    return cluster_factory(profile="1.36", pools=POOLS, name="gitops")


@pytest.fixture(scope="module")
def operator(cluster: Any, operator_factory: Callable[[Any], Operator]) -> Operator:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(DEPLOY / "rbac-quota.yaml"))
    return operator_factory(cluster)


def reconciled(cluster: Any, quota: bool) -> dict[str, Any] | None:
    """The stack once the operator has caught up with its spec: Ready at the current generation (and
    its quota webhook registered), else None."""
    result = cluster.kubectl("get", "gpustack", STACK, "-o", "json", check=False)
    if result.returncode != 0:
        return None
    stack = kube_json(cluster, "gpustack", STACK)
    status = stack.get("status", {})
    if status.get("observedGeneration") != stack["metadata"]["generation"] or status.get("phase") != "Ready":
        return None
    if quota and condition(status, q.CONDITION).get("status") != "True":
        return None
    return dict(stack)


def stack_ready_message(cluster: Any) -> str:
    return str(condition(kube_json(cluster, "gpustack", STACK)["status"], "Ready").get("message", ""))


def server_side(cluster: Any, verb: str, path: Path) -> Any:
    """`kubectl apply|diff --server-side` as a GitOps tool runs them: its own field manager, taking over
    fields another manager holds (so a diff shows what a sync would change, rather than a conflict)."""
    return cluster.kubectl(
        verb, "--server-side", "--force-conflicts", f"--field-manager={MANAGER}", "-f", str(path), check=False
    )


@pytest.mark.parametrize(
    ("example", "quota"),
    [("gpustack-device-plugin.yaml", False), ("gpustack-dra.yaml", False), ("gpustack-quota.yaml", True)],
)
def test_reconciled_example_shows_no_drift(
    cluster: Any, operator: Operator, example: str, quota: bool
) -> None:
    path = EXAMPLES / example
    applied = server_side(cluster, "apply", path)
    assert applied.returncode == 0, applied.stderr
    try:
        stack = wait_for(f"{example} reconciled", lambda: reconciled(cluster, quota), timeout=180)
        assert stack["metadata"]["finalizers"], "the operator has handled it (its finalizer is there)"
        diff = server_side(cluster, "diff", path)
        assert diff.returncode == 0, f"drift after reconcile:\n{diff.stdout}{diff.stderr}"
        # Argo CD's view of it, with the health check of docs/install.md.
        assert health(kube_json(cluster, "gpustack", STACK)) == ("Healthy", stack_ready_message(cluster))
        # A second sync changes nothing either: the generation stays.
        again = server_side(cluster, "apply", path)
        assert again.returncode == 0, again.stderr
        generation = kube_json(cluster, "gpustack", STACK)["metadata"]["generation"]
        assert generation == stack["metadata"]["generation"]
        # The check sees drift where there is some: another writer's change to spec shows up.
        patch = '{"spec":{"namespace":"elsewhere"}}'
        cluster.kubectl("patch", "gpustack", STACK, "--type=merge", "-p", patch)
        drift = server_side(cluster, "diff", path)
        assert drift.returncode == 1 and "elsewhere" in drift.stdout, drift.stdout + drift.stderr
    finally:
        cluster.kubectl("delete", "gpustack", STACK, "--wait=false", "--ignore-not-found")
        wait_for(
            f"GpuStack {STACK} gone",
            lambda: cluster.kubectl("get", "gpustack", STACK, check=False).returncode != 0,
            timeout=180,
        )
