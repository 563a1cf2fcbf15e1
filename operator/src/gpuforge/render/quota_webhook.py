"""What the operator deploys for a GpuStack with `quota.enabled`: the GpuQuota webhook. No I/O.

Two ways the API server can reach the webhook:
- service mode (default): the webhook runs in the cluster as a Deployment (replicas spread over nodes,
  a PodDisruptionBudget, probes on /healthz and /readyz) behind a Service; the operator's CA signs its
  serving certificate, which is mounted from a Secret, and is injected as the caBundle.
- url mode (`quota.webhook.url`): the webhook runs outside the cluster; only the GpuQuota CRD and the
  ValidatingWebhookConfigurations (that URL, `quota.webhook.caBundle`) are deployed here.

The webhook's admission is cluster-wide, so one GpuStack at most deploys it: the oldest with
`quota.enabled` (`quota_holder`); the others report so in their condition. Names are fixed, which lets
the operator's RBAC name each object it may touch (`operator/deploy/rbac-quota.yaml`).
Objects are built as dicts (not templates): the webhook configurations are dicts already, and the
Secrets carry generated data.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import yaml

from gpuforge import __version__
from gpuforge.api.gpuquota import CRD_NAME as GPUQUOTA_CRD_NAME
from gpuforge.api.gpuquota import PLURAL as GPUQUOTA_PLURAL
from gpuforge.api.gpustack import Condition, FailurePolicy, GpuStack
from gpuforge.api.workloadkinds import plurals_by_group
from gpuforge.constants import (
    COMPONENT_LABEL,
    COMPONENT_QUOTA_WEBHOOK,
    GROUP,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    QUOTA_WEBHOOK_ENDPOINT_LABEL,
    STACK_LABEL,
)
from gpuforge.render.certs import CertPlan, KeyPair, service_dns_names
from gpuforge.render.webhook_configurations import (
    DEFAULT_TIMEOUT_SECONDS,
    ClientTarget,
    render_webhook_configurations,
)

Manifest = dict[str, Any]
# (apiVersion, kind, namespace, name): an object the quota deployment may have made.
QuotaRef = tuple[str, str, str, str]

NAME: Final = "gpuforge-quota-webhook"  # Deployment, Service, PodDisruptionBudget, ServiceAccount
CA_SECRET: Final = "gpuforge-quota-webhook-ca"
TLS_SECRET: Final = "gpuforge-quota-webhook-tls"
CLUSTER_ROLE: Final = "gpuforge:quota-webhook"  # and its ClusterRoleBinding
ENDPOINT_ROLE: Final = "gpuforge:quota-webhook-endpoint"  # Role and RoleBinding in the webhook's namespace
CONFIGURATION_PREFIX: Final = "gpuforge-quota"
CONFIGURATIONS: Final = (f"{CONFIGURATION_PREFIX}-workloads", f"{CONFIGURATION_PREFIX}-tree")
PORT: Final = 8443
TLS_DIR: Final = "/etc/gpuforge/quota-webhook/tls"
DEFAULT_IMAGE: Final = f"ghcr.io/gpuforge/gpuforge:{__version__}"
PRIORITY_CLASS: Final = "system-cluster-critical"
# Keys of the CA Secret.
CA_CERT_KEY: Final = "ca.crt"
CA_KEY_KEY: Final = "ca.key"
PREVIOUS_CA_KEY: Final = "previous-ca.crt"

# --- status: the condition type, its reasons, and event reasons ---------------------------------
CONDITION: Final = "QuotaWebhookReady"
# True: the configurations are registered and at least one replica is available (service mode).
AVAILABLE: Final = "WebhookAvailable"
# True: the configurations point at the external URL of quota.webhook.url.
EXTERNAL: Final = "ExternalWebhook"
# False: deployed, no replica available yet; the configurations are registered once one is.
WAITING: Final = "WaitingForReplicas"
# False: registered, but no replica is available (failurePolicy decides what the API server does).
UNAVAILABLE: Final = "WebhookUnavailable"
# False: an older GpuStack deploys the quota webhook; only one may.
ELSEWHERE: Final = "HeldByOtherStack"
# False: applying or pruning failed; the message has the API error.
APPLY_FAILED: Final = "ApplyFailed"
# False: quota was disabled (or the stack is going); the webhook objects are being removed.
REMOVING: Final = "Removing"
EVENT_CERT_ISSUED: Final = "QuotaCertificateIssued"
EVENT_CERT_ROTATED: Final = "QuotaCertificateRotated"
EVENT_CA_ROTATED: Final = "QuotaCaRotated"
EVENT_REGISTERED: Final = "QuotaWebhookRegistered"
EVENT_REMOVED: Final = "QuotaWebhookRemoved"


class QuotaSpecError(ValueError):
    """The quota part of the spec cannot be deployed (the message names the field)."""


@functools.cache
def gpuquota_crd() -> Manifest:
    """The GpuQuota CRD shipped in the package (a copy of operator/deploy/crds/; a unit test keeps them
    equal). Deployed when quota is enabled and never removed: deleting a CRD deletes every GpuQuota."""
    text = resources.files("gpuforge.render").joinpath("crds", f"{GPUQUOTA_CRD_NAME}.yaml").read_text()
    crd: Manifest = yaml.safe_load(text)
    return crd


def quota_holder(stacks: Sequence[GpuStack]) -> str | None:
    """The GpuStack that deploys the quota webhook: the oldest with quota.enabled."""
    enabled = sorted((s for s in stacks if s.spec.quota.enabled), key=lambda s: s.age_key)
    return enabled[0].name if enabled else None


def external_ca_bundle(stack: GpuStack) -> bytes:
    """quota.webhook.caBundle decoded (base64 of PEM, as in a webhook configuration); b"" if unset."""
    text = "".join(stack.spec.quota.webhook.ca_bundle.split())
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise QuotaSpecError(f"spec.quota.webhook.caBundle is not base64: {err}") from err


def serving_hosts(namespace: str) -> list[str]:
    return service_dns_names(NAME, namespace)


@dataclass(frozen=True)
class StoredCerts:
    """What the CA and serving Secrets hold (None: missing or unreadable)."""

    ca: KeyPair | None = None
    serving: KeyPair | None = None
    previous_ca_pem: bytes | None = None


def _decoded(data: Mapping[str, str], key: str) -> bytes | None:
    value = data.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def stored_certs(ca_secret: Mapping[str, Any] | None, tls_secret: Mapping[str, Any] | None) -> StoredCerts:
    """The PEMs in the two Secrets as read from the API (`data` is base64)."""
    ca_data = (ca_secret or {}).get("data") or {}
    tls_data = (tls_secret or {}).get("data") or {}
    ca_cert, ca_key = _decoded(ca_data, CA_CERT_KEY), _decoded(ca_data, CA_KEY_KEY)
    cert, key = _decoded(tls_data, "tls.crt"), _decoded(tls_data, "tls.key")
    return StoredCerts(
        KeyPair(ca_cert, ca_key) if ca_cert and ca_key else None,
        KeyPair(cert, key) if cert and key else None,
        _decoded(ca_data, PREVIOUS_CA_KEY),
    )


@dataclass(frozen=True)
class QuotaInput:
    stack: GpuStack
    # Service mode: the certificates to store and inject; None in url mode.
    certs: CertPlan | None
    # Whether to render the ValidatingWebhookConfigurations (service mode registers them only once a
    # replica is available, or when they are registered already, so installing never blocks the API).
    register: bool = True
    image: str = DEFAULT_IMAGE
    # Whether the Service selects only the replica(s) taking calls (`routes_to_leader`).
    route_to_leader: bool = False


def _labels(stack: GpuStack) -> dict[str, str]:
    return {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        STACK_LABEL: stack.name,
        COMPONENT_LABEL: COMPONENT_QUOTA_WEBHOOK,
    }


def _selector(stack: GpuStack) -> dict[str, str]:
    """The webhook's pods (a new dict each time: no object shares parts with another). Not the stack's
    name: there is one webhook per cluster, and another stack taking it over in the same namespace then
    changes labels only (a Deployment's selector is immutable)."""
    return {COMPONENT_LABEL: COMPONENT_QUOTA_WEBHOOK}


def _meta(stack: GpuStack, name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": _labels(stack)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _rule(group: str, resources_: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources_, "verbs": verbs}


# What the webhook and its usage controller do (gpuforge.webhook, gpuforge.k8s.quota).
WEBHOOK_RULES: Final = (
    # Read quotas (informer: list, watch; admission: get) and write reservations and usage (PUT status).
    _rule(GROUP, [GPUQUOTA_PLURAL], ["get", "list", "watch"]),
    _rule(GROUP, [f"{GPUQUOTA_PLURAL}/status"], ["update"]),
    # Labelled workloads (informers: list, watch; the scale webhook gets the workload it scales).
    *(_rule(group, plurals, ["get", "list", "watch"]) for group, plurals in plurals_by_group()),
    # Namespaces' labels: which namespaces may charge a quota (informer; get for one not cached yet).
    _rule("", ["namespaces"], ["get", "list", "watch"]),
    # LimitRanges' container defaults, counted as the pods will get them (informer).
    _rule("", ["limitranges"], ["list", "watch"]),
    # Whether a user may create a root GpuQuota (verb "root"): one SubjectAccessReview per root write.
    _rule("authorization.k8s.io", ["subjectaccessreviews"], ["create"]),
    # Devices asked for through DRA: claim templates and claims a workload references.
    _rule("resource.k8s.io", ["resourceclaims", "resourceclaimtemplates"], ["get", "list"]),
    # DeviceClasses' extended resource names: which GPUs asked for by name DRA may serve (informer).
    _rule("resource.k8s.io", ["deviceclasses"], ["list", "watch"]),
    # BudgetExhausted and denial events on GpuQuotas.
    _rule("", ["events"], ["create"]),
    # Leader election of the usage controller: one replica writes recomputed usage (webhook.leader).
    _rule("coordination.k8s.io", ["leases"], ["get", "create", "update"]),
)


# In the webhook's namespace only: each replica labels its own pod QUOTA_WEBHOOK_ENDPOINT_LABEL, which the
# Service selects, so the API server calls the leader and not a follower that would forward the call.
ENDPOINT_RULES: Final = (_rule("", ["pods"], ["patch"]),)


def _deployment(inp: QuotaInput, namespace: str) -> Manifest:
    stack, quota = inp.stack, inp.stack.spec.quota
    probe: dict[str, Any] = {
        "httpGet": {"path": "/healthz", "port": "https", "scheme": "HTTPS"},
        "timeoutSeconds": 3,
    }
    container = {
        "name": "webhook",
        "image": quota.image or inp.image,
        "args": [
            "webhook",
            "run",
            "--host=0.0.0.0",
            f"--port={PORT}",
            f"--cert={TLS_DIR}/tls.crt",
            f"--key={TLS_DIR}/tls.key",
            # Followers verify the leader with it before forwarding admission requests to it.
            f"--ca={TLS_DIR}/ca.crt",
            # The configurations' timeoutSeconds: a new leader waits it out (docs/quota.md, Concurrency).
            f"--timeout={DEFAULT_TIMEOUT_SECONDS}",
            # The Service reaches the leader only (a follower steps out by its pod's label).
            "--route=pod-label",
        ],
        # The Lease holder's identity, and the address followers forward to.
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "ports": [{"name": "https", "containerPort": PORT}],
        "readinessProbe": {**probe, "httpGet": {**probe["httpGet"], "path": "/readyz"}, "periodSeconds": 5},
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "periodSeconds": 20, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": NAME,
        "priorityClassName": PRIORITY_CLASS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            # The kubelet gives the Secret's files this group, so the 0440 key is readable by the webhook.
            "fsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # Preferred, not required: replicas spread over nodes (and zones) when there are enough, yet
        # a small cluster still runs all of them and a surge pod during a rollout always has a place.
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": _selector(stack)},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    },
                    {
                        "weight": 50,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": _selector(stack)},
                            "topologyKey": "topology.kubernetes.io/zone",
                        },
                    },
                ]
            }
        },
        "containers": [container],
        "volumes": [
            # The kubelet swaps the files when the Secret changes; the webhook reloads them.
            {"name": "tls", "secret": {"secretName": TLS_SECRET, "defaultMode": 0o440}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}},
        ],
    }
    if stack.spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in stack.spec.image_pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(stack, NAME, namespace),
        "spec": {
            "replicas": quota.replicas,
            "selector": {"matchLabels": _selector(stack)},
            # Never below the desired count during a rollout: a fail-closed webhook must keep serving.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {
                    # Every replica starts as an endpoint: one that has not decided yet (or an older
                    # version during an upgrade, which never labels itself) still takes calls.
                    "labels": {**_labels(stack), QUOTA_WEBHOOK_ENDPOINT_LABEL: "true"},
                    # /metrics is served on the webhook's HTTPS port.
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(PORT),
                        "prometheus.io/scheme": "https",
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def _service_mode_objects(inp: QuotaInput, certs: CertPlan, namespace: str) -> list[Manifest]:
    stack = inp.stack
    ca_data = {CA_CERT_KEY: _b64(certs.ca.cert_pem), CA_KEY_KEY: _b64(certs.ca.key_pem)}
    if certs.previous_ca_pem:
        ca_data[PREVIOUS_CA_KEY] = _b64(certs.previous_ca_pem)
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(stack, CLUSTER_ROLE),
            "rules": [dict(rule) for rule in WEBHOOK_RULES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(stack, CLUSTER_ROLE),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}],
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(stack, NAME, namespace)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(stack, ENDPOINT_ROLE, namespace),
            "rules": [dict(rule) for rule in ENDPOINT_RULES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(stack, ENDPOINT_ROLE, namespace),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ENDPOINT_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}],
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": _meta(stack, CA_SECRET, namespace),
            "type": "Opaque",
            "data": ca_data,
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": _meta(stack, TLS_SECRET, namespace),
            "type": "kubernetes.io/tls",
            "data": {
                "tls.crt": _b64(certs.serving.cert_pem),
                "tls.key": _b64(certs.serving.key_pem),
                "ca.crt": _b64(certs.ca_bundle),
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(stack, NAME, namespace),
            "spec": {
                "selector": (
                    {**_selector(stack), QUOTA_WEBHOOK_ENDPOINT_LABEL: "true"}
                    if inp.route_to_leader
                    else _selector(stack)
                ),
                "ports": [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}],
            },
        },
        _deployment(inp, namespace),
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(stack, NAME, namespace),
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": _selector(stack)},
                # A crash-looping replica must not block node drains.
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
        },
    ]


