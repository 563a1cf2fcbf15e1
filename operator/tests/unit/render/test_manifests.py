"""Rendered manifests: golden files per scenario, plus the properties every object must have."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge import compat
from gpuforge.api.convert import from_dict
from gpuforge.api.gpustack import GpuStack, GpuStackSpec, Mode
from gpuforge.constants import (
    COMPONENT_LABEL,
    DEPLOY_DEVICE_PLUGIN_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    MANAGED_BY_LABEL,
    STACK_LABEL,
)
from gpuforge.render.manifests import RenderInput, held_elsewhere, object_key, render

GOLDEN = Path(__file__).parents[2] / "golden" / "render"
DP, DRA = Mode.DEVICE_PLUGIN, Mode.DRA

CASES: dict[str, tuple[dict[str, Any], frozenset[Mode], str | None]] = {
    "device-plugin-defaults": ({}, frozenset({DP}), None),
    "device-plugin-time-slicing": (
        {
            "devicePlugin": {
                "version": "v0.17.4",
                "image": "registry.example.com/nvidia/k8s-device-plugin",
                "migStrategy": "mixed",
                "config": {"sharing": {"timeSlicing": {"replicas": 4, "renameByDefault": True}}},
            },
            "namespace": "gpu-a100",
            "imagePullSecrets": ["registry-creds"],
            "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
            "priorityClassName": "gpu-critical",
        },
        frozenset({DP}),
        None,
    ),
    "dra-v1": ({"mode": "dra"}, frozenset({DRA}), "v1"),
    "dra-v1beta2": ({"mode": "dra", "dra": {"version": "v25.12.0"}}, frozenset({DRA}), "v1beta2"),
    "dra-v1beta1-old-release": ({"mode": "dra", "dra": {"version": "v25.3.2"}}, frozenset({DRA}), "v1beta1"),
    "dra-compute-domains-mig": (
        {
            "mode": "dra",
            "dra": {
                "computeDomains": True,
                "deviceClasses": ["gpu.nvidia.com", "mig.nvidia.com"],
                "extendedResourceMapping": False,
            },
        },
        frozenset({DRA}),
        "v1",
    ),
    "switching-device-plugin-to-dra": ({"mode": "dra"}, frozenset({DP, DRA}), "v1"),
    # v25.3.x: no ComputeDomainClique API, no health server, the host's /dev for the compute-domain plugin
    "dra-compute-domains-openshift-v25-3": (
        {"mode": "dra", "dra": {"version": "v25.3.2", "computeDomains": True}},
        frozenset({DRA}),
        "v1beta1",
    ),
    "device-plugin-openshift": ({}, frozenset({DP}), None),
    # PassthroughSupport and the host root, /sys and /proc mounts of NVIDIA's chart
    "dra-vfio-passthrough": (
        {"mode": "dra", "dra": {"deviceClasses": ["gpu.nvidia.com", "vfio.gpu.nvidia.com"]}},
        frozenset({DRA}),
        "v1",
    ),
}
# Cases rendered for a cluster that serves security.openshift.io.
OPENSHIFT_CASES = {"dra-compute-domains-openshift-v25-3", "device-plugin-openshift"}


def _render(name: str) -> list[dict[str, Any]]:
    spec, operands, api = CASES[name]
    stack = GpuStack("a100", from_dict(GpuStackSpec, spec, "spec"))
    return render(RenderInput(stack, operands, api, compat.load(), openshift_scc=name in OPENSHIFT_CASES))


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str, update_golden: bool) -> None:
    text = yaml.safe_dump_all(_render(case), sort_keys=False, width=110)
    path = GOLDEN / f"{case}.yaml"
    if update_golden:
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run pytest with --update-golden"
    assert text == path.read_text(), f"{path} differs; review and run pytest with --update-golden"


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_object_and_pod_is_labelled(case: str) -> None:
    for obj in _render(case):
        labels = obj["metadata"]["labels"]
        assert labels[MANAGED_BY_LABEL] == "gpuforge"
        assert labels[STACK_LABEL] == "a100"
        assert COMPONENT_LABEL in labels
        template = obj.get("spec", {}).get("template")
        if template is not None:
            pod_labels = template["metadata"]["labels"]
            assert pod_labels[COMPONENT_LABEL] == labels[COMPONENT_LABEL]
            assert pod_labels[STACK_LABEL] == "a100"
            assert obj["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


@pytest.mark.parametrize(
    ("case", "label"),
    [("device-plugin-defaults", DEPLOY_DEVICE_PLUGIN_LABEL), ("dra-v1", DEPLOY_DRA_KUBELET_PLUGIN_LABEL)],
)
def test_plugin_daemonsets_are_gated_per_node_and_replaced_on_delete(case: str, label: str) -> None:
    (daemonset,) = [o for o in _render(case) if o["kind"] == "DaemonSet"]
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {label: "true", STACK_LABEL: "a100"}


@pytest.mark.parametrize(
    ("case", "api_version", "extended"),
    [
        ("dra-v1", "resource.k8s.io/v1", "nvidia.com/gpu"),
        ("dra-v1beta2", "resource.k8s.io/v1beta2", None),
        ("dra-v1beta1-old-release", "resource.k8s.io/v1beta1", None),
    ],
)
def test_device_classes_in_the_chosen_version(case: str, api_version: str, extended: str | None) -> None:
    (device_class,) = [o for o in _render(case) if o["kind"] == "DeviceClass"]
    assert device_class["apiVersion"] == api_version
    assert device_class["spec"].get("extendedResourceName") == extended


def test_admission_policy_only_where_the_release_ships_one() -> None:
    from dataclasses import replace

    facts = compat.load()
    releases = tuple(replace(r, admission_policy=False) for r in facts.dra_releases)
    without = replace(facts, dra_releases=releases)
    stack = GpuStack("a100", GpuStackSpec(mode=DRA))

    def kinds(data: compat.Compat) -> set[str]:
        return {o["kind"] for o in render(RenderInput(stack, frozenset({DRA}), "v1", data))}

    assert "ValidatingAdmissionPolicy" in kinds(facts)
    assert "ValidatingAdmissionPolicy" not in kinds(without)


def test_no_device_classes_without_a_served_api() -> None:
    stack = GpuStack("a", GpuStackSpec(mode=DRA))
    objects = render(RenderInput(stack, frozenset({DRA}), None, compat.load()))
    assert "DeviceClass" not in {o["kind"] for o in objects}


def test_older_stack_holds_shared_objects() -> None:
    old = GpuStack("old", GpuStackSpec(mode=DRA), creation_timestamp="2026-01-01T00:00:00Z")
    new = GpuStack("new", GpuStackSpec(mode=DRA), creation_timestamp="2026-02-01T00:00:00Z")
    c = compat.load()
    objects = {s.name: render(RenderInput(s, frozenset({DRA}), "v1", c)) for s in (old, new)}
    shared = held_elsewhere(new, objects["new"], [(old, objects["old"])])
    assert shared == {
        ("", "Namespace", "", "gpuforge-operands"),
        ("resource.k8s.io", "DeviceClass", "", "gpu.nvidia.com"),
    }
    assert held_elsewhere(old, objects["old"], [(new, objects["new"])]) == set()
    assert object_key(objects["new"][0]) == ("", "Namespace", "", "gpuforge-operands")


def test_pinned_release_gets_its_own_daemonset() -> None:
    """A node rolled back to v0.17.0 (deploy label value "v0.17.0") keeps a DaemonSet of that release,
    whose selector never overlaps the main DaemonSet's pods."""
    stack = GpuStack("s", from_dict(GpuStackSpec, {"devicePlugin": {"version": "v0.18.0"}}))
    objects = render(RenderInput(stack, frozenset({DP}), None, compat.load(), frozenset({(DP, "v0.17.0")})))
    daemonsets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "DaemonSet"}
    assert set(daemonsets) == {"s-device-plugin", "s-device-plugin-v0-17-0"}
    pinned = daemonsets["s-device-plugin-v0-17-0"]["spec"]
    assert pinned["template"]["spec"]["nodeSelector"]["gpuforge.io/deploy.device-plugin"] == "v0.17.0"
    assert pinned["template"]["spec"]["containers"][0]["image"].endswith(":v0.17.0")
    assert pinned["selector"]["matchLabels"]["gpuforge.io/pinned"] == "v0.17.0"
    assert pinned["template"]["metadata"]["labels"]["app.kubernetes.io/version"] == "v0.17.0"
    main = daemonsets["s-device-plugin"]["spec"]
    assert main["template"]["spec"]["nodeSelector"]["gpuforge.io/deploy.device-plugin"] == "true"
    assert main["template"]["metadata"]["labels"]["app.kubernetes.io/version"] == "v0.18.0"


