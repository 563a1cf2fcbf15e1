#!/usr/bin/python
"""Evict the GPU pods of one node through the eviction API (PodDisruptionBudgets honoured), by a deadline."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_pod_eviction
short_description: Evict the GPU pods of a node through the eviction API
description:
  - Lists the pods bound to O(node) that use GPUs (a container request or limit on C(nvidia.com/gpu*) or
    C(nvidia.com/mig-*), or a ResourceClaim), skipping DaemonSet pods and finished pods.
  - Evicts each through the eviction API, so PodDisruptionBudgets are honoured; an eviction a budget refuses
    (HTTP 429) is retried until O(timeout), then the module fails naming the pods and budgets that blocked.
  - Waits until the evicted pods are gone from the node (or O(timeout)).
  - In check mode, lists the pods it would evict.
options:
  node: {description: Node name., type: str, required: true}
  kubeconfig: {description: Path of the kubeconfig; the client's default when empty., type: str, default: ""}
  context: {description: Kubeconfig context; the current one when empty., type: str, default: ""}
  timeout:
    description: Seconds to keep retrying refused evictions and waiting for pods to go.
    type: int
    default: 300
  poll: {description: Seconds between attempts., type: float, default: 2}
  resource_prefixes:
    description: Extended resource name prefixes that mark a GPU pod.
    type: list
    elements: str
    default: [nvidia.com/gpu, nvidia.com/mig-]
requirements: [kubernetes]
"""

EXAMPLES = r"""
- name: Evict the GPU pods of gpu-1 before its driver is upgraded
  gpuforge.nodes.gpu_pod_eviction:
    node: gpu-1
  delegate_to: localhost

- name: Evict through another kubeconfig and context, giving PodDisruptionBudgets ten minutes
  gpuforge.nodes.gpu_pod_eviction:
    node: "{{ inventory_hostname }}"
    kubeconfig: /etc/gpuforge/admin.kubeconfig
    context: production
    timeout: 600
    poll: 5
  delegate_to: localhost
  register: eviction

- name: Evict only pods of whole GPUs, leaving MIG slices running
  gpuforge.nodes.gpu_pod_eviction:
    node: gpu-2
    resource_prefixes: [nvidia.com/gpu]
  delegate_to: localhost

- name: List the pods that would be evicted, without evicting
  gpuforge.nodes.gpu_pod_eviction:
    node: gpu-3
  check_mode: true
  delegate_to: localhost
"""

RETURN = r"""
evicted: {description: Pods evicted (namespace/name)., type: list, returned: always}
blocked:
  description: Pods still on the node at the deadline, with the last refusal.
  type: list
  returned: on failure
"""

# Ansible modules carry their documentation before the imports.
import time  # noqa: E402
from typing import Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

try:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
except ImportError:  # reported by main()
    client = None  # type: ignore[assignment]


def _uses_gpu(pod: Any, prefixes: list[str]) -> bool:
    if pod.spec.resource_claims:
        return True
    for container in (pod.spec.containers or []) + (pod.spec.init_containers or []):
        resources = container.resources
        for section in (resources.requests, resources.limits) if resources else ():
            if any(name.startswith(tuple(prefixes)) for name in (section or {})):
                return True
    return False


def _is_daemonset_pod(pod: Any) -> bool:
    return any(owner.kind == "DaemonSet" for owner in pod.metadata.owner_references or [])


def gpu_pods(core: Any, node: str, prefixes: list[str]) -> list[tuple[str, str]]:
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return sorted(
        (pod.metadata.namespace, pod.metadata.name)
        for pod in pods
        if pod.status.phase not in ("Succeeded", "Failed")
        and not _is_daemonset_pod(pod)
        and _uses_gpu(pod, prefixes)
    )


def _still_on_node(core: Any, node: str, namespace: str, name: str) -> bool:
    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return bool(pod.spec.node_name == node)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "node": {"type": "str", "required": True},
            "kubeconfig": {"type": "str", "default": ""},
            "context": {"type": "str", "default": ""},
            "timeout": {"type": "int", "default": 300},
            "poll": {"type": "float", "default": 2},
            "resource_prefixes": {
                "type": "list",
                "elements": "str",
                "default": ["nvidia.com/gpu", "nvidia.com/mig-"],
            },
        },
        supports_check_mode=True,
    )
    if client is None:
        module.fail_json(
            msg="the kubernetes Python client is needed on the controller (pip install kubernetes)"
        )
    params = module.params
    loader: Any = config.load_kube_config  # untyped in the client
    loader(config_file=params["kubeconfig"] or None, context=params["context"] or None)
    core = client.CoreV1Api()
    node = params["node"]
    pending = gpu_pods(core, node, params["resource_prefixes"])
    names = [f"{ns}/{name}" for ns, name in pending]
    if module.check_mode or not pending:
        module.exit_json(changed=False, evicted=[], would_evict=names)

    deadline = time.monotonic() + params["timeout"]
    refusals: dict[tuple[str, str], str] = {}
    evicted: list[str] = []
    while pending and time.monotonic() < deadline:
        for namespace, name in list(pending):
            if (namespace, name) not in refusals or refusals[(namespace, name)] != "evicted":
                body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
                try:
                    core.create_namespaced_pod_eviction(name, namespace, body)
                    refusals[(namespace, name)] = "evicted"
                    evicted.append(f"{namespace}/{name}")
                except ApiException as exc:
                    if exc.status == 404:
                        pending.remove((namespace, name))
                        continue
                    if exc.status != 429:
                        module.fail_json(msg=f"evicting {namespace}/{name} failed: {exc.status} {exc.body}")
                    refusals[(namespace, name)] = _refusal(exc)
            if refusals.get((namespace, name)) == "evicted" and not _still_on_node(
                core, node, namespace, name
            ):
                pending.remove((namespace, name))
        if pending:
            time.sleep(params["poll"])
    if pending:
        blocked = [f"{ns}/{name}: {refusals.get((ns, name), 'still terminating')}" for ns, name in pending]
        module.fail_json(
            msg=f"{len(pending)} GPU pod(s) still on {node} after {params['timeout']}s: "
            + "; ".join(blocked),
            evicted=evicted,
            blocked=blocked,
            changed=bool(evicted),
        )
    module.exit_json(changed=bool(evicted), evicted=evicted)


def _refusal(exc: Any) -> str:
    """The API server's reason, e.g. which disruption budget refused the eviction."""
    import json

    try:
        body = json.loads(exc.body)
    except (TypeError, ValueError):
        return f"HTTP {exc.status}"
    causes = [cause.get("message", "") for cause in body.get("details", {}).get("causes", [])]
    return " ".join(filter(None, [body.get("message", ""), *causes])) or f"HTTP {exc.status}"


if __name__ == "__main__":
    main()
