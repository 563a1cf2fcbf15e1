"""Tenancy on the real local control plane: a GpuQuota admits workloads only from the namespaces it
names. Two teams, each a user (impersonated with `kubectl --as`) who may create Deployments in their
own namespace only: neither can spend the other's quota by writing its name in the label."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from .conftest import GPU, Quotas, deployment, kubectl, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def team_namespaces(api_client: Any) -> Iterator[dict[str, str]]:
    """Two namespaces, each labelled with its team, and a user per team who may create Deployments in
    the team's namespace (and nowhere else)."""
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    suffix = secrets.token_hex(3)
    spaces = {team: f"t-{team}-{suffix}" for team in ("vision", "speech")}
    for team, name in spaces.items():
        core.create_namespace({"metadata": {"name": name, "labels": {"gpuforge.io/team": team}}})
        rbac.create_namespaced_role(
            name,
            {
                "metadata": {"name": "deployer"},
                "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create", "get"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            name,
            {
                "metadata": {"name": "deployer"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": f"{team}-dev"}
                ],
            },
        )
    yield spaces
    for name in spaces.values():
        core.delete_namespace(name, propagation_policy="Background")


def create_as(
    dev_cluster: Any, user: str, namespace: str, body: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*kubectl(dev_cluster), f"--as={user}", "create", "-n", namespace, "-f", "-"],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_team_cannot_spend_another_teams_quota(
    quotas: Quotas, dev_cluster: Any, team_namespaces: dict[str, str]
) -> None:
    vision, speech = team_namespaces["vision"], team_namespaces["speech"]
    quotas.create("org", {GPU: 8}, namespaces=[])  # names none: nothing charges it directly
    quotas.create("vision", {GPU: 4}, parent="org", namespaces=[vision])
    quotas.create(
        "speech", {GPU: 4}, parent="org", namespace_selector={"matchLabels": {"gpuforge.io/team": "speech"}}
    )

    own = create_as(dev_cluster, "vision-dev", vision, deployment("train", quotas.name("vision"), gpus=2))
    assert own.returncode == 0, own.stderr
    stolen = create_as(dev_cluster, "speech-dev", speech, deployment("steal", quotas.name("vision"), gpus=2))
    assert stolen.returncode != 0
    assert f'namespace "{speech}" may not charge GpuQuota "{quotas.name("vision")}"' in stolen.stderr
    # The user could not create anywhere else: RBAC, not the quota, stops that.
    elsewhere = create_as(dev_cluster, "speech-dev", vision, deployment("x", quotas.name("speech")))
    assert elsewhere.returncode != 0 and "forbidden" in elsewhere.stderr.lower()
    by_label = create_as(dev_cluster, "speech-dev", speech, deployment("asr", quotas.name("speech"), gpus=1))
    assert by_label.returncode == 0, by_label.stderr  # admitted by the namespace's label
    # Usage reaches the status written behind, each quota in its own write: wait for both.
    wait_for("vision to be charged 2", lambda: quotas.used("vision") == "2", timeout=10)
    wait_for("speech to be charged 1", lambda: quotas.used("speech") == "1", timeout=10)

    refused = create_as(dev_cluster, "vision-dev", vision, deployment("root", quotas.name("org")))
    assert refused.returncode != 0
    assert f'GpuQuota "{quotas.name("org")}" names no namespace' in refused.stderr


def test_an_ancestor_narrows_its_subtree(
    quotas: Quotas, api_client: Any, team_namespaces: dict[str, str]
) -> None:
    vision, speech = team_namespaces["vision"], team_namespaces["speech"]
    quotas.create("dept", {GPU: 8}, namespaces=[vision])
    quotas.create("team", {GPU: 4}, parent="dept", namespaces=[vision, speech])
    apps = client.AppsV1Api(api_client)
    apps.create_namespaced_deployment(vision, deployment("ok", quotas.name("team")))
    with pytest.raises(client.ApiException, match="its ancestor GpuQuota") as refused:
        apps.create_namespaced_deployment(speech, deployment("no", quotas.name("team")))
    assert quotas.name("dept") in str(refused.value.body) and speech in str(refused.value.body)


def test_a_quota_that_names_no_namespace_admits_nothing(
    quotas: Quotas, namespace: str, api_client: Any
) -> None:
    quotas.create("closed", {GPU: 4}, namespaces=[])
    with pytest.raises(client.ApiException, match="names no namespace, so it admits none"):
        client.AppsV1Api(api_client).create_namespaced_deployment(
            namespace, deployment("w", quotas.name("closed"))
        )
    assert quotas.used("closed") == "0"
