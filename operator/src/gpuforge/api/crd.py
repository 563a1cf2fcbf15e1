"""The GpuStack CustomResourceDefinition, built next to the typed model. No I/O.

`operator/deploy/crds/gpustacks.gpuforge.io.yaml` is this dict written out by
`python -m gpuforge.api.crd > operator/deploy/crds/gpustacks.gpuforge.io.yaml`; unit tests fail when the
file, the schema and the dataclasses in `gpuforge.api.gpustack` disagree (fields or defaults).
Validation happens at apply time so that a bad GpuStack never reaches the operator: enums, patterns,
bounds, and CEL rules whose messages name the field.
"""

from __future__ import annotations

import enum
import sys
from typing import Any

import yaml

from gpuforge.api import gpustack as m
from gpuforge.api.convert import to_dict
from gpuforge.constants import GROUP, VERSION

Schema = dict[str, Any]

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Image repository (no tag: the tag is the version field); empty means "the release's default".
IMAGE_PATTERN = r"^$|^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$"
MAX_STACK_NAME = 40


def _obj(
    desc: str,
    props: dict[str, Schema],
    *,
    default: Any = None,
    required: tuple[str, ...] = (),
    rules: tuple[Schema, ...] = (),
) -> Schema:
    schema: Schema = {"type": "object", "description": desc, "properties": props}
    if required:
        schema["required"] = list(required)
    if default is not None:
        schema["default"] = default
    if rules:
        schema["x-kubernetes-validations"] = list(rules)
    return schema


def _str(
    desc: str,
    *,
    default: str | None = None,
    choices: type[enum.Enum] | None = None,
    pattern: str | None = None,
    max_length: int | None = None,
) -> Schema:
    schema: Schema = {"type": "string", "description": desc}
    if choices is not None:
        schema["enum"] = [member.value for member in choices]
    if pattern is not None:
        schema["pattern"] = pattern
    if max_length is not None:
        schema["maxLength"] = max_length
    if default is not None:
        schema["default"] = default
    return schema


def _int(desc: str, *, default: int | None = None, minimum: int | None = 0) -> Schema:
    schema: Schema = {"type": "integer", "format": "int32", "description": desc}
    if minimum is not None:
        schema["minimum"] = minimum
    if default is not None:
        schema["default"] = default
    return schema


def _bool(desc: str, default: bool | None = None) -> Schema:
    schema: Schema = {"type": "boolean", "description": desc}
    if default is not None:
        schema["default"] = default
    return schema


def _arr(
    desc: str,
    items: Schema,
    *,
    default: Any = None,
    min_items: int | None = None,
    list_type: str = "atomic",
    max_items: int | None = None,
) -> Schema:
    schema: Schema = {
        "type": "array",
        "description": desc,
        "items": items,
        "x-kubernetes-list-type": list_type,
    }
    if min_items is not None:
        schema["minItems"] = min_items
    if max_items is not None:
        schema["maxItems"] = max_items
    if default is not None:
        schema["default"] = default
    return schema


def _quantities(desc: str) -> Schema:
    return {
        "type": "object",
        "description": desc,
        "additionalProperties": {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
        },
    }


