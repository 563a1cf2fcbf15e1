"""Delegation on the real local control plane: whoever may create GpuQuotas may carve children out of
a parent, but creating a root (quota from nothing) needs the RBAC verb "root" on gpuquotas."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from .conftest import GPU, Quotas, kubectl

pytestmark = pytest.mark.cluster


@pytest.fixture
def quota_admin(api_client: Any) -> Iterator[str]:
    """A user who may create GpuQuotas (not roots), bound to a ClusterRole of the same name."""
    rbac = client.RbacAuthorizationV1Api(api_client)
    name = f"quota-lead-{secrets.token_hex(3)}"
    rbac.create_cluster_role(
        {
            "metadata": {"name": name},
            "rules": [{"apiGroups": ["gpuforge.io"], "resources": ["gpuquotas"], "verbs": ["create", "get"]}],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}],
        }
    )
    yield name
    rbac.delete_cluster_role_binding(name)
    rbac.delete_cluster_role(name)


def create_as(
    dev_cluster: Any, user: str, quotas: Quotas, short: str, parent: str
) -> subprocess.CompletedProcess[str]:
    body = {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"name": quotas.name(short)},
        "spec": {"parent": quotas.name(parent) if parent else "", "hard": {GPU: "2"}, "namespaces": ["x"]},
    }
    quotas.created.append(quotas.name(short))  # cleaned up whether or not it was admitted
    return subprocess.run(
        [*kubectl(dev_cluster), f"--as={user}", "create", "-f", "-"],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_root_needs_the_root_verb(
    quotas: Quotas, dev_cluster: Any, api_client: Any, quota_admin: str
) -> None:
    user = role = quota_admin
    quotas.create("org", {GPU: 8})
    child = create_as(dev_cluster, user, quotas, "team", "org")
    assert child.returncode == 0, child.stderr  # carving under a parent needs only create
    root = create_as(dev_cluster, user, quotas, "rogue", "")
    assert root.returncode != 0
    assert f'creating root GpuQuota "{quotas.name("rogue")}" needs the RBAC verb "root"' in root.stderr
    assert user in root.stderr
    client.RbacAuthorizationV1Api(api_client).patch_cluster_role(
        role,
        {
            "rules": [
                {"apiGroups": ["gpuforge.io"], "resources": ["gpuquotas"], "verbs": ["create", "get", "root"]}
            ]
        },
    )
    granted = create_as(dev_cluster, user, quotas, "granted", "")
    assert granted.returncode == 0, granted.stderr
