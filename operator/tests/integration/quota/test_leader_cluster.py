"""Two webhook replicas on the real local control plane: one leader (through a coordination.k8s.io
Lease) decides every admission from its ledger; the other forwards to it. Killed mid-race, the leader
is replaced after the Lease expires and the new one's wait, and the quota is never exceeded. With
pod-label routing, the webhook's Service reaches the leader only."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from .conftest import LEASE_SECONDS, Certificates, Quotas, WebhookProcess, deployment, wait_for

pytestmark = pytest.mark.cluster

FORWARDED = 'gpuforge_quota_forwarded_total{result="answered"}'


class Pair:
    """`registered` is what the API server calls; `other` is the second replica."""

    def __init__(self, registered: WebhookProcess, other: WebhookProcess) -> None:
        self.registered, self.other = registered, other

    def leader(self) -> WebhookProcess | None:
        leading = [
            r for r in (self.registered, self.other) if r.process and r.metric("gpuforge_quota_leader") == 1
        ]
        assert len(leading) <= 1, "two replicas hold the Lease"
        return leading[0] if leading else None


@pytest.fixture
def pair(dev_cluster: Any, quota_webhook: WebhookProcess, tmp_path: Path) -> Iterator[Pair]:
    """The session's single webhook gives way to two elected replicas; the other replica starts first,
    so it leads and the registered one forwards to it."""
    quota_webhook.stop()  # SIGTERM: unregisters
    kubeconfig = Path(dev_cluster.kubeconfig)
    certificates = Certificates.issue(tmp_path)
    lease = f"q-test-{uuid.uuid4().hex[:6]}"  # a Lease of their own: no earlier holder to wait out
    other = WebhookProcess(
        kubeconfig,
        tmp_path,
        register=False,
        tag="other",
        elect=True,
        certificates=certificates,
        lease_name=lease,
    )
    registered = WebhookProcess(
        kubeconfig, tmp_path, tag="registered", elect=True, certificates=certificates, lease_name=lease
    )
    try:
        other.start()  # a new Lease: it waits one Lease duration plus the webhook timeout and 5 s
        registered.start(wait_admitting=False)
        wait_for("the registered replica to follow", lambda: registered.role() == "follower")
        yield Pair(registered, other)
    finally:
        for replica in (other, registered):
            replica.stop()
        quota_webhook.start()


def _create(apps: client.AppsV1Api, namespace: str, body: dict[str, Any]) -> str:
    """'admitted', 'full', or 'retry' (denied for now: no leader, or the leader waits)."""
    try:
        apps.create_namespaced_deployment(namespace, body)
    except client.ApiException as error:
        text = str(error.body)
        if "already exists" in text:  # admitted, but the answer was lost (the leader died meanwhile)
            return "admitted"
        if "but only 0 is left" in text:
            return "full"
        return "retry"
    return "admitted"


def test_the_follower_forwards_and_a_killed_leader_is_replaced_without_over_admission(
    pair: Pair, quotas: Quotas, namespace: str, api_client: Any
) -> None:
    quotas.create("race", {"requests.nvidia.com/gpu": 16})
    apps = client.AppsV1Api(api_client)
    assert pair.leader() is pair.other
    counts: list[int] = []
    done = threading.Event()

    def sample() -> None:  # the Deployments that exist, all through the race
        while not done.is_set():
            counts.append(len(apps.list_namespaced_deployment(namespace).items))
            time.sleep(0.2)

    retries: list[int] = [0]

    def client_loop(i: int) -> str:
        time.sleep(i * 0.1)  # clients keep coming for 5 s: through the leader's death and after
        while True:  # a client tries again while the webhook says so
            result = _create(apps, namespace, deployment(f"w{i}", quotas.name("race")))
            if result != "retry":
                return result
            retries[0] += 1
            time.sleep(0.3)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(50) as pool:
            futures = [pool.submit(client_loop, i) for i in range(50)]
            wait_for("admissions", lambda: len(apps.list_namespaced_deployment(namespace).items) >= 4)
            pair.other.stop(crash=True)  # SIGKILL mid-race: what it admitted may not be written yet
            killed, before = time.monotonic(), len(apps.list_namespaced_deployment(namespace).items)
            results = [f.result(timeout=240) for f in futures]
        resumed = time.monotonic() - killed
    finally:
        done.set()
        sampler.join()
    assert results.count("admitted") == 16, results
    assert max(counts) <= 16, f"{max(counts)} Deployments admitted against 16"
    assert len(apps.list_namespaced_deployment(namespace).items) == 16
    assert before < 16  # admission resumed after the takeover
    assert pair.leader() is pair.registered and pair.registered.role() == "admitting"
    assert (pair.registered.metric(FORWARDED) or 0) >= 4  # the first admissions went through it
    assert retries[0] > 0  # refused while no leader admitted: the clients tried again
    # Lease expiry (6 s, from when the follower last saw it renewed) + its read period + the wait for
    # the dead leader's admissions (webhook timeout 5 s + 5 s to store them) + reading everything.
    assert resumed < LEASE_SECONDS + 2 + 10 + 30
    wait_for("the status to say 16", lambda: quotas.used("race") == "16", timeout=10)


def test_a_leader_stopped_cleanly_hands_over_at_once_and_usage_stays_right(
    pair: Pair, quotas: Quotas, namespace: str, api_client: Any
) -> None:
    quotas.create("lead", {"requests.nvidia.com/gpu": 8})
    apps = client.AppsV1Api(api_client)
    for i in range(4):
        apps.create_namespaced_deployment(namespace, deployment(f"l{i}", quotas.name("lead")))
    wait_for("usage 4", lambda: quotas.used("lead") == "4")
    pair.other.stop()  # SIGTERM: stops admitting, writes everything, releases the Lease
    stopped = time.monotonic()
    wait_for("takeover", lambda: pair.registered.role() == "admitting", timeout=10)
    assert time.monotonic() - stopped < 5  # a released Lease needs no wait
    # The new leader recomputes: deletions lower usage (deletes do not go through the webhook).
    for i in range(2):
        apps.delete_namespaced_deployment(f"l{i}", namespace)
    wait_for("usage 2 after the handover", lambda: quotas.used("lead") == "2")
    apps.create_namespaced_deployment(namespace, deployment("after", quotas.name("lead")))
    wait_for("usage 3", lambda: quotas.used("lead") == "3")


def test_with_pod_label_routing_the_service_reaches_the_leader_only(
    dev_cluster: Any, namespace: str, api_client: Any, tmp_path: Path
) -> None:
    """Two pods stand for the replicas' pods (kwok runs them: Ready, with an IP) behind a Service that
    selects the endpoint label as the operator renders it; each replica process is told its pod's name
    as the downward API would. The endpoint controller then keeps the leader's pod only."""
    core, discovery = client.CoreV1Api(api_client), client.DiscoveryV1Api(api_client)
    label = "gpuforge.io/quota-webhook-endpoint"
    for name in ("hook-a", "hook-b"):
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": name, "labels": {"app": "hook", label: "true"}},  # as the template
                "spec": {
                    "containers": [
                        {"name": "webhook", "image": "gpuforge", "ports": [{"containerPort": 8443}]}
                    ],
                    "tolerations": [{"operator": "Exists"}],
                },
            },
        )
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "hook"},
            "spec": {
                "selector": {"app": "hook", label: "true"},
                "ports": [{"port": 443, "targetPort": 8443}],
            },
        },
    )

    def pod_ip(name: str) -> str:
        return str(core.read_namespaced_pod(name, namespace).status.pod_ip or "")

    def endpoints() -> set[str]:
        slices = discovery.list_namespaced_endpoint_slice(
            namespace, label_selector="kubernetes.io/service-name=hook"
        ).items
        return {
            address
            for piece in slices
            for endpoint in piece.endpoints or []
            if endpoint.conditions and endpoint.conditions.ready
            for address in endpoint.addresses
        }

    wait_for("both pods running", lambda: pod_ip("hook-a") and pod_ip("hook-b"))
    wait_for("both pods as endpoints", lambda: endpoints() == {pod_ip("hook-a"), pod_ip("hook-b")})
    certificates = Certificates.issue(tmp_path)
    lease = f"q-route-{uuid.uuid4().hex[:6]}"
    replicas = {
        name: WebhookProcess(
            Path(dev_cluster.kubeconfig),
            tmp_path,
            register=False,
            tag=name,
            elect=True,
            certificates=certificates,
            lease_name=lease,
            route="pod-label",
            env={"POD_NAME": name, "POD_NAMESPACE": namespace},
        )
        for name in ("hook-a", "hook-b")
    }
    try:
        replicas["hook-a"].start(wait_admitting=False)
        wait_for("hook-a to lead", lambda: replicas["hook-a"].role() != "follower")
        replicas["hook-b"].start(wait_admitting=False)

        def labels() -> dict[str, str]:
            return {
                name: core.read_namespaced_pod(name, namespace).metadata.labels[label] for name in replicas
            }

        wait_for("hook-b to step out", lambda: labels() == {"hook-a": "true", "hook-b": "false"})
        wait_for("the Service to reach the leader only", lambda: endpoints() == {pod_ip("hook-a")})
        replicas["hook-a"].stop()  # SIGTERM: hands over and releases the Lease
        wait_for("hook-b to take over", lambda: replicas["hook-b"].role() != "follower")
        wait_for("hook-b to take calls again", lambda: labels()["hook-b"] == "true")
        # hook-a's pod keeps its label: a pod whose webhook stopped is no longer Ready in a cluster, and
        # a replica that starts again in it decides afresh.
        wait_for("the new leader in the Service", lambda: pod_ip("hook-b") in endpoints())
        replicas["hook-a"].start(wait_admitting=False)
        wait_for("the restarted replica to step out", lambda: labels()["hook-a"] == "false")
    finally:
        for replica in replicas.values():
            replica.stop()
