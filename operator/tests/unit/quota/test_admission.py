from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuforge.api.gpuquota import GpuQuota, GpuQuotaStatus
from gpuforge.quota.admission import (
    Allowed,
    Decision,
    Denied,
    WorkloadAsk,
    admit_quota_create,
    admit_quota_delete,
    admit_quota_update,
    admit_workload,
)
from gpuforge.quota.convert import quota_from_object, quota_to_object
from gpuforge.quota.models import Placement, Selection
from gpuforge.quota.quantity import parse_quantity

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GPU = "requests.nvidia.com/gpu"
H100 = f"{GPU}.H100"
D = Decimal


def admit_many(quota: GpuQuota, asks: list[WorkloadAsk], now: datetime) -> tuple[GpuQuota, list[Decision]]:
    """Decide asks one after the other, each against the status the previous one left (as the ledger)."""
    decisions: list[Decision] = []
    for item in asks:
        decision = admit_workload(quota, item, now)
        if isinstance(decision, Allowed) and decision.status is not None:
            quota = replace(quota, status=decision.status)
        decisions.append(decision)
    return quota, decisions


def q(value: int | str) -> Decimal:
    return parse_quantity(value)


def quota(
    name: str, hard: dict[str, int | str], used: dict[str, int | str] | None = None, parent: str = ""
) -> GpuQuota:
    return GpuQuota(
        name=name,
        parent=parent,
        hard={k: q(v) for k, v in hard.items()},
        status=GpuQuotaStatus(used={k: q(v) for k, v in (used or {}).items()}),
    )


def ask(delta: dict[str, int | str], uid: str = "u1", workload: str = "Deployment/ns/w") -> WorkloadAsk:
    """An ask whose pods are held to H100 nodes when it takes H100s, else to L4 nodes."""
    values = {k: q(v) for k, v in delta.items()}
    product = "NVIDIA-H100-80GB-HBM3" if H100 in values else "NVIDIA-L4"
    placement = Placement({"gpu": Selection(frozenset({product}), "spec.template.spec.nodeSelector")})
    return WorkloadAsk(uid=uid, workload=workload, delta=values, expected=values, placement=placement)


@pytest.mark.parametrize(
    ("hard", "used", "delta", "allowed"),
    [
        ({GPU: 16}, {GPU: 15}, {GPU: 1}, True),
        ({GPU: 16}, {GPU: 16}, {GPU: 1}, False),
        ({GPU: 16}, {}, {GPU: 17}, False),
        ({GPU: 16}, {}, {"requests.cpu": 100}, True),  # keys the quota does not hold are unlimited
        ({GPU: 8}, {GPU: 10}, {GPU: 1}, False),  # hard lowered below used: nothing more
        ({GPU: 8}, {GPU: 10}, {"requests.cpu": 1}, True),  # ... unless it does not touch that key
        ({GPU: 10, H100: 4}, {GPU: 4, H100: 4}, {GPU: 1, H100: 1}, False),  # model quota full
        ({GPU: 10, H100: 4}, {GPU: 4, H100: 4}, {GPU: 6}, True),  # other models still fit the generic key
        ({GPU: 10, H100: 4}, {GPU: 10, H100: 4}, {GPU: 1}, False),
        ({"requests.cpu": "1"}, {"requests.cpu": "700m"}, {"requests.cpu": "300m"}, True),  # exact decimals
        ({"requests.cpu": "1"}, {"requests.cpu": "700m"}, {"requests.cpu": "301m"}, False),
        ({GPU: 4, f"cash/{GPU}": 100}, {f"cash/{GPU}": 100}, {GPU: 1}, False),  # budget spent
        ({GPU: 4, f"cash/{GPU}": 100}, {f"cash/{GPU}": 100}, {"requests.cpu": 1}, True),  # not a GPU workload
        ({GPU: 4, f"cash/{GPU}": 100}, {f"cash/{GPU}": "99.9"}, {GPU: 1}, True),
    ],
)
def test_workload_admission(
    hard: dict[str, int], used: dict[str, int], delta: dict[str, int], allowed: bool
) -> None:
    decision = admit_workload(quota("team", hard, used), ask(delta), NOW)
    assert isinstance(decision, Allowed) is allowed


