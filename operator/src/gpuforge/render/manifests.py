"""Manifests of a GpuStack's operands, from Jinja2 templates over the typed model. No I/O.

Templates (`templates/NNNN_<what>.yaml.j2`, applied in name order) switch themselves off with a top-level
`{% if %}`; undefined variables are errors (StrictUndefined). Every scalar goes through `tojson`, so no
value can break the YAML. The ownership labels are added here, after parsing, so no template can forget
them: every object carries `app.kubernetes.io/managed-by: gpuforge`, `gpuforge.io/stack: <name>` and a
`gpuforge.io/component`.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import jinja2
import yaml

from gpuforge.api.convert import to_dict
from gpuforge.api.gpustack import (
    DEVICE_CLASS_GPU,
    DEVICE_CLASS_MIG,
    DEVICE_CLASS_VFIO,
    GpuStack,
    Mode,
)
from gpuforge.compat import Compat
from gpuforge.compat.operands import (
    DEVICE_PLUGIN,
    DRA_COMPUTE_DOMAIN_PLUGIN,
    DRA_KUBELET_PLUGIN,
    OperandContract,
    OperandRelease,
    Probe,
    load_operands,
)
from gpuforge.constants import (
    COMPONENT_DEVICE_PLUGIN,
    COMPONENT_DRA_CONTROLLER,
    COMPONENT_DRA_KUBELET_PLUGIN,
    COMPONENT_LABEL,
    DEPLOY_DEVICE_PLUGIN_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    DEVICE_PLUGIN_PATH,
    DRA_DRIVER_COMPUTE_DOMAIN,
    DRA_DRIVER_GPU,
    GPU_RESOURCE,
    GROUP,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    STACK_LABEL,
)

Manifest = dict[str, Any]
# (API group, kind, namespace, name): identifies an object whatever API version it is written in.
ObjectKey = tuple[str, str, str, str]

# Component value of objects that belong to the stack as a whole (namespace, DeviceClasses).
COMPONENT_STACK = "stack"
# Every component value the operator renders; pruning only ever looks at these.
RENDERED_COMPONENTS = (
    COMPONENT_STACK,
    COMPONENT_DEVICE_PLUGIN,
    COMPONENT_DRA_KUBELET_PLUGIN,
    COMPONENT_DRA_CONTROLLER,
)
# On operand pods: the release they run (the upgrade planner reads it).
VERSION_LABEL = "app.kubernetes.io/version"
# Selector label of a pinned DaemonSet's pods (the release), so it never overlaps the main DaemonSet's.
PINNED_LABEL = f"{GROUP}/pinned"
# Pod template annotation: a hash of the plugin's config, so a config change is a new DaemonSet revision.
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
# Where the plugin containers see the host's driver root (NVIDIA's charts and GPU Operator use the same).
CONTAINER_DRIVER_ROOT = "/driver-root"
# The device plugin hands GPUs to containers as CDI devices, through both the CRI field and the
# annotations, as NVIDIA's GPU Operator does with CDI on (controllers/object_controls.go): the runtime
# injects the devices and driver libraries whether or not nvidia is containerd's default runtime.
DEVICE_LIST_STRATEGY = ["cdi-annotations", "cdi-cri"]
CDI_ROOT = "/var/run/cdi"

_DEVICE_CLASS_TYPES = {DEVICE_CLASS_GPU: "gpu", DEVICE_CLASS_MIG: "mig", DEVICE_CLASS_VFIO: "vfio"}
# The ComputeDomain DeviceClasses, as NVIDIA's DRA chart writes them
# (templates/deviceclass-compute-domain-daemon.yaml, deviceclass-compute-domain-default-channel.yaml).
_CD = f"device.attributes['{DRA_DRIVER_COMPUTE_DOMAIN}']"
COMPUTE_DOMAIN_DEVICE_CLASSES = {
    "compute-domain-daemon.nvidia.com": (
        f"device.driver == '{DRA_DRIVER_COMPUTE_DOMAIN}' && {_CD}.type == 'daemon'"
    ),
    "compute-domain-default-channel.nvidia.com": (
        f"device.driver == '{DRA_DRIVER_COMPUTE_DOMAIN}' && {_CD}.type == 'channel' && {_CD}.id == 0"
    ),
}
# The ComputeDomain daemons' ServiceAccount: the controller's daemon pod template names it
# (DRA templates/compute-domain-daemon.tmpl.yaml), so it cannot carry the stack's name.
COMPUTE_DOMAIN_DAEMON_SERVICE_ACCOUNT = "compute-domain-daemon-service-account"


class RenderError(ValueError):
    """A template produced something that is not a Kubernetes object."""


@dataclass(frozen=True)
class RenderInput:
    stack: GpuStack
    # Operand DaemonSets to render: the mode's, and the other one while nodes still run it.
    operands: frozenset[Mode]
    # resource.k8s.io version for DeviceClasses ("v1", "v1beta2", "v1beta1"); None: DeviceClasses left out.
    dra_api_version: str | None
    compat: Compat
    # Releases nodes are pinned to (a rolled-back node: deploy label value = the release): one extra
    # DaemonSet per (mode, release), selecting `<deploy label>=<release>`.
    pinned: frozenset[tuple[Mode, str]] = frozenset()
    # What each release's binaries require of their pods (compat/operands.yaml).
    operands_contract: OperandContract = field(default_factory=load_operands)
    # The cluster serves security.openshift.io (OpenShift): bind the operands' ServiceAccounts to the
    # SecurityContextConstraints NVIDIA's charts bind them to.
    openshift_scc: bool = False


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("gpuforge.render", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def template_names() -> list[str]:
    return sorted(n for n in _environment().list_templates() if n.endswith(".yaml.j2"))


def device_plugin_config(stack: GpuStack) -> Manifest:
    """The device plugin's config file (NVIDIA k8s-device-plugin `version: v1` format)."""
    spec = stack.spec.device_plugin
    config: Manifest = {
        "version": "v1",
        "flags": {
            "migStrategy": spec.mig_strategy.value,
            "failOnInitError": True,
            "plugin": {
                "passDeviceSpecs": False,
                "deviceListStrategy": DEVICE_LIST_STRATEGY,
                "deviceIDStrategy": "uuid",
            },
        },
    }
    time_slicing = spec.config.sharing.time_slicing
    if time_slicing is not None:
        config["sharing"] = {
            "timeSlicing": {
                "renameByDefault": time_slicing.rename_by_default,
                "failRequestsGreaterThanOne": time_slicing.fail_requests_greater_than_one,
                "resources": [{"name": GPU_RESOURCE, "replicas": time_slicing.replicas}],
            }
        }
    return config


