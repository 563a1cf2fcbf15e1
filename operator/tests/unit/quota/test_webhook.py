"""Webhook pieces that need no cluster: AdmissionReview parsing (fuzzed), certificates, configurations."""

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from cryptography import x509
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuforge.k8s.quota import Credentials, QuotaApi
from gpuforge.webhook.admission import AdmissionHandlers
from gpuforge.webhook.certs import (
    generate_ca,
    issue_serving_cert,
    needs_rotation,
    plan_certificates,
    service_dns_names,
    signed_by,
)
from gpuforge.webhook.manifests import ClientTarget, render_webhook_configurations
from gpuforge.webhook.review import MAX_BODY_BYTES, BadReview, parse_review
from gpuforge.webhook.server import CertReloader, make_app

from ..webhook.fakes import Shell

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def review(**request: Any) -> dict[str, Any]:
    base = {
        "uid": "u1",
        "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "operation": "CREATE",
        "namespace": "ns",
        "name": "w",
        "object": {"metadata": {"name": "w"}},
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {**base, **request}}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"kind": "Pod"}', "not AdmissionReview"),
        (json.dumps({**review(), "apiVersion": "v9"}).encode(), "apiVersion"),
        (json.dumps({**review(), "request": None}).encode(), "request is missing"),
        (json.dumps(review(uid="")).encode(), "uid"),
        (json.dumps(review(operation="EXPLODE")).encode(), "operation"),
        (json.dumps(review(object=[1])).encode(), "request.object must be an object"),
        (json.dumps(review(dryRun="yes")).encode(), "dryRun"),
        (b"[" * 100_000, "not JSON"),
        (b"x" * (MAX_BODY_BYTES + 1), "larger than"),
    ],
)
def test_malformed_reviews(body: bytes, message: str) -> None:
    with pytest.raises(BadReview, match=message):
        parse_review(body)


def test_well_formed_review() -> None:
    request = parse_review(json.dumps(review(dryRun=True)).encode())
    assert (request.kind, request.operation, request.dry_run, request.namespace) == (
        "Deployment",
        "CREATE",
        True,
        "ns",
    )


# An API client pointing nowhere: any request that needs the API fails fast, and must still be answered.
UNREACHABLE = Credentials(server="http://127.0.0.1:9", ssl_context=False, headers={})


def unreachable_leader() -> AdmissionHandlers:
    """The handlers of a leader that admits, over an API server it cannot reach."""
    shell = Shell(QuotaApi(UNREACHABLE, request_timeout=1))  # type: ignore[arg-type]
    shell.admitting()
    return shell.handlers


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
near_reviews = st.builds(
    lambda request, api_version: {"apiVersion": api_version, "kind": "AdmissionReview", "request": request},
    st.fixed_dictionaries(
        {},
        optional={
            "uid": st.text(max_size=5) | json_values,
            "kind": st.fixed_dictionaries({"kind": st.sampled_from(["Deployment", "Scale", "GpuQuota"])})
            | json_values,
            "resource": st.fixed_dictionaries({"resource": st.sampled_from(["deployments", "gpuquotas"])}),
            "operation": st.sampled_from(["CREATE", "UPDATE", "DELETE"]) | json_values,
            "object": json_values
            | st.fixed_dictionaries(
                {"metadata": st.fixed_dictionaries({"labels": json_values}), "spec": json_values}
            ),
            "oldObject": json_values,
            "dryRun": st.booleans() | json_values,
        },
    ),
    st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1", "x"]),
)
bodies = (
    st.binary(max_size=300)
    | json_values.map(lambda v: json.dumps(v).encode())
    | near_reviews.map(lambda v: json.dumps(v).encode())
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, path=st.sampled_from(["/validate-workloads", "/validate-scale", "/validate-gpuquotas"]))
async def test_fuzzed_bodies_get_400_or_a_review_never_a_crash(body: bytes, path: str) -> None:
    handlers = unreachable_leader()
    async with TestClient(TestServer(make_app(handlers))) as client:
        response = await client.post(path, data=body)
        assert response.status in (200, 400)
        payload = await response.json()
        if response.status == 200:
            assert payload["kind"] == "AdmissionReview"
            assert isinstance(payload["response"]["allowed"], bool)
    await handlers.api.close()


async def test_unlabelled_and_owned_objects_are_allowed_without_the_api() -> None:
    handlers = unreachable_leader()
    owned = {
        "metadata": {
            "labels": {"gpuforge.io/quota": "t"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "controller": True}],
        }
    }
    async with TestClient(TestServer(make_app(handlers))) as client:
        for obj, kind in (({"metadata": {"name": "w"}}, "Pod"), (owned, "ReplicaSet")):
            response = await client.post("/validate-workloads", json=review(object=obj, kind={"kind": kind}))
            assert (await response.json())["response"]["allowed"] is True
        metrics = await (await client.get("/metrics")).text()
        assert "gpuforge_quota_admissions_total" in metrics
    await handlers.api.close()


