"""The GpuStack operator's "Done when" list, on the real local control plane with simulated GPU nodes.

The operator runs as a subprocess (`gpuforge operator run`) with the credentials of its own
ServiceAccount (a token from the TokenRequest API), bound to exactly the shipped ClusterRole
(operator/deploy/rbac.yaml): a missing permission makes these tests fail, and the last test fails when a
shipped permission was never used.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.constants import (
    COMPONENT_LABEL,
    DEPLOY_DEVICE_PLUGIN_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    STACK_LABEL,
)
from gpuforge_lab.devcluster.pools import GpuSpec, Pool, Taint

# The operator-process plumbing lives in tests/integration/operator_process.py; its names stay importable
# from here (OperatorProcess, start_operator, service_account_kubeconfig, ...) for older imports.
from ..operator_process import (
    DEPLOY,
    GPUFORGE,
    OPERATOR_DIR,
    Operator,
    OperatorProcess,
    condition,
    free_port,
    kube_json,
    operator_factory,
    running_operator,
    service_account_kubeconfig,
    stack_status,
    start_operator,
    stop_operator,
    wait_for,
)

__all__ = [
    "DEPLOY",
    "GPUFORGE",
    "OPERATOR_DIR",
    "Operator",
    "OperatorProcess",
    "condition",
    "free_port",
    "kube_json",
    "operator_factory",
    "service_account_kubeconfig",
    "stack_status",
    "start_operator",
    "stop_operator",
    "wait_for",
]

EXAMPLES = OPERATOR_DIR.parent / "examples"

# Small, mixed cluster: 5 GPU nodes in three pools (one tainted, one on an older kubelet) and a CPU node.
POOLS = (
    Pool(
        name="h100",
        count=2,
        gpu=GpuSpec(product="NVIDIA H100 80GB HBM3", memory_mib=81559),
        kubelet_version="v1.34.2",
    ),
    Pool(name="a100", count=2, gpu=GpuSpec()),
    Pool(
        name="l4",
        count=1,
        gpu=GpuSpec(product="NVIDIA L4", count=1, memory_mib=23034, mig_capable=False),
        taints=(Taint(key="nvidia.com/gpu", effect="NoSchedule"),),
    ),
    Pool(name="cpu", count=1, gpu=None),
)
GPU_NODES = {f"{p.name}-{i}" for p in POOLS if p.gpu is not None for i in range(p.count)}


@pytest.fixture(scope="module")
def op_cluster(cluster_factory: Callable[..., Any]) -> Any:
    return cluster_factory(profile="1.36", pools=POOLS, name="operator")


@pytest.fixture(scope="module")
def operator(op_cluster: Any, operator_factory: Callable[[Any], Operator]) -> Operator:
    return operator_factory(op_cluster)


pytestmark = pytest.mark.cluster


def apply(cluster: Any, document: str | Path) -> None:
    text = document.read_text() if isinstance(document, Path) else document
    cluster.kubectl("apply", "-f", "-", input=text)


def delete_stack_and_wait(cluster: Any, name: str, timeout: float = 120) -> None:
    cluster.kubectl("delete", "gpustack", name, "--wait=false", "--ignore-not-found")
    wait_for(
        f"GpuStack {name} to be gone",
        lambda: cluster.kubectl("get", "gpustack", name, check=False).returncode != 0,
        timeout=timeout,
    )


def owned_objects(cluster: Any, stack: str) -> list[str]:
    kinds = "namespaces,serviceaccounts,configmaps,daemonsets,deployments,clusterroles,clusterrolebindings"
    kinds += ",validatingadmissionpolicies,validatingadmissionpolicybindings,deviceclasses"
    out = cluster.kubectl("get", kinds, "-A", "-l", f"{STACK_LABEL}={stack}", "-o", "name", check=False)
    return [line for line in out.stdout.split() if line]


def nodes_by_name(cluster: Any) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in kube_json(cluster, "nodes")["items"]}


@pytest.fixture
def stacks(op_cluster: Any, operator: Operator) -> Iterator[list[str]]:
    """Names of GpuStacks a test creates; all are deleted (and their cleanup awaited) afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        delete_stack_and_wait(op_cluster, name)


