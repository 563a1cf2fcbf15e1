"""Simulated GPU node pools: parse a pools file and render the Node objects kwok will keep alive.

Each node carries the labels Node Feature Discovery and GPU Feature Discovery would put on a real GPU node, a
kubelet version, and an annotation describing its (simulated) GPUs, which the simulated node agent reads to
advertise them. Pure: no I/O besides reading the file handed in.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuforge.constants import (
    SIM_MIG_ENABLED_LABEL,
    SIM_NVIDIA_DEFAULT_RUNTIME_LABEL,
    SIM_POOL_LABEL,
)

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# The simulated hardware of a node, JSON of GpuSpec; read by gpuforge_lab.sim.
SIM_GPUS_ANNOTATION = "sim.gpuforge.io/gpus"
# "not-ready" makes kwok report the node NotReady (failure injection).
SIM_HEALTH_ANNOTATION = "sim.gpuforge.io/health"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_KUBELET_VERSION = re.compile(r"^v1\.\d+\.\d+$")
# The collection's playbooks a real pool may bootstrap its hosts with (`bootstrap:` of a pools file).
BOOTSTRAP_PLAYBOOKS = ("site.yml",)


class PoolError(ValueError):
    pass


# The MIG layout a GPU gets by default when its pool is in MIG mode: the smallest profile, as many as fit
# (NVIDIA's MIG user guide, "Supported MIG Profiles"), by a word of the product name and its memory size.
MIG_DEFAULTS: Mapping[tuple[str, str | None], tuple[str, int]] = {
    ("A100", "40GB"): ("1g.5gb", 7),
    ("A100", "80GB"): ("1g.10gb", 7),
    ("H100", "80GB"): ("1g.10gb", 7),
    ("A30", None): ("1g.6gb", 4),
}
_MIG_PROFILE = re.compile(r"^[1-9]g\.[0-9]+gb(\+[a-z]+)*$")


@dataclass(frozen=True)
class GpuSpec:
    product: str = "NVIDIA A100-SXM4-80GB"
    count: int = 8
    memory_mib: int = 81920
    driver_version: str = "580.95.05"
    cuda_version: str = "13.0"
    compute_capability: str = "8.0"
    architecture: str = "Ampere"
    brand: str = "Nvidia"
    mig_capable: bool = True
    # The MIG devices each GPU carries when the node's GPUs are in MIG mode (the pool's migEnabled):
    # a profile such as "1g.10gb" and how many; "" / 0 take the product's default (MIG_DEFAULTS).
    mig_profile: str = ""
    mig_devices_per_gpu: int = 0

    def mig_layout(self) -> tuple[str, int] | None:
        """(profile, devices per GPU) of a GPU in MIG mode; None when the product has no default and
        none was given."""
        default = next(
            (
                layout
                for (word, memory), layout in MIG_DEFAULTS.items()
                if word in self.product.upper() and (memory is None or memory in self.product.upper())
            ),
            None,
        )
        profile = self.mig_profile or (default[0] if default else "")
        devices = self.mig_devices_per_gpu or (default[1] if default else 0)
        return (profile, devices) if profile and devices > 0 else None

    @property
    def product_label(self) -> str:
        """GFD replaces spaces in the product name with dashes."""
        return self.product.replace(" ", "-")

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GpuSpec:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True)
class Pool:
    name: str
    count: int
    gpu: GpuSpec | None = field(default_factory=GpuSpec)
    kubelet_version: str | None = None  # None: the profile's default
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    cpu: str = "64"
    memory: str = "512Gi"
    pods: str = "110"
    # A real kubelet node (a lab host with containerd) instead of a kwok one; always the cluster's release.
    real: bool = False
    # A playbook of the collection (playbooks/<name>) run on a real pool's hosts before their kubelets join,
    # so their containerd, driver and CDI spec are the roles' instead of the lab's own.
    bootstrap: str | None = None
    # What the plugins find on the node beyond their pod spec (read by the simulated agent's judge).
    nvidia_default_runtime: bool = False
    mig_enabled: bool = False

    def node_names(self) -> list[str]:
        return [f"{self.name}-{index}" for index in range(self.count)]


_GPU_KEYS = {
    "product": "product",
    "count": "count",
    "memoryMiB": "memory_mib",
    "driverVersion": "driver_version",
    "cudaVersion": "cuda_version",
    "computeCapability": "compute_capability",
    "architecture": "architecture",
    "brand": "brand",
    "migCapable": "mig_capable",
    "migProfile": "mig_profile",
    "migDevicesPerGpu": "mig_devices_per_gpu",
}


def _parse_gpu(raw: Any, where: str) -> GpuSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise PoolError(f"{where}.gpu must be a mapping or null")
    unknown = set(raw) - set(_GPU_KEYS)
    if unknown:
        raise PoolError(f"{where}.gpu has unknown keys {sorted(unknown)}; known: {sorted(_GPU_KEYS)}")
    values: dict[str, Any] = {_GPU_KEYS[key]: value for key, value in raw.items()}
    for key in ("driver_version", "cuda_version", "compute_capability"):
        if key in values:
            values[key] = str(values[key])
    spec = GpuSpec(**values)
    if not isinstance(spec.count, int) or spec.count < 1:
        raise PoolError(f"{where}.gpu.count must be a positive integer")
    if spec.mig_profile and not _MIG_PROFILE.match(spec.mig_profile):
        raise PoolError(f"{where}.gpu.migProfile must look like 1g.10gb, got {spec.mig_profile!r}")
    if not isinstance(spec.mig_devices_per_gpu, int) or spec.mig_devices_per_gpu < 0:
        raise PoolError(f"{where}.gpu.migDevicesPerGpu must be a non-negative integer")
    return spec


def parse_pools(document: Mapping[str, Any]) -> list[Pool]:
    raw_pools = document.get("pools")
    if not isinstance(raw_pools, list) or not raw_pools:
        raise PoolError("a pools file needs a non-empty list under 'pools'")
    pools: list[Pool] = []
    for index, raw in enumerate(raw_pools):
        where = f"pools[{index}]"
        if not isinstance(raw, dict):
            raise PoolError(f"{where} must be a mapping")
        name = raw.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise PoolError(f"{where}.name must be a DNS label, got {name!r}")
        count = raw.get("count", 1)
        if not isinstance(count, int) or count < 0:
            raise PoolError(f"{where}.count must be a non-negative integer")
        kubelet = raw.get("kubeletVersion")
        if kubelet is not None and (not isinstance(kubelet, str) or not _KUBELET_VERSION.match(kubelet)):
            raise PoolError(f"{where}.kubeletVersion must look like v1.34.2, got {kubelet!r}")
        real = raw.get("real", False)
        if not isinstance(real, bool):
            raise PoolError(f"{where}.real must be true or false, got {real!r}")
        if real and kubelet is not None:
            raise PoolError(
                f"{where}.kubeletVersion cannot be set on a real pool: its kubelet is the cluster's"
            )
        bootstrap = raw.get("bootstrap")
        if bootstrap is not None:
            if bootstrap not in BOOTSTRAP_PLAYBOOKS:
                raise PoolError(
                    f"{where}.bootstrap must name a playbook of the collection "
                    f"({', '.join(BOOTSTRAP_PLAYBOOKS)}), got {bootstrap!r}"
                )
            if not real:
                raise PoolError(f"{where}.bootstrap needs real: true (kwok nodes have no host to bootstrap)")
        taints = tuple(
            Taint(key=t["key"], effect=t["effect"], value=str(t.get("value", "")))
            for t in raw.get("taints", [])
        )
        runtime_facts = {}
        for key in ("nvidiaDefaultRuntime", "migEnabled"):
            value = raw.get(key, False)
            if not isinstance(value, bool):
                raise PoolError(f"{where}.{key} must be true or false, got {value!r}")
            runtime_facts[key] = value
        gpu = _parse_gpu(raw.get("gpu", {}), where)
        if runtime_facts["migEnabled"] and gpu is not None:
            if not gpu.mig_capable:
                raise PoolError(f"{where}.migEnabled needs a MIG-capable GPU ({where}.gpu.migCapable)")
            if gpu.mig_layout() is None:
                raise PoolError(
                    f"{where}.migEnabled: no default MIG layout for {gpu.product!r}; "
                    f"set {where}.gpu.migProfile and {where}.gpu.migDevicesPerGpu"
                )
        pools.append(
            Pool(
                name=name,
                count=count,
                gpu=gpu,
                kubelet_version=kubelet,
                labels={str(k): str(v) for k, v in raw.get("labels", {}).items()},
                taints=taints,
                cpu=str(raw.get("cpu", "64")),
                memory=str(raw.get("memory", "512Gi")),
                pods=str(raw.get("pods", "110")),
                real=real,
                bootstrap=bootstrap,
                nvidia_default_runtime=runtime_facts["nvidiaDefaultRuntime"],
                mig_enabled=runtime_facts["migEnabled"],
            )
        )
    names = [pool.name for pool in pools]
    if len(set(names)) != len(names):
        raise PoolError(f"pool names must be unique: {names}")
    return pools


def load_pools(path: Path) -> list[Pool]:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise PoolError(f"cannot read pools file {path}: {error}") from error
    if not isinstance(document, dict):
        raise PoolError(f"{path}: expected a mapping with 'pools'")
    return parse_pools(document)


def uniform_pools(nodes: int) -> list[Pool]:
    return [Pool(name="gpu", count=nodes)]


def gpu_labels(gpu: GpuSpec) -> dict[str, str]:
    """Labels NFD (PCI vendor 10de) and GPU Feature Discovery publish for these GPUs."""
    driver_major, driver_minor, *driver_rest = [*gpu.driver_version.split("."), "0", "0"][:3]
    cuda_major, cuda_minor = [*gpu.cuda_version.split("."), "0"][:2]
    cc_major, cc_minor = [*gpu.compute_capability.split("."), "0"][:2]
    revision = driver_rest[0] if driver_rest else "0"
    return {
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "feature.node.kubernetes.io/pci-0302_10de.present": "true",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": gpu.product_label,
        "nvidia.com/gpu.count": str(gpu.count),
        "nvidia.com/gpu.memory": str(gpu.memory_mib),
        "nvidia.com/gpu.family": gpu.architecture.lower().replace(" ", "-"),
        "nvidia.com/gpu.compute.major": cc_major,
        "nvidia.com/gpu.compute.minor": cc_minor,
        "nvidia.com/gpu.machine": "SIMULATED",
        "nvidia.com/cuda.driver-version.major": driver_major,
        "nvidia.com/cuda.driver-version.minor": driver_minor,
        "nvidia.com/cuda.driver-version.revision": revision,
        "nvidia.com/cuda.driver-version.full": gpu.driver_version,
        "nvidia.com/cuda.driver.major": driver_major,
        "nvidia.com/cuda.driver.minor": driver_minor,
        "nvidia.com/cuda.driver.rev": revision,
        "nvidia.com/cuda.runtime-version.major": cuda_major,
        "nvidia.com/cuda.runtime-version.minor": cuda_minor,
        "nvidia.com/cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
        "nvidia.com/mig.capable": "true" if gpu.mig_capable else "false",
    }


def _sim_id(name: str, kind: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{kind}.{name}.sim.gpuforge.io"))


def render_node(pool: Pool, name: str, default_kubelet_version: str) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        SIM_POOL_LABEL: pool.name,
    }
    annotations = {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"}
    if pool.gpu is not None:
        labels.update(gpu_labels(pool.gpu))
        annotations[SIM_GPUS_ANNOTATION] = pool.gpu.to_json()
    if pool.nvidia_default_runtime:
        labels[SIM_NVIDIA_DEFAULT_RUNTIME_LABEL] = "true"
    if pool.mig_enabled:
        labels[SIM_MIG_ENABLED_LABEL] = "true"
    labels.update(pool.labels)
    resources = {"cpu": pool.cpu, "memory": pool.memory, "pods": pool.pods}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "taints": [
                {"key": t.key, "value": t.value, "effect": t.effect}
                if t.value
                else {"key": t.key, "effect": t.effect}
                for t in pool.taints
            ]
        },
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "nodeInfo": {
                "kubeletVersion": pool.kubelet_version or default_kubelet_version,
                "operatingSystem": "linux",
                "architecture": "amd64",
                "osImage": "Debian GNU/Linux 12 (bookworm) [simulated by kwok]",
                "kernelVersion": "6.1.0-sim",
                "containerRuntimeVersion": "containerd://1.7.24-sim",
                "kubeProxyVersion": "",
                "bootID": _sim_id(name, "boot"),
                "machineID": _sim_id(name, "machine").replace("-", ""),
                "systemUUID": _sim_id(name, "system"),
            },
        },
    }


def render_nodes(pools: Sequence[Pool], default_kubelet_version: str) -> list[dict[str, Any]]:
    """The kwok nodes of the pools (real pools register themselves through their kubelets)."""
    return [
        render_node(pool, name, default_kubelet_version)
        for pool in pools
        if not pool.real
        for name in pool.node_names()
    ]


# The lab's simulated GPU models (tests/ansible/lab.py GPU_MODELS), by a word of the product name.
_LAB_GPU_MODELS = (("H100", "h100"), ("A100", "a100"), ("L40S", "l40s"), ("L4", "l4"), ("T4", "t4"))


def lab_gpu_models(gpu: GpuSpec | None) -> tuple[str, ...]:
    """The lab hardware a real node of this pool pretends to have: `count` GPUs of the nearest model."""
    if gpu is None:
        return ()
    product = gpu.product.upper()
    model = next((key for word, key in _LAB_GPU_MODELS if word in product), "a100")
    return (model,) * gpu.count


def real_node_patch(pool: Pool) -> dict[str, Any]:
    """Labels and taints a real node gets after it registers: what NFD and GFD would publish, and the pool's.

    A kubelet may not set labels under kubernetes.io itself (NFD's are), so the cluster patches them."""
    labels = {SIM_POOL_LABEL: pool.name, **(gpu_labels(pool.gpu) if pool.gpu else {}), **pool.labels}
    taints = [
        {"key": t.key, "value": t.value, "effect": t.effect}
        if t.value
        else {"key": t.key, "effect": t.effect}
        for t in pool.taints
    ]
    return {"metadata": {"labels": labels}, **({"spec": {"taints": taints}} if taints else {})}
