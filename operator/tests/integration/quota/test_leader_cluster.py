"""Two webhook replicas on the real local control plane: exactly one usage controller leads (through a
coordination.k8s.io Lease); when the leader is SIGKILLed the other takes over within the Lease duration
and usage stays right."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from .conftest import LEASE_SECONDS, Quotas, WebhookProcess, deployment, wait_for

pytestmark = pytest.mark.cluster

LEADER = "gpuforge_quota_controller_leader"


@pytest.fixture
def second_replica(
    dev_cluster: Any, quota_webhook: WebhookProcess, tmp_path: Path
) -> Iterator[WebhookProcess]:
    replica = WebhookProcess(Path(dev_cluster.kubeconfig), tmp_path, register=False, tag="replica")
    replica.start()
    yield replica
    replica.stop()


def _leaders(*replicas: WebhookProcess) -> list[float | None]:
    return [replica.metric(LEADER) for replica in replicas]


def test_one_leader_and_failover_after_sigkill(
    quotas: Quotas,
    namespace: str,
    api_client: Any,
    quota_webhook: WebhookProcess,
    second_replica: WebhookProcess,
) -> None:
    replicas = (quota_webhook, second_replica)
    wait_for(
        lambda: sorted(_leaders(*replicas), key=float) == [0.0, 1.0],  # type: ignore[arg-type]
        timeout=3 * LEASE_SECONDS,
        message="exactly one leader",
    )
    for _ in range(5):  # and it stays exactly one
        assert sorted(_leaders(*replicas), key=float) == [0.0, 1.0]  # type: ignore[arg-type]
        time.sleep(0.5)

    quotas.create("lead", {"requests.nvidia.com/gpu": 8})
    apps = client.AppsV1Api(api_client)
    for i in range(4):
        apps.create_namespaced_deployment(namespace, deployment(f"l{i}", quotas.name("lead")))
    wait_for(lambda: quotas.used("lead") == "4", message="usage 4")

    leader, follower = replicas if quota_webhook.metric(LEADER) == 1.0 else replicas[::-1]
    leader.stop(crash=True)
    killed = time.monotonic()
    wait_for(lambda: follower.metric(LEADER) == 1.0, timeout=LEASE_SECONDS + 5, message="takeover")
    took_over = time.monotonic() - killed
    assert took_over <= LEASE_SECONDS + 5

    # The new leader recomputes: deletions lower usage (deletes do not go through the webhook).
    for i in range(2):
        apps.delete_namespaced_deployment(f"l{i}", namespace)
    wait_for(lambda: quotas.used("lead") == "2", message="usage 2 after failover")

    if leader is quota_webhook:  # the session's registered webhook serves the other tests
        quota_webhook.start()
        wait_for(lambda: quota_webhook.metric(LEADER) == 0.0, message="the restarted replica follows")
    assert quotas.used("lead") == "2"
