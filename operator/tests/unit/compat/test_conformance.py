"""The conformance judge: each rule against every release of the operand contract, the renders of today
passing and renders from before the contract failing with the release's own words."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.compat.conformance import (
    DEVICE_TYPE_GPU,
    DEVICE_TYPE_VFIO,
    PASSTHROUGH_GATE,
    NodeRuntime,
    advertised_device_types,
    judge,
)
from gpuforge.compat.operands import (
    COMPONENTS,
    COMPUTE_DOMAIN_CONTAINER,
    DEVICE_PLUGIN,
    DRA_COMPUTE_DOMAIN_PLUGIN,
    DRA_KUBELET_PLUGIN,
    OperandRelease,
    load_operands,
)

CONTRACT = load_operands()
ALL_RELEASES = [CONTRACT.release(c, v) for c in COMPONENTS for v in CONTRACT.versions(c)]
FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parents[2] / "golden" / "render"
PLAIN_NODE = NodeRuntime()
NVIDIA_DEFAULT_NODE = NodeRuntime(nvidia_default_runtime=True)
MIG_NODE = NodeRuntime(mig_enabled=True)


def _ids(release: OperandRelease) -> str:
    return f"{release.component}-{release.version}"


def conforming_pod(release: OperandRelease) -> dict[str, Any]:
    env: list[dict[str, Any]] = [{"name": release.flag_env[f], "value": "x"} for f in release.required_flags]
    container: dict[str, Any] = {"name": "main", "env": env}
    spec: dict[str, Any] = {"runtimeClassName": "nvidia", "containers": [container]}
    if release.nvml_from_driver_root:
        del spec["runtimeClassName"]
        container["volumeMounts"] = [{"name": "driver-root", "mountPath": "/driver-root"}]
        spec["volumes"] = [{"name": "driver-root", "hostPath": {"path": "/"}}]
    return {"metadata": {"name": "p"}, "spec": spec}


@pytest.mark.parametrize("release", ALL_RELEASES, ids=_ids)
def test_a_pod_written_to_the_contract_starts(release: OperandRelease) -> None:
    assert judge(conforming_pod(release), release, PLAIN_NODE, None).ok


@pytest.mark.parametrize("release", [r for r in ALL_RELEASES if r.required_flags], ids=_ids)
def test_each_required_env_var_missing_fails_with_the_flag_name(release: OperandRelease) -> None:
    for flag in release.required_flags:
        pod = conforming_pod(release)
        container = pod["spec"]["containers"][0]
        container["env"] = [e for e in container["env"] if e["name"] != release.flag_env[flag]]
        verdict = judge(pod, release, NVIDIA_DEFAULT_NODE, None)
        assert not verdict.ok
        assert verdict.message == f'Required flag "{flag}" not set'


@pytest.mark.parametrize("release", [r for r in ALL_RELEASES if r.required_flags], ids=_ids)
def test_an_env_var_from_a_field_ref_sets_the_flag(release: OperandRelease) -> None:
    pod = conforming_pod(release)
    for entry in pod["spec"]["containers"][0]["env"]:
        del entry["value"]
        entry["valueFrom"] = {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert judge(pod, release, PLAIN_NODE, None).ok


RUNTIME_NVML = [r for r in ALL_RELEASES if not r.nvml_from_driver_root]
DRIVER_ROOT_NVML = [r for r in ALL_RELEASES if r.nvml_from_driver_root]


def test_the_dra_kubelet_plugins_alone_load_nvml_from_the_driver_root() -> None:
    assert {r.component for r in DRIVER_ROOT_NVML} == {DRA_KUBELET_PLUGIN, DRA_COMPUTE_DOMAIN_PLUGIN}


@pytest.mark.parametrize("release", RUNTIME_NVML, ids=_ids)
@pytest.mark.parametrize(
    ("runtime_class", "node", "starts_when_nvml_needed"),
    [
        ("nvidia", PLAIN_NODE, True),
        (None, NVIDIA_DEFAULT_NODE, True),
        (None, PLAIN_NODE, False),
    ],
)
def test_nvml_needs_the_nvidia_runtime(
    release: OperandRelease, runtime_class: str | None, node: NodeRuntime, starts_when_nvml_needed: bool
) -> None:
    pod = conforming_pod(release)
    if runtime_class is None:
        del pod["spec"]["runtimeClassName"]
    verdict = judge(pod, release, node, None)
    expected = starts_when_nvml_needed or not release.needs_nvml
    assert verdict.ok is expected
    if not expected:
        assert verdict.message == "failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND"


@pytest.mark.parametrize("release", DRIVER_ROOT_NVML, ids=_ids)
@pytest.mark.parametrize("node", [PLAIN_NODE, NVIDIA_DEFAULT_NODE], ids=["runc", "nvidia-default"])
def test_without_the_driver_root_mounted_the_dra_plugin_finds_no_nvml(
    release: OperandRelease, node: NodeRuntime
) -> None:
    pod = conforming_pod(release)
    pod["spec"]["runtimeClassName"] = "nvidia"  # NVIDIA_VISIBLE_DEVICES=void: the runtime injects nothing
    pod["spec"]["containers"][0]["volumeMounts"] = []
    verdict = judge(pod, release, node, None)
    assert (verdict.ok, verdict.message) == (False, "failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND")


def _time_slicing(replicas: int) -> dict[str, Any]:
    return {
        "version": "v1",
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}},
    }


@pytest.mark.parametrize("release", ALL_RELEASES, ids=_ids)
@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_time_slicing_replicas_below_the_minimum_are_rejected(release: OperandRelease, replicas: int) -> None:
    verdict = judge(conforming_pod(release), release, PLAIN_NODE, _time_slicing(replicas))
    minimum = release.min_time_slicing_replicas
    if minimum is not None and replicas < minimum:
        assert not verdict.ok
        assert verdict.message == "unable to load config: number of replicas must be >= 2"
    else:
        assert verdict.ok


@pytest.mark.parametrize("release", ALL_RELEASES, ids=_ids)
@pytest.mark.parametrize(
    ("strategy_env", "config_strategy", "node", "sys_admin", "fails_when_mig_needs_it"),
    [
        ("single", None, MIG_NODE, False, True),
        ("mixed", None, MIG_NODE, False, True),
        (None, "mixed", MIG_NODE, False, True),
        ("mixed", None, MIG_NODE, True, False),
        ("none", "mixed", MIG_NODE, False, False),  # the environment overrides the config file
        ("none", None, MIG_NODE, False, False),
        ("mixed", None, PLAIN_NODE, False, False),
    ],
)
def test_mig_strategies_on_a_mig_node_need_sys_admin(
    release: OperandRelease,
    strategy_env: str | None,
    config_strategy: str | None,
    node: NodeRuntime,
    sys_admin: bool,
    fails_when_mig_needs_it: bool,
) -> None:
    pod = conforming_pod(release)
    container = pod["spec"]["containers"][0]
    if strategy_env is not None:
        container["env"].append({"name": "MIG_STRATEGY", "value": strategy_env})
    if sys_admin:
        container["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}}
    config = {"version": "v1", "flags": {"migStrategy": config_strategy}} if config_strategy else None
    verdict = judge(pod, release, node, config)
    if fails_when_mig_needs_it and release.mig_needs_sys_admin:
        assert not verdict.ok
        assert verdict.message == "Insufficient Permissions"
    else:
        assert verdict.ok


def _pod_of(path: Path, component: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The pod a rendered DaemonSet of `component` makes, and its parsed device-plugin config file."""
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    daemonset = next(
        d
        for d in documents
        if d["kind"] == "DaemonSet" and d["metadata"]["labels"].get("gpuforge.io/component") == component
    )
    template = copy.deepcopy(daemonset["spec"]["template"])
    config = None
    for volume in template["spec"].get("volumes") or []:
        name = (volume.get("configMap") or {}).get("name")
        for d in documents:
            if name and d["kind"] == "ConfigMap" and d["metadata"]["name"] == name:
                config = yaml.safe_load(next(iter(d["data"].values())))
    return template, config


