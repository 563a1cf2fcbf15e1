"""ComputeDomains and OpenShift SCC bindings on the local control plane, with the operator running as its
own ServiceAccount bound to the shipped RBAC (operator/deploy/rbac.yaml): a permission it lacks to apply or
prune the CRDs, Roles or SCC bindings fails these tests."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from gpuforge.constants import COMPONENT_LABEL
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

from ..operator_process import Operator, kube_json, operator_factory, stack_status, wait_for

__all__ = ["operator_factory"]

pytestmark = pytest.mark.cluster

POOLS = (Pool(name="gb200", count=2, gpu=GpuSpec()),)
NAMESPACE = "gpuforge-cd"
CRDS = ("computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com")
CD_CLASSES = ("compute-domain-daemon.nvidia.com", "compute-domain-default-channel.nvidia.com")
# OpenShift's SecurityContextConstraints API, served here by a CRD of the same group and kind: discovery
# then answers for security.openshift.io as it does on OpenShift.
SCC_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: securitycontextconstraints.security.openshift.io}
spec:
  group: security.openshift.io
  names:
    kind: SecurityContextConstraints
    plural: securitycontextconstraints
    singular: securitycontextconstraints
  scope: Cluster
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
"""


@pytest.fixture(scope="module")
def cd_cluster(cluster_factory: Callable[..., Any]) -> Any:
    return cluster_factory(profile="1.36", pools=POOLS, name="computedomains")


@pytest.fixture(scope="module")
def operator(cd_cluster: Any, operator_factory: Callable[[Any], Operator]) -> Operator:
    return operator_factory(cd_cluster)


def _apply_stack(cluster: Any, name: str, compute_domains: bool) -> None:
    stack = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": name},
        "spec": {"mode": "dra", "dra": {"computeDomains": compute_domains}, "namespace": NAMESPACE},
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(stack))


def _exists(cluster: Any, *what: str) -> bool:
    return bool(cluster.kubectl("get", *what, check=False).returncode == 0)


@pytest.fixture
def stack(cd_cluster: Any, operator: Operator) -> Iterator[str]:
    yield "domains"
    cd_cluster.kubectl("delete", "gpustack", "domains", "--wait=false", "--ignore-not-found")
    wait_for(
        "GpuStack domains to be gone", lambda: not _exists(cd_cluster, "gpustack", "domains"), timeout=120
    )


def _ready(cluster: Any, name: str) -> bool:
    return stack_status(cluster, name).get("phase") == "Ready"


def _pods_running(cluster: Any, component: str) -> list[dict[str, Any]]:
    pods = kube_json(cluster, "pods", "-n", NAMESPACE, "-l", f"{COMPONENT_LABEL}={component}")["items"]
    return [p for p in pods if p.get("status", {}).get("phase") == "Running"]


def test_compute_domains_install_and_leave_with_the_switch(cd_cluster: Any, stack: str) -> None:
    cluster = cd_cluster
    _apply_stack(cluster, stack, compute_domains=True)
    wait_for(f"GpuStack {stack} Ready", lambda: _ready(cluster, stack), timeout=180)
    for crd in CRDS:
        established = kube_json(cluster, "crd", crd)["status"]["conditions"]
        assert any(c["type"] == "Established" and c["status"] == "True" for c in established)
    for device_class in CD_CLASSES:
        assert _exists(cluster, "--raw", f"/apis/resource.k8s.io/v1/deviceclasses/{device_class}")
    # The simulated agent starts both plugin containers and the controller only if their releases would.
    plugins = wait_for(
        "the kubelet plugin pods running",
        lambda: p if len(p := _pods_running(cluster, "dra-kubelet-plugin")) == 2 else None,
    )
    assert {c["name"] for c in plugins[0]["spec"]["containers"]} == {"gpus", "compute-domains"}
    wait_for("the ComputeDomain controller running", lambda: _pods_running(cluster, "dra-controller"))
    # The API exists: a ComputeDomain can be created in a user namespace.
    cluster.kubectl("create", "namespace", "cd-user", check=False)
    domain = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "nvl72", "namespace": "cd-user"},
        "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "nvl72-channel"}}},
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(domain))

    _apply_stack(cluster, stack, compute_domains=False)
    wait_for(
        "the ComputeDomain CRDs and DeviceClasses to be pruned",
        lambda: (
            not any(_exists(cluster, "crd", crd) for crd in CRDS)
            and not any(_exists(cluster, "deviceclass", c) for c in CD_CLASSES)
        ),
        timeout=120,
    )
    assert not _exists(cluster, "deploy", "-n", NAMESPACE, f"{stack}-dra-controller")
    assert not _exists(cluster, "sa", "-n", NAMESPACE, "compute-domain-daemon-service-account")
    assert _exists(cluster, "deviceclass", "gpu.nvidia.com")  # the GPUs stay served
    cluster.kubectl("delete", "namespace", "cd-user", "--wait=false")


def _scc_bindings(cluster: Any, stack: str) -> dict[str, list[str]]:
    """Subject ServiceAccount -> SCC names it may use, from the stack's ClusterRoleBindings."""
    selector = f"gpuforge.io/stack={stack}"
    roles = {r["metadata"]["name"]: r for r in kube_json(cluster, "clusterroles", "-l", selector)["items"]}
    out: dict[str, list[str]] = {}
    for binding in kube_json(cluster, "clusterrolebindings", "-l", selector)["items"]:
        role = roles.get(binding["roleRef"]["name"], {})
        for rule in role.get("rules", []):
            if "securitycontextconstraints" in rule["resources"]:
                out.setdefault(binding["subjects"][0]["name"], []).extend(rule["resourceNames"])
    return out


def test_openshift_scc_bindings_follow_the_served_api(cd_cluster: Any, stack: str) -> None:
    cluster = cd_cluster
    _apply_stack(cluster, stack, compute_domains=True)
    wait_for(f"GpuStack {stack} Ready", lambda: _ready(cluster, stack), timeout=180)
    assert _scc_bindings(cluster, stack) == {}

    cluster.kubectl("apply", "-f", "-", input=SCC_CRD)
    try:
        expected = {
            f"{stack}-dra-kubelet-plugin": ["privileged"],
            "compute-domain-daemon-service-account": ["anyuid"],
        }
        # the next level-based pass sees the group in discovery (idle resync: 30 s)
        wait_for("the SCC bindings", lambda: _scc_bindings(cluster, stack) == expected, timeout=120)
        # The device plugin runs as its own ServiceAccount there, allowed the privileged SCC.
        switched = {"spec": {"mode": "devicePlugin"}}
        cluster.kubectl("patch", "gpustack", stack, "--type=merge", "-p", json.dumps(switched))
        wait_for(
            "the device plugin's SCC binding",
            lambda: _scc_bindings(cluster, stack).get(f"{stack}-device-plugin") == ["privileged"],
            timeout=180,
        )
        plugin = kube_json(cluster, "ds", "-n", NAMESPACE, f"{stack}-device-plugin")
        assert plugin["spec"]["template"]["spec"]["serviceAccountName"] == f"{stack}-device-plugin"
    finally:
        cluster.kubectl("delete", "crd", "securitycontextconstraints.security.openshift.io", "--wait=true")
    wait_for("the SCC bindings pruned", lambda: _scc_bindings(cluster, stack) == {}, timeout=120)
