"""The operand contract (operands.yaml): what each release of NVIDIA's device plugin and DRA driver
requires of its pod and how it fails without it. The renderer writes manifests to it; the simulated node
agent judges plugin pods by it. No I/O beyond reading the packaged data file once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import yaml

from gpuforge.compat import UnknownRelease, parse_release

DEVICE_PLUGIN = "device-plugin"
DRA_KUBELET_PLUGIN = "dra-kubelet-plugin"
DRA_CONTROLLER = "dra-controller"
# The compute-domain-kubelet-plugin binary: container `compute-domains` of the DRA kubelet plugin's pods.
DRA_COMPUTE_DOMAIN_PLUGIN = "dra-compute-domain-plugin"
COMPONENTS = (DEVICE_PLUGIN, DRA_KUBELET_PLUGIN, DRA_CONTROLLER, DRA_COMPUTE_DOMAIN_PLUGIN)
# The DRA kubelet plugin pods' container running DRA_COMPUTE_DOMAIN_PLUGIN (chart kubeletplugin.yaml).
COMPUTE_DOMAIN_CONTAINER = "compute-domains"
DRIVER_ROOT_MOUNT = "/driver-root"
# The DRA kubelet plugin's flag taking "Name=true,..." (pkg/flags/featuregates.go), where a release has it.
FEATURE_GATES_FLAG = "feature-gates"


class UnsupportedRelease(ValueError):
    """The contract has no entry a release could be served by; the message says why."""


@dataclass(frozen=True)
class Probe:
    period_seconds: int
    failure_threshold: int
    timeout_seconds: int


@dataclass(frozen=True)
class HostMount:
    """A hostPath volume and where a container mounts it, as NVIDIA's chart writes it."""

    name: str
    host_path: str
    mount_path: str
    read_only: bool
    mount_propagation: str


@dataclass(frozen=True)
class Passthrough:
    """What serving vfio.gpu.nvidia.com takes of a DRA kubelet plugin: the feature gate that makes it
    enumerate GPUs bound to vfio-pci, and the host mounts the chart adds with it."""

    feature_gate: str
    mounts: tuple[HostMount, ...]


@dataclass(frozen=True)
class OperandRelease:
    component: str
    version: str
    required_flags: tuple[str, ...]
    # flag -> the environment variable that sets it (urfave/cli EnvVars)
    flag_env: Mapping[str, str]
    errors: Mapping[str, str]
    # The rest defaults to what a component without that capability has (no health server, no NVML...).
    health_port: int | None = None
    needs_nvml: bool = False
    min_time_slicing_replicas: int | None = None
    mig_needs_sys_admin: bool = False
    mig_env: Mapping[str, str] = field(default_factory=dict)
    checkpoint_format: str | None = None
    # a node that ran this release cannot go back to one with another checkpoint format
    forward_only: bool = False
    advertises: tuple[str, ...] = ()
    startup_probe: Probe | None = None
    liveness_probe: Probe | None = None
    config_versions: tuple[str, ...] = field(default=())
    # dlopens libnvidia-ml from the host's driver root mounted at DRIVER_ROOT_MOUNT, not from what a
    # container runtime injects
    nvml_from_driver_root: bool = False
    # wants the host's /dev at /host/dev
    host_dev: bool = False
    # SecurityContextConstraints its ServiceAccount may use on OpenShift; None: none bound
    openshift_scc: str | None = None
    # None: the release cannot enumerate vfio devices at all
    passthrough: Passthrough | None = None

    @property
    def required_env(self) -> tuple[str, ...]:
        """The env vars a pod must set for the required flags (the binaries are started without flags)."""
        return tuple(self.flag_env[flag] for flag in self.required_flags)

    def error(self, kind: str, **values: str) -> str:
        return self.errors[kind].format(**values)


Rule = Mapping[str, Any]  # a PolicyRule, as the chart writes it


@dataclass(frozen=True)
class ComputeDomainRbac:
    kubelet_plugin: tuple[Rule, ...]
    kubelet_plugin_namespaced: tuple[Rule, ...]
    controller: tuple[Rule, ...]
    controller_namespaced: tuple[Rule, ...]
    daemon: tuple[Rule, ...]