# --- validation at apply time ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"mode": "magic"}, "spec.mode"),
        ({"devicePlugin": {"version": "0.17"}}, "spec.devicePlugin.version"),
        ({"dra": {"version": "latest"}}, "spec.dra.version"),
        ({"nodeSelector": {"nodeSelectorTerms": []}}, "spec.nodeSelector.nodeSelectorTerms"),
        (
            {"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": []}]}},
            "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions",
        ),
        ({"upgradePolicy": {"maxUnavailable": "110%"}}, "spec.upgradePolicy.maxUnavailable"),
        # NVIDIA's device plugin refuses a time-slicing config with fewer than 2 replicas.
        (
            {"devicePlugin": {"config": {"sharing": {"timeSlicing": {"replicas": 1}}}}},
            "spec.devicePlugin.config.sharing.timeSlicing.replicas",
        ),
        ({"driverRoot": "run/nvidia/driver"}, "spec.driverRoot"),
        ({"devicePlugin": {"runtimeClassName": "Nvidia"}}, "spec.devicePlugin.runtimeClassName"),
    ],
)
def test_invalid_gpustack_is_rejected_naming_the_field(
    op_cluster: Any, spec: dict[str, Any], field: str
) -> None:
    cluster = op_cluster
    cluster.kubectl("apply", "--server-side", "-f", str(DEPLOY / "crds" / "gpustacks.gpuforge.io.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/gpustacks.gpuforge.io", "--timeout=60s")
    body = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": "bad"},
        "spec": spec,
    }
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode != 0
    assert field in result.stderr, result.stderr
    assert cluster.kubectl("get", "gpustack", "bad", check=False).returncode != 0


# --- device plugin -----------------------------------------------------------------------------------------
def test_device_plugin_example(op_cluster: Any, stacks: list[str]) -> None:
    cluster = op_cluster
    stacks.append("gpus")
    apply(cluster, EXAMPLES / "gpustack-device-plugin.yaml")

    status = wait_for(
        "GpuStack gpus Ready", lambda: (s := stack_status(cluster, "gpus")).get("phase") == "Ready" and s
    )
    assert status["nodesReady"] == f"{len(GPU_NODES)}/{len(GPU_NODES)}"
    assert status["nodes"]["total"] == len(GPU_NODES) and status["nodes"]["ready"] == len(GPU_NODES)
    assert condition(status, "Ready")["status"] == "True"
    assert status["operands"]["devicePlugin"] == "v0.20.0" and status["version"] == "v0.20.0"

    pods = kube_json(cluster, "pods", "-A", "-l", f"{COMPONENT_LABEL}=device-plugin,{STACK_LABEL}=gpus")[
        "items"
    ]
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(
        GPU_NODES
    )  # one per GPU node, none elsewhere
    nodes = nodes_by_name(cluster)
    for name in GPU_NODES:
        assert int(nodes[name]["status"]["capacity"].get("nvidia.com/gpu", 0)) > 0, name
    assert "nvidia.com/gpu" not in nodes["cpu-0"]["status"]["capacity"]

    # Drift: a deleted DaemonSet comes back.
    cluster.kubectl("delete", "daemonset", "-n", "gpuforge-operands", "gpus-device-plugin")
    wait_for(
        "the DaemonSet to be re-created",
        lambda: (
            cluster.kubectl(
                "get", "ds", "-n", "gpuforge-operands", "gpus-device-plugin", check=False
            ).returncode
            == 0
        ),
        timeout=60,
    )

    # Deleting the GpuStack removes everything it made, node labels included.
    delete_stack_and_wait(cluster, "gpus")
    wait_for("owned objects gone", lambda: not owned_objects(cluster, "gpus"))
    for node in nodes_by_name(cluster).values():
        labels = node["metadata"].get("labels", {})
        assert STACK_LABEL not in labels and DEPLOY_DEVICE_PLUGIN_LABEL not in labels