def routes_to_leader(deployment: Mapping[str, Any] | None, service: Mapping[str, Any] | None) -> bool:
    """Whether the Service may select QUOTA_WEBHOOK_ENDPOINT_LABEL "true", which sends the API server's
    calls to the replica(s) taking them (the leader) only. Only once every replica labels its own pod:
    the Deployment's template must start pods with the label (pods of an earlier release never set it,
    so selecting it while they serve alone would leave the Service without endpoints), and either its
    rollout is complete or the Service selects the label already (a later rollout keeps it)."""
    if deployment is None:
        return False
    spec = deployment.get("spec") or {}
    template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if template_labels.get(QUOTA_WEBHOOK_ENDPOINT_LABEL) != "true":
        return False
    selector = ((service or {}).get("spec") or {}).get("selector") or {}
    if selector.get(QUOTA_WEBHOOK_ENDPOINT_LABEL) == "true":
        return True
    status = deployment.get("status") or {}
    wanted = int(spec.get("replicas", 1))
    return (
        status.get("observedGeneration") == (deployment.get("metadata") or {}).get("generation")
        and status.get("updatedReplicas", 0) == wanted
        and status.get("replicas", 0) == wanted
        and status.get("availableReplicas", 0) >= 1
    )


def render_quota(inp: QuotaInput) -> list[Manifest]:
    """Every object of the quota webhook, in apply order (CRD, RBAC, Secrets, Service, Deployment, PDB,
    webhook configurations last so they never point at something not there yet)."""
    stack = inp.stack
    namespace = stack.spec.namespace
    quota = stack.spec.quota
    objects: list[Manifest] = [gpuquota_crd()]
    if quota.webhook.url:
        target = ClientTarget(ca_bundle=external_ca_bundle(stack), url=quota.webhook.url)
    else:
        if inp.certs is None:
            raise QuotaSpecError("service mode needs certificates")
        objects += _service_mode_objects(inp, inp.certs, namespace)
        target = ClientTarget(
            ca_bundle=inp.certs.ca_bundle, service_name=NAME, service_namespace=namespace, service_port=443
        )
    if inp.register:
        configurations = render_webhook_configurations(
            target,
            name=CONFIGURATION_PREFIX,
            failure_policy=quota.failure_policy.value,
            excluded_namespaces=[namespace],
            labels={STACK_LABEL: stack.name, COMPONENT_LABEL: COMPONENT_QUOTA_WEBHOOK},
        )
        if inp.certs is not None and inp.certs.rotated_ca and configurations:
            # A new CA: the API server must trust it before any replica can serve a certificate from it.
            tls = next(i for i, o in enumerate(objects) if o["metadata"]["name"] == TLS_SECRET)
            objects = [*objects[:tls], *objects[tls + 1 :], *configurations, objects[tls]]
        else:
            objects += configurations
    return objects


