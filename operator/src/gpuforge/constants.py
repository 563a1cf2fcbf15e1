"""Names shared by every part of gpuforge: API group, label and annotation keys.

Defined once here so the operator, the quota webhook, the simulated node agent and the Ansible
day-2 playbook (which copies the maintenance key) agree. Pure data, no I/O.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "gpuforge.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
FIELD_MANAGER: Final = "gpuforge"
FINALIZER: Final = f"{GROUP}/finalizer"

# --- Ownership: on every object the operator creates -----------------------------------------
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "gpuforge"
# Set to the GpuStack's name on everything rendered for that stack.
STACK_LABEL: Final = f"{GROUP}/stack"
# Which operand a pod/DaemonSet/Deployment is; the simulated node agent recognises plugin pods by it.
COMPONENT_LABEL: Final = f"{GROUP}/component"
COMPONENT_DEVICE_PLUGIN: Final = "device-plugin"
COMPONENT_DRA_KUBELET_PLUGIN: Final = "dra-kubelet-plugin"
COMPONENT_DRA_CONTROLLER: Final = "dra-controller"
COMPONENT_QUOTA_WEBHOOK: Final = "quota-webhook"
# Set by each quota webhook replica on its own pod: "true" while it takes the API server's calls (the
# leader; any replica while no leader does), which the webhook's Service selects (webhook.routing).
QUOTA_WEBHOOK_ENDPOINT_LABEL: Final = f"{GROUP}/quota-webhook-endpoint"
PLUGIN_COMPONENTS: Final = frozenset({COMPONENT_DEVICE_PLUGIN, COMPONENT_DRA_KUBELET_PLUGIN})

# --- Per-node gating: a plugin DaemonSet only runs where its deploy label is "true" ------------
DEPLOY_DEVICE_PLUGIN_LABEL: Final = f"{GROUP}/deploy.device-plugin"
DEPLOY_DRA_KUBELET_PLUGIN_LABEL: Final = f"{GROUP}/deploy.dra-kubelet-plugin"

# --- Upgrade engine (node state machine), see gpuforge.upgrade --------------------------------
NODE_STATE_LABEL: Final = f"{GROUP}/upgrade-state"
# Nodes carrying this label with value "true" are left alone by the upgrade engine.
UPGRADE_SKIP_LABEL: Final = f"{GROUP}/upgrade.skip"
# When the operator last took the node away from a GpuStack (RFC 3339). For a while after that, what the
# node still advertises is the departing plugin's, not another installation's (gpuforge.render.placement).
RELEASED_ANNOTATION: Final = f"{GROUP}/released-at"
# Set by the day-2 Ansible driver upgrade while it works on a node; the operator keeps off such nodes.
MAINTENANCE_ANNOTATION: Final = f"{GROUP}/maintenance"

# --- Quota ---------------------------------------------------------------------------------------
# Workloads name their GpuQuota with this label (on themselves or their pod template); only such
# objects reach the webhook, and from namespaces that require a quota also those naming none.
QUOTA_LABEL: Final = f"{GROUP}/quota"
# A namespace labelled with this set to "true" refuses workloads that take GPUs and name no quota.
QUOTA_REQUIRED_LABEL: Final = f"{GROUP}/quota-required"
GPU_MODEL_LABEL: Final = f"{GROUP}/gpu-model"
# A namespace labelled with this names the GpuQuota its workloads that take GPUs and name none are
# charged to (a label, not an annotation: the webhook's namespaceSelector can then send only those).
DEFAULT_QUOTA_LABEL: Final = f"{GROUP}/default-quota"
# Node labels that name a node's CPU model and memory type (machine types a platform defines, e.g. A4),
# which per-model `limits.cpu.<model>` and `requests.memory.<type>` keys are proven by. Set by whoever
# builds the pool (kubelet --node-labels, NFD's local feature files or a NodeFeatureRule).
CPU_MODEL_NODE_LABEL: Final = f"{GROUP}/cpu-model"
MEMORY_TYPE_NODE_LABEL: Final = f"{GROUP}/memory-type"

# --- Resources and drivers -----------------------------------------------------------------------
GPU_RESOURCE: Final = "nvidia.com/gpu"
# What NVIDIA's device plugin advertises besides nvidia.com/gpu: `nvidia.com/gpu.shared` with time
# slicing's renameByDefault (consts.go DefaultSharedResourceNameSuffix) and `nvidia.com/mig-<profile>`
# (and `.shared`) with the mixed MIG strategy.
GPU_SHARED_SUFFIX: Final = ".shared"
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"


def is_gpu_resource(name: str) -> bool:
    """Whether an extended resource is one of the GPUs (or GPU slices) NVIDIA's device plugin advertises."""
    return name in (GPU_RESOURCE, GPU_RESOURCE + GPU_SHARED_SUFFIX) or name.startswith(MIG_RESOURCE_PREFIX)