def _image(repository: str, default_repository: str, version: str) -> str:
    return f"{repository or default_repository}:{version}"


def pinned_suffix(version: str) -> str:
    """`v0.17.0` -> `v0-17-0`: a release as part of an object name."""
    return "".join(ch if ch.isalnum() else "-" for ch in version.lower()).strip("-")


def _probe(probe: Probe | None) -> dict[str, int] | None:
    if probe is None:
        return None
    return {
        "periodSeconds": probe.period_seconds,
        "failureThreshold": probe.failure_threshold,
        "timeoutSeconds": probe.timeout_seconds,
    }


def _mig_needs(release: OperandRelease, mig_strategy: str) -> tuple[bool, dict[str, str]]:
    """(add CAP_SYS_ADMIN, extra env) for a device plugin advertising MIG devices."""
    if mig_strategy == "none":
        return False, {}
    return release.mig_needs_sys_admin, dict(release.mig_env)


@functools.cache
def compute_domain_crd(path: str) -> Manifest:
    """One of NVIDIA's ComputeDomain CRDs shipped in the package (render/crds/computedomains/<path>)."""
    text = resources.files("gpuforge.render").joinpath("crds", "computedomains", path).read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    if len(docs) != 1 or docs[0].get("kind") != "CustomResourceDefinition":
        raise RenderError(f"crds/computedomains/{path}: not one CustomResourceDefinition")
    crd: Manifest = docs[0]
    return crd


def _compute_domain_plugin(release: OperandRelease) -> dict[str, Any]:
    """The `compute-domains` container of a kubelet plugin DaemonSet at `release`."""
    return {
        "health_port": release.health_port,
        "startup_probe": _probe(release.startup_probe),
        "liveness_probe": _probe(release.liveness_probe),
        "host_dev": release.host_dev,
    }


def _compute_domains(inp: RenderInput) -> dict[str, Any]:
    name, contract = inp.stack.name, inp.operands_contract.compute_domains(inp.stack.spec.dra.version)
    crds = []
    for path in contract.crds:
        crd = copy.deepcopy(compute_domain_crd(path))
        crd["metadata"].setdefault("labels", {})[COMPONENT_LABEL] = COMPONENT_DRA_CONTROLLER
        crds.append(crd)
    return {
        "crds": crds,
        "controller_rules": list(contract.rbac.controller),
        "controller_namespaced_rules": list(contract.rbac.controller_namespaced),
        "plugin_rules": list(contract.rbac.kubelet_plugin),
        "plugin_namespaced_rules": list(contract.rbac.kubelet_plugin_namespaced),
        "daemon_rules": list(contract.rbac.daemon),
        "daemon_service_account": COMPUTE_DOMAIN_DAEMON_SERVICE_ACCOUNT,
        "daemon_cluster_role": f"gpuforge:{name}:compute-domain-daemon",
        "daemon_scc": contract.daemon_scc if inp.openshift_scc else None,
    }


