"""SIMULATION: the extended resources NVIDIA's device plugin advertises for a node's GPUs and its config.

A pure function of (the node's GPUs, whether they are in MIG mode, the plugin's MIG strategy, the config
file it mounts), following k8s-device-plugin v0.20.0 (v0.17.0 reads the same):
- cmd/nvidia-device-plugin/main.go `startPlugins` calls api/config/v1/config.go
  `DisableResourceNamingInConfig`: custom `resources` and, in `sharing.timeSlicing.resources`, any `rename`
  other than the default and any `devices` other than "all" are ignored (logged, not refused);
- internal/rm/rm.go `AddDefaultResourcesToConfig`: every full GPU is `nvidia.com/gpu`; MIG strategy `single`
  names MIG devices `nvidia.com/gpu` too, `mixed` names them `nvidia.com/mig-<profile>` ("+" becomes ".");
- internal/rm/device_map.go `buildDeviceMapFromConfigResources`: with strategy `none` a GPU in MIG mode is
  advertised whole; otherwise it contributes its MIG devices. `single` refuses a node whose MIG-mode GPUs
  carry no MIG devices, carry more than one kind, or sit beside GPUs not in MIG mode (the plugin exits);
- device_map.go `updateDeviceMapWithReplicas`: a time-sliced resource is advertised `replicas` times per
  device, under `<name>.shared` with `renameByDefault` (api/config/v1/replicas.go, consts.go
  `DefaultSharedResourceNameSuffix`), devices of other resources unchanged;
- main.go: a resource with no devices gets no plugin, so it is not advertised at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuforge.constants import GPU_RESOURCE, GPU_SHARED_SUFFIX, MIG_RESOURCE_PREFIX
from gpuforge_lab.devcluster.pools import GpuSpec

RESOURCE_NAME_PREFIX = "nvidia.com"  # api/config/v1/consts.go ResourceNamePrefix
MIG_STRATEGIES = ("none", "single", "mixed")


class PluginExits(Exception):
    """The plugin would exit on start; the message is the one it prints."""


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML shows it: MIG mode off (`mig_devices` None) or on, with its MIG devices' profiles."""

    mig_devices: tuple[str, ...] | None = None


def node_gpus(spec: GpuSpec, mig_enabled: bool) -> list[Gpu]:
    """The GPUs of a simulated node: all in MIG mode with the pool's layout, or none of them."""
    layout = spec.mig_layout() if mig_enabled and spec.mig_capable else None
    if layout is None:
        return [Gpu() for _ in range(spec.count)]
    profile, per_gpu = layout
    return [Gpu(mig_devices=(profile,) * per_gpu) for _ in range(spec.count)]


def _resource_name(name: str) -> str:
    # api/config/v1/resources.go NewResourceName: a bare name gets the nvidia.com/ prefix.
    return name if name.startswith(RESOURCE_NAME_PREFIX + "/") else f"{RESOURCE_NAME_PREFIX}/{name}"


def mig_resource(profile: str) -> str:
    """internal/rm/rm.go: `mig-` + the profile with "+" (a media-extension suffix) turned into "."."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def _devices(gpus: Sequence[Gpu], strategy: str) -> Counter[str]:
    if strategy not in MIG_STRATEGIES:
        # cmd/nvidia-device-plugin/main.go validateFlags accepts these three.
        raise PluginExits(f"unable to validate flags: unknown MIG strategy: {strategy}")
    if strategy == "none":
        return Counter({GPU_RESOURCE: len(gpus)}) if gpus else Counter()
    whole = sum(1 for gpu in gpus if gpu.mig_devices is None)
    migs = [profile for gpu in gpus if gpu.mig_devices is not None for profile in gpu.mig_devices]
    if strategy == "single":
        prefix = "error building device map from config.resources: invalid MIG configuration: "
        for index, gpu in enumerate(gpus):
            if gpu.mig_devices is not None and not gpu.mig_devices:
                raise PluginExits(
                    prefix + "at least one device with migEnabled=true was not configured correctly: "
                    f"device {index} has no MIG devices configured"
                )
        if len(set(migs)) > 1:
            raise PluginExits(prefix + "more than one MIG device type present on node")
        if whole and migs:
            raise PluginExits(
                "error building device map from config.resources: "
                "all devices on the node must be configured with the same migEnabled value"
            )
        return Counter({GPU_RESOURCE: whole + len(migs)}) if whole + len(migs) else Counter()
    devices = Counter({GPU_RESOURCE: whole}) if whole else Counter()
    devices.update(mig_resource(profile) for profile in migs)
    return devices


def _time_slicing(config: Mapping[str, Any] | None) -> tuple[bool, list[tuple[str, int]]]:
    sharing = (config or {}).get("sharing") or {}
    time_slicing = sharing.get("timeSlicing") or {}
    resources = [
        (_resource_name(str(r["name"])), int(r.get("replicas", 0)))
        for r in time_slicing.get("resources") or []
        if isinstance(r, Mapping) and "name" in r
    ]
    return bool(time_slicing.get("renameByDefault", False)), resources


def advertised(gpus: Sequence[Gpu], mig_strategy: str, config: Mapping[str, Any] | None) -> dict[str, int]:
    """Resource name -> count the plugin registers with kubelet; raises PluginExits where it would exit.

    Replica counts below 2 are refused before this (gpuforge.compat.conformance judges the config)."""
    devices = _devices(gpus, mig_strategy)
    rename_by_default, shared = _time_slicing(config)
    out: Counter[str] = Counter()
    replicated = {name for name, _ in shared}
    for name, count in devices.items():
        if name not in replicated:
            out[name] += count
    for name, replicas in shared:
        count = devices.get(name, 0)
        if count == 0:
            continue  # nothing of that name on the node
        # Only the default rename survives DisableResourceNamingInConfig.
        out[name + GPU_SHARED_SUFFIX if rename_by_default else name] += count * replicas
    return {name: count for name, count in sorted(out.items()) if count > 0}
