"""Every `gpuforge` subcommand, run as a user runs it, against the real local control plane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge_lab.devcluster.cluster import DevCluster

REPO = Path(__file__).resolve().parents[4]


def gpuforge(
    *args: str, kubeconfig: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **(env or {})}
    if kubeconfig is not None:
        environment["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [sys.executable, "-m", "gpuforge", *args],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
    )


def test_help_lists_every_subcommand() -> None:
    result = gpuforge("--help")
    assert result.returncode == 0
    for name in ("dev", "operator", "webhook", "status", "plan", "quota", "demo"):
        assert f"  {name} " in result.stdout
    for args in (
        ["dev", "cluster", "--help"],
        ["operator", "run", "--help"],
        ["webhook", "run", "--help"],
        ["quota", "tree", "--help"],
        ["status", "--help"],
        ["plan", "--help"],
        ["demo", "--help"],
    ):
        assert gpuforge(*args).returncode == 0, args


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_shell_completion_scripts(shell: str) -> None:
    result = gpuforge(env={"_GPUFORGE_COMPLETE": f"{shell}_source"})
    assert result.returncode == 0
    assert "gpuforge" in result.stdout


def test_usage_errors_exit_2() -> None:
    assert gpuforge("dev", "cluster", "up", "--api-profile", "1.20").returncode == 2
    assert gpuforge("status", "--output", "xml").returncode == 2


@pytest.mark.cluster
def test_dev_cluster_status_and_kubeconfig(dev_cluster: DevCluster) -> None:
    env = {"GPUFORGE_STATE": str(dev_cluster.state_dir.parent)}
    status = gpuforge("dev", "cluster", "status", "--name", dev_cluster.name, "-o", "json", env=env)
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert document["servedResourceVersions"] == ["v1"]
    assert {c["name"] for c in document["components"]} >= {"etcd", "kube-apiserver", "kwok", "gpu-agent"}
    path = gpuforge("dev", "cluster", "kubeconfig", "--name", dev_cluster.name, env=env)
    assert path.stdout.strip() == str(dev_cluster.kubeconfig)
    missing = gpuforge("dev", "cluster", "kubeconfig", "--name", "no-such-cluster", env=env)
    assert missing.returncode == 3


@pytest.mark.cluster
def test_status_plan_and_quota_tree_on_the_cluster(dev_cluster: DevCluster) -> None:
    deploy = REPO / "operator" / "deploy" / "crds"
    dev_cluster.kubectl("apply", "--server-side", "-f", str(deploy))
    dev_cluster.kubectl(
        "wait", "--for=condition=Established", "crd/gpustacks.gpuforge.io", "crd/gpuquotas.gpuforge.io"
    )
    # The cluster these tests share may still be settling from an earlier test: the two outputs must agree
    # once it holds still between the two calls.
    for _ in range(5):
        status = gpuforge("status", "-o", "json", kubeconfig=dev_cluster.kubeconfig)
        assert status.returncode == 0, status.stderr
        rows: Any = json.loads(status.stdout)
        assert isinstance(rows, (list, dict))
        as_yaml = gpuforge("status", "-o", "yaml", kubeconfig=dev_cluster.kubeconfig)
        assert as_yaml.returncode == 0, as_yaml.stderr
        if yaml.safe_load(as_yaml.stdout) == rows:
            break
        time.sleep(2)
    else:
        raise AssertionError(f"status -o yaml never matched -o json:\n{as_yaml.stdout}\n{status.stdout}")
    table = gpuforge("status", kubeconfig=dev_cluster.kubeconfig)
    assert table.returncode == 0
    tree = gpuforge("quota", "tree", "-o", "json", kubeconfig=dev_cluster.kubeconfig)
    assert tree.returncode == 0, tree.stderr
    assert isinstance(json.loads(tree.stdout), list)
    plan = gpuforge("plan", "-o", "json", kubeconfig=dev_cluster.kubeconfig)
    # No GpuStack need exist in the session cluster: plan says so, without a traceback.
    assert "Traceback" not in plan.stderr


@pytest.mark.cluster
def test_status_without_the_crd_says_so(cluster_factory: Any) -> None:
    bare = cluster_factory(profile="1.36", nodes=1)
    for command in (["status"], ["plan"]):
        result = gpuforge(*command, kubeconfig=bare.kubeconfig)
        assert result.returncode == 3, result.stderr
        assert "CRD is not installed" in result.stderr
        assert "Traceback" not in result.stderr
    bare.down()
