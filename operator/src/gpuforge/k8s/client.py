"""The operator's client of the Kubernetes API: typed calls over the shared transport (k8s.transport).

Everything goes through `Kube.request` (raw REST with JSON bodies), which counts requests per verb and
resource for metrics and benchmarks. Writes use server-side apply under the field manager "gpuforge"
with force, so drift is corrected and ownership of our fields is unambiguous.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import orjson

from gpuforge.api.cluster import NodeFacts, OperandPod
from gpuforge.api.gpustack import PLURAL, GpuStack
from gpuforge.constants import (
    COMPONENT_LABEL,
    DRA_DRIVER_GPU,
    FIELD_MANAGER,
    GROUP,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    PLUGIN_COMPONENTS,
    RELEASED_ANNOTATION,
    STACK_LABEL,
    VERSION,
    is_gpu_resource,
)
from gpuforge.k8s.transport import ApiTransport, Credentials

log = logging.getLogger(__name__)

Obj = dict[str, Any]
RequestHook = Callable[[str, str], None]  # (verb, resource)
AnswerHook = Callable[[str, str, float], None]  # (verb, resource, seconds until the whole answer was read)
PROTOBUF_MAGIC = b"k8s\x00"  # how an answer in Kubernetes' protobuf encoding starts
PageDecoder = Callable[[bytes], Obj]  # a list page's body -> the page (see gpuforge.k8s.shapes)

# (API group, kind) -> (plural, namespaced), for every kind the operator applies or prunes.
KINDS: Mapping[tuple[str, str], tuple[str, bool]] = {
    ("", "Namespace"): ("namespaces", False),
    ("", "ServiceAccount"): ("serviceaccounts", True),
    ("", "ConfigMap"): ("configmaps", True),
    ("apps", "DaemonSet"): ("daemonsets", True),
    ("apps", "Deployment"): ("deployments", True),
    ("rbac.authorization.k8s.io", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): ("clusterrolebindings", False),
    ("rbac.authorization.k8s.io", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io", "RoleBinding"): ("rolebindings", True),
    ("apiextensions.k8s.io", "CustomResourceDefinition"): ("customresourcedefinitions", False),
    ("resource.k8s.io", "DeviceClass"): ("deviceclasses", False),
    ("node.k8s.io", "RuntimeClass"): ("runtimeclasses", False),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"): ("validatingadmissionpolicies", False),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"): (
        "validatingadmissionpolicybindings",
        False,
    ),
}
# Versions used to list owned objects of each group (DeviceClasses: whatever the server prefers).
LIST_VERSIONS = {
    "": "v1",
    "apps": "v1",
    "rbac.authorization.k8s.io": "v1",
    "admissionregistration.k8s.io": "v1",
    "node.k8s.io": "v1",
    "apiextensions.k8s.io": "v1",
}
RESOURCE_GROUP = "resource.k8s.io"
EVENTS_NAMESPACE = "default"  # events about cluster-scoped objects live here, as kubectl expects


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, message: str) -> None:
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status


@dataclass(frozen=True)
class Ref:
    """An object the operator owns, as listed from the API."""

    api_version: str
    kind: str
    namespace: str
    name: str
    labels: Mapping[str, str]

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]


def _path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    return base + (f"/{quote(name)}" if name else "")


def resource_of(path: str) -> str:
    """The resource a request is for, as labelled in metrics and benchmarks.

    `/apis/apps/v1/namespaces/x/daemonsets/y` -> `daemonsets`; `.../gpustacks/a/status` -> `gpustacks/status`.
    """
    parts = [p for p in path.split("?")[0].split("/") if p]
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        rest = parts
    if not rest:
        return "discovery"
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    return f"{rest[0]}/{rest[2]}" if len(rest) > 2 else rest[0]


def rbac_verb(method: str, path: str) -> str:
    """The RBAC verb a request is authorised as (GET on a collection is `list`)."""
    if method != "GET":
        return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method, method)
    parts = [p for p in path.split("?")[0].split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    return "get" if len(rest) >= 2 else "list"


def _int_quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class Kube:
    def __init__(
        self,
        transport: ApiTransport,
        on_request: RequestHook | None = None,
        on_answer: AnswerHook | None = None,
    ) -> None:
        self.transport = transport
        self._on_request = on_request
        self._on_answer = on_answer
        self.requests: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._emitted: dict[tuple[str, str], str] = {}

    @classmethod
    def from_kubeconfig(
        cls,
        kubeconfig: str | None = None,
        on_request: RequestHook | None = None,
        on_answer: AnswerHook | None = None,
        *,
        plain: bool = False,
    ) -> Kube:
        """Credentials from `kubeconfig`, else $KUBECONFIG / ~/.kube/config, else the in-cluster account.
        `plain`: without the official client where the kubeconfig allows (short commands; the result has
        no `connection_info` for kopf)."""
        transport = ApiTransport.from_kubeconfig(kubeconfig, timeout=60.0, plain=plain)
        return cls(transport, on_request, on_answer)

    def connection_info(self) -> dict[str, Any]:
        """Server and credentials, as keyword arguments for kopf.ConnectionInfo."""
        config = self.transport.credentials.configuration
        scheme, _, token = self.credentials().authorization().get("Authorization", "").rpartition(" ")
        return {
            "server": config.host,
            "ca_path": config.ssl_ca_cert,
            "insecure": not config.verify_ssl,
            "scheme": scheme or ("Bearer" if token else None),
            "token": token or None,
            "certificate_path": config.cert_file,
            "private_key_path": config.key_file,
        }

    def credentials(self) -> Credentials:
        """The same server and credentials for aiohttp (the watch-fed cache runs on kopf's loop)."""
        return self.transport.credentials

    # --- transport ---------------------------------------------------------------------------------

    def count_request(self, verb: str, resource: str) -> None:
        """Every request to the API server is counted here (watches and cache lists included)."""
        with self._lock:
            self.requests[(verb, resource)] += 1
        if self._on_request is not None:
            self._on_request(verb, resource)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """One request to the API server (counted; ApiError on a status >= 400), for kinds this class has
        no method for (the quota webhook's objects)."""
        data = self._answer(method, path, query=query, body=body, content_type=content_type)
        return orjson.loads(data) if data else None

    def _answer(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> bytes:
        """`request`'s answer, not decoded."""
        verb, resource = rbac_verb(method, path), resource_of(path)
        self.count_request(verb, resource)
        started = time.monotonic()
        status, data = self.transport.request_sync(
            method, path, query=query, body=body, content_type=content_type, accept=accept
        )
        if self._on_answer is not None:
            self._on_answer(verb, resource, time.monotonic() - started)
        if status >= 400:
            raise ApiError(status, method, path, _error_message(data))
        return data

    def list_objects(self, path: str, query: Mapping[str, str] | None = None) -> Iterator[Obj]:
        """Every item of a collection (`/api/v1/nodes`, ...), fetched in pages of 500."""
        return self._list(path, query)

    def list_side_by_side(
        self,
        collections: Mapping[str, tuple[str, Mapping[str, str] | None]],
        formats: Mapping[str, ListFormat] | None = None,
    ) -> dict[str, list[Obj]]:
        """Several whole collections (name -> (path, query)), each read by its own thread, which asks for
        a page's successor before decoding it: the API server prepares the next page, and the other
        collections' pages, while this process decodes. `formats`: how a collection's pages are asked
        for and decoded (`gpuforge.k8s.shapes_protobuf`, `gpuforge.k8s.shapes`: only the fields they
        name), else JSON, whole."""
        workers = max(1, len(collections))
        with ThreadPoolExecutor(workers) as pool, ThreadPoolExecutor(workers) as ahead:
            futures = {
                name: pool.submit(self._list_ahead, path, query, ahead, (formats or {}).get(name, WHOLE_JSON))
                for name, (path, query) in collections.items()
            }
            return {name: future.result() for name, future in futures.items()}

    def _list_ahead(
        self, path: str, query: Mapping[str, str] | None, ahead: ThreadPoolExecutor, form: ListFormat
    ) -> list[Obj]:
        return [item for page in self._pages(path, query, ahead, form) for item in page.get("items") or []]

    def _list(self, path: str, query: Mapping[str, str] | None = None) -> Iterator[Obj]:
        for page in self._pages(path, query):
            yield from page.get("items") or []

    def _pages(
        self,
        path: str,
        query: Mapping[str, str] | None,
        ahead: ThreadPoolExecutor | None = None,
        form: ListFormat | None = None,
    ) -> Iterator[Obj]:
        """A collection's pages of 500, decoded (as `form` says, else whole JSON), in order. With
        `ahead`, each page's successor is asked for there, from the token in the page's head, before the
        page is decoded."""
        form = form or WHOLE_JSON
        params = {**(query or {}), "limit": "500"}
        data = self._answer("GET", path, query=params, accept=form.accept)
        while True:
            token = form.token(data) if ahead is not None else None
            following = None
            if token and ahead is not None:
                params = {**params, "continue": token}
                following = ahead.submit(self._answer, "GET", path, query=params, accept=form.accept)
            page = form.decode(data)
            yield page
            if following is not None:
                data = following.result()
                continue
            token = (page.get("metadata") or {}).get("continue")
            if not token:  # read at its place: the last page, or a list whose metadata came after its items
                return
            params = {**params, "continue": token}
            data = self._answer("GET", path, query=params, accept=form.accept)

    # --- discovery ---------------------------------------------------------------------------------

    def served_versions(self, group: str = RESOURCE_GROUP) -> frozenset[str]:
        try:
            data = self.request("GET", f"/apis/{group}")
        except ApiError as err:
            if err.status == 404:
                return frozenset()
            raise
        return frozenset(v["version"] for v in data.get("versions", []))

    # --- generic objects -----------------------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Server-side apply (field manager gpuforge, force): creates, updates and corrects drift."""
        api_version, kind, meta = obj["apiVersion"], obj["kind"], obj["metadata"]
        plural, namespaced = KINDS[(api_version.rpartition("/")[0], kind)]
        path = _path(api_version, plural, meta.get("namespace") if namespaced else None, meta["name"])
        query = {"fieldManager": FIELD_MANAGER, "force": "true"}
        result: Obj = self.request(
            "PATCH", path, query=query, body=obj, content_type="application/apply-patch+yaml"
        )
        return result

    def delete(self, ref: Ref) -> bool:
        """Delete with background propagation; False when it was already gone."""
        plural, namespaced = KINDS[(ref.group, ref.kind)]
        path = _path(ref.api_version, plural, ref.namespace if namespaced else None, ref.name)
        try:
            self.request("DELETE", path, body={"propagationPolicy": "Background"})
        except ApiError as err:
            if err.status == 404:
                return False
            raise
        return True

    def list_owned(self, stack: str, components: Iterable[str], dra_api_version: str | None) -> list[Ref]:
        """Objects labelled as made by gpuforge for `stack`, with one of the given component labels."""
        selector = (
            f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{STACK_LABEL}={stack},"
            f"{COMPONENT_LABEL} in ({','.join(sorted(components))})"
        )
        refs = []
        for (group, kind), (plural, _) in KINDS.items():
            version = dra_api_version if group == RESOURCE_GROUP else LIST_VERSIONS[group]
            if version is None:
                continue
            api_version = f"{group}/{version}" if group else version
            for item in self._list(_path(api_version, plural), {"labelSelector": selector}):
                meta = item["metadata"]
                refs.append(
                    Ref(api_version, kind, meta.get("namespace", ""), meta["name"], meta.get("labels") or {})
                )
        return refs

    # --- GpuStacks -------------------------------------------------------------------------------------

    def list_stacks(self) -> list[GpuStack]:
        return [GpuStack.from_body(item) for item in self.list_stack_bodies()]

    def list_stack_bodies(self) -> list[Obj]:
        return list(self._list(_path(f"{GROUP}/{VERSION}", PLURAL)))

    def patch_stack_status(self, name: str, status: Mapping[str, Any]) -> None:
        path = _path(f"{GROUP}/{VERSION}", PLURAL, name=name) + "/status"
        self.request("PATCH", path, body={"status": status}, content_type="application/merge-patch+json")

    # --- nodes, pods, slices ---------------------------------------------------------------------------

    def list_nodes(
        self, slices_per_node: Mapping[str, int], label_selector: str | None = None
    ) -> list[NodeFacts]:
        query = {"labelSelector": label_selector} if label_selector else None
        return [node_facts(item, slices_per_node) for item in self._list("/api/v1/nodes", query)]

    def count_gpu_slices(self, resource_api_version: str | None) -> Counter[str]:
        """ResourceSlices of driver gpu.nvidia.com per node (any served version has spec.nodeName)."""
        return slices_per_node(self.list_gpu_slices(resource_api_version))

    def list_gpu_slices(self, resource_api_version: str | None) -> list[Obj]:
        if resource_api_version is None:
            return []
        path = _path(f"{RESOURCE_GROUP}/{resource_api_version}", "resourceslices")
        return list(self._list(path, {"fieldSelector": f"spec.driver={DRA_DRIVER_GPU}"}))

    def list_resource_claims(self, resource_api_version: str | None) -> list[Obj]:
        """Every ResourceClaim (to see which pods hold GPUs through DRA); none when DRA is not served."""
        if resource_api_version is None:
            return []
        return list(self._list(_path(f"{RESOURCE_GROUP}/{resource_api_version}", "resourceclaims")))

    def list_node_objects(self) -> list[Obj]:
        return list(self._list("/api/v1/nodes"))

    def list_pods(self) -> list[Obj]:
        """Every pod scheduled to a node, in all namespaces."""
        return list(self._list("/api/v1/pods", {"fieldSelector": "spec.nodeName!="}))

    def list_operand_pods(self, stack: str) -> list[OperandPod]:
        selector = f"{STACK_LABEL}={stack},{COMPONENT_LABEL} in ({','.join(sorted(PLUGIN_COMPONENTS))})"
        return operand_pods(self._list("/api/v1/pods", {"labelSelector": selector}), stack)

    def count_claim_pods(self, node: str) -> int:
        """Unfinished pods on `node` that hold ResourceClaims (directly or via DRA extended resources)."""
        count = 0
        for item in self._list("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"}):
            status = item.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                continue
            if (item.get("spec") or {}).get("resourceClaims") or status.get("extendedResourceClaimStatus"):
                count += 1
        return count

    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        self.patch_node(node, {"metadata": {"labels": dict(labels)}})

    def patch_node(self, node: str, patch: Mapping[str, Any]) -> Obj:
        """One JSON merge patch of a Node (labels, annotations, spec.unschedulable together); the Node
        as written."""
        result: Obj = self.request(
            "PATCH", f"/api/v1/nodes/{quote(node)}", body=patch, content_type="application/merge-patch+json"
        )
        return result

    def evict_pod(self, namespace: str, name: str) -> bool:
        """Evict through the eviction API, so PodDisruptionBudgets hold. False: refused for now (429: a
        budget does not allow it); a pod already gone counts as evicted."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            self.request("POST", _path("v1", "pods", namespace, name) + "/eviction", body=body)
        except ApiError as err:
            if err.status == 404:
                return True
            if err.status == 429:
                return False
            raise
        return True

    def delete_pod(self, namespace: str, name: str) -> Obj | None:
        """Delete a pod (an outdated operand pod: its OnDelete DaemonSet recreates it); gone is fine.
        Returns the pod as the server left it (being deleted), None when it was gone already."""
        try:
            result: Obj | None = self.request("DELETE", _path("v1", "pods", namespace, name))
        except ApiError as err:
            if err.status != 404:
                raise
            return None
        return result if result and result.get("kind") == "Pod" else None

    # --- events ----------------------------------------------------------------------------------------

    def _post_event(
        self, involved: Mapping[str, str], kind: str, reason: str, message: str, source: Mapping[str, str]
    ) -> None:
        """A core/v1 Event about `involved`; a failure is worth a log line, never a failed reconcile."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": EVENTS_NAMESPACE},
            "involvedObject": dict(involved),
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": dict(source),
            "reportingComponent": "gpuforge.io/operator",
            "reportingInstance": "gpuforge-operator",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.request("POST", f"/api/v1/namespaces/{EVENTS_NAMESPACE}/events", body=body)
        except ApiError as err:
            log.warning(
                "could not post event %s on %s %s: %s", reason, involved["kind"], involved["name"], err
            )

    def emit_node_event(self, node: str, kind: str, reason: str, message: str, *, once: bool = False) -> None:
        """A core/v1 Event on a Node (one per upgrade state change; `kubectl describe node` shows it).
        `once`: not again while the node's last event of this reason had the same message (a level-based
        pass finds the same thing on every resync)."""
        if once:
            key = (f"node/{node}", reason)
            with self._lock:
                if self._emitted.get(key) == message:
                    return
                self._emitted[key] = message
        involved = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node}
        self._post_event(involved, kind, reason, message, {"component": "gpuforge-operator", "host": node})

    def emit_event(self, stack: GpuStack, kind: str, reason: str, message: str) -> None:
        """A core/v1 Event on the GpuStack; the same reason and message are not repeated in a row."""
        key = (stack.uid or stack.name, reason)
        with self._lock:
            if self._emitted.get(key) == message:
                return
            self._emitted[key] = message
        involved = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "GpuStack",
            "name": stack.name,
            "uid": stack.uid,
        }
        self._post_event(involved, kind, reason, message, {"component": "gpuforge-operator"})


