"""Every release in the operand contract renders what its binaries require: the env of each required
flag, probes only where a health server answers them (with upstream's timings), and MIG's and the
runtime's needs."""

from __future__ import annotations

from typing import Any

import pytest

from gpuforge import compat
from gpuforge.api.convert import from_dict
from gpuforge.api.gpustack import GpuStack, GpuStackSpec, Mode
from gpuforge.compat.operands import DEVICE_PLUGIN, DRA_CONTROLLER, DRA_KUBELET_PLUGIN, load_operands
from gpuforge.render.manifests import RenderInput, render

CONTRACT = load_operands()


def _objects(spec: dict[str, Any], mode: Mode) -> list[dict[str, Any]]:
    stack = GpuStack("s", from_dict(GpuStackSpec, spec, "spec"))
    return render(RenderInput(stack, frozenset({mode}), "v1", compat.load()))


def _container(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (workload,) = [o for o in objects if o["kind"] == kind]
    return dict(workload["spec"]["template"]["spec"]["containers"][0])


def _env(container: dict[str, Any]) -> set[str]:
    return {e["name"] for e in container.get("env", [])}


@pytest.mark.parametrize("version", CONTRACT.versions(DRA_KUBELET_PLUGIN))
def test_dra_kubelet_plugin_renders_its_release_contract(version: str) -> None:
    release = CONTRACT.release(DRA_KUBELET_PLUGIN, version)
    container = _container(_objects({"mode": "dra", "dra": {"version": version}}, Mode.DRA), "DaemonSet")
    assert set(release.required_env) <= _env(container)
    image = {e["name"]: e.get("value") for e in container["env"]}["IMAGE_NAME"]
    assert image == container["image"]
    if release.health_port is None:
        assert "startupProbe" not in container and "livenessProbe" not in container
        assert "HEALTHCHECK_PORT" not in _env(container)
    else:
        assert release.startup_probe is not None and release.liveness_probe is not None
        startup, liveness = container["startupProbe"], container["livenessProbe"]
        assert startup["grpc"]["port"] == liveness["grpc"]["port"] == release.health_port
        timing = ("periodSeconds", "failureThreshold", "timeoutSeconds")
        assert tuple(startup[key] for key in timing) == (1, 600, 10)
        assert tuple(liveness[key] for key in timing) == (30, 3, 10)


@pytest.mark.parametrize("version", CONTRACT.versions(DRA_CONTROLLER))
def test_compute_domain_controller_renders_its_release_contract(version: str) -> None:
    release = CONTRACT.release(DRA_CONTROLLER, version)
    objects = _objects({"mode": "dra", "dra": {"version": version, "computeDomains": True}}, Mode.DRA)
    assert set(release.required_env) <= _env(_container(objects, "Deployment"))


@pytest.mark.parametrize("version", CONTRACT.versions(DEVICE_PLUGIN))
@pytest.mark.parametrize("mig_strategy", ["none", "single", "mixed"])
def test_device_plugin_renders_its_release_contract(version: str, mig_strategy: str) -> None:
    release = CONTRACT.release(DEVICE_PLUGIN, version)
    spec = {"devicePlugin": {"version": version, "migStrategy": mig_strategy}}
    objects = _objects(spec, Mode.DEVICE_PLUGIN)
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert set(release.required_env) <= _env(container)
    # NVML is reached through the nvidia runtime the RuntimeClass names, and devices are handed out by CDI.
    assert pod["runtimeClassName"] == "nvidia"
    (runtime_class,) = [o for o in objects if o["kind"] == "RuntimeClass"]
    assert runtime_class["handler"] == "nvidia"
    assert {"/var/run/cdi", "/driver-root"} <= {m["mountPath"] for m in container["volumeMounts"]}
    (config,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert "cdi-annotations" in config["data"]["config.yaml"]
    capabilities = container["securityContext"]["capabilities"]
    mig = mig_strategy != "none"
    assert ("SYS_ADMIN" in capabilities.get("add", [])) == (mig and release.mig_needs_sys_admin)
    assert (set(release.mig_env) <= _env(container)) == mig


def test_no_runtime_class_where_nvidia_is_the_default_runtime() -> None:
    objects = _objects({"devicePlugin": {"runtimeClassName": ""}}, Mode.DEVICE_PLUGIN)
    assert "RuntimeClass" not in {o["kind"] for o in objects}
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    assert "runtimeClassName" not in daemonset["spec"]["template"]["spec"]


@pytest.mark.parametrize("driver_root", ["/", "/run/nvidia/driver", "/home/kubernetes/bin/nvidia"])
def test_driver_root_reaches_the_plugins(driver_root: str) -> None:
    for mode in (Mode.DEVICE_PLUGIN, Mode.DRA):
        objects = _objects({"mode": mode.value, "driverRoot": driver_root}, mode)
        (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
        pod = daemonset["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["NVIDIA_DRIVER_ROOT"] == driver_root
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["driver-root"]["hostPath"]["path"] == driver_root