def _daemonsets(inp: RenderInput, mode: Mode, base: str, repository: str) -> list[dict[str, Any]]:
    """The main DaemonSet of `mode` (deploy label "true") if it is an operand, plus one per pinned release."""
    main_version = (
        inp.stack.spec.device_plugin.version if mode is Mode.DEVICE_PLUGIN else inp.stack.spec.dra.version
    )
    wanted: list[tuple[str, str, bool]] = []  # (name, version, pinned)
    if mode in inp.operands:
        wanted.append((base, main_version, False))
    for pinned_mode, version in sorted(inp.pinned):
        if pinned_mode is mode and version != main_version:
            wanted.append((f"{base}-{pinned_suffix(version)}", version, True))
    out: list[dict[str, Any]] = []
    for name, version, pinned in wanted:
        release = (
            inp.compat.device_plugin_release(version)
            if mode is Mode.DEVICE_PLUGIN
            else inp.compat.dra_release(version)
        )
        contract = inp.operands_contract.release(
            DEVICE_PLUGIN if mode is Mode.DEVICE_PLUGIN else DRA_KUBELET_PLUGIN, version
        )
        compute_domains = (
            _compute_domain_plugin(inp.operands_contract.release(DRA_COMPUTE_DOMAIN_PLUGIN, version))
            if mode is Mode.DRA and _compute_domains_on(inp)
            else None
        )
        # vfio.gpu.nvidia.com: the gate and host mounts the chart adds with PassthroughSupport on
        passthrough = (
            contract.passthrough
            if mode is Mode.DRA and DEVICE_CLASS_VFIO in inp.stack.spec.dra.device_classes
            else None
        )
        out.append(
            {
                "name": name,
                "version": version,
                "deploy_value": version if pinned else "true",
                "pinned": pinned,
                "image": _image(repository, release.image, version),
                "health_port": contract.health_port,
                "startup_probe": _probe(contract.startup_probe),
                "liveness_probe": _probe(contract.liveness_probe),
                "compute_domains": compute_domains,
                "feature_gates": f"{passthrough.feature_gate}=true," if passthrough else None,
                "host_mounts": list(passthrough.mounts) if passthrough else [],
            }
        )
    return out


def _compute_domains_on(inp: RenderInput) -> bool:
    return (
        inp.stack.spec.dra.compute_domains and inp.compat.dra_release(inp.stack.spec.dra.version).controller
    )


