"""The upgrade engine's promises on the real local control plane: ordered migrations and upgrades of 30
simulated GPU nodes with GPU workloads running, checked at every sampled moment.

The tests of this module run in order on one cluster and one GpuStack (`gpus`), each starting where the
previous one left it: device plugin -> DRA -> device plugin; DRA again with the operator killed at random
moments; a DRA driver release that never becomes Ready, rolled back. The operator runs as a subprocess
with its ServiceAccount's credentials (the shipped RBAC).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpuforge.constants import (
    COMPONENT_LABEL,
    DEPLOY_DEVICE_PLUGIN_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    NODE_STATE_LABEL,
)
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

from .helpers import (
    Operator,
    Sampler,
    apply,
    condition,
    kube_json,
    merge_patch_stack,
    sample_nodes,
    stack_status,
    wait_for,
)

pytestmark = pytest.mark.cluster

NODES = 30
MAX_UNAVAILABLE = 3
POOLS = (Pool(name="gpu", count=NODES, gpu=GpuSpec(count=8)),)
NAMES = {f"gpu-{i}" for i in range(NODES)}
CORDONED_BY_SOMEONE_ELSE = "gpu-7"
WORKLOAD_NS = "training"
REPLICAS = 30
STACK: dict[str, Any] = {
    "apiVersion": "gpuforge.io/v1alpha1",
    "kind": "GpuStack",
    "metadata": {"name": "gpus"},
    "spec": {
        "mode": "devicePlugin",
        "upgradePolicy": {
            "maxUnavailable": MAX_UNAVAILABLE,
            "maxParallel": 0,
            "podDeletion": {"timeoutSeconds": 120},
        },
    },
}
ROLLOUT_TIMEOUT = 420


@pytest.fixture(scope="module")
def cluster(cluster_factory: Callable[..., Any]) -> Any:
    return cluster_factory(profile="1.36", pools=POOLS, name="upgrade")


@pytest.fixture(scope="module")
def operator(cluster: Any, operator_factory: Callable[[Any], Operator]) -> Operator:
    return operator_factory(cluster)


def workloads(replicas: int) -> str:
    """A Deployment of pods asking for nvidia.com/gpu, unchanged whichever stack serves the GPUs."""
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "trainers", "namespace": WORKLOAD_NS},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "trainer"}},
                "template": {
                    "metadata": {"labels": {"app": "trainer"}},
                    "spec": {
                        "tolerations": [
                            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                        ],
                        "containers": [
                            {
                                "name": "main",
                                "image": "registry.example/cuda-train:1",
                                "resources": {"limits": {"nvidia.com/gpu": 2}},
                            }
                        ],
                    },
                },
            },
        }
    )


def running_trainers(cluster: Any) -> int:
    pods = kube_json(cluster, "pods", "-n", WORKLOAD_NS, "-l", "app=trainer")["items"]
    return sum(
        1
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    )


def rolled_out(cluster: Any, mode: str) -> dict[str, Any]:
    """Status once every node runs `mode` ("devicePlugin"/"dra") and the upgrade is complete, else {}."""
    status = stack_status(cluster, "gpus")
    if not status.get("upgrade", {}).get("complete") or status.get("phase") != "Ready":
        return {}
    with cluster.api_client() as api_client:
        view = sample_nodes(api_client)
    want, other = (
        (DEPLOY_DRA_KUBELET_PLUGIN_LABEL, DEPLOY_DEVICE_PLUGIN_LABEL)
        if mode == "dra"
        else (DEPLOY_DEVICE_PLUGIN_LABEL, DEPLOY_DRA_KUBELET_PLUGIN_LABEL)
    )
    for name in NAMES:
        node = view[name]
        if node.labels.get(want) != "true" or other in node.labels:
            return {}
        if (mode == "dra" and node.slices != 1) or (mode != "dra" and node.gpus != 8):
            return {}
    return dict(status)


def assert_cordons(cluster: Any) -> None:
    """Only the node someone else cordoned is cordoned; our state label says upgrade-done everywhere."""
    with cluster.api_client() as api_client:
        view = sample_nodes(api_client)
    cordoned = sorted(n for n in NAMES if view[n].unschedulable)
    assert cordoned == [CORDONED_BY_SOMEONE_ELSE]
    assert {view[n].labels.get(NODE_STATE_LABEL) for n in NAMES} == {"upgrade-done"}


def migrate(cluster: Any, mode: str) -> Sampler:
    with Sampler(cluster, NAMES, MAX_UNAVAILABLE, {CORDONED_BY_SOMEONE_ELSE}) as sampler:
        merge_patch_stack(cluster, "gpus", {"spec": {"mode": mode}})
        wait_for(
            f"every node on {mode}", lambda: rolled_out(cluster, mode), timeout=ROLLOUT_TIMEOUT, interval=2
        )
    return sampler


def test_device_plugin_to_dra_and_back_keeps_every_node_serving(cluster: Any, operator: Operator) -> None:
    apply(cluster, STACK)
    wait_for("the device plugin on every node", lambda: rolled_out(cluster, "devicePlugin"), interval=2)
    cluster.kubectl("create", "namespace", WORKLOAD_NS)
    cluster.kubectl("apply", "-f", "-", input=workloads(REPLICAS))
    wait_for("the GPU workloads running", lambda: running_trainers(cluster) == REPLICAS)
    cluster.kubectl("cordon", CORDONED_BY_SOMEONE_ELSE)

    for mode in ("dra", "devicePlugin"):
        started = time.monotonic()
        sampler = migrate(cluster, mode)
        sampler.assert_kept()
        assert cluster.violations() == []
        assert_cordons(cluster)
        wait_for(
            f"the workloads asking for nvidia.com/gpu running again on {mode}",
            lambda: running_trainers(cluster) == REPLICAS,
            timeout=120,
        )
        print(
            f"{mode}: {time.monotonic() - started:.0f}s, {sampler.samples} samples, "
            f"peak out of service {sampler.peak_out_of_service}"
        )

    events = kube_json(cluster, "events", "-n", "default", "--field-selector=involvedObject.kind=Node")
    reasons = {e["reason"] for e in events["items"] if e["source"].get("component") == "gpuforge-operator"}
    assert "UpgradeStep" in reasons
    metrics = operator.metrics()
    assert 'gpuforge_upgrade_transitions_total{from_state="wait-old-gone"' in metrics
    assert 'gpuforge_upgrade_nodes{stack="gpus",state="upgrade-done"} 30.0' in metrics
    reaction_count = (
        r'^gpuforge_upgrade_step_reaction_seconds_count\{stack="gpus",step="upgrade-done"\} (\S+)$'
    )
    reacted = re.search(reaction_count, metrics, re.MULTILINE)
    assert reacted is not None and float(reacted[1]) >= 10  # steps timed from their cause (timers' aside)


def test_operator_killed_during_a_rollout_resumes_and_completes(cluster: Any, operator: Operator) -> None:
    rng = random.Random(5)
    kills = 0
    with Sampler(cluster, NAMES, MAX_UNAVAILABLE, {CORDONED_BY_SOMEONE_ELSE}) as sampler:
        # The operator moves 30 nodes in well under a minute: if a rollout ends before 5 kills, the
        # next one (back and forth, ending on DRA for the tests after this one) is killed too.
        for mode in ("dra", "devicePlugin", "dra"):
            merge_patch_stack(cluster, "gpus", {"spec": {"mode": mode}})
            deadline = time.monotonic() + ROLLOUT_TIMEOUT
            while kills < 5 and time.monotonic() < deadline:
                time.sleep(rng.uniform(0.3, 2.0))
                if rolled_out(cluster, mode):
                    break
                operator.kill()
                kills += 1
                time.sleep(rng.uniform(0.0, 1.0))
                operator.start()
            wait_for(
                f"every node on {mode}",
                lambda mode=mode: rolled_out(cluster, mode),
                timeout=ROLLOUT_TIMEOUT,
                interval=2,
            )
            if kills >= 5 and mode == "dra":
                break
    assert kills >= 5, f"only {kills} kills in three rollouts"
    sampler.assert_kept()
    assert cluster.violations() == []
    assert_cordons(cluster)
    wait_for("the workloads running again", lambda: running_trainers(cluster) == REPLICAS, timeout=120)


def test_a_release_that_never_becomes_ready_is_stopped_and_rolled_back(
    cluster: Any, operator: Operator
) -> None:
    def plugin_pods() -> dict[str, str]:
        pods = kube_json(cluster, "pods", "-A", "-l", f"{COMPONENT_LABEL}=dra-kubelet-plugin")["items"]
        return {p["spec"]["nodeName"]: p["metadata"]["uid"] for p in pods if p["spec"].get("nodeName")}

    if not stack_status(cluster, "gpus"):  # run on its own: start from every node on DRA
        apply(cluster, {**STACK, "spec": {**STACK["spec"], "mode": "dra"}})
    wait_for("every node on DRA", lambda: rolled_out(cluster, "dra"), timeout=ROLLOUT_TIMEOUT, interval=2)
    before = plugin_pods()
    with cluster.api_client() as api_client:
        cordoned = {n for n, node in sample_nodes(api_client).items() if n in NAMES and node.unschedulable}
    merge_patch_stack(
        cluster,
        "gpus",
        {
            "spec": {
                "dra": {"version": "v0.4.1-sim-never-ready"},
                "upgradePolicy": {"onFailure": "rollback", "stepTimeouts": {"validation": 10}},
            }
        },
    )
    with Sampler(cluster, NAMES, MAX_UNAVAILABLE, cordoned) as sampler:

        def settled() -> dict[str, Any]:
            status = stack_status(cluster, "gpus")
            upgrade = status.get("upgrade", {})
            rolled_back = upgrade.get("nodes", {}).get("rolled-back") or 0
            moving = condition(status, "Progressing").get("status") == "True"
            return status if rolled_back and not moving else {}

        status = wait_for("the failed batch to be rolled back", settled, timeout=240, interval=2)
    sampler.assert_kept()
    assert cluster.violations() == []

    failed = sorted(f["node"] for f in status["upgrade"]["failed"])
    assert 1 <= len(failed) <= MAX_UNAVAILABLE, failed  # the first batch only
    degraded = condition(status, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "UpgradeFailed"
    assert all(name in degraded["message"] for name in failed), degraded["message"]
    assert "Halted" in {h["reason"] for h in status["upgrade"]["holds"]}

    with cluster.api_client() as api_client:
        view = sample_nodes(api_client)
    after = plugin_pods()
    for name in failed:  # back on the release it ran, pinned, serving, uncordoned
        assert view[name].labels[DEPLOY_DRA_KUBELET_PLUGIN_LABEL] == "v0.4.0"
        assert view[name].labels[NODE_STATE_LABEL] == "rolled-back"
        # uncordoned, unless someone else had cordoned it (admitted first: it costs no extra unavailability)
        assert view[name].slices == 1 and view[name].unschedulable == (name in cordoned)
    for name in NAMES - set(failed):  # the rest never stopped serving: same plugin pod as before
        assert after.get(name) == before[name], name
        assert view[name].slices == 1
    pods = kube_json(cluster, "pods", "-A", "-l", f"{COMPONENT_LABEL}=dra-kubelet-plugin")["items"]
    images = {
        p["spec"]["nodeName"]: p["spec"]["containers"][0]["image"] for p in pods if p["spec"].get("nodeName")
    }
    assert all(images[name].endswith(":v0.4.0") for name in failed)
