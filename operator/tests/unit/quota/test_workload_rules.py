"""Where the quota label may be, LimitRange defaults, and ResourceQuota's "must specify" rule, as pure
functions of the objects."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from gpuforge.api.gpuquota import GpuQuota
from gpuforge.quota.admission import Allowed, Denied, WorkloadAsk, admit_workload
from gpuforge.quota.limitranges import ContainerDefaults, apply_defaults, container_defaults, unset_resources
from gpuforge.quota.tenancy import quota_required
from gpuforge.quota.usage import (
    cronjob_label_unreached,
    quota_label,
    quota_label_conflict,
    takes_gpus,
    workload_usage,
)

LABEL = "gpuforge.io/quota"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
D = Decimal


def container(limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    return {"name": "main", "resources": resources}


def deployment(own: str = "", template: str = "", *containers: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {"name": "w", "namespace": "ns", "labels": {LABEL: own} if own else {}},
        "spec": {
            "replicas": 2,
            "template": {
                "metadata": {"labels": {LABEL: template} if template else {}},
                "spec": {"containers": list(containers) or [container({"nvidia.com/gpu": 1})]},
            },
        },
    }


def cronjob(template: str) -> dict[str, Any]:
    pod = {
        "metadata": {"labels": {LABEL: template}},
        "spec": {"containers": [container({"nvidia.com/gpu": 1})]},
    }
    return {
        "kind": "CronJob",
        "metadata": {"name": "c"},
        "spec": {"jobTemplate": {"spec": {"template": pod}}},
    }


@pytest.mark.parametrize(
    ("obj", "quota"),
    [
        (deployment("a", ""), "a"),
        (deployment("", "b"), "b"),  # only on the pod template: still checked and counted
        (deployment("a", "a"), "a"),
        (deployment("a", "b"), "a"),  # the object's wins in counting; admission refuses the pair
        (deployment("", ""), ""),
        (cronjob("c"), "c"),
        ({"kind": "Service", "metadata": {"labels": {}}}, ""),
    ],
)
def test_the_quota_a_workload_names(obj: dict[str, Any], quota: str) -> None:
    assert quota_label(obj) == quota


def test_a_template_label_alone_is_counted() -> None:
    usage = workload_usage(deployment("", "b"))
    assert (usage.quota, usage.usage["requests.nvidia.com/gpu"]) == ("b", D(2))


def test_a_conflict_names_both_values() -> None:
    assert quota_label_conflict(deployment("a", "a")) == ""
    assert quota_label_conflict(deployment("", "b")) == ""
    message = quota_label_conflict(deployment("a", "b"))
    assert "'a' on the Deployment but 'b' on its pod template (spec.template.metadata.labels)" in message


LIMIT_RANGE = {
    "metadata": {"name": "defaults"},
    "spec": {
        "limits": [
            {"type": "Pod", "max": {"cpu": "64"}},
            {
                "type": "Container",
                "default": {"cpu": "2", "memory": "1Gi"},
                "defaultRequest": {"cpu": "500m"},
            },
        ]
    },
}


def test_limit_range_defaults_fill_what_a_container_leaves_unset() -> None:
    defaults = container_defaults([LIMIT_RANGE])
    assert defaults == ContainerDefaults({"cpu": "2", "memory": "1Gi"}, {"cpu": "500m"})
    spec = apply_defaults({"containers": [container({"nvidia.com/gpu": 1, "memory": "4Gi"})]}, defaults)
    assert spec["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": 1, "memory": "4Gi", "cpu": "2"},
        "requests": {"cpu": "500m"},  # memory's request is its own limit (defaulted before LimitRanger)
    }
    usage = workload_usage(deployment("a", ""), defaults=defaults).usage
    assert (usage["requests.cpu"], usage["limits.cpu"], usage["limits.memory"]) == (D(1), D(4), D(2 * 2**30))


def test_the_first_limit_range_by_name_wins() -> None:
    other = {
        "metadata": {"name": "a-first"},
        "spec": {"limits": [{"type": "Container", "default": {"cpu": "8"}}]},
    }
    assert container_defaults([LIMIT_RANGE, other]).limits["cpu"] == "8"
    assert not container_defaults([])


@pytest.mark.parametrize(
    ("spec", "unset"),
    [
        ({"containers": [container()]}, {"limits.cpu", "requests.cpu"}),
        ({"containers": [container({"cpu": "1"})]}, set()),  # a request defaults to its limit
        ({"containers": [container(requests={"cpu": "1"})]}, {"limits.cpu"}),
        ({"containers": [container()], "resources": {"limits": {"cpu": "1"}}}, set()),  # pod-level
    ],
)
def test_unset_resources(spec: dict[str, Any], unset: set[str]) -> None:
    found = {key for key in unset_resources(spec) if key.endswith(".cpu")}
    assert found == unset


def ask(unset: dict[str, tuple[str, ...]]) -> WorkloadAsk:
    delta = {"requests.nvidia.com/gpu": D(1)}
    return WorkloadAsk("u1", "Deployment/ns/w", delta, delta, generation=1, unset=unset)


@pytest.mark.parametrize(
    ("hard", "unset", "denied"),
    [
        ({"limits.cpu": D(8)}, {"limits.cpu": ("main",)}, "must specify limits.cpu for: main"),
        ({"cpu": D(8)}, {"requests.cpu": ("main", "init")}, "must specify requests.cpu for: main, init"),
        ({"cash/limits.cpu": D(8)}, {"limits.cpu": ("main",)}, ""),  # a budget is not a limit
        ({"limits.cpu": D(8)}, {"limits.memory": ("main",)}, ""),
    ],
)
def test_a_quota_on_a_resource_needs_every_container_to_set_it(
    hard: dict[str, Decimal], unset: dict[str, tuple[str, ...]], denied: str
) -> None:
    quota = GpuQuota(name="team", parent="", hard={"requests.nvidia.com/gpu": D(4), **hard})
    decision = admit_workload(quota, ask(unset), NOW)
    if denied:
        assert isinstance(decision, Denied) and denied in decision.message
        assert decision.message.startswith('GpuQuota "team" limits ')
    else:
        assert isinstance(decision, Allowed)


@pytest.mark.parametrize(
    ("labels", "gpus", "refused"),
    [
        ({"gpuforge.io/quota-required": "true"}, True, True),
        ({"gpuforge.io/quota-required": "true"}, False, False),  # only GPU workloads need a quota
        ({"gpuforge.io/quota-required": "false"}, True, False),
        ({}, True, False),
    ],
)
def test_a_namespace_may_require_a_quota(labels: dict[str, str], gpus: bool, refused: bool) -> None:
    denied = quota_required("ml", labels, "Deployment ml/w", gpus)
    assert (denied is not None) == refused
    if denied is not None:
        assert denied.message.startswith('namespace "ml" requires a GpuQuota for workloads that take GPUs')
        assert (
            "Deployment ml/w names none; label it (or its pod template) gpuforge.io/quota=<quota>"
            in denied.message
        )


@pytest.mark.parametrize(
    ("spec", "gpus"),
    [
        ({"containers": [container({"nvidia.com/gpu": 1})]}, True),
        ({"containers": [container({"nvidia.com/mig-1g.5gb": 1})]}, True),
        ({"containers": [container({"cpu": 1})]}, False),
        ({"containers": [], "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "gpu"}]}, True),
    ],
)
def test_takes_gpus(spec: dict[str, Any], gpus: bool) -> None:
    assert takes_gpus({"kind": "Pod", "metadata": {}, "spec": spec}) is gpus


def test_a_cronjob_label_must_reach_its_jobs() -> None:
    pod = {"spec": {"containers": [container({"nvidia.com/gpu": 1})]}}
    own_only = {
        "kind": "CronJob",
        "metadata": {"labels": {LABEL: "a"}},
        "spec": {"jobTemplate": {"spec": {"template": pod}}},
    }
    assert "its Jobs carry only the job template's labels" in cronjob_label_unreached(own_only)
    assert cronjob_label_unreached(cronjob("a")) == ""  # on the pod template
    on_job = {
        **own_only,
        "spec": {"jobTemplate": {"metadata": {"labels": {LABEL: "a"}}, "spec": {"template": pod}}},
    }
    assert cronjob_label_unreached(on_job) == ""
    assert quota_label({**on_job, "metadata": {}}) == "a"  # the job template's label names it too
    assert workload_usage(cronjob("a")).usage == {}  # a schedule: its Jobs are charged as created
