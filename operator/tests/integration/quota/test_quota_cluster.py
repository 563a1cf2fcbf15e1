"""GpuQuota on the real local control plane: the API server calls the webhook over TLS.

Each test gets quotas with unique names (and a fresh namespace), so they share one webhook process.
Admissions are answered first and written to the quota's status right after (write-behind): a test
that reads the status after an admission waits a moment for it; a child quota's carve-out is written
before the answer.
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes import client

from .conftest import GPU, Quotas, WebhookProcess, deployment, kubectl, wait_for

pytestmark = pytest.mark.cluster

DRA = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"


def create(apps: client.AppsV1Api, namespace: str, body: dict[str, Any]) -> str:
    """'admitted', or the webhook's denial message."""
    try:
        apps.create_namespaced_deployment(namespace, body)
    except client.ApiException as error:
        return str(error.body)
    return "admitted"


# --- tree rules ----------------------------------------------------------------------------------


def test_tree_create_rules(quotas: Quotas) -> None:
    quotas.create("org", {GPU: 16, "requests.cpu": 64})
    quotas.create("team", {GPU: 10, "requests.cpu": 8}, parent="org")
    assert quotas.used("org") == "10"  # the child's hard is carved from the parent
    with pytest.raises(client.ApiException, match="only 6 is left"):
        quotas.create("greedy", {GPU: 7, "requests.cpu": 1}, parent="org")
    with pytest.raises(client.ApiException, match=r"missing: requests\.cpu"):
        quotas.create("partial", {GPU: 1}, parent="org")
    with pytest.raises(client.ApiException, match="does not exist"):
        quotas.create("orphan", {GPU: 1}, parent="nobody")
    with pytest.raises(client.ApiException, match=r"spec\.hard\.requests\.cpu"):
        quotas.create("garbage", {GPU: 1, "requests.cpu": "lots"}, parent="org")
    assert quotas.used("org") == "10"  # refusals changed nothing


def test_tree_update_rules(quotas: Quotas) -> None:
    quotas.create("org", {GPU: 16})
    quotas.create("other", {GPU: 1})
    quotas.create("team", {GPU: 4}, parent="org")
    quotas.patch("team", {"spec": {"hard": {GPU: "16"}}})  # grows into the parent's remaining 12
    assert quotas.used("org") == "16"
    with pytest.raises(client.ApiException, match="only 0 is left"):
        quotas.patch("team", {"spec": {"hard": {GPU: "17"}}})
    with pytest.raises(client.ApiException, match=r"spec\.parent is immutable"):
        quotas.patch("team", {"spec": {"parent": quotas.name("other")}})
    quotas.patch("team", {"spec": {"hard": {GPU: "2"}}})  # lowering is always allowed
    wait_for("the controller to release the parent's carve-out", lambda: quotas.used("org") == "2")
    quotas.patch("org", {"spec": {"hard": {GPU: "1"}}})  # below used: allowed, but admits nothing more
    with pytest.raises(client.ApiException, match="only 0 is left"):
        quotas.create("late", {GPU: 1}, parent="org")


def test_tree_delete_rules(quotas: Quotas) -> None:
    quotas.create("org", {GPU: 8})
    quotas.create("team", {GPU: 3}, parent="org")
    with pytest.raises(client.ApiException, match="only leaves can be deleted"):
        quotas.delete("org")
    quotas.delete("team")
    wait_for("the parent to get its quota back", lambda: quotas.used("org") == "0")
    quotas.delete("org")


# --- racing workloads ------------------------------------------------------------------------------


def test_fifty_racing_creates_admit_exactly_sixteen(quotas: Quotas, namespace: str, api_client: Any) -> None:
    quotas.create("race", {GPU: 16})
    apps = client.AppsV1Api(api_client)
    with ThreadPoolExecutor(50) as pool:
        results = list(
            pool.map(lambda i: create(apps, namespace, deployment(f"w{i}", quotas.name("race"))), range(50))
        )
    admitted = results.count("admitted")
    odd = [r for r in results if r != "admitted" and "requests.nvidia.com/gpu=1 but only 0 is left" not in r]
    assert admitted == 16, (admitted, odd[:3], quotas.get("race").get("status"))
    assert not odd, odd[:3]
    assert len(apps.list_namespaced_deployment(namespace).items) == 16
    wait_for("the status to say 16", lambda: quotas.used("race") == "16", timeout=5)
    time.sleep(6)  # a full resync recomputes from the Deployments that exist: still 16
    assert quotas.used("race") == "16"


