"""The quota webhook the operator deploys (gpuforge.render.quota_webhook) and its certificate plan
(gpuforge.render.certs), table by table, with a fixed clock."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.api.convert import from_dict
from gpuforge.api.gpustack import Condition, GpuStack, GpuStackSpec
from gpuforge.constants import COMPONENT_LABEL, MANAGED_BY_LABEL, STACK_LABEL
from gpuforge.render import quota_webhook as q
from gpuforge.render.certs import (
    CA_OVERLAP,
    CertPlan,
    KeyPair,
    generate_ca,
    issue_serving_cert,
    plan_certificates,
    signed_by,
)

GOLDEN = Path(__file__).parents[2] / "golden" / "render"
DEPLOY_CRD = Path(__file__).parents[3] / "deploy" / "crds" / "gpuquotas.gpuforge.io.yaml"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
# Placeholder PEMs: rendering never parses them, so golden files stay stable.
FIXED = CertPlan(KeyPair(b"CA-CERT", b"CA-KEY"), b"CA-CERT", KeyPair(b"TLS-CERT", b"TLS-KEY"), False, False)
EXTERNAL_CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n").decode()


def stack(
    quota: dict[str, Any] | None = None, name: str = "gpus", created: str = "", **spec: Any
) -> GpuStack:
    body = {"quota": {"enabled": True, **(quota or {})}, **spec}
    return GpuStack(name, from_dict(GpuStackSpec, body, "spec"), creation_timestamp=created)


def by_kind(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        out.setdefault(obj["kind"], []).append(obj)
    return out


# --- rendering ------------------------------------------------------------------------------------

GOLDEN_CASES: dict[str, q.QuotaInput] = {
    "quota-service": q.QuotaInput(
        stack({"failurePolicy": "Ignore", "replicas": 3}), FIXED, route_to_leader=True
    ),
    "quota-service-unregistered": q.QuotaInput(stack(), FIXED, register=False),
    "quota-url": q.QuotaInput(
        stack({"webhook": {"url": "https://webhook.example:8443", "caBundle": EXTERNAL_CA}}), None
    ),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden(case: str, update_golden: bool) -> None:
    objects = q.render_quota(GOLDEN_CASES[case])
    assert objects[0] == q.gpuquota_crd()  # first, so workloads can name quotas; not in the golden file
    text = yaml.safe_dump_all(objects[1:], sort_keys=False, width=110)
    path = GOLDEN / f"{case}.yaml"
    if update_golden:
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run pytest with --update-golden"
    assert text == path.read_text(), f"{path} differs; review and run pytest with --update-golden"


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_every_object_is_owned_by_the_stack_but_the_crd(case: str) -> None:
    crd, *rest = q.render_quota(GOLDEN_CASES[case])
    assert STACK_LABEL not in crd["metadata"]["labels"]  # shared, and never pruned
    for obj in rest:
        labels = obj["metadata"]["labels"]
        assert labels[STACK_LABEL] == "gpus" and labels[MANAGED_BY_LABEL] == "gpuforge"
        assert labels[COMPONENT_LABEL] == "quota-webhook"
        assert q.ref_of(obj) in q.quota_refs("gpuforge-operands"), "pruning must know every object"


def test_service_mode_deployment_survives_a_node_drain() -> None:
    objects = by_kind(q.render_quota(q.QuotaInput(stack(), FIXED)))
    (deployment,) = objects["Deployment"]
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    assert spec["replicas"] == 2 and spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert f"--cert={q.TLS_DIR}/tls.crt" in container["args"] and "--host=0.0.0.0" in container["args"]
    assert {"name": "tls", "secret": {"secretName": q.TLS_SECRET, "defaultMode": 0o440}} in pod["volumes"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]  # may read its key
    assert container["securityContext"]["readOnlyRootFilesystem"] and any(
        m["mountPath"] == "/tmp" for m in container["volumeMounts"]
    )  # the webhook writes a scratch directory
    (pdb,) = objects["PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    (service,) = objects["Service"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("quota", "image"),
    [({}, q.DEFAULT_IMAGE), ({"image": "registry.example/gpuforge:dev"}, "registry.example/gpuforge:dev")],
)
def test_image_defaults_to_the_operators_release(quota: dict[str, Any], image: str) -> None:
    (deployment,) = by_kind(q.render_quota(q.QuotaInput(stack(quota), FIXED)))["Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image


@pytest.mark.parametrize(
    ("quota", "client_config", "ca_bundle"),
    [
        (
            {},
            {"service": {"name": q.NAME, "namespace": "gpuforge-operands", "port": 443}},
            base64.b64encode(b"CA-CERT").decode(),
        ),
        (
            {"webhook": {"url": "https://10.0.0.9:8443/", "caBundle": EXTERNAL_CA}},
            {"url": "https://10.0.0.9:8443"},
            EXTERNAL_CA,
        ),
        ({"webhook": {"url": "https://quota.example.com"}}, {"url": "https://quota.example.com"}, ""),
    ],
)
def test_webhook_configurations_client_config(
    quota: dict[str, Any], client_config: dict[str, Any], ca_bundle: str
) -> None:
    inp = q.QuotaInput(stack(quota), None if "webhook" in quota else FIXED)
    configurations = by_kind(q.render_quota(inp))["ValidatingWebhookConfiguration"]
    assert [c["metadata"]["name"] for c in configurations] == list(q.CONFIGURATIONS)
    for configuration in configurations:
        for hook in configuration["webhooks"]:
            config = hook["clientConfig"]
            assert config["caBundle"] == ca_bundle
            if "service" in client_config:
                assert config["service"].items() >= client_config["service"].items()
            else:
                assert config["url"].startswith(client_config["url"] + "/validate-")
            assert hook["failurePolicy"] == "Fail"
            if "namespaceSelector" in hook:  # its own namespace never reaches the webhook
                expression = hook["namespaceSelector"]["matchExpressions"][0]
                assert "gpuforge-operands" in expression["values"] and "kube-system" in expression["values"]


def test_url_mode_deploys_nothing_in_the_cluster() -> None:
    quota = {"webhook": {"url": "https://127.0.0.1:9443"}}
    kinds = [o["kind"] for o in q.render_quota(q.QuotaInput(stack(quota), None))]
    assert kinds == [
        "CustomResourceDefinition",
        "ValidatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]


def test_unregistered_until_a_replica_is_available() -> None:
    kinds = [o["kind"] for o in q.render_quota(q.QuotaInput(stack(), FIXED, register=False))]
    assert "ValidatingWebhookConfiguration" not in kinds and "Deployment" in kinds


def test_new_ca_is_trusted_before_a_certificate_from_it_is_served() -> None:
    rotated = CertPlan(FIXED.ca, b"NEW+OLD", FIXED.serving, True, True, b"OLD")
    names = [o["metadata"]["name"] for o in q.render_quota(q.QuotaInput(stack(), rotated))]
    assert names.index(q.TLS_SECRET) > names.index(q.CONFIGURATIONS[1])
    kinds = [o["kind"] for o in q.render_quota(q.QuotaInput(stack(), FIXED))]
    names = [o["metadata"]["name"] for o in q.render_quota(q.QuotaInput(stack(), FIXED))]
    assert names.index(q.TLS_SECRET) < kinds.index("Deployment")


@pytest.mark.parametrize("bundle", ["not base64!", "QUJD*"])
def test_bad_ca_bundle_names_the_field(bundle: str) -> None:
    inp = q.QuotaInput(stack({"webhook": {"url": "https://x", "caBundle": bundle}}), None)
    with pytest.raises(q.QuotaSpecError, match=r"spec\.quota\.webhook\.caBundle"):
        q.render_quota(inp)


def test_service_mode_without_certificates_is_an_error() -> None:
    with pytest.raises(q.QuotaSpecError):
        q.render_quota(q.QuotaInput(stack(), None))


def test_packaged_crd_is_the_shipped_one() -> None:
    assert q.gpuquota_crd() == yaml.safe_load(DEPLOY_CRD.read_text())


def test_secrets_round_trip() -> None:
    plan = CertPlan(FIXED.ca, b"CA-CERTOLD", FIXED.serving, True, True, b"OLD")
    secrets = {
        o["metadata"]["name"]: o for o in q.render_quota(q.QuotaInput(stack(), plan)) if o["kind"] == "Secret"
    }
    stored = q.stored_certs(secrets[q.CA_SECRET], secrets[q.TLS_SECRET])
    assert stored == q.StoredCerts(FIXED.ca, FIXED.serving, b"OLD")
    assert q.stored_certs(None, {"data": {"tls.crt": "%%%", "tls.key": "QQ=="}}) == q.StoredCerts()


# --- who deploys it -------------------------------------------------------------------------------


JAN1, JAN2 = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"


@pytest.mark.parametrize(
    ("stacks", "holder"),
    [
        ([], None),
        ([stack({"enabled": False}, "a")], None),
        ([stack({}, "a", JAN2), stack({}, "b", JAN1)], "b"),
        ([stack({"enabled": False}, "a", JAN1), stack({}, "b", JAN2)], "b"),
        ([stack({}, "b", JAN1), stack({}, "a", JAN1)], "a"),  # the name breaks ties
    ],
)  # fmt: skip
def test_oldest_enabled_stack_holds_the_webhook(stacks: list[GpuStack], holder: str | None) -> None:
    assert q.quota_holder(stacks) == holder


# --- the condition --------------------------------------------------------------------------------

URL = {"webhook": {"url": "https://127.0.0.1:9443"}}


@pytest.mark.parametrize(
    ("quota", "facts", "expected"),
    [
        ({"enabled": False}, q.QuotaFacts(None), None),
        ({"enabled": False}, q.QuotaFacts(None, removing=True), ("False", q.REMOVING)),
        ({"enabled": False}, q.QuotaFacts(None, removing=True, error="403"), ("False", q.APPLY_FAILED)),
        ({}, q.QuotaFacts("other"), ("False", q.ELSEWHERE)),
        ({}, q.QuotaFacts("gpus", error="409 conflict"), ("False", q.APPLY_FAILED)),
        ({}, q.QuotaFacts("gpus", registered=False, replicas=2, available=0), ("False", q.WAITING)),
        ({}, q.QuotaFacts("gpus", registered=True, replicas=2, available=0), ("False", q.UNAVAILABLE)),
        ({}, q.QuotaFacts("gpus", registered=True, replicas=2, available=1), ("True", q.AVAILABLE)),
        (URL, q.QuotaFacts("gpus", registered=True), ("True", q.EXTERNAL)),
    ],
)
def test_condition(quota: dict[str, Any], facts: q.QuotaFacts, expected: tuple[str, str] | None) -> None:
    condition = q.quota_condition(stack(quota), facts, (), "2026-01-01T00:00:00Z")
    if expected is None:
        assert condition is None
    else:
        assert condition is not None and (condition.status, condition.reason) == expected
        assert condition.type == q.CONDITION and condition.message


def test_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    before = Condition(q.CONDITION, "False", q.WAITING, "", "2026-01-01T00:00:00Z", 1)
    facts = q.QuotaFacts("gpus", registered=True, replicas=2, available=0)
    later = q.quota_condition(stack(), facts, (before,), "2026-01-01T00:05:00Z")
    assert later is not None and later.last_transition_time == "2026-01-01T00:00:00Z"
    up = q.quota_condition(stack(), q.QuotaFacts("gpus", True, 2, 2), (before,), "2026-01-01T00:06:00Z")
    assert up is not None and up.last_transition_time == "2026-01-01T00:06:00Z"


# --- the certificate plan, with a fixed clock ----------------------------------------------------

HOSTS = q.serving_hosts("gpuforge-operands")
CA = generate_ca(NOW)
SERVING = issue_serving_cert(CA, HOSTS, NOW)
OTHER_CA = generate_ca(NOW)
DAY = timedelta(days=1)
OTHER_HOSTS = issue_serving_cert(CA, ["x.y.svc"], NOW)
OTHER_ISSUER = issue_serving_cert(OTHER_CA, HOSTS, NOW)


@pytest.mark.parametrize(
    ("name", "ca", "serving", "previous", "at", "rotated_ca", "rotated_serving", "keeps_previous"),
    [
        ("first install", None, None, None, NOW, True, True, False),
        ("steady", CA, SERVING, None, NOW + DAY, False, False, False),
        ("serving lost", CA, None, None, NOW + DAY, False, True, False),
        ("serving at 2/3 of 90 days", CA, SERVING, None, NOW + 61 * DAY, False, True, False),
        ("serving not yet due", CA, SERVING, None, NOW + 59 * DAY, False, False, False),
        ("serving for other hosts", CA, OTHER_HOSTS, None, NOW + DAY, False, True, False),
        ("serving from another CA", CA, OTHER_ISSUER, None, NOW + DAY, False, True, False),
        ("garbage serving", CA, KeyPair(b"junk", b"junk"), None, NOW + DAY, False, True, False),
        ("CA at 2/3 of its life", CA, SERVING, None, NOW + 2500 * DAY, True, True, True),
        ("CA expired", CA, SERVING, None, NOW + 3700 * DAY, True, True, False),
        ("overlap running", CA, SERVING, OTHER_CA.cert_pem, NOW + DAY / 2, False, False, True),
        ("overlap over", CA, SERVING, OTHER_CA.cert_pem, NOW + CA_OVERLAP + DAY, False, False, False),
    ],
)  # fmt: skip
def test_certificate_plan(
    name: str,
    ca: KeyPair | None,
    serving: KeyPair | None,
    previous: bytes | None,
    at: datetime,
    rotated_ca: bool,
    rotated_serving: bool,
    keeps_previous: bool,
) -> None:
    plan = plan_certificates(at, HOSTS, ca, serving, previous)
    assert (plan.rotated_ca, plan.rotated_serving) == (rotated_ca, rotated_serving), name
    assert signed_by(plan.serving.cert_pem, plan.ca.cert_pem)
    assert plan.ca_bundle.startswith(plan.ca.cert_pem)
    assert (plan.previous_ca_pem is not None) is keeps_previous, name
    if keeps_previous:
        assert plan.previous_ca_pem is not None and plan.previous_ca_pem in plan.ca_bundle
    if not rotated_ca:
        assert plan.ca == ca
    if not rotated_serving:
        assert plan.serving == serving


def test_ca_rotation_overlap_ends_a_day_after_the_new_ca() -> None:
    rotated = plan_certificates(NOW + 2500 * DAY, HOSTS, CA, SERVING)
    assert rotated.previous_ca_pem == CA.cert_pem and CA.cert_pem in rotated.ca_bundle
    args = (HOSTS, rotated.ca, rotated.serving, rotated.previous_ca_pem)
    during = plan_certificates(NOW + 2500 * DAY + DAY / 2, *args)
    assert during.previous_ca_pem == CA.cert_pem and not during.rotated_serving
    after = plan_certificates(NOW + 2500 * DAY + 2 * DAY, *args)
    assert after.previous_ca_pem is None and after.ca_bundle == rotated.ca.cert_pem


def _webhook_deployment(labelled: bool, updated: int, replicas: int, generation: int = 2) -> dict[str, Any]:
    labels = {"gpuforge.io/component": "quota-webhook"}
    if labelled:
        labels["gpuforge.io/quota-webhook-endpoint"] = "true"
    return {
        "metadata": {"generation": 2},
        "spec": {"replicas": 2, "template": {"metadata": {"labels": labels}}},
        "status": {
            "observedGeneration": generation,
            "updatedReplicas": updated,
            "replicas": replicas,
            "availableReplicas": replicas,
        },
    }


ROUTED_SERVICE = {"spec": {"selector": {"gpuforge.io/quota-webhook-endpoint": "true"}}}
PLAIN_SERVICE = {"spec": {"selector": {"gpuforge.io/component": "quota-webhook"}}}


@pytest.mark.parametrize(
    ("deployment", "service", "routes"),
    [
        (None, None, False),  # nothing deployed yet: every replica takes calls
        (_webhook_deployment(False, 2, 2), PLAIN_SERVICE, False),  # an earlier release: never labels itself
        (_webhook_deployment(True, 1, 3), PLAIN_SERVICE, False),  # rolling out: old pods would be left out
        (_webhook_deployment(True, 2, 2, generation=1), PLAIN_SERVICE, False),  # not observed yet
        (_webhook_deployment(True, 2, 2), PLAIN_SERVICE, True),  # rolled out: every pod labels itself
        (_webhook_deployment(True, 1, 3), ROUTED_SERVICE, True),  # a later rollout keeps the route
        (_webhook_deployment(False, 1, 3), ROUTED_SERVICE, False),  # a template without it: back to all
    ],
)
def test_routes_to_leader(
    deployment: dict[str, Any] | None, service: dict[str, Any] | None, routes: bool
) -> None:
    assert q.routes_to_leader(deployment, service) is routes