def test_denial_names_quota_key_asked_and_left() -> None:
    decision = admit_workload(quota("team-a", {GPU: 16}, {GPU: 15}), ask({GPU: 2}), NOW)
    assert isinstance(decision, Denied)
    assert (decision.quota, decision.key, decision.asked, decision.left) == ("team-a", GPU, 2, 1)
    assert decision.message == (
        'GpuQuota "team-a": Deployment ns/w asks requests.nvidia.com/gpu=2 but only 1 is left (15 of 16 used)'
    )


def test_budget_denial_says_spent() -> None:
    decision = admit_workload(quota("t", {f"cash/{GPU}": 10}, {f"cash/{GPU}": 12}), ask({GPU: 1}), NOW)
    assert isinstance(decision, Denied)
    assert "budget cash/requests.nvidia.com/gpu is spent" in decision.message


def test_allowed_reserves_usage() -> None:
    decision = admit_workload(quota("t", {GPU: 16}, {GPU: 3}), ask({GPU: 2, "requests.cpu": 4}), NOW)
    assert isinstance(decision, Allowed) and decision.status is not None
    assert decision.status.used == {GPU: 5}
    assert decision.status.self_used == {GPU: 2}
    (reservation,) = decision.status.reservations
    assert reservation.workload == "Deployment/ns/w"
    assert reservation.delta == {GPU: 2}


def test_nothing_to_charge_writes_nothing() -> None:
    decision = admit_workload(quota("t", {GPU: 16}), ask({"requests.cpu": 4}), NOW)
    assert decision == Allowed(quota="t")


def test_batch_of_asks_stops_at_hard() -> None:
    _, decisions = admit_many(quota("t", {GPU: 16}), [ask({GPU: 1}, uid=str(i)) for i in range(50)], NOW)
    assert sum(isinstance(d, Allowed) for d in decisions) == 16


def test_a_retried_create_replaces_the_reservation_of_its_lost_attempt() -> None:
    """A webhook killed after writing a reservation but before answering: the API server retries the
    same object (same generation). Both attempts cannot succeed, so the quota holds one of them."""
    first = replace(ask({GPU: 1}, uid="a", workload="Deployment/ns/w"), generation=1)
    retry = replace(first, uid="b")
    other = replace(ask({GPU: 1}, uid="c", workload="Deployment/ns/x"), generation=1)
    updated, decisions = admit_many(quota("t", {GPU: 2}), [first, retry, other], NOW)
    assert all(isinstance(d, Allowed) for d in decisions)
    assert updated.status.used[GPU] == 2
    assert [r.uid for r in updated.status.reservations] == ["b", "c"]
    bigger = replace(retry, uid="d", delta={GPU: q(2)})  # the larger amount is held, never the sum
    denied = admit_workload(updated, bigger, NOW)
    assert isinstance(denied, Denied) and denied.asked == 2 and denied.left == 1
    next_generation = replace(first, uid="e", generation=2)  # a later change adds up
    assert isinstance(admit_workload(updated, next_generation, NOW), Denied)


def test_a_reservation_records_the_uids_that_may_settle_it() -> None:
    """Each attempt of a create gets its own object uid; the merged reservation keeps every attempt's
    uid (any of them may be the object that persisted), this request's last."""
    first = replace(ask({GPU: 1}, uid="a", workload="Deployment/ns/w"), generation=1, object_uid="u1")
    retry = replace(first, uid="b", object_uid="u2")
    again = replace(first, uid="c", object_uid="u1")
    updated, _ = admit_many(quota("t", {GPU: 4}), [first, retry], NOW)
    assert [r.object_uids for r in updated.status.reservations] == [("u1", "u2")]
    updated, _ = admit_many(updated, [again], NOW)
    assert [r.object_uids for r in updated.status.reservations] == [("u2", "u1")]
    anonymous = replace(first, object_uid="")  # without the object's uid the name decides
    updated, _ = admit_many(quota("t", {GPU: 4}), [anonymous], NOW)
    assert [r.object_uids for r in updated.status.reservations] == [()]


# --- tree rules --------------------------------------------------------------------------------


ROOT = quota("org", {GPU: 16, "requests.cpu": 64}, {GPU: 10, "requests.cpu": 4})