def _release_of(pod: dict[str, Any], component: str) -> OperandRelease:
    return CONTRACT.release(component, pod["metadata"]["labels"]["app.kubernetes.io/version"])


@pytest.mark.parametrize(
    ("path", "component", "message"),
    [
        (FIXTURES / "dra-v1-e555eb3.yaml", DRA_KUBELET_PLUGIN, 'Required flag "image-name" not set'),
        (
            FIXTURES / "device-plugin-defaults-e555eb3.yaml",
            DEVICE_PLUGIN,
            "failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND",
        ),
    ],
)
def test_renders_from_before_the_contract_fail_like_the_release(
    path: Path, component: str, message: str
) -> None:
    pod, config = _pod_of(path, component)
    verdict = judge(pod, _release_of(pod, component), PLAIN_NODE, config)
    assert (verdict.ok, verdict.message) == (False, message)


@pytest.mark.parametrize(
    ("name", "component"),
    [
        ("dra-v1.yaml", DRA_KUBELET_PLUGIN),
        ("dra-v1beta2.yaml", DRA_KUBELET_PLUGIN),
        ("dra-v1beta1-old-release.yaml", DRA_KUBELET_PLUGIN),
        ("dra-compute-domains-mig.yaml", DRA_KUBELET_PLUGIN),
        ("dra-vfio-passthrough.yaml", DRA_KUBELET_PLUGIN),
        ("device-plugin-defaults.yaml", DEVICE_PLUGIN),
        ("device-plugin-time-slicing.yaml", DEVICE_PLUGIN),
    ],
)
@pytest.mark.parametrize("node", [PLAIN_NODE, MIG_NODE], ids=["plain", "mig"])
def test_todays_renders_start(name: str, component: str, node: NodeRuntime) -> None:
    pod, config = _pod_of(GOLDEN / name, component)
    release = _release_of(pod, component)
    verdict = judge(pod, release, node, config, CONTRACT.container_releases(release))
    assert verdict.ok, verdict.message