def quota_refs(namespace: str) -> list[QuotaRef]:
    """Everything the quota deployment can make (not the CRD), in removal order: the webhook
    configurations first, so nothing is refused by a webhook that is going away."""
    return [
        *(
            ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", "", n)
            for n in CONFIGURATIONS
        ),
        ("apps/v1", "Deployment", namespace, NAME),
        ("policy/v1", "PodDisruptionBudget", namespace, NAME),
        ("v1", "Service", namespace, NAME),
        ("v1", "Secret", namespace, TLS_SECRET),
        ("v1", "Secret", namespace, CA_SECRET),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", namespace, ENDPOINT_ROLE),
        ("rbac.authorization.k8s.io/v1", "Role", namespace, ENDPOINT_ROLE),
        ("v1", "ServiceAccount", namespace, NAME),
        ("rbac.authorization.k8s.io/v1", "ClusterRole", "", CLUSTER_ROLE),
        # Last: its subject records the namespace of the objects above (gpuforge.k8s.quota_deploy).
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "", CLUSTER_ROLE),
    ]


def ref_of(obj: Mapping[str, Any]) -> QuotaRef:
    meta = obj["metadata"]
    return (str(obj["apiVersion"]), str(obj["kind"]), str(meta.get("namespace") or ""), str(meta["name"]))