@dataclass(frozen=True)
class ComputeDomains:
    """What a DRA release's chart installs for ComputeDomains beside the controller Deployment."""

    version: str
    # package paths under gpuforge/render/crds/computedomains/
    crds: tuple[str, ...]
    rbac: ComputeDomainRbac
    # SecurityContextConstraints bound where security.openshift.io is served; None: no binding
    kubelet_plugin_scc: str | None
    daemon_scc: str | None


@dataclass(frozen=True)
class OperandContract:
    releases: Mapping[tuple[str, str], OperandRelease]
    compute_domain_sets: Mapping[str, ComputeDomains] = field(default_factory=dict)

    def container_releases(self, release: OperandRelease) -> dict[str, OperandRelease]:
        """Containers of `release`'s pods that run another binary, by name: the DRA kubelet plugin's
        `compute-domains` container runs compute-domain-kubelet-plugin of the same release."""
        if release.component != DRA_KUBELET_PLUGIN:
            return {}
        return {COMPUTE_DOMAIN_CONTAINER: self.release(DRA_COMPUTE_DOMAIN_PLUGIN, release.version)}

    def compute_domains(self, dra_version: str) -> ComputeDomains:
        """The ComputeDomain objects of DRA release `dra_version` (a patch shares its base's)."""
        return self.compute_domain_sets[self.release(DRA_COMPUTE_DOMAIN_PLUGIN, dra_version).version]

    def versions(self, component: str) -> tuple[str, ...]:
        """In release order, oldest first (the DRA driver's v0.4.0 follows its v25.12.0)."""
        return tuple(v for c, v in self.releases if c == component)

    def is_older(self, component: str, version: str, than: str) -> bool:
        order = self.versions(component)
        return order.index(self.release(component, version).version) < order.index(
            self.release(component, than).version
        )

    def release(self, component: str, version: str) -> OperandRelease:
        """The entry of `version`, or of the newest earlier release of its major line (a patch or
        pre-release shares its base's contract)."""
        if component not in COMPONENTS:
            raise UnsupportedRelease(f"unknown operand component {component!r}")
        try:
            wanted = parse_release(version)
        except UnknownRelease as exc:
            raise UnsupportedRelease(str(exc)) from None
        candidates = [v for v in self.versions(component) if parse_release(v)[0] == wanted[0]]
        earlier = [v for v in candidates if parse_release(v) <= wanted]
        if not earlier:
            known = ", ".join(self.versions(component)) or "none"
            raise UnsupportedRelease(
                f"{component} {version}: no contract for this release (known: {known}), so gpuforge "
                "cannot tell what its binaries require"
            )
        return self.releases[(component, max(earlier, key=parse_release))]


def _probe(data: Mapping[str, Any] | None) -> Probe | None:
    if not data:
        return None
    return Probe(int(data["periodSeconds"]), int(data["failureThreshold"]), int(data["timeoutSeconds"]))


def _passthrough(data: Mapping[str, Any] | None) -> Passthrough | None:
    if not data:
        return None
    mounts = tuple(
        HostMount(
            name=str(m["name"]),
            host_path=str(m["hostPath"]),
            mount_path=str(m["mountPath"]),
            read_only=bool(m["readOnly"]),
            mount_propagation=str(m["mountPropagation"]),
        )
        for m in data["mounts"]
    )
    return Passthrough(feature_gate=str(data["featureGate"]), mounts=mounts)


def _release(
    component: str, version: str, entry: Mapping[str, Any], errors: Mapping[str, str]
) -> OperandRelease:
    """A release with what every component's contract entry gives (its flags and how they are set) and
    none of the capabilities; `replace` adds those an entry has."""
    return OperandRelease(
        component=component,
        version=version,
        required_flags=tuple(entry["requiredFlags"]),
        flag_env=dict(entry["flagEnv"]),
        errors=errors,
    )