async def test_api_failure_denies_with_a_message() -> None:
    handlers = unreachable_leader()
    labelled = {
        "metadata": {"name": "w", "labels": {"gpuforge.io/quota": "t"}},
        "spec": {"template": {"spec": {"containers": []}}},
    }
    async with TestClient(TestServer(make_app(handlers))) as client:
        response = await client.post("/validate-workloads", json=review(object=labelled))
        answer = (await response.json())["response"]
        assert answer["allowed"] is False
        assert "could not check the quota" in answer["status"]["message"]
    await handlers.api.close()


async def test_a_body_arriving_in_pieces_is_read_whole() -> None:
    """Under load a review reaches the server in several segments; all of them make up the body."""
    handlers = unreachable_leader()
    body = json.dumps(review(object={"metadata": {"name": "w", "annotations": {"pad": "x" * 5000}}})).encode()

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]
            await asyncio.sleep(0.01)

    async with TestClient(TestServer(make_app(handlers))) as client:
        response = await client.post("/validate-workloads", data=pieces())
        assert response.status == 200, await response.text()
        assert (await response.json())["response"]["allowed"] is True
    await handlers.api.close()


# --- certificates ----------------------------------------------------------------------------------


def test_serving_cert_chains_to_ca_and_names_hosts() -> None:
    ca = generate_ca(NOW)
    hosts = [*service_dns_names("quota", "gpuforge"), "127.0.0.1"]
    pair = issue_serving_cert(ca, hosts, NOW)
    assert signed_by(pair.cert_pem, ca.cert_pem)
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "quota.gpuforge.svc" in sans.get_values_for_type(x509.DNSName)


@pytest.mark.parametrize(("days", "rotate"), [(1, False), (59, False), (61, True), (100, True)])
def test_rotation_after_two_thirds(days: int, rotate: bool) -> None:
    pair = issue_serving_cert(generate_ca(NOW), ["h"], NOW, validity=timedelta(days=90))
    assert needs_rotation(pair.cert_pem, NOW + timedelta(days=days)) is rotate


def test_plan_keeps_then_rotates() -> None:
    first = plan_certificates(NOW, ["h"])
    assert first.rotated_ca and first.rotated_serving
    again = plan_certificates(NOW + timedelta(days=1), ["h"], first.ca, first.serving)
    assert not again.rotated_ca and not again.rotated_serving and again.serving == first.serving
    later = plan_certificates(NOW + timedelta(days=70), ["h"], first.ca, first.serving)
    assert later.rotated_serving and not later.rotated_ca
    renamed = plan_certificates(NOW + timedelta(days=1), ["h", "other"], first.ca, first.serving)
    assert renamed.rotated_serving
    ca_expiring = plan_certificates(NOW + timedelta(days=3000), ["h"], first.ca, first.serving)
    assert ca_expiring.rotated_ca
    assert first.ca.cert_pem in ca_expiring.ca_bundle  # old CA trusted until replicas have the new cert


def test_cert_reload_without_restart(tmp_path: Path) -> None:
    ca = generate_ca(NOW)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first = issue_serving_cert(ca, ["127.0.0.1"], datetime.now(UTC))
    cert.write_bytes(first.cert_pem)
    key.write_bytes(first.key_pem)
    reloader = CertReloader(cert, key)
    assert not reloader.reload_if_changed()
    second = issue_serving_cert(ca, ["127.0.0.1", "localhost"], datetime.now(UTC))
    cert.write_bytes(second.cert_pem)
    key.write_bytes(second.key_pem)
    assert reloader.reload_if_changed()
    cert.write_bytes(b"half written")
    assert not reloader.reload_if_changed()  # keeps serving the last good certificate
    assert isinstance(reloader.context, ssl.SSLContext)


# --- webhook configurations ----------------------------------------------------------------------