# --- list pages (no I/O) -----------------------------------------------------------------------------


def _error_message(data: bytes) -> str:
    """What an error answer's Status says, in JSON or in protobuf (asked for by `ListFormat`s)."""
    if data.startswith(PROTOBUF_MAGIC):
        from gpuforge.k8s.shapes_protobuf import status_message  # the protobuf module only when used

        return status_message(data)
    try:
        return str(orjson.loads(data).get("message", ""))
    except ValueError:
        return data.decode(errors="replace")[:300]


# The API server encodes a list's metadata (ListMeta) before its items, so a page's continue token is in
# its first bytes; an opaque token, never with a quote in it.
_CONTINUE = re.compile(rb'"continue":"([^"]+)"')
_LIST_HEAD = 4096


def continue_token(page: bytes) -> str | None:
    """The continue token of a list page, read from its head without decoding it; None when there is
    none before the items (the last page), or the head is not shaped so."""
    items = page.find(b'"items":', 0, _LIST_HEAD)
    found = _CONTINUE.search(page, 0, items) if items > 0 else None
    return found.group(1).decode() if found else None


@dataclass(frozen=True)
class ListFormat:
    """How a collection's pages are asked for (`accept`), decoded (`decode`: the page, with its
    `metadata` and `items`), and where the next page's token is read from before that (`token`: None
    when the page's head does not tell; the decoded page is read then)."""

    accept: str
    decode: PageDecoder
    token: Callable[[bytes], str | None]


