"""Kubernetes API access for the GpuQuota webhook and its usage controller (async, aiohttp).

Reads GpuQuotas and workloads, replaces GpuQuota status with a resourceVersion precondition (a 409 is
raised as `Conflict` so the caller decides again from a fresh read), lists and watches workloads,
records Events and (for `gpuforge webhook run --register`) creates and deletes the webhook's own
ValidatingWebhookConfigurations. Requests go through the shared transport (k8s.transport).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import aiohttp
import orjson

from gpuforge.api.gpuquota import API_VERSION as QUOTA_API_VERSION
from gpuforge.api.gpuquota import KIND as QUOTA_KIND
from gpuforge.api.gpuquota import PLURAL as QUOTA_PLURAL
from gpuforge.api.workloadkinds import WORKLOAD_KINDS
from gpuforge.constants import FIELD_MANAGER
from gpuforge.k8s.informer import ChangeHandler, Informer, without_managed_fields
from gpuforge.k8s.transport import (
    ApiError,
    ApiTransport,
    Credentials,
    error_message,
    load_credentials,
    selectors,
)

log = logging.getLogger(__name__)

# A 429 is retried this many times (see ApiTransport.retries_on_429).
RETRIES_ON_429 = 5


class Conflict(ApiError):
    """The object changed since it was read (HTTP 409): read again and decide again."""


@dataclass(frozen=True)
class Resource:
    prefix: str  # /api/v1 or /apis/<group>/<version>
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str = "") -> str:
        parts = [self.prefix]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{quote(namespace)}")
        parts.append(self.plural)
        if name:
            parts.append(quote(name))
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


RESOURCES: Final[dict[str, Resource]] = {
    **{kind.kind: Resource(kind.api_prefix, kind.plural, True) for kind in WORKLOAD_KINDS},
    "Event": Resource("/api/v1", "events", True),
    "Namespace": Resource("/api/v1", "namespaces", False),
    "LimitRange": Resource("/api/v1", "limitranges", True),
    # Which DeviceClass serves which extended resource (DRA's extended resource mapping, from 1.34).
    "DeviceClass": Resource("/apis/resource.k8s.io/v1", "deviceclasses", False),
    QUOTA_KIND: Resource(f"/apis/{QUOTA_API_VERSION}", QUOTA_PLURAL, False),
    "ValidatingWebhookConfiguration": Resource(
        "/apis/admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", False
    ),
}


class QuotaApi:
    """The calls the quota webhook and controller make. One aiohttp session, many concurrent requests."""

    def __init__(self, credentials: Credentials, *, request_timeout: float = 10.0) -> None:
        self.transport = ApiTransport(credentials, timeout=request_timeout, retries_on_429=RETRIES_ON_429)
        self._resource_api: str | None = None

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path | None = None, context: str | None = None) -> QuotaApi:
        return cls(load_credentials(kubeconfig, context))

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> QuotaApi:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any] | None:
        """JSON result, or None on 404. Raises Conflict on 409 and ApiError on other failures (a 429
        after the transport's retries)."""
        status, text = await self.transport.request(
            method, path, body=body, params=params, content_type=content_type
        )
        if status == 404:
            return None
        if status == 409:
            raise Conflict(409, error_message(text))
        if status >= 400:
            raise ApiError(status, error_message(text))
        result: dict[str, Any] = orjson.loads(text) if text else {}
        return result

    async def may(self, user_info: Mapping[str, Any], attributes: Mapping[str, str]) -> bool:
        """Whether the user an AdmissionRequest's userInfo describes may do what `attributes` (a
        SubjectAccessReview's resourceAttributes) say: one SubjectAccessReview."""
        spec: dict[str, Any] = {"resourceAttributes": dict(attributes)}
        for ours, theirs in (("username", "user"), ("uid", "uid"), ("groups", "groups"), ("extra", "extra")):
            if user_info.get(ours):
                spec[theirs] = user_info[ours]
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        answer = await self._request(
            "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review
        )
        return bool(((answer or {}).get("status") or {}).get("allowed"))

    # --- GpuQuota ---------------------------------------------------------------------------------

    async def get_quota(self, name: str) -> dict[str, Any] | None:
        return await self._request("GET", RESOURCES[QUOTA_KIND].path(name=name))

    async def list_quotas(self) -> list[dict[str, Any]]:
        return await self.list_objects(QUOTA_KIND)

    async def replace_quota_status(
        self, name: str, resource_version: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Replace status only if the quota still has `resource_version`; Conflict otherwise."""
        if not resource_version:
            raise ValueError("a status write needs the resourceVersion it was decided on")
        body = {
            "apiVersion": QUOTA_API_VERSION,
            "kind": QUOTA_KIND,
            "metadata": {"name": name, "resourceVersion": resource_version},
            "status": dict(status),
        }
        # PUT with metadata.resourceVersion is a compare-and-swap: 409 if the quota moved since the read.
        # (A replace, not a merge patch, so keys dropped from hard also leave used.)
        result = await self._request(
            "PUT",
            RESOURCES[QUOTA_KIND].path(name=name, subresource="status"),
            body=body,
            params={"fieldManager": FIELD_MANAGER},
        )
        if result is None:
            raise ApiError(404, f"GpuQuota {name!r} is gone")
        return result

    async def create_quota(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        result = await self._request("POST", RESOURCES[QUOTA_KIND].path(), body=obj)
        assert result is not None
        return result

    async def delete_quota(self, name: str) -> None:
        await self._request("DELETE", RESOURCES[QUOTA_KIND].path(name=name))

    # --- Workloads and claims -----------------------------------------------------------------------

    async def get_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._request("GET", RESOURCES[kind].path(namespace, name))

    async def list_objects(
        self, kind: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        items, _ = await self.list_with_version(kind, namespace, label_selector)
        return items

    async def list_with_version(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        params = selectors(label_selector, field_selector) or None
        result = await self._request("GET", RESOURCES[kind].path(namespace), params=params)
        if result is None:
            return [], ""
        items: list[dict[str, Any]] = result.get("items") or []
        for item in items:  # lists omit kind on items
            item.setdefault("kind", kind)
        return items, str((result.get("metadata") or {}).get("resourceVersion", ""))

    async def _resource_api_prefix(self) -> str:
        """resource.k8s.io in the newest version this API server serves (v1 from 1.34, betas before)."""
        if self._resource_api is None:
            group = await self._request("GET", "/apis/resource.k8s.io")
            version = ((group or {}).get("preferredVersion") or {}).get("groupVersion", "resource.k8s.io/v1")
            self._resource_api = f"/apis/{version}"
        return self._resource_api

    async def list_claims(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        """`resourceclaimtemplates` or `resourceclaims` of a namespace."""
        prefix = await self._resource_api_prefix()
        result = await self._request("GET", Resource(prefix, plural, True).path(namespace))
        return list((result or {}).get("items") or [])

    async def get_claim(self, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
        prefix = await self._resource_api_prefix()
        return await self._request("GET", Resource(prefix, plural, True).path(namespace, name))

    async def watch(
        self,
        kind: str,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        field_selector: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events ({type, object}) from `resource_version` until the server ends the stream."""
        async for event in self.transport.watch(
            RESOURCES[kind].path(),
            resource_version,
            label_selector,
            timeout_seconds,
            field_selector,
        ):
            yield event

    # --- Leases (leader election) -------------------------------------------

    @staticmethod
    def _lease_path(namespace: str, name: str | None = None) -> str:
        return Resource("/apis/coordination.k8s.io/v1", "leases", True).path(namespace, name)

    async def label_pod(self, namespace: str, name: str, key: str, value: str) -> None:
        """Set one label on a pod (a merge patch: other labels stay as they are)."""
        result = await self._request(
            "PATCH",
            f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}",
            body={"metadata": {"labels": {key: value}}},
            params={"fieldManager": FIELD_MANAGER},
            content_type="application/merge-patch+json",
        )
        if result is None:
            raise ApiError(404, f"pod {namespace}/{name} not found")

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._request("GET", self._lease_path(namespace, name))

    async def create_lease(
        self,
        namespace: str,
        name: str,
        spec: Mapping[str, Any],
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create the Lease; Conflict (409 AlreadyExists) if another replica created it first."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
            "spec": dict(spec),
        }
        result = await self._request(
            "POST", self._lease_path(namespace), body=body, params={"fieldManager": FIELD_MANAGER}
        )
        assert result is not None
        return result

    async def replace_lease(
        self,
        namespace: str,
        name: str,
        resource_version: str,
        spec: Mapping[str, Any],
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Replace the Lease (spec and annotations) only if it still has `resource_version` (Conflict
        otherwise)."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": resource_version,
                "annotations": dict(annotations or {}),
            },
            "spec": dict(spec),
        }
        result = await self._request(
            "PUT", self._lease_path(namespace, name), body=body, params={"fieldManager": FIELD_MANAGER}
        )
        if result is None:
            raise ApiError(404, f"Lease {namespace}/{name} is gone")
        return result

    # --- Events -----------------------------------------------------------------------------------

    async def record_event(
        self,
        *,
        quota_name: str,
        quota_uid: str,
        reason: str,
        message: str,
        type_: str = "Warning",
        namespace: str = "default",
    ) -> None:
        """A core/v1 Event about a (cluster-scoped) GpuQuota; failures are logged, never raised."""
        now = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{quota_name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": QUOTA_API_VERSION,
                "kind": QUOTA_KIND,
                "name": quota_name,
                "uid": quota_uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": "gpuforge-quota"},
            "reportingComponent": "gpuforge.io/quota",
            "reportingInstance": "gpuforge-quota",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "eventTime": now,
            "action": "Admit",
            "count": 1,
        }
        try:
            await self._request("POST", RESOURCES["Event"].path(namespace), body=body)
        except (TimeoutError, ApiError, aiohttp.ClientError) as error:
            log.warning("could not record event %s on GpuQuota %s: %s", reason, quota_name, error)

    # --- Webhook configurations (for `webhook run --register`) ------------------------------------------

    async def apply_webhook_configuration(self, obj: Mapping[str, Any]) -> None:
        resource = RESOURCES["ValidatingWebhookConfiguration"]
        name = obj["metadata"]["name"]
        await self._request(
            "PATCH",
            resource.path(name=name),
            body=obj,
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    async def apply_object(self, collection_path: str, name: str, obj: Mapping[str, Any]) -> None:
        """Server-side apply of a cluster-scoped object (the CRD, for tests and the demo)."""
        await self._request(
            "PATCH",
            f"{collection_path}/{quote(name)}",
            body=obj,
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    async def wait_crd_established(self, name: str, timeout: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            crd = await self._request(
                "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            )
            conditions = ((crd or {}).get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                return
            await asyncio.sleep(0.2)
        raise ApiError(504, f"CRD {name} not established after {timeout}s")

    async def delete_webhook_configuration(self, name: str) -> None:
        await self._request("DELETE", RESOURCES["ValidatingWebhookConfiguration"].path(name=name))


__all__ = [
    "ApiError",
    "ChangeHandler",
    "Conflict",
    "Credentials",
    "Informer",
    "QuotaApi",
    "load_credentials",
    "without_managed_fields",
]
