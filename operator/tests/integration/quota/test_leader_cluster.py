"""Two webhook replicas on the real local control plane: one leader (through a coordination.k8s.io
Lease) decides every admission from its ledger; the other forwards to it. Killed mid-race, the leader
is replaced after the Lease expires and the new one's wait, and the quota is never exceeded."""

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
        wait_for(lambda: registered.role() == "follower", message="the registered replica to follow")
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
            wait_for(lambda: len(apps.list_namespaced_deployment(namespace).items) >= 4, message="admissions")
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
    wait_for(lambda: quotas.used("race") == "16", timeout=10, message="the status to say 16")


def test_a_leader_stopped_cleanly_hands_over_at_once_and_usage_stays_right(
    pair: Pair, quotas: Quotas, namespace: str, api_client: Any
) -> None:
    quotas.create("lead", {"requests.nvidia.com/gpu": 8})
    apps = client.AppsV1Api(api_client)
    for i in range(4):
        apps.create_namespaced_deployment(namespace, deployment(f"l{i}", quotas.name("lead")))
    wait_for(lambda: quotas.used("lead") == "4", message="usage 4")
    pair.other.stop()  # SIGTERM: stops admitting, writes everything, releases the Lease
    stopped = time.monotonic()
    wait_for(lambda: pair.registered.role() == "admitting", timeout=10, message="takeover")
    assert time.monotonic() - stopped < 5  # a released Lease needs no wait
    # The new leader recomputes: deletions lower usage (deletes do not go through the webhook).
    for i in range(2):
        apps.delete_namespaced_deployment(f"l{i}", namespace)
    wait_for(lambda: quotas.used("lead") == "2", message="usage 2 after the handover")
    apps.create_namespaced_deployment(namespace, deployment("after", quotas.name("lead")))
    wait_for(lambda: quotas.used("lead") == "3", message="usage 3")