WHOLE_JSON = ListFormat("application/json", orjson.loads, continue_token)


# --- API objects to typed facts (no I/O) -------------------------------------------------------------


def node_facts(
    item: Mapping[str, Any], slices: Mapping[str, int], plugin_nodes: Collection[str] = frozenset()
) -> NodeFacts:
    """`plugin_nodes`: the nodes a plugin pod of any GpuStack is bound to (see `plugin_nodes`)."""
    meta, spec, status = item["metadata"], item.get("spec") or {}, item.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return NodeFacts(
        name=meta["name"],
        labels=meta.get("labels") or {},
        kubelet_version=(status.get("nodeInfo") or {}).get("kubeletVersion", ""),
        ready=ready,
        unschedulable=bool(spec.get("unschedulable")),
        gpu_capacity=sum(
            _int_quantity(value)
            for resource, value in (status.get("capacity") or {}).items()
            if is_gpu_resource(resource)
        ),
        dra_slices=slices.get(meta["name"], 0),
        gpu_allocatable={
            resource: count
            for resource, value in (status.get("allocatable") or {}).items()
            if is_gpu_resource(resource) and (count := _int_quantity(value)) > 0
        },
        gpuforge_plugin=meta["name"] in plugin_nodes,
        released_at=_parse_time((meta.get("annotations") or {}).get(RELEASED_ANNOTATION)),
    )


