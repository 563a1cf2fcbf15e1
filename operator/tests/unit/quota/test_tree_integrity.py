"""Tree integrity: what a child holds of its parent, leaves that workloads still charge, and keys a
parent may only gain once its children hold them. Pure decisions, table by table."""

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from gpuforge.api.gpuquota import GpuQuota, GpuQuotaStatus
from gpuforge.quota.admission import (
    Allowed,
    Denied,
    admit_quota_delete,
    admit_quota_update,
    charged_to_parent,
    charging_workloads,
)
from gpuforge.quota.reconcile import recompute_status

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GPU = "requests.nvidia.com/gpu"
CPU = "requests.cpu"
D = Decimal


def quota(name: str, hard: dict[str, int], used: dict[str, int] | None = None, parent: str = "") -> GpuQuota:
    return GpuQuota(
        name=name,
        parent=parent,
        hard={k: D(v) for k, v in hard.items()},
        status=GpuQuotaStatus(used={k: D(v) for k, v in (used or {}).items()}),
    )


@pytest.mark.parametrize(
    ("hard", "used", "charged"),
    [
        ({GPU: 8}, {}, {GPU: 8}),  # idle: its hard
        ({GPU: 8}, {GPU: 3}, {GPU: 8}),  # using less than hard: its hard
        ({GPU: 2}, {GPU: 6}, {GPU: 6}),  # hard lowered below what runs: what runs
        ({GPU: 2, CPU: 10}, {GPU: 6, CPU: 1}, {GPU: 6, CPU: 10}),  # per key
    ],
)
def test_a_child_charges_its_parent_the_larger_of_hard_and_used(
    hard: dict[str, int], used: dict[str, int], charged: dict[str, int]
) -> None:
    assert charged_to_parent(quota("c", hard, used, "p")) == {k: D(v) for k, v in charged.items()}


@pytest.mark.parametrize(
    ("child_hard", "child_used", "parent_used"),
    [
        (8, 3, 8),
        (2, 6, 6),  # lowering a busy child's hard gives back nothing that still runs
        (2, 2, 2),  # once its work is gone, the difference is given back
    ],
)
def test_recompute_counts_what_each_child_holds(child_hard: int, child_used: int, parent_used: int) -> None:
    parent = quota("p", {GPU: 16})
    child = quota("c", {GPU: child_hard}, {GPU: child_used}, "p")
    status = recompute_status(parent, [child], [], {}, NOW)
    assert status.used[GPU] == D(parent_used)


@pytest.mark.parametrize(
    ("old", "new", "used", "carved"),
    [
        (4, 10, 0, 6),  # raised: the increase is carved
        (2, 8, 6, 2),  # the parent already counts the 6 running: only 6 -> 8 is new
        (2, 5, 6, 0),  # still below what runs: nothing new to carve
    ],
)
def test_raising_a_busy_child_carves_only_beyond_what_its_parent_counts(
    old: int, new: int, used: int, carved: int
) -> None:
    parent = quota("p", {GPU: 16}, {GPU: max(old, used)})
    decision = admit_quota_update(
        quota("c", {GPU: old}, {GPU: used}, "p"), quota("c", {GPU: new}, {GPU: used}, "p"), parent, "u", NOW
    )
    assert isinstance(decision, Allowed)
    now_used = decision.status.used[GPU] if decision.status is not None else parent.status.used[GPU]
    assert now_used == D(max(old, used) + carved)


@pytest.mark.parametrize(
    ("children", "workloads", "allowed", "message"),
    [
        ([], [], True, ""),
        (["a"], [], False, "has children (a)"),
        ([], ["Deployment/ns/w"], False, "still charged by 1 running workload (Deployment/ns/w)"),
        (
            [],
            [f"Job/ns/j{i}" for i in range(7)],
            False,
            "still charged by 7 running workloads (Job/ns/j0, Job/ns/j1, Job/ns/j2, Job/ns/j3, "
            "Job/ns/j4, ...)",
        ),
    ],
)
def test_delete(children: list[str], workloads: list[str], allowed: bool, message: str) -> None:
    decision = admit_quota_delete(quota("leaf", {GPU: 1}), children, workloads)
    assert isinstance(decision, Allowed) is allowed
    if message:
        assert isinstance(decision, Denied) and message in decision.message


def _obj(kind: str, name: str, quota_name: str = "leaf", **extra: Any) -> dict[str, Any]:
    container = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    pod_spec = {"containers": [container]}
    obj: dict[str, Any] = {
        "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "labels": {"gpuforge.io/quota": quota_name}},
    }
    if kind == "Pod":
        obj["spec"] = pod_spec
    elif kind == "Job":
        obj["spec"] = {"template": {"spec": pod_spec}}
    else:
        obj["spec"] = {"replicas": 1, "template": {"spec": pod_spec}}
    for path, value in extra.items():
        section, key = path.split("__")
        obj.setdefault(section, {})[key] = value
    return obj


@pytest.mark.parametrize(
    ("obj", "charges"),
    [
        (_obj("Deployment", "w"), True),
        (_obj("Deployment", "w", "other"), False),  # another quota's
        (_obj("Deployment", "w", spec__replicas=0), False),  # scaled to zero
        (_obj("Pod", "p"), True),
        (_obj("Pod", "p", status__phase="Succeeded"), False),  # finished
        (_obj("Job", "j", spec__suspend=True), False),  # suspended
        (
            _obj(
                "Pod",
                "p",
                metadata__ownerReferences=[
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "controller": True}
                ],
            ),
            False,  # its controller is what is charged
        ),
    ],
)
def test_charging_workloads(obj: dict[str, Any], charges: bool) -> None:
    refs = charging_workloads("leaf", [obj])
    assert bool(refs) is charges


@pytest.mark.parametrize(
    ("children", "added", "allowed", "message"),
    [
        ([quota("a", {GPU: 1, CPU: 1}, parent="p")], {CPU: 4}, True, ""),
        (
            [quota("a", {GPU: 1}, parent="p"), quota("b", {GPU: 1, CPU: 1}, parent="p")],
            {CPU: 4},
            False,
            "add it to the children first: a",
        ),
        ([quota("a", {GPU: 1}, parent="p")], {}, True, ""),  # no key added: children unchecked
    ],
)
def test_a_key_added_to_a_parent_must_be_in_its_children_first(
    children: list[GpuQuota], added: dict[str, int], allowed: bool, message: str
) -> None:
    old = quota("p", {GPU: 8})
    new = quota("p", {GPU: 8, **added})
    decision = admit_quota_update(old, new, None, "u", NOW, children=children)
    assert isinstance(decision, Allowed) is allowed
    if message:
        assert isinstance(decision, Denied) and message in decision.message and CPU in decision.message