def test_configurations_are_narrow() -> None:
    workloads, tree = render_webhook_configurations(
        ClientTarget(b"CA", url="https://127.0.0.1:8443"),
        failure_policy="Ignore",
        excluded_namespaces=["gpuforge"],
    )
    hook, required, defaulted, scale = workloads["webhooks"]
    assert hook["clientConfig"]["url"] == "https://127.0.0.1:8443/validate-workloads"
    assert hook["clientConfig"]["caBundle"] == "Q0E="
    assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == 5
    assert hook["sideEffects"] == "NoneOnDryRun"
    excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
    assert {"kube-system", "gpuforge"} <= set(excluded)
    assert "gpuforge.io/quota" in hook["matchConditions"][0]["expression"]
    rules = {rule["resources"][0]: rule for rule in hook["rules"]}
    assert rules["pods"] == {
        "apiGroups": [""],
        "apiVersions": ["*"],
        "resources": ["pods"],
        "operations": ["CREATE", "UPDATE"],  # UPDATE: a bare pod relabelled into another quota
        "scope": "Namespaced",
    }
    conditions = {item["name"]: item["expression"] for item in hook["matchConditions"]}
    assert "o.apiVersion.startsWith('batch/')" in conditions["not-owned-by-a-workload"]
    assert "oldObject.metadata.labels" in conditions["pod-quota-changed"]
    assert "object.spec.replicas >= oldObject.spec.replicas" in conditions["not-a-scale-down"]
    assert scale["rules"][0]["resources"] == ["deployments/scale", "statefulsets/scale", "replicasets/scale"]
    assert [rule["resources"] for rule in scale["rules"][1:]] == [
        ["leaderworkersets/scale"],
        ["pytorchjobs/scale"],
        ["rollouts/scale"],
    ]
    assert rules["pods/resize"]["operations"] == ["UPDATE"]
    # Every kind of the workload table comes, each by its own group.
    assert rules["jobsets"]["apiGroups"] == ["jobset.x-k8s.io"]
    assert rules["rayclusters"]["resources"] == ["rayclusters", "rayjobs"]
    assert {"leaderworkersets", "pytorchjobs", "rollouts"} <= set(rules)
    assert (
        "o.apiVersion.startsWith('kubeflow.org/') && o.kind in ['PyTorchJob']"
        in conditions["not-owned-by-a-workload"]
    )
    assert "object.spec.pytorchReplicaSpecs.exists(i0" in conditions["labelled-for-quota"]
    assert "object.spec.replicatedJobs.exists(i0, (has(i0.template)" in conditions["labelled-for-quota"]
    assert "object.spec.template.metadata.labels" in conditions["labelled-for-quota"]
    # Only namespaces that require a quota send objects naming none.
    assert required["namespaceSelector"]["matchLabels"] == {"gpuforge.io/quota-required": "true"}
    assert required["matchConditions"][0]["expression"].startswith("!(")
    assert "pods" not in required["matchConditions"][1]["expression"].split("||")[0]
    # ... unless they have a default quota; those send them to the default's webhook, which charges it.
    default_label = {"key": "gpuforge.io/default-quota", "operator": "DoesNotExist"}
    assert default_label in required["namespaceSelector"]["matchExpressions"]
    assert {"key": "gpuforge.io/default-quota", "operator": "Exists"} in defaulted["namespaceSelector"][
        "matchExpressions"
    ]
    assert defaulted["matchConditions"][0] == required["matchConditions"][0]
    assert defaulted["rules"][:-1] == required["rules"]
    # A default quota checks the resize of any pod naming none, one a controller made too.
    assert defaulted["rules"][-1]["resources"] == ["pods/resize"]
    assert "pods/resize" not in [resource for rule in required["rules"] for resource in rule["resources"]]
    not_owned = defaulted["matchConditions"][1]["expression"]
    assert not_owned == (
        "(has(request.subResource) && request.subResource == 'resize') || "
        + required["matchConditions"][1]["expression"]
    )
    (scale_up,) = scale["matchConditions"]
    assert scale_up["name"] == "scale-up" and "> (has(oldObject.spec.replicas)" in scale_up["expression"]
    assert tree["webhooks"][0]["rules"][0]["operations"] == ["CREATE", "UPDATE", "DELETE"]


def test_registered_and_operator_rendered_configurations_filter_alike() -> None:
    """`webhook run --register` (a URL) and the operator (a Service) render one set of filters."""
    by_url = render_webhook_configurations(ClientTarget(b"CA", url="https://127.0.0.1:8443"))
    by_service = render_webhook_configurations(
        ClientTarget(b"CA", service_name="quota", service_namespace="gpuforge"), excluded_namespaces=["x"]
    )
    for url_config, service_config in zip(by_url, by_service, strict=True):
        for url_hook, service_hook in zip(url_config["webhooks"], service_config["webhooks"], strict=True):
            assert url_hook.get("matchConditions") == service_hook.get("matchConditions")
            assert url_hook["rules"] == service_hook["rules"]


def test_service_target_and_bad_timeout() -> None:
    target = ClientTarget(b"CA", service_name="quota", service_namespace="gpuforge")
    workloads, _ = render_webhook_configurations(target)
    assert workloads["webhooks"][0]["clientConfig"]["service"]["path"] == "/validate-workloads"
    with pytest.raises(ValueError, match="timeoutSeconds"):
        render_webhook_configurations(target, timeout_seconds=60)
