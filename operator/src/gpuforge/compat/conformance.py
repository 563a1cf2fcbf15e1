"""Would NVIDIA's release start from this pod on this node? A pure judge over the operand contract
(operands.yaml): it answers with the text the release itself prints when it gives up, so the simulated node
agent can fail a plugin pod where the real binary would. No I/O: the caller passes the pod, the node's
runtime facts and the device-plugin config file the pod mounts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuforge.compat.operands import DRIVER_ROOT_MOUNT, FEATURE_GATES_FLAG, OperandRelease

MIG_STRATEGY_NONE = "none"
# The `type` attribute of the devices gpu-kubelet-plugin publishes (cmd/gpu-kubelet-plugin/types.go).
DEVICE_TYPE_GPU = "gpu"
DEVICE_TYPE_VFIO = "vfio"
# operands.yaml draDriver passthrough.featureGate (pkg/featuregates/featuregates.go), named here to judge
# releases that lack it.
PASSTHROUGH_GATE = "PassthroughSupport"


@dataclass(frozen=True)
class NodeRuntime:
    """What the node gives a container beyond its pod spec."""

    # containerd's default runtime is nvidia-container-runtime (GPU Operator's toolkit sets this up),
    # so a pod without a RuntimeClass still gets libnvidia-ml injected.
    nvidia_default_runtime: bool = False
    mig_enabled: bool = False


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str = ""


OK = Verdict(ok=True)


def _env_names(container: Mapping[str, Any]) -> set[str]:
    # A value or a valueFrom both set the variable for urfave/cli's EnvVars lookup.
    return {str(entry["name"]) for entry in container.get("env") or [] if "name" in entry}


def _env_value(container: Mapping[str, Any], name: str) -> str | None:
    for entry in container.get("env") or []:
        if entry.get("name") == name and "value" in entry:
            return str(entry["value"])
    return None


def enabled_feature_gates(container: Mapping[str, Any], release: OperandRelease) -> dict[str, bool]:
    """The gates `container` sets through the release's --feature-gates env var ("A=true,B=false,", as
    the chart writes it); nothing where the release has no such flag (the variable is then ignored)."""
    env = release.flag_env.get(FEATURE_GATES_FLAG)
    text = _env_value(container, env) if env else None
    gates: dict[str, bool] = {}
    for item in (text or "").split(","):
        name, _, value = item.strip().partition("=")
        if name:
            gates[name] = value.strip().lower() == "true"
    return gates


def _unknown_gate(container: Mapping[str, Any], release: OperandRelease) -> str | None:
    # The contract records only the gate gpuforge sets; a release without its passthrough entry does
    # not define it, and featuregate.Set refuses it whatever its value.
    if release.passthrough is None and PASSTHROUGH_GATE in enabled_feature_gates(container, release):
        return PASSTHROUGH_GATE
    return None


def advertised_device_types(pod: Mapping[str, Any], release: OperandRelease) -> frozenset[str]:
    """The device types the DRA kubelet plugin in `pod` publishes: full GPUs always, GPUs for vfio-pci
    passthrough only where the release has the passthrough gate and the pod turns it on
    (cmd/gpu-kubelet-plugin/nvlib.go enumerateAllPossibleDevices)."""
    types = {DEVICE_TYPE_GPU}
    if release.passthrough is not None:
        gate = release.passthrough.feature_gate
        containers = (pod.get("spec") or {}).get("containers") or []
        if any(enabled_feature_gates(c, release).get(gate) for c in containers):
            types.add(DEVICE_TYPE_VFIO)
    return frozenset(types)


def _adds_sys_admin(container: Mapping[str, Any]) -> bool:
    security = container.get("securityContext") or {}
    if security.get("privileged"):
        return True
    added = (security.get("capabilities") or {}).get("add") or []
    return any(str(cap).upper().removeprefix("CAP_") == "SYS_ADMIN" for cap in added)


def _mounts_host_path_at(spec: Mapping[str, Any], container: Mapping[str, Any], path: str) -> bool:
    host_volumes = {v.get("name") for v in spec.get("volumes") or [] if "hostPath" in v}
    return any(
        m.get("mountPath") == path and m.get("name") in host_volumes
        for m in container.get("volumeMounts") or []
    )


def _reaches_nvml(
    spec: Mapping[str, Any], container: Mapping[str, Any], release: OperandRelease, node: NodeRuntime
) -> bool:
    if release.nvml_from_driver_root:
        return _mounts_host_path_at(spec, container, DRIVER_ROOT_MOUNT)
    # Injected by the nvidia runtime: asked for through a RuntimeClass, or containerd's default.
    return bool(spec.get("runtimeClassName")) or node.nvidia_default_runtime


def mig_strategy(container: Mapping[str, Any], config: Mapping[str, Any] | None) -> str:
    """The MIG strategy the device plugin in `container` runs with."""
    # The plugin's flags: the environment overrides the config file, which overrides the default.
    from_env = _env_value(container, "MIG_STRATEGY")
    if from_env is not None:
        return from_env
    flags = (config or {}).get("flags") or {}
    return str(flags.get("migStrategy") or MIG_STRATEGY_NONE)


def _time_slicing_replicas(config: Mapping[str, Any] | None) -> list[int]:
    sharing = (config or {}).get("sharing") or {}
    time_slicing = sharing.get("timeSlicing") or {}
    return [int(r.get("replicas", 0)) for r in time_slicing.get("resources") or []]


def judge(
    pod: Mapping[str, Any],
    release: OperandRelease,
    node: NodeRuntime,
    config: Mapping[str, Any] | None,
    by_container: Mapping[str, OperandRelease] | None = None,
) -> Verdict:
    """The first reason the release would exit on start, in the order the binary checks them (flag
    parsing, config file, NVML init, MIG setup), or OK. `by_container`: containers that run another
    binary (OperandContract.container_releases), judged by its contract instead of `release`'s."""
    spec = pod.get("spec") or {}
    containers: list[Mapping[str, Any]] = list(spec.get("containers") or [])
    others = by_container or {}
    judged = [(c, others.get(str(c.get("name")), release)) for c in containers]
    for container, binary in judged:
        present = _env_names(container)
        for flag in binary.required_flags:
            if binary.flag_env[flag] not in present:
                return Verdict(False, binary.error("missing_flag", flag=flag))
        # featuregate.Set runs while the flags are parsed
        gate = _unknown_gate(container, binary)
        if gate is not None:
            return Verdict(False, binary.error("unknown_feature_gate", gate=gate))
    minimum = release.min_time_slicing_replicas
    if minimum is not None and any(r < minimum for r in _time_slicing_replicas(config)):
        return Verdict(False, release.error("config_rejected", value=release.error("replicas_too_few")))
    for container, binary in judged:
        if binary.needs_nvml and not _reaches_nvml(spec, container, binary, node):
            return Verdict(False, binary.error("nvml_unavailable"))
    if release.mig_needs_sys_admin and node.mig_enabled:
        for container in containers:
            if mig_strategy(container, config) != MIG_STRATEGY_NONE and not _adds_sys_admin(container):
                return Verdict(False, release.error("mig_permission"))
    return OK