@pytest.mark.parametrize(
    ("child", "parent", "allowed", "message"),
    [
        (quota("root2", {GPU: 8}), None, True, ""),
        (quota("a", {GPU: 6, "requests.cpu": 8}, parent="org"), ROOT, True, ""),
        (
            quota("a", {GPU: 7, "requests.cpu": 8}, parent="org"),
            ROOT,
            False,
            "asks requests.nvidia.com/gpu=7",
        ),
        (quota("a", {GPU: 1}, parent="org"), ROOT, False, "missing: requests.cpu"),
        (quota("a", {GPU: 1, "requests.cpu": 1, H100: 1}, parent="org"), ROOT, True, ""),  # extra keys fine
        (
            quota("a", {GPU: 1, "requests.cpu": 1}, parent="nope"),
            None,
            False,
            'parent GpuQuota "nope" does not exist',
        ),
        (quota("a", {GPU: 1}, parent="a"), None, False, "own parent"),
    ],
)
def test_create(child: GpuQuota, parent: GpuQuota | None, allowed: bool, message: str) -> None:
    decision = admit_quota_create(child, parent, "uid", NOW)
    assert isinstance(decision, Allowed) is allowed
    if message:
        assert isinstance(decision, Denied) and message in decision.message


def test_create_carves_from_parent() -> None:
    decision = admit_quota_create(quota("a", {GPU: 6, "requests.cpu": 8}, parent="org"), ROOT, "uid", NOW)
    assert isinstance(decision, Allowed) and decision.status is not None
    assert decision.quota == "org"
    assert decision.status.used == {GPU: 16, "requests.cpu": 12}
    assert decision.status.self_used == {}  # a child's hard is not the parent's own usage


@pytest.mark.parametrize(
    ("old", "new", "allowed", "carved"),
    [
        ({GPU: 4, "requests.cpu": 8}, {GPU: 10, "requests.cpu": 8}, True, {GPU: 16, "requests.cpu": 4}),
        ({GPU: 4, "requests.cpu": 8}, {GPU: 11, "requests.cpu": 8}, False, None),
        ({GPU: 4, "requests.cpu": 8}, {GPU: 1, "requests.cpu": 8}, True, None),  # lowering: always
        ({GPU: 4, "requests.cpu": 8}, {GPU: 4}, False, None),  # dropping a parent key
    ],
)
def test_update(
    old: dict[str, int], new: dict[str, int], allowed: bool, carved: dict[str, int] | None
) -> None:
    decision = admit_quota_update(
        quota("a", old, parent="org"), quota("a", new, parent="org"), ROOT, "uid", NOW
    )
    assert isinstance(decision, Allowed) is allowed
    if carved is not None:
        assert isinstance(decision, Allowed) and decision.status is not None
        assert decision.status.used == {k: D(v) for k, v in carved.items()}


def test_parent_is_immutable() -> None:
    decision = admit_quota_update(
        quota("a", {GPU: 1}, parent="org"), quota("a", {GPU: 1}, parent="x"), None, "u", NOW
    )
    assert isinstance(decision, Denied) and "spec.parent is immutable" in decision.message


def test_only_leaves_are_deleted() -> None:
    assert isinstance(admit_quota_delete(ROOT, ["a", "b"]), Denied)
    assert isinstance(admit_quota_delete(ROOT, []), Allowed)


# --- property: any sequence of admissions keeps every level within hard ------------------------

KEYS = [GPU, H100, "requests.cpu"]


@st.composite
def operations(draw: st.DrawFn) -> list[tuple[str, int, dict[str, int]]]:
    ops = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["child", "grow", "work"]))
        target = draw(st.integers(0, 5))
        amounts = {key: draw(st.integers(0, 9)) for key in KEYS}
        ops.append((kind, target, amounts))
    return ops