def _parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 timestamp, None when absent or unreadable (a hand-edited annotation)."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def slices_per_node(slices: Iterable[Mapping[str, Any]]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for item in slices:
        node = (item.get("spec") or {}).get("nodeName")
        if node:
            counts[node] += 1
    return counts


def plugin_nodes(items: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Nodes a plugin pod of any GpuStack is bound to (pods being deleted count: they still serve)."""
    nodes = set()
    for item in items:
        labels = item["metadata"].get("labels") or {}
        node = (item.get("spec") or {}).get("nodeName")
        if node and STACK_LABEL in labels and labels.get(COMPONENT_LABEL) in PLUGIN_COMPONENTS:
            nodes.add(node)
    return frozenset(nodes)


def operand_pods(items: Iterable[Mapping[str, Any]], stack: str) -> list[OperandPod]:
    """The stack's plugin pods (not being deleted) among `items`."""
    pods = []
    for item in items:
        meta = item["metadata"]
        labels = meta.get("labels") or {}
        node = (item.get("spec") or {}).get("nodeName")
        if (
            node
            and not meta.get("deletionTimestamp")
            and labels.get(STACK_LABEL) == stack
            and labels.get(COMPONENT_LABEL) in PLUGIN_COMPONENTS
        ):
            pods.append(OperandPod(meta["name"], node, stack, labels[COMPONENT_LABEL], _pod_ready(item)))
    return pods