def _rule(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> Schema:
    out: Schema = {"rule": rule, "message": message}
    if field_path is not None:
        out["fieldPath"] = field_path
    if reason is not None:
        out["reason"] = reason
    return out


def _node_selector() -> Schema:
    requirement = _obj(
        "A label requirement on the node.",
        {
            "key": _str("Node label key.", max_length=317),
            "operator": _str("How the key's value is compared.", choices=m.SelectorOperator),
            "values": _arr(
                "Values for In/NotIn (one or more), Gt/Lt (exactly one integer).",
                _str("Value.", max_length=63),
                max_items=64,
            ),
        },
        required=("key", "operator"),
        rules=(
            _rule(
                "self.operator in ['Exists', 'DoesNotExist'] ? !has(self.values) || size(self.values) == 0"
                " : has(self.values) && size(self.values) > 0",
                "values must be empty for Exists/DoesNotExist and non-empty for In/NotIn/Gt/Lt",
                ".values",
            ),
            _rule(
                "!(self.operator in ['Gt', 'Lt'])"
                " || (size(self.values) == 1 && self.values[0].matches('^-?[0-9]+$'))",
                "Gt/Lt need exactly one integer value",
                ".values",
            ),
        ),
    )
    term = _obj(
        "Expressions that must all match (AND).",
        {"matchExpressions": _arr("Label requirements.", requirement, min_items=1, max_items=32)},
        required=("matchExpressions",),
    )
    return _obj(
        "Which nodes are the stack's GPU nodes: a node is selected when any term matches (OR). "
        "Default: nodes Node Feature Discovery marks as having an NVIDIA PCI device (any label variant).",
        {"nodeSelectorTerms": _arr("Terms, ORed.", term, min_items=1, max_items=16)},
        required=("nodeSelectorTerms",),
        default=to_dict(m.GpuStackSpec().node_selector),
    )


def _device_plugin() -> Schema:
    time_slicing = _obj(
        "Advertise each GPU several times; pods share it by time slicing (no memory isolation).",
        {
            "replicas": _int(
                "Advertised replicas per GPU (NVIDIA's plugin refuses fewer than 2).", default=2, minimum=2
            ),
            "renameByDefault": _bool("Advertise nvidia.com/gpu.shared instead of nvidia.com/gpu.", False),
            "failRequestsGreaterThanOne": _bool("Reject requests for more than one shared GPU.", False),
        },
    )
    return _obj(
        "The NVIDIA device plugin (extended resource nvidia.com/gpu).",
        {
            "version": _str(
                "Release tag.", default=m.DEFAULT_DEVICE_PLUGIN_VERSION, pattern=m.VERSION_PATTERN
            ),
            "image": _str(
                "Image repository without tag; empty: the release's own.",
                default="",
                pattern=IMAGE_PATTERN,
                max_length=255,
            ),
            "config": _obj(
                "Plugin configuration file.",
                {"sharing": _obj("GPU sharing.", {"timeSlicing": time_slicing}, default={})},
                default={},
            ),
            "migStrategy": _str(
                "How MIG devices are advertised.", default=m.MigStrategy.NONE.value, choices=m.MigStrategy
            ),
            "runtimeClassName": _str(
                "RuntimeClass of the plugin pods, created by the operator with the handler of the same "
                "name; empty: none (only where nvidia is containerd's default runtime on every node).",
                default="nvidia",
                pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$",
                max_length=253,
            ),
        },
        default={},
    )


def _dra() -> Schema:
    return _obj(
        "The NVIDIA DRA driver (driver gpu.nvidia.com, ResourceSlices and DeviceClasses).",
        {
            "version": _str("Release tag.", default=m.DEFAULT_DRA_DRIVER_VERSION, pattern=m.VERSION_PATTERN),
            "image": _str(
                "Image repository without tag; empty: the release's own.",
                default="",
                pattern=IMAGE_PATTERN,
                max_length=255,
            ),
            "deviceClasses": _arr(
                "DeviceClasses to create (vfio.gpu.nvidia.com needs DRA driver v25.12.0 or later).",
                _str("DeviceClass.")
                | {"enum": [m.DEVICE_CLASS_GPU, m.DEVICE_CLASS_MIG, m.DEVICE_CLASS_VFIO]},
                default=[m.DEVICE_CLASS_GPU],
                min_items=1,
                list_type="set",
            ),
            "extendedResourceMapping": _bool(
                "Map the nvidia.com/gpu extended resource onto gpu.nvidia.com devices (DeviceClass "
                "extendedResourceName; written where the served DeviceClass API is v1).",
                True,
            ),
            "computeDomains": _bool(
                "Deploy ComputeDomains (multi-node NVLink): NVIDIA's CRDs, controller, kubelet plugin "
                "container, DeviceClasses and RBAC; turning it off removes them.",
                False,
            ),
        },
        default={},
    )


def _toleration() -> Schema:
    return _obj(
        "A toleration added to the operand pods.",
        {
            "key": _str("Taint key; empty with operator Exists tolerates everything."),
            "operator": _str("Exists or Equal.", choices=m.TolerationOperator, default="Equal"),
            "value": _str("Taint value (operator Equal)."),
            "effect": _str("Taint effect; empty matches all.", choices=m.TaintEffect),
            "tolerationSeconds": _int("For NoExecute: how long the pod stays bound.", minimum=None),
        },
        rules=(
            _rule(
                "self.operator != 'Exists' || !has(self.value) || self.value == ''",
                "value must be empty when operator is Exists",
                ".value",
            ),
        ),
    )


def _upgrade_policy() -> Schema:
    selector_desc = "Label selector (kubectl syntax) of the pods concerned; empty: all GPU pods."
    return _obj(
        "How the operator changes what runs on nodes (versions, mode switches): a few nodes at a time.",
        {
            "maxUnavailable": {
                "x-kubernetes-int-or-string": True,
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "description": "Nodes out of service at once: a count or a percentage of the stack's nodes. "
                "Cordoned and NotReady nodes count.",
                "default": "25%",
                "x-kubernetes-validations": [
                    _rule(
                        "type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",
                        "must be a non-negative integer or a percentage such as '25%'",
                    )
                ],
            },
            "maxParallel": _int(
                "Nodes changed at once; 0: unlimited (maxUnavailable still applies).", default=1
            ),
            "waitForCompletion": _obj(
                "Wait for selected pods on a node to finish before changing it.",
                {
                    "podSelector": _str(selector_desc, default=""),
                    "timeoutSeconds": _int("0: wait forever.", default=0),
                },
                default={},
            ),
            "drain": _obj(
                "Drain the node (eviction API, PodDisruptionBudgets honoured).",
                {
                    "enable": _bool("Drain before changing a node.", False),
                    "force": _bool("Also delete pods not managed by a controller.", False),
                    "timeoutSeconds": _int("0: no timeout.", default=300),
                    "podSelector": _str(selector_desc, default=""),
                    "deleteEmptyDir": _bool("Also evict pods using emptyDir volumes.", False),
                },
                default={},
            ),
            "podDeletion": _obj(
                "Evict the node's GPU pods before changing it.",
                {
                    "enable": _bool("Delete GPU pods on the node.", True),
                    "force": _bool("Also delete pods not managed by a controller.", False),
                    "timeoutSeconds": _int("0: no timeout.", default=300),
                    "deleteEmptyDir": _bool("Also delete pods using emptyDir volumes.", False),
                },
                default={},
            ),
            "onFailure": _str(
                "A node failing its step: halt the rollout, or roll that node back.",
                default=m.OnFailure.HALT.value,
                choices=m.OnFailure,
            ),
            "maxFailures": _int(
                "No new node starts once this many failed on the current target; 0: never stop.", default=1
            ),
            "paused": _bool("Stop starting new node changes.", False),
            "stepTimeoutSeconds": _int(
                "Sets all four step timeouts at once (a node waiting longer in a step fails); 0: no limit."
            ),
            "stepTimeouts": _obj(
                "Seconds a node may wait in each step before it fails; 0: no limit.",
                {
                    "waitOldGone": _int("Until the old stack's pod and advertisement are gone (600)."),
                    "operandRestart": _int("Until the DaemonSet recreated the plugin pod (600)."),
                    "validation": _int("Until the new plugin is Ready and advertising (600)."),
                    "rollback": _int("Until a rolled-back node serves again (900)."),
                },
                default={},
            ),
        },
        default={},
    )


def _quota() -> Schema:
    return _obj(
        "The hierarchical GPU quota admission webhook (GpuQuota). One GpuStack at most deploys it (the "
        "oldest with enabled: true). Disabling it removes the webhook but keeps the GpuQuota CRD.",
        {
            "enabled": _bool("Deploy the GpuQuota CRD and the webhook, and register the webhook.", False),
            "webhook": _obj(
                "Where the API server reaches the webhook. Empty url: the operator runs it in the "
                "stack's namespace behind a Service, with a CA and serving certificate it makes and rotates.",
                {
                    "url": _str(
                        "https URL of a webhook served outside the cluster (e.g. `gpuforge webhook run`); "
                        "only the CRD and webhook configurations are deployed then.",
                        default="",
                        pattern=r"^$|^https://",
                    ),
                    "caBundle": _str(
                        "Base64 of the PEM CA bundle the API server verifies the url's certificate with "
                        "(as in a webhook configuration); empty: the API server's trust roots.",
                        default="",
                        pattern=r"^[A-Za-z0-9+/=\s]*$",
                    ),
                },
                default={},
            ),
            "failurePolicy": _str(
                "What the API server does with a labelled workload when the webhook cannot be reached.",
                default=m.FailurePolicy.FAIL.value,
                choices=m.FailurePolicy,
            ),
            "replicas": _int(
                "Webhook replicas (at least 2: a fail-closed webhook must survive a node drain).",
                default=2,
                minimum=2,
            ),
            "image": _str("Webhook image (with tag); empty: the operator's own release.", default=""),
        },
        default={},
    )


def spec_schema() -> Schema:
    return _obj(
        "What the GPU nodes the stack selects should run.",
        {
            "mode": _str(
                "devicePlugin: the NVIDIA device plugin; dra: the NVIDIA DRA driver.",
                default=m.Mode.DEVICE_PLUGIN.value,
                choices=m.Mode,
            ),
            "nodeSelector": _node_selector(),
            "devicePlugin": _device_plugin(),
            "dra": _dra(),
            "namespace": _str(
                "Namespace of the operand pods (created and labelled for Pod Security).",
                default=m.DEFAULT_NAMESPACE,
                pattern=DNS_LABEL_PATTERN,
                max_length=63,
            ),
            "tolerations": _arr(
                "Tolerations of the operand pods.", _toleration(), default=to_dict(m.DEFAULT_TOLERATIONS)
            ),
            "driverRoot": _str(
                "Host path of the NVIDIA driver on the nodes: / (host install), /run/nvidia/driver (GPU "
                "Operator driver container), /home/kubernetes/bin/nvidia (GKE).",
                default="/",
                pattern=r"^/([A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*)?$",
                max_length=255,
            ),
            "priorityClassName": _str(
                "PriorityClass of the operand pods.", default=m.DEFAULT_PRIORITY_CLASS, max_length=253
            ),
            "imagePullSecrets": _arr(
                "Secrets (in the operand namespace) to pull images with.",
                _str("Secret name.", pattern=DNS_SUBDOMAIN_PATTERN, max_length=253),
                default=[],
                list_type="set",
            ),
            "resources": _obj(
                "Compute resources of the plugin containers.",
                {
                    "requests": _quantities("Requests, e.g. cpu: 10m."),
                    "limits": _quantities("Limits, e.g. memory: 200Mi."),
                },
                default={},
            ),
            "upgradePolicy": _upgrade_policy(),
            "quota": _quota(),
        },
        default={},
    )


def _condition() -> Schema:
    return _obj(
        "Standard condition.",
        {
            "type": _str("Ready, Progressing or Degraded."),
            "status": _str("True, False or Unknown.") | {"enum": ["True", "False", "Unknown"]},
            "reason": _str("CamelCase reason."),
            "message": _str("Human-readable details; names nodes and stacks."),
            "lastTransitionTime": _str("When status last changed.") | {"format": "date-time"},
            "observedGeneration": _int("Generation the condition was computed from.", minimum=None)
            | {"format": "int64"},
        },
        required=("type", "status", "reason"),
    )


def status_schema() -> Schema:
    counts = {
        "total": "Nodes the selector matches.",
        "ready": "Nodes whose plugin is Ready and advertises GPUs.",
        "pending": "Nodes waiting for their plugin.",
        "switching": "Nodes moving from one mode to the other.",
        "refused": "Nodes the spec cannot serve (kubelet or API versions).",
        "conflict": "Nodes held by an older GpuStack.",
    }
    return _obj(
        "Observed state, written by the operator.",
        {
            "observedGeneration": _int("Generation last reconciled.", minimum=None) | {"format": "int64"},
            "phase": _str("Summary for humans.", choices=m.Phase),
            "conditions": {
                **_arr(
                    "Ready, Progressing, Degraded; QuotaWebhookReady when quota is enabled.",
                    _condition(),
                    list_type="map",
                ),
                "x-kubernetes-list-map-keys": ["type"],
            },
            "nodes": _obj("Selected nodes per state.", {k: _int(v) for k, v in counts.items()}),
            "nodesReady": _str("ready/total, for kubectl get."),
            "version": _str("Version of the operand the mode selects."),
            "operands": _obj(
                "Operand versions deployed.",
                {
                    "devicePlugin": _str("Device plugin release."),
                    "draDriver": _str("DRA driver release."),
                },
            ),
            "draApiVersion": _str("resource.k8s.io version the DeviceClasses are written in."),
            "servedElsewhere": _arr(
                "Selected nodes whose GPUs another installation serves (NVIDIA's GPU Operator, a device "
                "plugin or DRA driver gpuforge did not deploy); gpuforge runs no plugin there. The first "
                f"{m.ELSEWHERE_LISTED} by name.",
                _obj(
                    "One such node.",
                    {
                        "node": _str("Node name."),
                        "reason": _str("What shows that another installation serves it."),
                    },
                    required=("node", "reason"),
                ),
                max_items=m.ELSEWHERE_LISTED,
            ),
            "upgrade": {
                "type": "object",
                "description": "Upgrade engine progress (gpuforge.upgrade).",
                "x-kubernetes-preserve-unknown-fields": True,
            },
        },
    )


def build_crd() -> dict[str, Any]:
    schema: Schema = {
        "type": "object",
        "description": "GpuStack: which GPU stack (device plugin or DRA driver) a group of nodes runs.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "x-kubernetes-validations": [
            _rule(
                f"size(self.metadata.name) <= {MAX_STACK_NAME}",
                f"metadata.name must be at most {MAX_STACK_NAME} characters (it prefixes the names of the "
                "objects the stack creates)",
            ),
        ],
    }
    columns = [
        {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
        {"name": "Version", "type": "string", "jsonPath": ".status.version"},
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": ".status.nodesReady",
            "description": "ready/total nodes",
        },
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{m.PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "gpuforge", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": m.KIND,
                "listKind": f"{m.KIND}List",
                "plural": m.PLURAL,
                "singular": m.SINGULAR,
                "shortNames": list(m.SHORT_NAMES),
                "categories": ["gpuforge"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = (
        "# Generated by `python -m gpuforge.api.crd` from operator/src/gpuforge/api/crd.py; do not edit.\n"
        "# tests/unit/api/test_crd.py fails when this file and the typed model drift apart.\n"
    )
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=110)


if __name__ == "__main__":
    sys.stdout.write(crd_yaml())
