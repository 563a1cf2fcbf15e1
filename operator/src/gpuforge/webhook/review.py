"""AdmissionReview (admission.k8s.io/v1) requests in, responses out. Pure, no I/O.

Anything that is not a well-formed AdmissionReview raises BadReview, which the server answers with
HTTP 400 and a log line: the API server never sends such bodies, so whoever did gets a clear error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

MAX_BODY_BYTES: Final = 8 * 1024 * 1024  # two 1.5 MiB objects (object, oldObject) and more


class BadReview(ValueError):
    pass


@dataclass(frozen=True)
class AdmissionRequest:
    uid: str
    kind: str  # request.kind.kind: "Deployment", "Scale", "GpuQuota", ...
    resource: str  # request.resource.resource: "deployments"
    sub_resource: str
    operation: str  # CREATE | UPDATE | DELETE | CONNECT
    namespace: str
    name: str
    dry_run: bool
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    api_version: str = "admission.k8s.io/v1"
    user: str = ""
    user_info: Mapping[str, Any] = field(default_factory=dict)  # request.userInfo, for access reviews
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)


def _optional_object(value: object, name: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise BadReview(f"request.{name} must be an object")
    return value


def parse_review(body: bytes) -> AdmissionRequest:
    if len(body) > MAX_BODY_BYTES:
        raise BadReview(f"body of {len(body)} bytes is larger than {MAX_BODY_BYTES}")
    try:
        review = orjson.loads(body)
    except (ValueError, RecursionError) as error:
        raise BadReview(f"body is not JSON: {error}") from error
    if not isinstance(review, Mapping):
        raise BadReview("body is not a JSON object")
    if review.get("kind") != "AdmissionReview":
        raise BadReview(f"kind is {review.get('kind')!r}, not AdmissionReview")
    api_version = review.get("apiVersion")
    if api_version not in ("admission.k8s.io/v1", "admission.k8s.io/v1beta1"):
        raise BadReview(f"apiVersion {api_version!r} is not admission.k8s.io/v1")
    request = review.get("request")
    if not isinstance(request, Mapping):
        raise BadReview("request is missing")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing")
    kind = request.get("kind")
    resource = request.get("resource")
    if not isinstance(kind, Mapping) or not isinstance(kind.get("kind"), str):
        raise BadReview("request.kind.kind is missing")
    if not isinstance(resource, Mapping) or not isinstance(resource.get("resource"), str):
        raise BadReview("request.resource.resource is missing")
    operation = request.get("operation")
    if operation not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise BadReview(f"request.operation {operation!r} is not CREATE, UPDATE, DELETE or CONNECT")
    strings = {}
    for key in ("namespace", "name", "subResource"):
        value = request.get(key) or ""
        if not isinstance(value, str):
            raise BadReview(f"request.{key} must be a string")
        strings[key] = value
    dry_run = request.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise BadReview("request.dryRun must be a boolean")
    user_info = request.get("userInfo")
    user = user_info.get("username", "") if isinstance(user_info, Mapping) else ""
    return AdmissionRequest(
        uid=uid,
        kind=kind["kind"],
        resource=resource["resource"],
        sub_resource=strings["subResource"],
        operation=operation,
        namespace=strings["namespace"],
        name=strings["name"],
        dry_run=dry_run,
        object=_optional_object(request.get("object"), "object"),
        old_object=_optional_object(request.get("oldObject"), "oldObject"),
        api_version=str(api_version),
        user=str(user),
        user_info=user_info if isinstance(user_info, Mapping) else {},
        raw=request,
    )


def review_response(
    request: AdmissionRequest,
    allowed: bool,
    message: str = "",
    code: int = 200,
    reason: str = "",
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": request.uid, "allowed": allowed}
    if not allowed or message:
        status: dict[str, Any] = {"code": code if not allowed else 200, "message": message}
        if reason:
            status["reason"] = reason
        response["status"] = status
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": request.api_version, "kind": "AdmissionReview", "response": response}
