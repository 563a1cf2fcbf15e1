"""The GpuQuota CRD keeps every status field the webhook and controller write.

The API server silently prunes fields a structural schema does not declare. A pruned
`reservations[].generation` read back as 0 ("settled as soon as the object exists"), so the controller
released a scale-up's reservation before the new replica count was visible and a racing scale was
admitted over the quota. This test prunes what we write the way the API server does and compares.
"""

import functools
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.api.gpuquota import (
    QUOTA_KEY_PATTERN,
    Condition,
    GpuQuota,
    GpuQuotaStatus,
    Reservation,
    is_quota_key,
)
from gpuforge.quota.admission import Allowed, WorkloadAsk, admit_workload
from gpuforge.quota.convert import quota_from_object, quota_to_object, status_to_object
from gpuforge.quota.reconcile import recompute_status
from gpuforge.quota.usage import WorkloadUsage

CRD = Path(__file__).resolve().parents[3] / "deploy" / "crds" / "gpuquotas.gpuforge.io.yaml"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
GPU = "requests.nvidia.com/gpu"


def prune(value: Any, schema: dict[str, Any]) -> Any:
    """Drop what `schema` does not declare (structural-schema pruning, without defaults)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if properties is not None:
            return {key: prune(item, properties[key]) for key, item in value.items() if key in properties}
        if isinstance(extra, dict):
            return {key: prune(item, extra) for key, item in value.items()}
        return {}
    if isinstance(value, list):
        return [prune(item, schema.get("items") or {}) for item in value]
    return value


@functools.cache
def status_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


@functools.cache
def spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def test_status_round_trips_through_the_crd_schema() -> None:
    status = GpuQuotaStatus(
        hard={GPU: Decimal(16)},
        used={GPU: Decimal(3)},
        self_used={GPU: Decimal(3)},
        reservations=(
            Reservation("u1", "Deployment/ns/w", {GPU: Decimal(1)}, {GPU: Decimal(2)}, NOW, generation=7),
        ),
        last_reconcile_time=NOW,
        conditions=(Condition("Reconciled", "True", "Recomputed", "", NOW),),
        last_refill_time=NOW,
    )
    written = status_to_object(status)
    assert prune(written, status_schema()) == written


def _persisted(quota: GpuQuota, status: GpuQuotaStatus, version: int) -> GpuQuota:
    """What the next reader gets back after `status` is written: JSON, pruned by the CRD schema."""
    raw = quota_to_object(replace(quota, status=status, resource_version=str(version)))
    raw["status"] = prune(raw["status"], status_schema())
    return quota_from_object(raw)


@pytest.mark.parametrize("seed", range(40))
def test_racing_scales_never_exceed_hard_while_the_controller_lags(seed: int) -> None:
    """50 Deployments at 0 replicas race `kubectl scale --replicas=1` against a quota of 16, while the
    leader's usage controller recomputes from its lagging watch cache, and now and then a new leader
    takes over from what it lists afresh. Every status goes through the CRD schema (what a new leader
    reads back). At no point may more replicas be admitted than the quota holds."""
    rng = random.Random(seed)
    empty = GpuQuota(name="scale", parent="", hard={GPU: Decimal(16)}, status=GpuQuotaStatus())
    quota = _persisted(empty, GpuQuotaStatus(), 1)
    version = 1
    truth = {f"s{i}": (0, 1) for i in range(50)}  # name -> (replicas, generation) in etcd
    view = dict(truth)  # the leader's watch cache, behind the API server
    in_flight: list[str] = []  # admitted, not yet persisted by the API server
    now = NOW
    for _ in range(600):
        now += timedelta(milliseconds=rng.randint(1, 30))
        step = rng.random()
        waiting = [name for name, (replicas, _) in truth.items() if replicas == 0 and name not in in_flight]
        if step < 0.4 and waiting:  # a webhook admits a scale of a Deployment it just read
            name = rng.choice(waiting)
            _, generation = truth[name]
            ask = WorkloadAsk(f"uid-{name}", f"Deployment/ns/{name}", {GPU: Decimal(1)}, {GPU: Decimal(1)})
            decision = admit_workload(quota, replace(ask, generation=generation + 1), now)
            if isinstance(decision, Allowed) and decision.status is not None:
                version += 1
                quota = _persisted(quota, decision.status, version)
                in_flight.append(name)
        elif step < 0.6 and in_flight:  # the API server persists one admitted scale
            name = in_flight.pop(rng.randrange(len(in_flight)))
            truth[name] = (1, truth[name][1] + 1)
        elif step < 0.78:  # the watch delivers one change
            name = rng.choice(sorted(truth))
            view[name] = truth[name]
        elif step < 0.8:  # a new leader: it reads the quota back and lists the workloads afresh
            quota = _persisted(quota, quota.status, version)
            view = dict(truth)
        else:  # the leader's controller recomputes from what it has seen
            usages = [
                WorkloadUsage(
                    "Deployment", "ns", name, "scale", replicas, {GPU: Decimal(replicas)}, generation
                )
                for name, (replicas, generation) in view.items()
            ]
            status = recompute_status(quota, [], usages, {}, now)
            version += 1
            quota = _persisted(quota, status, version)
        admitted = sum(replicas for replicas, _ in truth.values()) + len(in_flight)
        assert admitted <= 16, f"seed {seed}: {admitted} replicas admitted against a quota of 16"


# --- CEL rules: what the API server checks without the webhook ---------------------------------------


def _hard_rule() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    hard = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["hard"]
    rule, bare_extended_resource = hard["x-kubernetes-validations"]
    assert "did you mean requests." in bare_extended_resource["messageExpression"]
    assert isinstance(rule, dict)
    return rule


def test_the_crd_key_rule_is_the_quota_key_grammar() -> None:
    rule = _hard_rule()
    grandfathered = "(oldSelf.hasValue() && key in oldSelf.value())"
    assert rule["rule"] == f'self.all(key, key.matches(r"{QUOTA_KEY_PATTERN}") || {grandfathered})'
    assert rule["optionalOldSelf"] is True  # evaluated on create too, where there is no oldSelf
    assert f'!key.matches(r"{QUOTA_KEY_PATTERN}")' in rule["messageExpression"]
    # The message names the first key off the grammar (the API server gives messageExpression no
    # oldSelf to leave a stored key out).
    assert "oldSelf" not in rule["messageExpression"]


def test_the_packaged_crd_is_the_deployed_one() -> None:
    packaged = Path(__file__).resolve().parents[3] / "src/gpuforge/render/crds/gpuquotas.gpuforge.io.yaml"
    assert packaged.read_text() == CRD.read_text()


@pytest.mark.parametrize(
    ("key", "countable"),
    [
        ("requests.nvidia.com/gpu", True),
        ("requests.nvidia.com/gpu.H100", True),
        ("limits.nvidia.com/gpu", True),
        ("requests.cpu", True),
        ("limits.memory", True),
        ("requests.hugepages-2Mi", True),
        ("requests.ephemeral-storage", True),
        ("requests.nvidia.com/gpu.shared", True),
        ("requests.nvidia.com/mig-1g.5gb", True),
        ("requests.amd.com/gpu", True),
        ("cpu", True),
        ("memory", True),
        ("ephemeral-storage", True),
        ("pods", True),
        ("gpu.nvidia.com.deviceclass.resource.k8s.io/devices", True),
        ("count/resourceclaims.resource.k8s.io", True),
        ("cash/requests.nvidia.com/gpu", True),
        ("cash/requests.cpu", True),
        ("nvidia.com/gpu", False),  # a resource name, not a quota key
        ("requests.", False),
        ("gpus", False),
        ("services", False),  # ResourceQuota counts it; GpuQuota counts only what pods take
        ("count/deployments.apps", False),
        ("cash/cash/requests.cpu", False),
        ("requests.Nvidia.com/gpu", False),  # a domain is lower case
        ("requests.nvidia.com/gpu ", False),
        ("Requests.cpu", False),
    ],
)
def test_quota_keys(key: str, countable: bool) -> None:
    assert is_quota_key(key) is countable


@pytest.mark.parametrize(
    ("hard", "used", "left"),
    [
        ({GPU: "8"}, {GPU: "2"}, {GPU: "6"}),
        ({GPU: "2"}, {GPU: "6"}, {GPU: "0"}),  # over hard: nothing left, not a negative amount
        ({GPU: "8", f"cash/{GPU}": "100"}, {f"cash/{GPU}": "99.5"}, {GPU: "8", f"cash/{GPU}": "500m"}),
    ],
)
def test_status_shows_what_is_left_and_the_schema_keeps_it(
    hard: dict[str, str], used: dict[str, str], left: dict[str, str]
) -> None:
    status = GpuQuotaStatus(
        hard={k: Decimal(v) for k, v in hard.items()}, used={k: Decimal(v) for k, v in used.items()}
    )
    written = prune(status_to_object(status), status_schema())
    assert written["remaining"] == left
