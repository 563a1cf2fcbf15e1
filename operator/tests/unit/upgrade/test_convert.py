"""Snapshot and policy conversion from plain Kubernetes objects, and label selectors."""

from __future__ import annotations

import pytest
from builders import NOW

from gpuforge.constants import COMPONENT_LABEL, DEPLOY_DEVICE_PLUGIN_LABEL
from gpuforge.upgrade.convert import PolicyError, policy_from_spec, snapshot_from_objects
from gpuforge.upgrade.labelselector import LabelSelector, SelectorError
from gpuforge.upgrade.model import IntOrPercent, Mode, OnFailure, PodRef, Policy

NODE = {
    "metadata": {"name": "gpu-1", "labels": {DEPLOY_DEVICE_PLUGIN_LABEL: "true"}, "annotations": {"a": "b"}},
    "spec": {"unschedulable": True},
    "status": {
        "nodeInfo": {"kubeletVersion": "v1.34.2"},
        "conditions": [{"type": "Ready", "status": "True"}],
        "capacity": {"nvidia.com/gpu": "4", "cpu": "64", "nvidia.com/mig-1g.5gb": "2"},
        "allocatable": {"nvidia.com/gpu": "3"},
    },
}
PLUGIN = {
    "metadata": {
        "name": "dp-abc",
        "namespace": "gpuforge-operands",
        "labels": {COMPONENT_LABEL: "device-plugin", "controller-revision-hash": "h1"},
    },
    "spec": {"nodeName": "gpu-1", "containers": [{"image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}]},
    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}
JOB = {
    "metadata": {
        "name": "train",
        "namespace": "ml",
        "uid": "u1",
        "labels": {"app": "train"},
        "ownerReferences": [{"kind": "Job", "controller": True}],
    },
    "spec": {
        "nodeName": "gpu-1",
        "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    },
    "status": {"phase": "Running"},
}
CLAIMER = {
    "metadata": {"name": "dra-job", "namespace": "ml", "uid": "u2"},
    "spec": {"nodeName": "gpu-1", "containers": [{}]},
    "status": {"phase": "Running"},
}
DONE = {"metadata": {"name": "old"}, "spec": {"nodeName": "gpu-1"}, "status": {"phase": "Succeeded"}}
CLAIM = {
    "status": {
        "allocation": {"devices": {"results": [{"driver": "gpu.nvidia.com", "device": "gpu-0"}]}},
        "reservedFor": [{"resource": "pods", "name": "dra-job", "uid": "u2"}],
    }
}
SLICE = {
    "spec": {
        "nodeName": "gpu-1",
        "driver": "gpu.nvidia.com",
        "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}],
    }
}


def test_snapshot_from_objects() -> None:
    snap = snapshot_from_objects(
        [NODE, {"metadata": {"name": "other"}}],
        [PLUGIN, JOB, CLAIMER, DONE],
        [SLICE, SLICE],
        now=NOW,
        claims=[CLAIM],
        served_resource_versions=["v1", "v1beta1"],
        names={"gpu-1"},
    )
    (node,) = snap.nodes
    assert (node.name, node.kubelet_minor, node.ready, node.unschedulable) == ("gpu-1", 34, True, True)
    assert (node.gpu_capacity, node.gpu_allocatable) == (6, 3)
    assert node.slices == {"gpu.nvidia.com": (2, 4)}
    (plugin,) = node.operands
    assert (plugin.mode, plugin.version, plugin.revision, plugin.ready) == (
        Mode.DEVICE_PLUGIN,
        "v0.17.0",
        "h1",
        True,
    )
    claimer, job = node.pods
    assert job.ref == PodRef("ml", "train") and job.uses_gpu and job.controlled and job.empty_dir
    assert claimer.holds_claim and claimer.uses_gpu and not claimer.controlled
    assert snap.served_resource_versions == {"v1", "v1beta1"}


def test_policy_defaults_and_fields() -> None:
    assert policy_from_spec(None) == Policy()
    policy = policy_from_spec(
        {
            "maxUnavailable": "10%",
            "maxParallel": 0,
            "waitForCompletion": {"podSelector": "app=train", "timeoutSeconds": 60},
            "drain": {"enable": True, "podSelector": {"matchLabels": {"tier": "batch"}}},
            "onFailure": "rollback",
            "maxFailures": 3,
            "stepTimeoutSeconds": 120,
            "stepTimeouts": {"validation": 900},
        }
    )
    assert policy.max_unavailable == IntOrPercent(10, percent=True)
    assert policy.wait_for_completion.pod_selector.matches({"app": "train"})
    assert policy.drain.enable and str(policy.drain.pod_selector) == "tier=batch"
    assert policy.on_failure is OnFailure.ROLLBACK and policy.max_failures == 3
    assert (policy.timeouts.wait_old_gone, policy.timeouts.validation) == (120, 900)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"maxUnavailable": "lots"}, "upgradePolicy.maxUnavailable"),
        ({"maxUnavailable": "150%"}, "upgradePolicy.maxUnavailable"),
        ({"maxParallel": -1}, "upgradePolicy.maxParallel"),
        ({"onFailure": "panic"}, "upgradePolicy.onFailure"),
        ({"drain": {"enable": "yes"}}, "upgradePolicy.drain.enable"),
        ({"waitForCompletion": {"podSelector": "a in ()"}}, "upgradePolicy.waitForCompletion.podSelector"),
        ({"maxUnavialable": 1}, "upgradePolicy.maxUnavialable"),
    ],
)
def test_bad_policy_names_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(PolicyError, match=f"^{field.replace('.', '[.]')}:"):
        policy_from_spec(spec)


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("", {}, True),
        ("app=train", {"app": "train"}, True),
        ("app==train", {"app": "web"}, False),
        ("app!=train", {}, True),
        ("gpu", {"gpu": ""}, True),
        ("!spot", {"spot": "true"}, False),
        ("zone in (a, b),tier notin (web)", {"zone": "b", "tier": "batch"}, True),
        ("zone in (a,b)", {"zone": "c"}, False),
    ],
)
def test_label_selector(selector: str, labels: dict[str, str], matches: bool) -> None:
    parsed = LabelSelector.parse(selector)
    assert parsed.matches(labels) is matches
    assert LabelSelector.parse(str(parsed)) == parsed


@pytest.mark.parametrize("bad", ["a in ()", "=x", "a,,b", "a b"])
def test_bad_selector(bad: str) -> None:
    with pytest.raises(SelectorError):
        LabelSelector.parse(bad)


@pytest.mark.parametrize(
    ("capacity", "gpus"),
    [
        ({"nvidia.com/gpu": "4"}, 4),
        # time slicing with renameByDefault: the plugin advertises only the shared name
        ({"nvidia.com/gpu.shared": "16"}, 16),
        # MIG mixed: only MIG resources, plain and shared
        ({"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb.shared": "4"}, 11),
        ({"nvidia.com/gpus": "2", "example.com/gpu": "1", "cpu": "8"}, 0),
    ],
)
def test_every_resource_the_device_plugin_advertises_counts_as_gpus(
    capacity: dict[str, str], gpus: int
) -> None:
    node = {**NODE, "status": {**NODE["status"], "capacity": capacity, "allocatable": capacity}}
    snapshot = snapshot_from_objects([node], [], now=NOW)
    (gpu_node,) = snapshot.nodes
    assert (gpu_node.gpu_capacity, gpu_node.gpu_allocatable) == (gpus, gpus)
