"""gpuforge beside another installation of NVIDIA's plugins, and forward-only upgrades said before they
start, on the real local control plane with simulated GPU nodes and the operator as a subprocess.

Three GPU nodes: one the GPU Operator labels as its own, one whose GPUs another device plugin already
advertises (written into the node status, as kubelet would for a plugin gpuforge did not deploy), and
one left to gpuforge.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from gpuforge.constants import (
    COMPONENT_LABEL,
    DEPLOY_DEVICE_PLUGIN_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    STACK_LABEL,
)
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

from ..operator_process import (
    GPUFORGE,
    Operator,
    condition,
    kube_json,
    operator_factory,
    stack_status,
    wait_for,
)

__all__ = ["operator_factory"]  # the fixture, for this module's tests

pytestmark = pytest.mark.cluster

POOLS = (Pool(name="a100", count=3, gpu=GpuSpec()),)
LABELLED, ADVERTISING, FREE = "a100-0", "a100-1", "a100-2"
GPU_OPERATOR_LABEL = "nvidia.com/gpu.deploy.device-plugin"
OURS = (STACK_LABEL, DEPLOY_DEVICE_PLUGIN_LABEL, DEPLOY_DRA_KUBELET_PLUGIN_LABEL)


@pytest.fixture(scope="module")
def coexist_cluster(cluster_factory: Callable[..., Any]) -> Any:
    return cluster_factory(profile="1.36", pools=POOLS, name="coexist")


@pytest.fixture(scope="module")
def operator(coexist_cluster: Any, operator_factory: Callable[[Any], Operator]) -> Operator:
    return operator_factory(coexist_cluster)


@pytest.fixture
def stacks(coexist_cluster: Any, operator: Operator) -> Iterator[list[str]]:
    """GpuStacks a test creates; deleted (cleanup awaited) afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        coexist_cluster.kubectl("delete", "gpustack", name, "--wait=false", "--ignore-not-found")
        wait_for(
            f"GpuStack {name} to be gone",
            lambda name=name: coexist_cluster.kubectl("get", "gpustack", name, check=False).returncode != 0,
        )


def gpustack(name: str, spec: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {"apiVersion": "gpuforge.io/v1alpha1", "kind": "GpuStack", "metadata": {"name": name}, "spec": spec}
    )


def advertise(cluster: Any, node: str, gpus: int) -> None:
    """What kubelet writes for a device plugin gpuforge did not deploy: capacity and allocatable."""
    body = {
        "status": {"capacity": {"nvidia.com/gpu": str(gpus)}, "allocatable": {"nvidia.com/gpu": str(gpus)}}
    }
    cluster.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(body))


def plugin_nodes(cluster: Any) -> set[str]:
    pods = kube_json(cluster, "pods", "-A", "-l", f"{COMPONENT_LABEL}=device-plugin")["items"]
    return {p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}


