"""Deploy, rotate and remove a GpuStack's quota webhook: the shell around `gpuforge.render.quota_webhook`.

Per pass it reads the two certificate Secrets and the webhook Deployment, asks the pure core what to
store (`plan_certificates`) and what to deploy (`render_quota`), applies that (server-side apply) and
removes what is no longer wanted. It touches nothing for a stack that never enabled quota, so the
operator needs the quota part of its RBAC (operator/deploy/rbac-quota.yaml) only where quota is used.

What there is to remove is found from cluster state: the QuotaWebhookReady condition is written before
the first object is made and dropped after the last is gone; the ClusterRoleBinding's subject names the
namespace the namespaced objects are in. An object is removed only if it carries this stack's label, with
its resourceVersion as precondition, so a stack never removes what another stack has just taken over.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from gpuforge.api.convert import to_dict
from gpuforge.api.gpustack import Condition, GpuStack
from gpuforge.constants import FIELD_MANAGER, MANAGED_BY_LABEL, MANAGED_BY_VALUE, STACK_LABEL
from gpuforge.k8s.client import ApiError, Kube
from gpuforge.k8s.memory import AppliedDigests
from gpuforge.render import quota_webhook as q
from gpuforge.render.certs import plan_certificates

log = logging.getLogger(__name__)

Obj = dict[str, Any]

# kind -> plural, for every kind the quota deployment writes.
PLURALS: Mapping[str, str] = {
    "CustomResourceDefinition": "customresourcedefinitions",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Secret": "secrets",
    "Service": "services",
    "Deployment": "deployments",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
}
NAMESPACED = frozenset(
    {"ServiceAccount", "Role", "RoleBinding", "Secret", "Service", "Deployment", "PodDisruptionBudget"}
)
# As in gpuforge.k8s.stack: unchanged objects are re-applied (drift) at most this often.
RESYNC_SECONDS = 25.0

Event = tuple[str, str, str]  # (type, reason, message)


@dataclass
class QuotaOutcome:
    condition: Condition | None  # None: the stack has no quota condition (never enabled, or all removed)
    applied: int = 0
    pruned: int = 0
    events: list[Event] = field(default_factory=list)


def _path(ref: q.QuotaRef) -> str:
    api_version, kind, namespace, name = ref
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    if namespace:
        base += f"/namespaces/{quote(namespace)}"
    return f"{base}/{PLURALS[kind]}/{quote(name)}"


# gpuforge.k8s.client.Kube knows the operands' kinds; these requests go through its transport too, so
# they are counted in the same metrics.
def _get(kube: Kube, ref: q.QuotaRef) -> Obj | None:
    try:
        result: Obj = kube.request("GET", _path(ref))
    except ApiError as err:
        if err.status == 404:
            return None
        raise
    return result


def _apply(kube: Kube, obj: Mapping[str, Any]) -> None:
    query = {"fieldManager": FIELD_MANAGER, "force": "true"}
    kube.request(
        "PATCH", _path(q.ref_of(obj)), query=query, body=obj, content_type="application/apply-patch+yaml"
    )


def _mine(obj: Mapping[str, Any] | None, stack: GpuStack) -> bool:
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(STACK_LABEL) == stack.name and labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE


def _delete_if_mine(kube: Kube, ref: q.QuotaRef, stack: GpuStack) -> bool:
    """Delete `ref` if this stack made it; False when it is gone or someone else's. The delete carries
    the resourceVersion read, so an object another stack took over meanwhile is never removed; a 409
    from a mere status update (the disruption controller writes a PodDisruptionBudget's status as the
    Deployment's pods go) reads it again and retries."""
    for _attempt in range(5):
        current = _get(kube, ref)
        if current is None or not _mine(current, stack):
            return False
        version = current["metadata"]["resourceVersion"]
        body = {"propagationPolicy": "Background", "preconditions": {"resourceVersion": version}}
        try:
            kube.request("DELETE", _path(ref), body=body)
        except ApiError as err:
            if err.status == 409:  # changed since we read it: whose is it now?
                continue
            if err.status == 404:
                return False
            raise
        log.info("removed %s %s/%s of GpuStack %s's quota webhook", ref[1], ref[2], ref[3], stack.name)
        return True
    return False


def _deployed_namespace(kube: Kube, stack: GpuStack) -> str | None:
    """Where this stack's namespaced webhook objects are: the ClusterRoleBinding's subject namespace."""
    binding = _get(kube, ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "", q.CLUSTER_ROLE))
    if binding is None or not _mine(binding, stack):
        return None
    subjects = binding.get("subjects") or [{}]
    namespace = subjects[0].get("namespace")
    return str(namespace) if namespace else None