# --- DRA --------------------------------------------------------------------------------------------------
CLAIM_POD = """
apiVersion: resource.k8s.io/{version}
kind: ResourceClaimTemplate
metadata: {{name: one-gpu, namespace: {ns}}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {{deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count: 1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: trainer, namespace: {ns}}}
spec:
  tolerations: [{{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}]
  resourceClaims: [{{name: gpu, resourceClaimTemplateName: one-gpu}}]
  containers:
  - name: main
    image: registry.example/cuda:latest
    resources: {{claims: [{{name: gpu}}]}}
"""


def test_dra_example_on_1_36(op_cluster: Any, stacks: list[str]) -> None:
    cluster = op_cluster
    stacks.append("gpus")
    apply(cluster, EXAMPLES / "gpustack-dra.yaml")
    status = wait_for(
        "GpuStack gpus Ready", lambda: (s := stack_status(cluster, "gpus")).get("phase") == "Ready" and s
    )
    assert status["draApiVersion"] == "resource.k8s.io/v1"
    device_class = json.loads(
        cluster.kubectl("get", "--raw", "/apis/resource.k8s.io/v1/deviceclasses/gpu.nvidia.com").stdout
    )
    assert device_class["metadata"]["labels"][STACK_LABEL] == "gpus"
    slices = kube_json(
        cluster, "resourceslices.v1.resource.k8s.io", "--field-selector=spec.driver=gpu.nvidia.com"
    )
    assert {s["spec"]["nodeName"] for s in slices["items"]} == GPU_NODES
    pods = kube_json(cluster, "pods", "-A", "-l", f"{COMPONENT_LABEL}=dra-kubelet-plugin")["items"]
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(GPU_NODES)

    # A pod with a ResourceClaim is scheduled onto a node with a slice.
    ns = f"t-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", ns)
    apply(cluster, CLAIM_POD.format(version="v1", ns=ns))
    node = wait_for(
        "the claim pod to be scheduled",
        lambda: kube_json(cluster, "pod", "-n", ns, "trainer")["spec"].get("nodeName"),
    )
    assert node in GPU_NODES

    # Deleting the stack while the pod holds its claim keeps the DRA plugin on that node.
    cluster.kubectl("delete", "gpustack", "gpus", "--wait=false")
    wait_for(
        "the other nodes to lose the DRA deploy label",
        lambda: all(
            DEPLOY_DRA_KUBELET_PLUGIN_LABEL not in n["metadata"].get("labels", {})
            for name, n in nodes_by_name(cluster).items()
            if name != node
        ),
    )
    labels = nodes_by_name(cluster)[node]["metadata"]["labels"]
    assert labels.get(DEPLOY_DRA_KUBELET_PLUGIN_LABEL) == "true"
    assert (
        cluster.kubectl(
            "get", "ds", "-n", "gpuforge-operands", "gpus-dra-kubelet-plugin", check=False
        ).returncode
        == 0
    )
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
    delete_stack_and_wait(cluster, "gpus")
    wait_for("owned objects gone", lambda: not owned_objects(cluster, "gpus"))


VFIO_STACK = """
apiVersion: gpuforge.io/v1alpha1
kind: GpuStack
metadata: {{name: passthrough}}
spec:
  mode: dra
  dra: {{version: {version}, deviceClasses: [gpu.nvidia.com, vfio.gpu.nvidia.com]}}
  namespace: gpuforge-operands
"""