@settings(max_examples=200, deadline=None)
@given(operations(), st.integers(0, 40), st.integers(0, 8))
def test_admissions_never_exceed_hard_at_any_level(
    ops: list[tuple[str, int, dict[str, int]]], root_gpus: int, root_h100: int
) -> None:
    tree: dict[str, GpuQuota] = {"q0": quota("q0", {GPU: root_gpus, H100: root_h100, "requests.cpu": 30})}
    for index, (kind, target, amounts) in enumerate(ops):
        names = sorted(tree)
        name = names[target % len(names)]
        asked = {k: D(v) for k, v in amounts.items()}
        if kind == "child":
            child = GpuQuota(name=f"q{len(tree)}", parent=name, hard=asked)
            decision = admit_quota_create(child, tree[name], str(index), NOW)
            if isinstance(decision, Allowed):
                if decision.status is not None:
                    tree[name] = replace(tree[name], status=decision.status)
                tree[child.name] = child
        elif kind == "grow" and tree[name].parent:
            old = tree[name]
            new = replace(old, hard={k: old.hard[k] + asked[k] for k in old.hard})
            decision = admit_quota_update(old, new, tree[old.parent], str(index), NOW)
            if isinstance(decision, Allowed):
                if decision.status is not None:
                    tree[old.parent] = replace(tree[old.parent], status=decision.status)
                tree[name] = replace(new, status=tree[name].status)
        else:
            decision = admit_workload(tree[name], ask(amounts, uid=str(index)), NOW)
            if isinstance(decision, Allowed) and decision.status is not None:
                tree[name] = replace(tree[name], status=decision.status)
        for node in tree.values():
            children = [c for c in tree.values() if c.parent == node.name]
            for key, hard in node.hard.items():
                used = node.status.used.get(key, D(0))
                assert used <= hard, (node.name, key)
                # used is exactly own usage plus children's hard
                assert used == node.status.self_used.get(key, D(0)) + sum(
                    (c.hard.get(key, D(0)) for c in children), D(0)
                )


def _through_status_json(parent: GpuQuota, decision: Decision) -> GpuQuota:
    """The parent as the next admission reads it back: status written as JSON, then parsed."""
    assert isinstance(decision, Allowed) and decision.status is not None
    raw = quota_to_object(replace(parent, status=decision.status))
    return quota_from_object(raw)


def test_a_retried_child_create_carves_its_share_once() -> None:
    """The client (or the API server) retries a child create whose answer it lost: the first attempt's
    carve-out is still pending in the parent's status; the retry replaces it instead of adding to it."""
    child = quota("team", {GPU: 6, "requests.cpu": 8}, parent="org")
    first = admit_quota_create(child, ROOT, "attempt-1", NOW)
    parent = _through_status_json(ROOT, first)
    assert parent.status.used == {GPU: 16, "requests.cpu": 12}
    retry = admit_quota_create(child, parent, "attempt-2", NOW)
    assert isinstance(retry, Allowed) and retry.status is not None
    assert retry.status.used == {GPU: 16, "requests.cpu": 12}
    assert [r.uid for r in retry.status.reservations] == ["attempt-2"]
    assert retry.status.reservations[0].generation == 1
    # The same request asked again (same uid): held once as well.
    again = admit_quota_create(child, _through_status_json(parent, retry), "attempt-2", NOW)
    assert isinstance(again, Allowed) and again.status is not None
    assert again.status.used == {GPU: 16, "requests.cpu": 12}


def test_a_different_child_or_a_later_raise_still_carves() -> None:
    child = quota("team", {GPU: 3, "requests.cpu": 2}, parent="org")
    parent = _through_status_json(ROOT, admit_quota_create(child, ROOT, "a", NOW))
    sibling = admit_quota_create(quota("other", {GPU: 4, "requests.cpu": 2}, parent="org"), parent, "b", NOW)
    assert isinstance(sibling, Denied)  # 10 + 3 + 4 > 16: the first child's carve-out still counts
    raised = admit_quota_update(
        replace(child, generation=1),
        replace(child, hard={GPU: q(6), "requests.cpu": q(2)}, generation=2),
        parent,
        "c",
        NOW,
    )
    assert isinstance(raised, Allowed) and raised.status is not None
    assert raised.status.used[GPU] == 16  # 10 + 3 (pending create) + 3 (the raise)


def test_a_retried_raise_of_a_child_carves_once() -> None:
    old = replace(quota("team", {GPU: 2, "requests.cpu": 2}, parent="org"), generation=1)
    new = replace(old, hard={GPU: q(5), "requests.cpu": q(2)}, generation=2)
    first = admit_quota_update(old, new, ROOT, "a", NOW)
    retry = admit_quota_update(old, new, _through_status_json(ROOT, first), "b", NOW)
    assert isinstance(retry, Allowed) and retry.status is not None
    assert retry.status.used[GPU] == 13