DRA_DRIVER_GPU: Final = "gpu.nvidia.com"
# The driver name the compute-domain kubelet plugin publishes its devices under (DRA chart
# deviceclass-compute-domain-*.yaml).
# OpenShift's SecurityContextConstraints API; where it is served, operand ServiceAccounts are bound to SCCs.
OPENSHIFT_SCC_GROUP: Final = "security.openshift.io"
DRA_DRIVER_COMPUTE_DOMAIN: Final = "compute-domain.nvidia.com"
DEVICE_PLUGIN_PATH: Final = "/var/lib/kubelet/device-plugins"

# --- NVIDIA's GPU Operator ---------------------------------------------------------------------------
# Its per-node deploy labels for the operands that advertise GPUs (controllers/state_manager.go
# gpuStateLabels): "true" where its device plugin or DRA driver runs. A second plugin on such a node
# would advertise the same GPUs twice.
GPU_OPERATOR_DEPLOY_LABELS: Final = (
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.dra-driver",
)

# --- Labels NFD and GPU Feature Discovery put on GPU nodes ----------------------------------------
NFD_PCI_NVIDIA_LABELS: Final = (
    "feature.node.kubernetes.io/pci-10de.present",  # deviceLabelFields: [vendor], as NVIDIA's charts set
    "feature.node.kubernetes.io/pci-0302_10de.present",  # default [class, vendor]: 3D controller
    "feature.node.kubernetes.io/pci-0300_10de.present",  # default [class, vendor]: VGA controller
    "nvidia.com/gpu.present",
)
# Jetson and IGX (Tegra) GPUs sit on no PCI bus; NVIDIA's charts select them by CPU vendor instead.
NFD_TEGRA_LABEL: Final = ("feature.node.kubernetes.io/cpu-model.vendor_id", "NVIDIA")
GFD_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GFD_COUNT_LABEL: Final = "nvidia.com/gpu.count"
GFD_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"  # MiB

# --- Simulation only (the local control plane); never read by the operator -------------------------
# Pool a simulated node belongs to.
SIM_POOL_LABEL: Final = f"sim.{GROUP}/pool"
# "true" on a node whose containerd runs nvidia-container-runtime by default; absent: runc (as gpuforge's
# toolkit role and the GPU Operator in CDI mode leave it).
SIM_NVIDIA_DEFAULT_RUNTIME_LABEL: Final = f"sim.{GROUP}/nvidia-default-runtime"
# "true" on a node whose GPUs are in MIG mode.
SIM_MIG_ENABLED_LABEL: Final = f"sim.{GROUP}/mig-enabled"
# On a plugin pod (or its pod template): "never-ready" keeps it unready, "crash" makes it crash-loop.
SIM_FAIL_ANNOTATION: Final = f"sim.{GROUP}/fail"
# An image tag ending in one of these has the same effect, so a "bad version" can be rolled out.
SIM_FAIL_TAG_SUFFIXES: Final = {"-sim-never-ready": "never-ready", "-sim-crash": "crash"}