def test_fifty_racing_kubectl_scales_admit_exactly_sixteen(
    quotas: Quotas, namespace: str, api_client: Any, dev_cluster: Any
) -> None:
    quotas.create("scale", {GPU: 16})
    apps = client.AppsV1Api(api_client)
    for i in range(50):
        assert create(apps, namespace, deployment(f"s{i}", quotas.name("scale"), replicas=0)) == "admitted"

    def scale(i: int) -> subprocess.CompletedProcess[str]:
        command = [*kubectl(dev_cluster), "-n", namespace, "scale", f"deployment/s{i}", "--replicas=1"]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(scale, range(50)))
    assert sum(r.returncode == 0 for r in results) == 16, [r.stderr for r in results if r.returncode][:3]
    assert all("but only 0 is left" in r.stderr for r in results if r.returncode)
    replicas = sum(d.spec.replicas for d in apps.list_namespaced_deployment(namespace).items)
    assert replicas == 16
    # A scale admitted whose write then failed in the API server stays reserved until it settles (<= 60 s):
    # the quota may briefly say more than 16, never allow more than 16.
    wait_for("status to settle at 16", lambda: quotas.used("scale") == "16", timeout=70)


def test_a_scale_reservation_keeps_its_generation_on_the_server(
    quotas: Quotas, namespace: str, api_client: Any
) -> None:
    """The API server prunes status fields the CRD does not declare. Reservations must come back with
    the generation they settle at: read as 0, a scale-up's reservation was released as soon as the
    controller saw the Deployment at its old replica count, and racing scales went over the quota."""
    quotas.create("gen", {GPU: 16})
    apps = client.AppsV1Api(api_client)
    assert create(apps, namespace, deployment("g", quotas.name("gen"), replicas=0)) == "admitted"
    before = apps.read_namespaced_deployment("g", namespace).metadata.generation
    apps.patch_namespaced_deployment_scale("g", namespace, {"spec": {"replicas": 2}})

    def mine() -> list[dict[str, Any]]:
        reservations = quotas.get("gen").get("status", {}).get("reservations") or []
        return [r for r in reservations if r["workload"] == f"Deployment/{namespace}/g"]

    # Written right after the answer; settled reservations are dropped in batches (15 s), so it is
    # still there a moment after the scale.
    wait_for("the scale's reservation in status", lambda: bool(mine()), timeout=5)
    assert mine()[-1].get("generation") == before + 1, mine()
    wait_for("status to settle at 2", lambda: quotas.used("gen") == "2")


def test_webhook_restart_in_the_middle_changes_nothing(
    quotas: Quotas, namespace: str, api_client: Any, quota_webhook: WebhookProcess
) -> None:
    quotas.create("restart", {GPU: 16})
    apps = client.AppsV1Api(api_client)

    def create_until_answered(i: int) -> str:
        while True:  # a refused call while the webhook is down fails closed; the client tries again
            result = create(apps, namespace, deployment(f"r{i}", quotas.name("restart")))
            if result == "admitted" or "is left" in result:
                return result
            if "already exists" in result:  # admitted, but the answer was lost with the old process
                return "admitted"
            time.sleep(0.2)

    with ThreadPoolExecutor(50) as pool:
        futures = [pool.submit(create_until_answered, i) for i in range(50)]
        time.sleep(0.3)
        # SIGKILL mid-race, then a new process with a new CA on the same port: it waits out what the
        # killed one admitted without writing it (the webhook timeout plus the time to store it).
        quota_webhook.restart()
        results = [f.result(timeout=180) for f in futures]
    assert results.count("admitted") == 16
    assert len(apps.list_namespaced_deployment(namespace).items) == 16
    wait_for("the status to say 16", lambda: quotas.used("restart") == "16", timeout=5)


# --- per model, DRA, budgets -------------------------------------------------------------------------


def test_model_quota_inside_generic_quota(quotas: Quotas, namespace: str, api_client: Any) -> None:
    quotas.create("models", {GPU: 10, f"{GPU}.H100": 4})
    apps = client.AppsV1Api(api_client)
    name = quotas.name("models")
    h100 = [create(apps, namespace, deployment(f"h{i}", name, model="H100")) for i in range(6)]
    assert h100.count("admitted") == 4
    assert "requests.nvidia.com/gpu.H100=1 but only 0 is left" in h100[-1]
    other = [create(apps, namespace, deployment(f"l{i}", name, model="L4")) for i in range(8)]
    assert other.count("admitted") == 6
    assert "requests.nvidia.com/gpu=1 but only 0 is left" in other[-1]
    wait_for("the status to say 10", lambda: quotas.used("models") == "10", timeout=5)
    assert quotas.used("models", f"{GPU}.H100") == "4"