@pytest.mark.parametrize(
    "golden", ["dra-compute-domains-mig.yaml", "dra-compute-domains-openshift-v25-3.yaml"]
)
@pytest.mark.parametrize("missing", ["NODE_NAME", "driver-root"])
def test_a_compute_domains_container_its_release_would_not_start(golden: str, missing: str) -> None:
    """The compute-domains container is judged by compute-domain-kubelet-plugin's own contract."""
    pod, config = _pod_of(GOLDEN / golden, DRA_KUBELET_PLUGIN)
    release = _release_of(pod, DRA_KUBELET_PLUGIN)
    by_container = CONTRACT.container_releases(release)
    assert by_container[COMPUTE_DOMAIN_CONTAINER].component == DRA_COMPUTE_DOMAIN_PLUGIN
    container = next(c for c in pod["spec"]["containers"] if c["name"] == COMPUTE_DOMAIN_CONTAINER)
    if missing == "NODE_NAME":
        container["env"] = [e for e in container["env"] if e["name"] != "NODE_NAME"]
        expected = 'Required flag "node-name" not set'
    else:
        container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "driver-root"]
        expected = "failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND"
    verdict = judge(pod, release, PLAIN_NODE, config, by_container)
    assert (verdict.ok, verdict.message) == (False, expected)


# --- vfio.gpu.nvidia.com: the PassthroughSupport gate ------------------------------------------------
PASSTHROUGH_RELEASES = {"v25.12.0", "v0.4.0"}


def _with_gates(release: OperandRelease, value: str) -> dict[str, Any]:
    pod = conforming_pod(release)
    pod["spec"]["containers"][0]["env"].append({"name": "FEATURE_GATES", "value": value})
    return pod


def test_the_passthrough_gate_exists_from_v25_12() -> None:
    have = {
        v
        for v in CONTRACT.versions(DRA_KUBELET_PLUGIN)
        if CONTRACT.release(DRA_KUBELET_PLUGIN, v).passthrough
    }
    assert have == PASSTHROUGH_RELEASES
    gated = CONTRACT.release(DRA_KUBELET_PLUGIN, "v25.12.0").passthrough
    assert gated is not None and gated.feature_gate == PASSTHROUGH_GATE
    assert {m.host_path for m in gated.mounts} == {"/", "/sys/", "/proc/"}


@pytest.mark.parametrize(
    ("version", "gates", "types"),
    [
        ("v25.12.0", None, {DEVICE_TYPE_GPU}),
        ("v25.12.0", "PassthroughSupport=false,", {DEVICE_TYPE_GPU}),
        ("v25.12.0", "PassthroughSupport=true,", {DEVICE_TYPE_GPU, DEVICE_TYPE_VFIO}),
        ("v0.4.0", "MPSSupport=true,PassthroughSupport=true,", {DEVICE_TYPE_GPU, DEVICE_TYPE_VFIO}),
        # v25.3.x has no --feature-gates flag: the variable is ignored, and no vfio devices exist
        ("v25.3.2", "PassthroughSupport=true,", {DEVICE_TYPE_GPU}),
    ],
)
def test_vfio_devices_are_published_only_with_the_gate(
    version: str, gates: str | None, types: set[str]
) -> None:
    release = CONTRACT.release(DRA_KUBELET_PLUGIN, version)
    pod = conforming_pod(release) if gates is None else _with_gates(release, gates)
    assert judge(pod, release, PLAIN_NODE, None).ok
    assert advertised_device_types(pod, release) == types


def test_a_release_without_the_gate_exits_on_it() -> None:
    release = CONTRACT.release(DRA_KUBELET_PLUGIN, "v25.8.0")
    verdict = judge(_with_gates(release, "PassthroughSupport=true,"), release, PLAIN_NODE, None)
    assert not verdict.ok
    assert verdict.message == "unrecognized feature gate: PassthroughSupport"


@pytest.mark.parametrize(
    ("golden", "types"),
    [("dra-v1.yaml", {DEVICE_TYPE_GPU}), ("dra-vfio-passthrough.yaml", {DEVICE_TYPE_GPU, DEVICE_TYPE_VFIO})],
)
def test_the_rendered_plugin_publishes_vfio_devices_only_when_the_class_is_chosen(
    golden: str, types: set[str]
) -> None:
    pod, _ = _pod_of(GOLDEN / golden, DRA_KUBELET_PLUGIN)
    assert advertised_device_types(pod, _release_of(pod, DRA_KUBELET_PLUGIN)) == types
