"""GitOps of a quota tree on the real local control plane: examples/quota-tree.yaml (four GpuQuotas and a
Deployment charged to one of them) applied with `kubectl apply --server-side`, admitted by the webhook
and accounted by its controller, shows no drift afterwards: `kubectl diff --server-side` of the same
file exits 0. The webhook writes usage and conditions to status only; the diff, a dry-run apply, goes
through the webhook too (its configurations declare sideEffects NoneOnDryRun), so this also checks
that a dry run is admitted without charging anything.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..argocd_health import health
from .conftest import GPU, REPO, WebhookProcess, kubectl, wait_for

pytestmark = pytest.mark.cluster

TREE = REPO / "examples" / "quota-tree.yaml"
MANAGER = "gitops"


def server_side(dev_cluster: Any, verb: str, path: Path) -> subprocess.CompletedProcess[str]:
    command = [
        *kubectl(dev_cluster),
        verb,
        "--server-side",
        "--force-conflicts",
        f"--field-manager={MANAGER}",
    ]
    return subprocess.run([*command, "-f", str(path)], capture_output=True, text=True, timeout=120)


def quota(dev_cluster: Any, name: str) -> dict[str, Any]:
    result = subprocess.run(
        [*kubectl(dev_cluster), "get", "gpuquota", name, "-o", "yaml"], capture_output=True, text=True
    )
    return yaml.safe_load(result.stdout) if result.returncode == 0 else {}


def reconciled(status: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    return conditions.get("Reconciled") == "True"


def test_reconciled_quota_tree_shows_no_drift(dev_cluster: Any, quota_webhook: WebhookProcess) -> None:
    objects = [o for o in yaml.safe_load_all(TREE.read_text()) if o]
    names = [o["metadata"]["name"] for o in objects if o["kind"] == "GpuQuota"]
    workloads = [o for o in objects if o["kind"] != "GpuQuota"]
    applied = server_side(dev_cluster, "apply", TREE)
    assert applied.returncode == 0, applied.stderr
    try:
        wait_for(
            "every quota of the tree reconciled, the trainer charged to research-vision",
            lambda: (
                all(reconciled(quota(dev_cluster, n).get("status", {})) for n in names)
                and quota(dev_cluster, "research-vision").get("status", {}).get("used", {}).get(GPU) == "2"
            ),
            timeout=120,
        )
        generations = {n: quota(dev_cluster, n)["metadata"]["generation"] for n in names}
        diff = server_side(dev_cluster, "diff", TREE)
        assert diff.returncode == 0, f"drift after reconcile:\n{diff.stdout}{diff.stderr}"
        # Argo CD's view of them, with the health check of docs/install.md.
        assert {n: health(quota(dev_cluster, n))[0] for n in names} == dict.fromkeys(names, "Healthy")
        # The dry run charged nothing.
        assert quota(dev_cluster, "research-vision")["status"]["used"][GPU] == "2"
        again = server_side(dev_cluster, "apply", TREE)
        assert again.returncode == 0, again.stderr
        assert {n: quota(dev_cluster, n)["metadata"]["generation"] for n in names} == generations
        # The check sees drift where there is some: another writer's change to a spec shows up.
        patch = '{"spec":{"hard":{"requests.cpu":"63"}}}'
        subprocess.run(
            [*kubectl(dev_cluster), "patch", "gpuquota", "research-vision", "--type=merge", "-p", patch],
            check=True,
            capture_output=True,
        )
        drift = server_side(dev_cluster, "diff", TREE)
        assert drift.returncode == 1 and '"63"' in drift.stdout, drift.stdout + drift.stderr
    finally:
        base = kubectl(dev_cluster)
        for workload in workloads:
            meta = workload["metadata"]
            subprocess.run(
                [*base, "delete", workload["kind"], meta["name"], "-n", meta.get("namespace", "default"),
                 "--ignore-not-found", "--wait=true"],
                capture_output=True, timeout=120,
            )  # fmt: skip
        for name in reversed(names):  # children before their parents
            subprocess.run(
                [*base, "delete", "gpuquota", name, "--ignore-not-found", "--wait=true"],
                capture_output=True,
                timeout=120,
            )