def _prune(kube: Kube, stack: GpuStack, keep: set[q.QuotaRef], everything: bool, deployed: str | None) -> int:
    """Remove this stack's quota objects not in `keep`, in `quota_refs` order (webhook configurations
    first, the ClusterRoleBinding that records the namespace last). `deployed`: the namespace the binding
    named before this pass applied anything (`_deployed_namespace`). `everything`: removal of the whole
    webhook, which also looks in the spec's namespace in case the binding was never made."""
    found = {deployed} if deployed else set()
    namespaces = sorted(found | {stack.spec.namespace}) if everything else sorted(found)
    candidates: list[q.QuotaRef] = []
    for api_version, kind, namespace, name in q.quota_refs(""):
        if kind in NAMESPACED:
            candidates += [(api_version, kind, ns, name) for ns in namespaces]
        elif kind in ("ClusterRole", "ClusterRoleBinding") and not namespaces:
            continue  # no binding of ours: the RBAC was never made or is gone
        else:
            candidates.append((api_version, kind, namespace, name))
    return sum(_delete_if_mine(kube, ref, stack) for ref in candidates if ref not in keep)


def _raw_conditions(body: Mapping[str, Any]) -> list[Any]:
    return list((body.get("status") or {}).get("conditions") or [])


def _digest(objects: Sequence[Mapping[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(list(objects), sort_keys=True).encode()).hexdigest()


def reconcile_quota(
    kube: Kube,
    stack: GpuStack,
    body: Mapping[str, Any],
    previous: Sequence[Condition],
    stacks: Sequence[GpuStack],
    applied: AppliedDigests,
    now: datetime | None = None,
) -> QuotaOutcome:
    """One pass over the quota webhook of `stack`; API errors end up in the condition, never raised.
    `applied` remembers what was applied, so unchanged objects are applied again only to resync."""
    now = now or datetime.now(UTC)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    holder = q.quota_holder(stacks)
    had = q.has_quota_condition(previous)
    was_elsewhere = any(p.type == q.CONDITION and p.reason == q.ELSEWHERE for p in previous)
    enabled_here = stack.spec.quota.enabled and holder == stack.name
    key = stack.uid or stack.name
    try:
        if not enabled_here:
            outcome = QuotaOutcome(None)
            if had and not was_elsewhere:
                deployed = _deployed_namespace(kube, stack)
                outcome.pruned = _prune(kube, stack, set(), everything=True, deployed=deployed)
                applied.forget(key)
                if outcome.pruned:
                    outcome.events.append(("Normal", q.EVENT_REMOVED, "removed the quota webhook"))
            outcome.condition = q.quota_condition(stack, q.QuotaFacts(holder), previous, stamp)
            return outcome
        if not had:
            # Record that objects may exist before making the first one (see the module docstring).
            marker = q.quota_condition(
                stack, q.QuotaFacts(holder, replicas=stack.spec.quota.replicas), (), stamp
            )
            kube.patch_stack_status(stack.name, {"conditions": [*_raw_conditions(body), to_dict(marker)]})
        return _deploy(kube, stack, previous, holder, now, stamp, applied)
    except (ApiError, q.QuotaSpecError) as err:
        applied.forget(key)
        log.warning("GpuStack %s quota webhook: %s", stack.name, err)
        facts = q.QuotaFacts(holder, removing=not enabled_here, error=str(err))
        # An error keeps the condition (and so the record of what to remove) until a pass succeeds.
        condition = q.quota_condition(stack, facts, previous, stamp)
        return QuotaOutcome(condition, events=[("Warning", q.APPLY_FAILED, f"quota webhook: {err}")])


def _deploy(
    kube: Kube,
    stack: GpuStack,
    previous: Sequence[Condition],
    holder: str | None,
    now: datetime,
    stamp: str,
    memory: AppliedDigests,
) -> QuotaOutcome:
    namespace = stack.spec.namespace
    quota = stack.spec.quota
    events: list[Event] = []
    facts = q.QuotaFacts(holder, replicas=quota.replicas)
    if quota.webhook.url:
        objects = q.render_quota(q.QuotaInput(stack, None))
        facts = q.QuotaFacts(holder, registered=True)
    else:
        ca_secret = _get(kube, ("v1", "Secret", namespace, q.CA_SECRET))
        tls_secret = _get(kube, ("v1", "Secret", namespace, q.TLS_SECRET))
        stored = q.stored_certs(ca_secret, tls_secret)
        plan = plan_certificates(
            now, q.serving_hosts(namespace), stored.ca, stored.serving, stored.previous_ca_pem
        )
        deployment = _get(kube, ("apps/v1", "Deployment", namespace, q.NAME))
        available = int(((deployment or {}).get("status") or {}).get("availableReplicas") or 0)
        registered = available > 0 or _mine(
            _get(
                kube,
                (
                    "admissionregistration.k8s.io/v1",
                    "ValidatingWebhookConfiguration",
                    "",
                    q.CONFIGURATIONS[0],
                ),
            ),
            stack,
        )
        route = q.routes_to_leader(deployment, _get(kube, ("v1", "Service", namespace, q.NAME)))
        objects = q.render_quota(q.QuotaInput(stack, plan, register=registered, route_to_leader=route))
        facts = q.QuotaFacts(holder, registered, quota.replicas, available)
        if plan.rotated_ca and stored.ca is not None:
            events.append(
                (
                    "Normal",
                    q.EVENT_CA_ROTATED,
                    "rotated the quota webhook CA; the old CA stays trusted for a day",
                )
            )
        if plan.rotated_serving:
            reason = q.EVENT_CERT_ISSUED if stored.serving is None else q.EVENT_CERT_ROTATED
            events.append(
                (
                    "Normal",
                    reason,
                    f"serving certificate for {q.NAME}.{namespace}.svc "
                    f"valid until {_not_after(plan.serving.cert_pem)}",
                )
            )
    digest = _digest(objects)
    key = stack.uid or stack.name
    applied = pruned = 0
    if memory.due(key, digest, RESYNC_SECONDS):
        was_registered = any(
            p.type == q.CONDITION and p.reason in (q.AVAILABLE, q.UNAVAILABLE, q.EXTERNAL) for p in previous
        )
        deployed = _deployed_namespace(kube, stack)  # before the binding is applied: a moved namespace
        for obj in objects:
            _apply(kube, obj)
            applied += 1
        keep = {q.ref_of(o) for o in objects}
        pruned = _prune(kube, stack, keep, everything=False, deployed=deployed)
        memory.applied(key, digest)
        if facts.registered and not was_registered:
            events.append(("Normal", q.EVENT_REGISTERED, f"registered {', '.join(q.CONFIGURATIONS)}"))
    return QuotaOutcome(q.quota_condition(stack, facts, previous, stamp), applied, pruned, events)


def _not_after(cert_pem: bytes) -> str:
    from cryptography import x509

    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def remove_quota(kube: Kube, stack: GpuStack, previous: Sequence[Condition], applied: AppliedDigests) -> int:
    """On GpuStack deletion: remove its quota webhook (not the GpuQuota CRD), configurations first."""
    if not (stack.spec.quota.enabled or q.has_quota_condition(previous)):
        return 0
    applied.forget(stack.uid or stack.name)
    return _prune(kube, stack, set(), everything=True, deployed=_deployed_namespace(kube, stack))