def test_model_quota_refuses_an_unproven_model() -> None:
    unplaced = replace(ask({GPU: 1}), placement=Placement())
    decision = admit_workload(quota("team", {GPU: 10, H100: 4}), unplaced, NOW)
    assert isinstance(decision, Denied)
    assert decision.key == H100
    assert decision.message.startswith(
        'GpuQuota "team": Deployment ns/w: requests.nvidia.com/gpu.H100 needs the GPU model proven'
    )
    # A quota without model keys needs no proof.
    assert isinstance(admit_workload(quota("team", {GPU: 10}), unplaced, NOW), Allowed)


def test_model_key_spelt_in_lower_case_is_charged() -> None:
    on_h100 = ask({GPU: 1, H100: 1})
    decision = admit_workload(quota("team", {GPU: 10, f"{GPU}.h100": 1}), on_h100, NOW)
    assert isinstance(decision, Allowed) and decision.status is not None
    assert decision.status.used[f"{GPU}.h100"] == 1
    another = ask({GPU: 1, H100: 1}, uid="u2", workload="Deployment/ns/w2")
    full = admit_workload(
        replace(quota("team", {GPU: 10, f"{GPU}.h100": 1}), status=decision.status), another, NOW
    )
    assert isinstance(full, Denied) and full.key == f"{GPU}.h100"


def test_cpu_model_key_needs_the_value_set_and_charges_the_model() -> None:
    unset = replace(ask({"requests.cpu": 1}), unset={"limits.cpu": ("main",)})
    denied = admit_workload(quota("team", {"limits.cpu": 8, "limits.cpu.A4": 4}), unset, NOW)
    assert isinstance(denied, Denied) and denied.key == "limits.cpu"
    on_a4 = Placement({"cpu": Selection(frozenset({"A4"}), "spec.template.spec.nodeSelector")})
    asked = {"limits.cpu": D(3), "limits.cpu.A4": D(3)}
    fits = WorkloadAsk(uid="u", workload="Deployment/ns/w", delta=asked, expected=asked, placement=on_a4)
    decision = admit_workload(
        quota("team", {"limits.cpu": 8, "limits.cpu.A4": 4}, {"limits.cpu.A4": 2}), fits, NOW
    )
    assert isinstance(decision, Denied)
    assert "limits.cpu.A4=3 but only 2 is left" in decision.message


@pytest.mark.parametrize(
    ("used", "delta", "surge", "note"),
    [
        # 4 running, the update asks 1 more for its surge pod: 4 of 4 used, the surge is what does not fit.
        (4, 1, 1, True),
        # It would not fit without the surge either: no word of it.
        (2, 5, 1, False),
        # No surge (maxSurge 0 or not a rolling update): the plain refusal.
        (4, 1, 0, False),
    ],
)
def test_a_refused_rolling_update_says_when_its_surge_does_not_fit(
    used: int, delta: int, surge: int, note: bool
) -> None:
    ask = WorkloadAsk(
        "u",
        "Deployment/ns/w",
        {GPU: D(delta)},
        {GPU: D(4 + surge)},
        surge_pods=surge,
        surge={GPU: D(surge)} if surge else {},
    )
    decision = admit_workload(quota("team", {GPU: 4}, {GPU: used}), ask, NOW)
    assert isinstance(decision, Denied)
    assert f"asks {GPU}={delta} but only {4 - used} is left" in decision.message
    said = f"of which {GPU}=1 is its rolling update's surge (1 pod above spec.replicas"
    assert (said in decision.message) is note
    assert ("set spec.strategy.rollingUpdate.maxSurge to 0" in decision.message) is note


def test_a_rolling_update_whose_surge_fits_is_charged_for_it() -> None:
    ask = WorkloadAsk("u", "Deployment/ns/w", {GPU: D(1)}, {GPU: D(5)}, surge_pods=1, surge={GPU: D(1)})
    decision = admit_workload(quota("team", {GPU: 5}, {GPU: 4}), ask, NOW)
    assert isinstance(decision, Allowed) and decision.status is not None
    assert decision.status.used[GPU] == 5