def from_data(data: Mapping[str, Any], device_plugin_versions: tuple[str, ...]) -> OperandContract:
    errors = dict(data["errors"])
    releases: dict[tuple[str, str], OperandRelease] = {}
    dp = data["devicePlugin"]["default"]
    for version in device_plugin_versions:
        releases[(DEVICE_PLUGIN, version)] = replace(
            _release(DEVICE_PLUGIN, version, dp, errors),
            health_port=dp["healthPort"],
            needs_nvml=bool(dp["needsNvml"]),
            min_time_slicing_replicas=dp["minTimeSlicingReplicas"],
            mig_needs_sys_admin=bool(dp["migNeedsSysAdmin"]),
            mig_env=dict(dp["migEnv"]),
            checkpoint_format=dp["checkpointFormat"],
            advertises=tuple(dp["advertises"]),
            config_versions=tuple(dp["configVersions"]),
            openshift_scc=dp.get("openshiftScc"),
        )
    probes = data["draProbes"]
    compute_domain_sets: dict[str, ComputeDomains] = {}
    for entry in data["draDriver"]:
        version = entry["version"]
        plugin, controller = entry["kubeletPlugin"], entry["controller"]
        has_health = plugin["healthPort"] is not None
        releases[(DRA_KUBELET_PLUGIN, version)] = replace(
            _release(DRA_KUBELET_PLUGIN, version, plugin, errors),
            health_port=plugin["healthPort"],
            needs_nvml=True,
            checkpoint_format=plugin["checkpointFormat"],
            forward_only=bool(plugin.get("forwardOnly", False)),
            startup_probe=_probe(probes["startup"]) if has_health else None,
            liveness_probe=_probe(probes["liveness"]) if has_health else None,
            nvml_from_driver_root=bool(plugin.get("nvmlFromDriverRoot", False)),
            passthrough=_passthrough(plugin.get("passthrough")),
        )
        releases[(DRA_CONTROLLER, version)] = _release(DRA_CONTROLLER, version, controller, errors)
    for entry in data["computeDomains"]:
        plugin, rbac, scc = entry["plugin"], entry["rbac"], entry["openshiftScc"]
        for version in entry["releases"]:
            releases[(DRA_COMPUTE_DOMAIN_PLUGIN, version)] = replace(
                _release(DRA_COMPUTE_DOMAIN_PLUGIN, version, plugin, errors),
                health_port=plugin["healthPort"],
                needs_nvml=True,
                startup_probe=_probe(plugin.get("startupProbe")),
                liveness_probe=_probe(plugin.get("livenessProbe")),
                nvml_from_driver_root=True,
                host_dev=bool(plugin["hostDev"]),
            )
            compute_domain_sets[version] = ComputeDomains(
                version=version,
                crds=tuple(entry["crds"]),
                rbac=ComputeDomainRbac(
                    kubelet_plugin=tuple(rbac["kubeletPlugin"]),
                    kubelet_plugin_namespaced=tuple(rbac["kubeletPluginNamespaced"]),
                    controller=tuple(rbac["controller"]),
                    controller_namespaced=tuple(rbac["controllerNamespaced"]),
                    daemon=tuple(rbac["daemon"]),
                ),
                kubelet_plugin_scc=scc["kubeletPlugin"],
                daemon_scc=scc["daemon"],
            )
    return OperandContract(releases, compute_domain_sets)


@functools.cache
def load_operands() -> OperandContract:
    """The packaged operands.yaml, for every device-plugin release compat.yaml lists (read once); DRA
    releases in the file's order, which is release order."""
    from gpuforge.compat import load

    text = resources.files(__package__).joinpath("operands.yaml").read_text()
    versions = tuple(r.version for r in load().device_plugin_releases)
    return from_data(yaml.safe_load(text), versions)


def rollback_problem(contract: OperandContract, component: str, current: str, target: str) -> str | None:
    """Why a node running `current` cannot be taken back to `target`, or None."""
    now, then = contract.release(component, current), contract.release(component, target)
    if not contract.is_older(component, target, current) or now.checkpoint_format == then.checkpoint_format:
        return None
    if now.forward_only:
        return (
            f"{component} {current} writes checkpoint format {now.checkpoint_format}, which {target} "
            f"cannot read ({now.error('checkpoint_unreadable')}): upgrades to {current} are forward-only"
        )
    return None