def _context(inp: RenderInput) -> dict[str, Any]:
    stack, spec = inp.stack, inp.stack.spec
    name = stack.name
    pinned_modes = {mode for mode, _ in inp.pinned}
    dp = None
    if Mode.DEVICE_PLUGIN in inp.operands | pinned_modes:
        dp_release = inp.compat.device_plugin_release(spec.device_plugin.version)
        dp_contract = inp.operands_contract.release(DEVICE_PLUGIN, spec.device_plugin.version)
        mig_sys_admin, mig_env = _mig_needs(dp_contract, spec.device_plugin.mig_strategy.value)
        config_yaml = yaml.safe_dump(device_plugin_config(stack), sort_keys=False)
        dp = {
            "image": _image(spec.device_plugin.image, dp_release.image, spec.device_plugin.version),
            "daemonsets": _daemonsets(
                inp, Mode.DEVICE_PLUGIN, f"{name}-device-plugin", spec.device_plugin.image
            ),
            "config_yaml": config_yaml,
            "config_hash": hashlib.sha256(config_yaml.encode()).hexdigest()[:16],
            "mig_strategy": spec.device_plugin.mig_strategy.value,
            "runtime_class": spec.device_plugin.runtime_class_name,
            # on OpenShift the plugin runs as its own ServiceAccount, allowed its SCC
            "service_account": f"{name}-device-plugin"
            if inp.openshift_scc and dp_contract.openshift_scc
            else None,
            "scc": dp_contract.openshift_scc if inp.openshift_scc else None,
            "sys_admin": mig_sys_admin,
            "mig_env": mig_env,
        }
    dra = None
    if Mode.DRA in inp.operands | pinned_modes:
        release = inp.compat.dra_release(spec.dra.version)
        classes = []
        for class_name in sorted(spec.dra.device_classes):
            expression = (
                f"device.driver == '{DRA_DRIVER_GPU}' && "
                f"device.attributes['{DRA_DRIVER_GPU}'].type == '{_DEVICE_CLASS_TYPES[class_name]}'"
            )
            maps = class_name == DEVICE_CLASS_GPU and spec.dra.extended_resource_mapping
            classes.append(
                {
                    "name": class_name,
                    "expression": expression,
                    # The field exists only in the v1 DeviceClass (gated by DRAExtendedResource).
                    "extended_resource_name": GPU_RESOURCE if maps and inp.dra_api_version == "v1" else None,
                }
            )
        compute_domains = _compute_domains(inp) if _compute_domains_on(inp) else None
        if compute_domains is not None:
            classes += [
                {"name": class_name, "expression": expression, "extended_resource_name": None}
                for class_name, expression in COMPUTE_DOMAIN_DEVICE_CLASSES.items()
            ]
        plugin_scc = inp.operands_contract.compute_domains(spec.dra.version).kubelet_plugin_scc
        dra = {
            "image": _image(spec.dra.image, release.image, spec.dra.version),
            "daemonsets": _daemonsets(inp, Mode.DRA, f"{name}-dra-kubelet-plugin", spec.dra.image),
            "api_version": inp.dra_api_version,
            "device_classes": classes,
            "admission_policy": release.admission_policy,
            "admission_policy_name": f"gpuforge-{name}-resourceslices",
            "controller": compute_domains is not None,
            "compute_domains": compute_domains,
            "plugin_scc": plugin_scc if inp.openshift_scc else None,
            "service_account": f"{name}-dra-kubelet-plugin",
            "cluster_role": f"gpuforge:{name}:dra-kubelet-plugin",
        }
    pods = {
        "priority_class_name": spec.priority_class_name,
        "tolerations": to_dict(spec.tolerations),
        "image_pull_secrets": [{"name": secret} for secret in spec.image_pull_secrets],
        "resources": to_dict(spec.resources),
    }
    keys = {
        "managed_by": MANAGED_BY_LABEL,
        "managed_by_value": MANAGED_BY_VALUE,
        "stack": STACK_LABEL,
        "component": COMPONENT_LABEL,
        "device_plugin": COMPONENT_DEVICE_PLUGIN,
        "dra_kubelet_plugin": COMPONENT_DRA_KUBELET_PLUGIN,
        "dra_controller": COMPONENT_DRA_CONTROLLER,
        "deploy_device_plugin": DEPLOY_DEVICE_PLUGIN_LABEL,
        "deploy_dra_kubelet_plugin": DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
        "device_plugin_path": DEVICE_PLUGIN_PATH,
        "config_hash": CONFIG_HASH_ANNOTATION,
        "version": VERSION_LABEL,
        "pinned": PINNED_LABEL,
    }
    return {
        "name": name,
        "namespace": spec.namespace,
        "driver_root": spec.driver_root,
        "container_driver_root": CONTAINER_DRIVER_ROOT,
        "cdi_root": CDI_ROOT,
        "dp": dp,
        "dra": dra,
        "pods": pods,
        "k": keys,
    }


def render(inp: RenderInput) -> list[Manifest]:
    """All objects of the stack, in apply order (namespace, config, RBAC, classes, policy, workloads)."""
    context = _context(inp)
    objects: list[Manifest] = []
    for template_name in template_names():
        text = _environment().get_template(template_name).render(context)
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            if not isinstance(doc, dict) or not {"apiVersion", "kind", "metadata"} <= doc.keys():
                raise RenderError(f"{template_name}: not a Kubernetes object: {doc!r:.200}")
            labels = doc["metadata"].setdefault("labels", {})
            if COMPONENT_LABEL not in labels:
                raise RenderError(f"{template_name}: {doc['kind']} without a {COMPONENT_LABEL} label")
            labels.update({MANAGED_BY_LABEL: MANAGED_BY_VALUE, STACK_LABEL: inp.stack.name})
            objects.append(doc)
    return objects


def object_key(obj: Mapping[str, Any]) -> ObjectKey:
    api_version = str(obj["apiVersion"])
    group = api_version.rpartition("/")[0]
    meta = obj["metadata"]
    return (group, str(obj["kind"]), str(meta.get("namespace") or ""), str(meta["name"]))


def held_elsewhere(
    stack: GpuStack, mine: Sequence[Manifest], others: Iterable[tuple[GpuStack, Sequence[Manifest]]]
) -> set[ObjectKey]:
    """Keys of objects `stack` renders that an older stack renders too (a shared namespace, a
    DeviceClass): the oldest stack applies those, the others leave them alone."""
    my_keys = {object_key(o) for o in mine}
    taken: set[ObjectKey] = set()
    for other, objects in others:
        if other.age_key < stack.age_key:
            taken |= my_keys & {object_key(o) for o in objects}
    return taken