def test_vfio_class_needs_a_release_with_passthrough(op_cluster: Any, stacks: list[str]) -> None:
    cluster = op_cluster
    stacks.append("passthrough")
    # v25.8.0 has no PassthroughSupport gate: refused, naming the field and the release.
    apply(cluster, VFIO_STACK.format(version="v25.8.0"))

    def refused() -> dict[str, Any]:
        degraded = condition(stack_status(cluster, "passthrough"), "Degraded")
        return degraded if degraded.get("reason") == "UnsupportedDeviceClass" else {}

    message = wait_for("the vfio class refused on v25.8.0", refused)["message"]
    assert "spec.dra.deviceClasses" in message and "v25.8.0" in message
    assert not kube_json(cluster, "pods", "-A", "-l", f"{COMPONENT_LABEL}=dra-kubelet-plugin")["items"]

    # v25.12.0: the plugin runs with the gate, and the simulated plugin offers each GPU as vfio too.
    apply(cluster, VFIO_STACK.format(version="v25.12.0"))
    wait_for(
        "GpuStack passthrough Ready", lambda: stack_status(cluster, "passthrough").get("phase") == "Ready"
    )
    ds = kube_json(cluster, "ds", "-n", "gpuforge-operands", "passthrough-dra-kubelet-plugin")
    gpus = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "gpus")
    assert {"name": "FEATURE_GATES", "value": "PassthroughSupport=true,"} in gpus["env"]

    def vfio_devices() -> set[str]:
        slices = kube_json(
            cluster, "resourceslices.v1.resource.k8s.io", "--field-selector=spec.driver=gpu.nvidia.com"
        )
        return {
            s["spec"]["nodeName"]
            for s in slices["items"]
            if any(d["attributes"]["type"]["string"] == "vfio" for d in s["spec"]["devices"])
        }

    wait_for("vfio devices on every GPU node", lambda: vfio_devices() == GPU_NODES)
    ns = f"t-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", ns)
    apply(cluster, CLAIM_POD.format(version="v1", ns=ns).replace("gpu.nvidia.com", "vfio.gpu.nvidia.com"))
    node = wait_for(
        "the vfio claim pod to be scheduled",
        lambda: kube_json(cluster, "pod", "-n", ns, "trainer")["spec"].get("nodeName"),
    )
    assert node in GPU_NODES
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
    delete_stack_and_wait(cluster, "passthrough")


# --- overlap ---------------------------------------------------------------------------------------------
def test_younger_stack_is_refused_on_shared_nodes(op_cluster: Any, stacks: list[str]) -> None:
    cluster = op_cluster
    older = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": "a100s"},
        "spec": {
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "nvidia.com/gpu.product",
                                "operator": "In",
                                "values": ["NVIDIA-A100-SXM4-80GB"],
                            }
                        ]
                    }
                ]
            }
        },
    }
    stacks.extend(["a100s", "everything"])
    apply(cluster, yaml.safe_dump(older))
    wait_for("a100s Ready", lambda: stack_status(cluster, "a100s").get("phase") == "Ready")
    younger = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": "everything"},
        "spec": {"namespace": "gpuforge-everything"},
    }
    apply(cluster, yaml.safe_dump(younger))

    def degraded() -> dict[str, Any]:
        status = stack_status(cluster, "everything")
        return status if condition(status, "Degraded").get("reason") == "NodeConflict" else {}

    status = wait_for("everything to report the conflict", degraded)
    message = condition(status, "Degraded")["message"]
    assert "a100s" in message and "a100-0" in message and "a100-1" in message
    assert status["nodes"]["conflict"] == 2
    wait_for(
        "everything to serve the other nodes",
        lambda: stack_status(cluster, "everything")["nodes"]["ready"] == 3,
    )
    nodes = nodes_by_name(cluster)
    assert {n for n, v in nodes.items() if v["metadata"]["labels"].get(STACK_LABEL) == "a100s"} == {
        "a100-0",
        "a100-1",
    }
    events = cluster.kubectl(
        "get", "events", "-n", "default", "--field-selector=involvedObject.name=everything"
    ).stdout
    assert "NodeConflict" in events