def _claim_template(version: str) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "gpus"}
    exact = {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}
    if version == "v1beta1":
        request.update(exact)
    else:
        request["exactly"] = exact
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "two-gpus"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def _job(name: str, quota: str, parallelism: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"gpuforge.io/quota": quota}},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example/train:1",
                            "resources": {"claims": [{"name": "gpus"}]},
                        }
                    ],
                }
            },
        },
    }


def test_job_with_claim_template_counts_devices(quotas: Quotas, namespace: str, api_client: Any) -> None:
    quotas.create("dra", {DRA: 6})
    custom = client.CustomObjectsApi(api_client)
    versions = [
        g.preferred_version.version
        for g in client.ApisApi(api_client).get_api_versions().groups
        if g.name == "resource.k8s.io"
    ]
    version = versions[0]
    custom.create_namespaced_custom_object(
        "resource.k8s.io", version, namespace, "resourceclaimtemplates", _claim_template(version)
    )
    batch = client.BatchV1Api(api_client)
    batch.create_namespaced_job(namespace, _job("train", quotas.name("dra"), 3))  # 2 devices x 3 pods
    wait_for("the status to say 6", lambda: quotas.used("dra", DRA) == "6", timeout=5)
    with pytest.raises(client.ApiException, match="devices=2 but only 0 is left"):
        batch.create_namespaced_job(namespace, _job("more", quotas.name("dra"), 1))


def test_gpu_hours_accrue_and_a_spent_budget_denies_new_work(
    quotas: Quotas, namespace: str, api_client: Any, gpu_nodes: list[str]
) -> None:
    # The webhook runs with --speedup 3600: one second of one running GPU counts as one GPU-hour.
    quotas.create("hours", {GPU: 4, f"cash/{GPU}": 3})
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    assert create(apps, namespace, deployment("runner", quotas.name("hours"))) == "admitted"
    wait_for(
        "the GPU pod to run",
        lambda: any(
            p.status.phase == "Running"
            for p in core.list_namespaced_pod(namespace, label_selector="app=runner").items
        ),
    )
    wait_for("GPU-hours to accrue", lambda: float(quotas.used("hours", f"cash/{GPU}")) > 0)
    wait_for("the budget to be spent", lambda: float(quotas.used("hours", f"cash/{GPU}")) >= 3, timeout=30)
    denied = create(apps, namespace, deployment("late", quotas.name("hours")))
    assert "budget cash/requests.nvidia.com/gpu is spent" in denied
    conditions = {c["type"]: c["status"] for c in quotas.get("hours")["status"]["conditions"]}
    assert conditions["BudgetExhausted"] == "True"
    running = core.list_namespaced_pod(namespace, label_selector="app=runner").items
    assert [p.status.phase for p in running] == ["Running"]  # running work is not killed
    events = core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={quotas.name('hours')}"
    )
    assert any(e.reason == "BudgetExhausted" for e in events.items)


def test_dry_run_writes_nothing(quotas: Quotas, namespace: str, api_client: Any) -> None:
    quotas.create("dry", {GPU: 2})
    apps = client.AppsV1Api(api_client)
    apps.create_namespaced_deployment(
        namespace, deployment("d", quotas.name("dry"), replicas=2), dry_run="All"
    )
    assert quotas.used("dry") == "0"
    with pytest.raises(client.ApiException, match="but only 2 is left"):
        apps.create_namespaced_deployment(
            namespace, deployment("d", quotas.name("dry"), replicas=3), dry_run="All"
        )


# --- reservations keyed by object uid ------------------------------------------------------------------


def test_delete_and_recreate_under_the_same_name_keeps_usage_right(
    quotas: Quotas, namespace: str, api_client: Any
) -> None:
    quotas.create("uid", {GPU: 8})
    apps = client.AppsV1Api(api_client)
    first = apps.create_namespaced_deployment(namespace, deployment("same", quotas.name("uid"), gpus=2))

    def reservation_uids() -> list[str]:
        status = quotas.get("uid").get("status") or {}
        return [uid for item in status.get("reservations") or [] for uid in item.get("objectUids") or []]

    # The API server assigns the uid before validating admission: the create's reservation names it.
    wait_for("the reservation", lambda: first.metadata.uid in reservation_uids(), timeout=5)
    apps.delete_namespaced_deployment("same", namespace)
    second = apps.create_namespaced_deployment(namespace, deployment("same", quotas.name("uid"), gpus=3))
    assert second.metadata.uid != first.metadata.uid
    wait_for("the reservation", lambda: second.metadata.uid in reservation_uids(), timeout=5)
    # The old object's deletion must not settle the new one's reservation: usage never dips below 3.
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        assert int(quotas.used("uid")) >= 3
        time.sleep(0.2)
    wait_for("usage 3 for the recreated Deployment", lambda: quotas.used("uid") == "3")