# --- status ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaFacts:
    """What the shell observed, for the condition."""

    holder: str | None
    registered: bool = False  # the webhook configurations are in place
    replicas: int = 0  # desired (service mode)
    available: int = 0  # available replicas (service mode)
    removing: bool = False
    error: str = ""


def quota_condition(
    stack: GpuStack, facts: QuotaFacts, previous: Sequence[Condition], now: str
) -> Condition | None:
    """The QuotaWebhookReady condition; None once nothing of the quota webhook is left to report."""
    quota = stack.spec.quota
    if facts.error:
        ok, reason, message = False, APPLY_FAILED, facts.error
    elif facts.removing:
        ok, reason, message = False, REMOVING, "removing the quota webhook (quota.enabled is false)"
    elif not quota.enabled:
        return None
    elif facts.holder != stack.name:
        ok, reason = False, ELSEWHERE
        message = f"GpuStack {facts.holder} deploys the quota webhook; only one GpuStack may"
    elif quota.webhook.url:
        ok, reason = facts.registered, EXTERNAL
        message = f"webhook configurations point at {quota.webhook.url}"
    elif facts.available > 0 and facts.registered:
        ok, reason = True, AVAILABLE
        message = (
            f"{facts.available}/{facts.replicas} replicas available; "
            f"registered {', '.join(CONFIGURATIONS)} (failurePolicy {quota.failure_policy.value})"
        )
    elif facts.registered:
        ok, reason = False, UNAVAILABLE
        effect = (
            "refuses labelled workloads"
            if quota.failure_policy is FailurePolicy.FAIL
            else "admits labelled workloads unchecked"
        )
        message = (
            f"0/{facts.replicas} replicas available: the API server {effect} "
            f"(failurePolicy {quota.failure_policy.value})"
        )
    else:
        ok, reason = False, WAITING
        message = f"0/{facts.replicas} replicas available; registering the webhook once one is"
    status = "True" if ok else "False"
    before = next((p for p in previous if p.type == CONDITION), None)
    since = before.last_transition_time if before is not None and before.status == status else now
    return Condition(CONDITION, status, reason, message, since, stack.generation)


def has_quota_condition(previous: Sequence[Condition]) -> bool:
    """Whether the stack may have deployed quota objects: the condition is written before the first
    object and removed after the last, so it is the cluster-stored record of what there is to prune."""
    return any(p.type == CONDITION for p in previous)