def events(cluster: Any, kind: str, name: str, reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind={kind},involvedObject.name={name},reason={reason}"
    items: list[dict[str, Any]] = kube_json(
        cluster, "events", "-n", "default", f"--field-selector={selector}"
    )["items"]
    return items


def gpuforge_plan(cluster: Any, stack: str, *args: str, command: str = "plan") -> str:
    """`gpuforge plan` (or `status`), run as a user runs it."""
    result = subprocess.run(
        [str(GPUFORGE), command, "--stack", stack, f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def passes(operator: Operator, stack: str) -> int:
    return operator.log.read_text(errors="replace").count(f"reconciled GpuStack {stack}:")


def test_nodes_another_installation_serves_are_left_to_it(
    coexist_cluster: Any, operator: Operator, stacks: list[str]
) -> None:
    cluster = coexist_cluster
    cluster.kubectl("label", "node", LABELLED, f"{GPU_OPERATOR_LABEL}=true", "--overwrite")
    advertise(cluster, ADVERTISING, 8)
    stacks.append("coexist")
    cluster.kubectl("apply", "-f", "-", input=gpustack("coexist", {"devicePlugin": {"version": "v0.20.0"}}))

    def ready() -> dict[str, Any]:
        status = stack_status(cluster, "coexist")
        return (
            status
            if condition(status, "Ready").get("status") == "True" and status["nodes"]["ready"] == 1
            else {}
        )

    status = wait_for("coexist Ready on the one free node", ready)
    elsewhere = {e["node"]: e["reason"] for e in status["servedElsewhere"]}
    assert set(elsewhere) == {LABELLED, ADVERTISING}
    assert f"GPU Operator deploys its plugin here ({GPU_OPERATOR_LABEL}=true)" in elsewhere[LABELLED]
    assert elsewhere[ADVERTISING] == "a device plugin gpuforge did not deploy advertises nvidia.com/gpu"
    degraded = condition(status, "Degraded")
    assert degraded["reason"] == "ServedElsewhere"
    assert LABELLED in degraded["message"] and ADVERTISING in degraded["message"]

    # No gpuforge plugin and none of its labels on either; the free node has both.
    wait_for("the plugin on the free node", lambda: plugin_nodes(cluster) == {FREE})
    nodes = {n["metadata"]["name"]: n for n in kube_json(cluster, "nodes")["items"]}
    for name in (LABELLED, ADVERTISING):
        assert not set(OURS) & set(nodes[name]["metadata"].get("labels", {})), name
    assert nodes[FREE]["metadata"]["labels"][STACK_LABEL] == "coexist"
    # The other plugin's advertisement stands; nothing of gpuforge's changed it.
    assert nodes[ADVERTISING]["status"]["allocatable"]["nvidia.com/gpu"] == "8"

    # `gpuforge plan` leaves them out as the operator does, and says why.
    report = yaml.safe_load(gpuforge_plan(cluster, "coexist", "-o", "yaml"))
    assert {e["node"]: e["reason"] for e in report["servedElsewhere"]} == elsewhere
    assert not {s["node"] for s in report["steps"]} & {LABELLED, ADVERTISING}
    # `gpuforge status` (which reads no ResourceSlices) shows the free node served, at its version.
    rows = {
        r["node"]: r
        for r in json.loads(gpuforge_plan(cluster, "coexist", "--nodes", "-o", "json", command="status"))
    }
    assert (rows[FREE]["mode"], rows[FREE]["version"], rows[FREE]["ready"]) == (
        "devicePlugin",
        "v0.20.0",
        True,
    )
    assert all(rows[name]["mode"] == "none" for name in (LABELLED, ADVERTISING) if name in rows)

    # Events name each node and why: on the GpuStack, and on each Node, once.
    stack_events = wait_for(
        "a ServedElsewhere event on the GpuStack naming both nodes",
        lambda: [
            e
            for e in events(cluster, "GpuStack", "coexist", "ServedElsewhere")
            if LABELLED in e["message"] and ADVERTISING in e["message"]
        ],
    )
    for name in (LABELLED, ADVERTISING):
        (event,) = wait_for(
            f"a ServedElsewhere event on node {name}",
            lambda name=name: events(cluster, "Node", name, "ServedElsewhere"),
        )
        assert (
            event["type"] == "Warning" and "GpuStack coexist runs no gpuforge plugin here" in event["message"]
        )
    assert (
        "advertises nvidia.com/gpu" in events(cluster, "Node", ADVERTISING, "ServedElsewhere")[0]["message"]
    )

    # Passes that find the same again post nothing again.
    before = passes(operator, "coexist")
    for round_ in range(2):  # a node change wakes a whole pass
        cluster.kubectl("label", "node", FREE, f"coexist.test/round={round_}", "--overwrite")
        wait_for("another pass", lambda seen=before: passes(operator, "coexist") > seen, timeout=60)
        before = passes(operator, "coexist")
    assert len(events(cluster, "GpuStack", "coexist", "ServedElsewhere")) == len(stack_events)
    for name in (LABELLED, ADVERTISING):
        assert len(events(cluster, "Node", name, "ServedElsewhere")) == 1, name

    # The other installations leave: gpuforge takes the nodes up.
    cluster.kubectl("label", "node", LABELLED, f"{GPU_OPERATOR_LABEL}=false", "--overwrite")
    advertise(cluster, ADVERTISING, 0)
    status = wait_for(
        "coexist serving all three nodes",
        lambda: (s := stack_status(cluster, "coexist")).get("nodes", {}).get("ready") == 3 and s,
    )
    assert status["servedElsewhere"] == [] and condition(status, "Degraded")["status"] == "False"
    assert plugin_nodes(cluster) == {LABELLED, ADVERTISING, FREE}


def test_plan_says_a_forward_only_upgrade_before_it_starts(
    coexist_cluster: Any, operator: Operator, stacks: list[str]
) -> None:
    cluster = coexist_cluster
    stacks.append("dra")
    spec: dict[str, Any] = {
        "mode": "dra",
        "dra": {"version": "v25.12.0"},
        "upgradePolicy": {"onFailure": "rollback"},
    }
    cluster.kubectl("apply", "-f", "-", input=gpustack("dra", spec))
    wait_for(
        "dra Ready on v25.12.0",
        lambda: (s := stack_status(cluster, "dra")).get("phase") == "Ready" and s["nodes"]["ready"] == 3,
        timeout=180,
    )
    # The new release, held back so that nothing moves while the plan is read.
    spec["dra"]["version"] = "v0.4.0"
    spec["upgradePolicy"]["paused"] = True
    cluster.kubectl("apply", "-f", "-", input=gpustack("dra", spec))
    wait_for("the operator to see v0.4.0", lambda: stack_status(cluster, "dra").get("version") == "v0.4.0")

    table = gpuforge_plan(cluster, "dra")
    lines = table.splitlines()
    assert lines[0].startswith("Target dra@v0.4.0")
    assert lines[1].startswith("forward-only dra@v25.12.0 -> dra@v0.4.0 is forward-only"), table
    flat = " ".join(table.split())
    assert "Rollback to v25.12.0 will be refused" in flat and "checkpoint" in flat
    assert all(name in flat for name in (LABELLED, ADVERTISING, FREE))
    report = yaml.safe_load(gpuforge_plan(cluster, "dra", "-o", "yaml"))
    (warning,) = report["forwardOnly"]
    assert warning["from"] == "dra@v25.12.0" and warning["nodes"] == sorted([LABELLED, ADVERTISING, FREE])

    # The GpuStack says it too, before any node moved.
    upgrade = wait_for(
        "status.upgrade.forwardOnly",
        lambda: stack_status(cluster, "dra").get("upgrade", {}).get("forwardOnly"),
    )
    assert upgrade[0]["from"] == "dra@v25.12.0" and upgrade[0]["nodeCount"] == 3
    (event,) = wait_for(
        "a ForwardOnlyUpgrade event", lambda: events(cluster, "GpuStack", "dra", "ForwardOnlyUpgrade")
    )
    assert "Rollback to v25.12.0 will be refused" in event["message"]
    nodes = kube_json(cluster, "nodes")["items"]
    assert all(n["metadata"]["labels"].get(DEPLOY_DRA_KUBELET_PLUGIN_LABEL) == "true" for n in nodes)
    pods = kube_json(cluster, "pods", "-A", "-l", f"{COMPONENT_LABEL}=dra-kubelet-plugin")["items"]
    assert {p["metadata"]["labels"].get("app.kubernetes.io/version") for p in pods} == {"v25.12.0"}