# --- ComputeDomains ---------------------------------------------------------------------------------
CD_CLASSES = {"compute-domain-daemon.nvidia.com", "compute-domain-default-channel.nvidia.com"}


def _dra(version: str, compute_domains: bool, api: str | None = "v1", openshift: bool = False) -> list[Any]:
    spec = {"mode": "dra", "dra": {"version": version, "computeDomains": compute_domains}}
    stack = GpuStack("cd", from_dict(GpuStackSpec, spec, "spec"))
    return render(RenderInput(stack, frozenset({DRA}), api, compat.load(), openshift_scc=openshift))


def _named(objects: list[Any], kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in objects if o["kind"] == kind}


@pytest.mark.parametrize(
    ("version", "crds"),
    [
        ("v25.3.2", {"computedomains.resource.nvidia.com"}),
        ("v25.8.0", {"computedomains.resource.nvidia.com"}),
        ("v25.12.0", {"computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"}),
        ("v0.4.1", {"computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"}),
    ],
)
def test_compute_domains_bring_the_release_crds_classes_plugin_and_daemon_rbac(
    version: str, crds: set[str]
) -> None:
    objects = _dra(version, True)
    assert _named(objects, "CustomResourceDefinition") == crds
    assert _named(objects, "DeviceClass") >= CD_CLASSES
    assert "compute-domain-daemon-service-account" in _named(objects, "ServiceAccount")
    assert "gpuforge:cd:compute-domain-daemon" in _named(objects, "ClusterRoleBinding")
    plugin = next(o for o in objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert [c["name"] for c in plugin["containers"]] == ["gpus", "compute-domains"]
    assert _named(objects, "Deployment") == {"cd-dra-controller"}


@pytest.mark.parametrize("api", ["v1", "v1beta2", "v1beta1"])
def test_compute_domain_device_classes_in_every_served_version(api: str) -> None:
    classes = [o for o in _dra("v25.12.0", True, api) if o["metadata"]["name"] in CD_CLASSES]
    assert {c["apiVersion"] for c in classes} == {f"resource.k8s.io/{api}"}
    assert all("extendedResourceName" not in c["spec"] for c in classes)


def test_no_compute_domain_objects_when_off() -> None:
    objects = _dra("v25.12.0", False)
    assert not _named(objects, "CustomResourceDefinition")
    assert not CD_CLASSES & _named(objects, "DeviceClass")
    assert not _named(objects, "Deployment")
    plugin = next(o for o in objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert [c["name"] for c in plugin["containers"]] == ["gpus"]


@pytest.mark.parametrize(
    ("compute_domains", "bound"),
    [
        (False, {("cd-dra-kubelet-plugin", "privileged")}),
        (
            True,
            {("cd-dra-kubelet-plugin", "privileged"), ("compute-domain-daemon-service-account", "anyuid")},
        ),
    ],
)
def test_openshift_binds_the_charts_scc(compute_domains: bool, bound: set[tuple[str, str]]) -> None:
    objects = _dra("v25.12.0", compute_domains, openshift=True)
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    got = set()
    for binding in (o for o in objects if o["kind"] == "ClusterRoleBinding"):
        rules = roles[binding["roleRef"]["name"]]["rules"]
        for rule in rules:
            if "securitycontextconstraints" in rule["resources"]:
                assert rule["verbs"] == ["use"] and rule["apiGroups"] == ["security.openshift.io"]
                got |= {(binding["subjects"][0]["name"], name) for name in rule["resourceNames"]}
    assert got == bound


def test_no_scc_objects_without_the_openshift_api() -> None:
    objects = _dra("v25.12.0", True)
    rules = [r for o in objects if o["kind"] in ("ClusterRole", "Role") for r in o["rules"]]
    assert not any("securitycontextconstraints" in r["resources"] for r in rules)


def test_openshift_gives_the_device_plugin_its_own_service_account_allowed_privileged() -> None:
    stack = GpuStack("dp", GpuStackSpec())
    objects = render(RenderInput(stack, frozenset({DP}), None, compat.load(), openshift_scc=True))
    pod = next(o for o in objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "dp-device-plugin"
    assert "dp-device-plugin" in _named(objects, "ServiceAccount")
    role = next(o for o in objects if o["kind"] == "ClusterRole")
    assert role["rules"][0]["resourceNames"] == ["privileged"]
    plain = render(RenderInput(stack, frozenset({DP}), None, compat.load()))
    plain_pod = next(o for o in plain if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert "serviceAccountName" not in plain_pod
    assert not _named(plain, "ClusterRole")


def _gpus_container(version: str, classes: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = {"mode": "dra", "dra": {"version": version, "deviceClasses": classes}}
    stack = GpuStack("a100", from_dict(GpuStackSpec, spec, "spec"))
    objects = render(RenderInput(stack, frozenset({DRA}), "v1", compat.load()))
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    return pod, next(c for c in pod["containers"] if c["name"] == "gpus")


VFIO = "vfio.gpu.nvidia.com"


@pytest.mark.parametrize(
    ("version", "classes", "gated"),
    [
        ("v25.12.0", ["gpu.nvidia.com", VFIO], True),
        ("v0.4.0", [VFIO], True),
        ("v25.12.0", ["gpu.nvidia.com"], False),
        ("v0.4.0", ["gpu.nvidia.com", "mig.nvidia.com"], False),
    ],
)
def test_vfio_class_turns_on_passthrough_with_the_charts_mounts(
    version: str, classes: list[str], gated: bool
) -> None:
    pod, gpus = _gpus_container(version, classes)
    env = {e["name"]: e.get("value") for e in gpus["env"]}
    mounts = {m["name"]: m for m in gpus["volumeMounts"]}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    if not gated:
        assert "FEATURE_GATES" not in env
        assert not {"host-root", "sysfs", "procfs"} & (mounts.keys() | host_paths.keys())
        return
    assert env["FEATURE_GATES"] == "PassthroughSupport=true,"
    assert {k: host_paths[k] for k in ("host-root", "sysfs", "procfs")} == {
        "host-root": "/",
        "sysfs": "/sys/",
        "procfs": "/proc/",
    }
    assert mounts["host-root"] == {
        "name": "host-root",
        "mountPath": "/host-root",
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }
    assert mounts["sysfs"]["mountPropagation"] == mounts["procfs"]["mountPropagation"] == "Bidirectional"
    assert gpus["securityContext"]["privileged"] is True