# --- RBAC: every shipped permission is used ----------------------------------------------------------
# Requests kopf makes on its own (not counted by gpuforge.k8s): watching and patching GpuStacks.
FRAMEWORK_USES = {("list", "gpustacks"), ("watch", "gpustacks"), ("patch", "gpustacks"), ("create", "events")}
# Server-side apply of an object that does not exist yet is authorised as create as well as patch
# (checked: without create, applying a new namespace fails with 403 "cannot create resource").
APPLY_CREATES = True


def _shipped_rules() -> set[tuple[str, str]]:
    docs = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    return {
        (verb, resource) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]
    }


def _delegated(cluster: Any) -> set[tuple[str, str]]:
    """Permissions the operator grants to operand ServiceAccounts (held so that it may grant them)."""
    from gpuforge import compat
    from gpuforge.api.convert import from_dict
    from gpuforge.api.gpustack import GpuStack, GpuStackSpec, Mode
    from gpuforge.render.manifests import RenderInput, render

    facts = compat.load()
    objects = []
    for release in facts.dra_releases:  # the ComputeDomain rules differ per release; OpenShift adds SCCs
        dra = {"version": release.version, "computeDomains": True}
        spec = from_dict(GpuStackSpec, {"mode": "dra", "dra": dra})
        stack = GpuStack("x", spec)
        objects += render(RenderInput(stack, frozenset({Mode.DRA}), "v1", facts, openshift_scc=True))
    return {
        (verb, resource)
        for o in objects
        if o["kind"] in ("ClusterRole", "Role")
        for rule in o["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_every_shipped_permission_is_used(op_cluster: Any, operator: Operator) -> None:
    """Exercise create, update, prune and delete of every kind, then compare the requests the operator
    made (its metrics) with the shipped ClusterRole."""
    cluster = op_cluster
    stack = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": "rbac"},
        "spec": {
            "mode": "dra",
            "dra": {"computeDomains": True},
            "namespace": "gpuforge-rbac",
            # all nodes at once; the bare test pod below is evicted only with force
            "upgradePolicy": {"maxUnavailable": "100%", "maxParallel": 0, "podDeletion": {"force": True}},
        },
    }
    apply(cluster, yaml.safe_dump(stack))
    wait_for(
        "the ComputeDomain controller Deployment",
        lambda: (
            cluster.kubectl(
                "get", "deploy", "-n", "gpuforge-rbac", "rbac-dra-controller", check=False
            ).returncode
            == 0
        ),
    )
    stack["spec"]["dra"]["computeDomains"] = False  # prunes the Deployment and its RBAC
    apply(cluster, yaml.safe_dump(stack))
    wait_for(
        "the Deployment to be pruned",
        lambda: (
            cluster.kubectl(
                "get", "deploy", "-n", "gpuforge-rbac", "rbac-dra-controller", check=False
            ).returncode
            != 0
        ),
    )
    # A new DRA driver release: the upgrade engine deletes each outdated plugin pod (OnDelete DaemonSet).
    stack["spec"]["dra"]["version"] = "v0.4.1"

    def upgraded() -> bool:
        pods = kube_json(
            cluster, "pods", "-n", "gpuforge-rbac", "-l", f"{COMPONENT_LABEL}=dra-kubelet-plugin"
        )
        images = [p["spec"]["containers"][0]["image"] for p in pods["items"]]
        return len(images) == len(GPU_NODES) and all(i.endswith(":v0.4.1") for i in images)

    apply(cluster, yaml.safe_dump(stack))
    wait_for("the DRA plugin pods at v0.4.1", upgraded)
    # A GPU pod on a DRA node: the switch below evicts it (eviction API) before the node changes stack.
    ns = f"t-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", ns)
    apply(cluster, CLAIM_POD.format(version="v1", ns=ns))
    wait_for(
        "the claim pod to be scheduled",
        lambda: kube_json(cluster, "pod", "-n", ns, "trainer")["spec"].get("nodeName"),
    )
    stack["spec"]["mode"] = "devicePlugin"  # switches every node over; renders the plugin's ConfigMap
    apply(cluster, yaml.safe_dump(stack))

    def switched() -> bool:
        status = stack_status(cluster, "rbac")
        operands = status.get("operands", {})
        return status.get("phase") == "Ready" and "devicePlugin" in operands and "draDriver" not in operands

    wait_for("the switch to the device plugin", switched, timeout=180)
    delete_stack_and_wait(cluster, "rbac")
    cluster.kubectl("delete", "namespace", ns, "--wait=false")

    used = set(FRAMEWORK_USES)
    for line in operator.metrics().splitlines():
        match = re.match(r"gpuforge_api_requests_total\{(.*)\} ([0-9.e+]+)$", line)
        if match and float(match[2]) > 0:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match[1]))
            used.add((labels["verb"], labels["resource"]))
    if APPLY_CREATES:
        used |= {("create", r) for verb, r in set(used) if verb == "patch"}
    unused = _shipped_rules() - used - _delegated(op_cluster)
    assert not unused, f"shipped permissions never used: {sorted(unused)}"


# --- older control planes ------------------------------------------------------------------------------
CLAIM_POD_V1BETA1 = """
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: {{name: one-gpu, namespace: {ns}}}
spec:
  spec:
    devices:
      requests:
      - {{name: gpu, deviceClassName: gpu.nvidia.com}}
---
apiVersion: v1
kind: Pod
metadata: {{name: trainer, namespace: {ns}}}
spec:
  resourceClaims: [{{name: gpu, resourceClaimTemplateName: one-gpu}}]
  containers:
  - name: main
    image: registry.example/cuda:latest
    resources: {{claims: [{{name: gpu}}]}}
"""


@pytest.mark.slow
@pytest.mark.parametrize(("profile", "api_version"), [("1.33", "v1beta2"), ("1.32", "v1beta1")])
def test_dra_on_older_control_planes(
    cluster_factory: Callable[..., Any], tmp_path: Path, profile: str, api_version: str
) -> None:
    """DeviceClasses in the best served version; a 1.31 kubelet is refused by name, the rest is served."""
    pools = (
        Pool(name="new", count=1, gpu=GpuSpec()),
        Pool(name="old", count=1, gpu=GpuSpec(), kubelet_version="v1.31.4"),
    )
    cluster = cluster_factory(profile=profile, pools=pools, name=f"operator-{profile.replace('.', '')}")
    with running_operator(cluster, tmp_path):
        apply(cluster, EXAMPLES / "gpustack-dra.yaml")

        def settled() -> dict[str, Any]:
            status = stack_status(cluster, "gpus")
            return status if status.get("nodes", {}).get("ready") == 1 else {}

        status = wait_for("the DRA stack on the new node", settled, timeout=120)
        assert status["draApiVersion"] == f"resource.k8s.io/{api_version}"
        assert status["nodes"]["refused"] == 1
        degraded = condition(status, "Degraded")
        assert degraded["reason"] == "IncompatibleKubelet" and "old-0" in degraded["message"]
        path = f"/apis/resource.k8s.io/{api_version}/deviceclasses/gpu.nvidia.com"
        assert cluster.kubectl("get", "--raw", path, check=False).returncode == 0
        ns = f"t-{secrets.token_hex(3)}"
        cluster.kubectl("create", "namespace", ns)
        template = CLAIM_POD_V1BETA1 if api_version == "v1beta1" else CLAIM_POD
        apply(cluster, template.format(version=api_version, ns=ns))
        node = wait_for(
            "the claim pod to be scheduled",
            lambda: kube_json(cluster, "pod", "-n", ns, "trainer")["spec"].get("nodeName"),
        )
        assert node == "new-0"
