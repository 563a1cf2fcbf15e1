"""The leadership shell against an in-memory API: the Lease (who leads, where it serves, how it got the
Lease), the gate it drives, the takeover a new term goes through, and the handover on shutdown."""

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest

from gpuforge.quota.admission import Allowed, Denied
from gpuforge.quota.convert import quota_from_object
from gpuforge.quota.leader import Role, Takeover, Timing
from gpuforge.webhook.leader import LeaderElector
from gpuforge.webhook.leadership import Leadership
from gpuforge.webhook.metrics import REGISTRY
from gpuforge.webhook.review import parse_review
from gpuforge.webhook.run import _hand_over

from .fakes import GPU, MemoryApi, Shell, deployment, quota


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(
    api: MemoryApi, clock: Clock, identity: str, endpoint: str, leadership: Leadership | None = None
) -> LeaderElector:
    return LeaderElector(
        api,  # type: ignore[arg-type]
        "ns",
        "l",
        identity=identity,
        endpoint=endpoint,
        monotonic=clock,
        on_lead=leadership.took if leadership is not None else None,
        on_lose=leadership.lost if leadership is not None else None,
    )


async def test_one_leader_publishes_its_endpoint_and_the_next_takes_over_after_expiry() -> None:
    api, clock = MemoryApi(), Clock()
    taken: list[tuple[str, Takeover]] = []
    a = elector(api, clock, "a", "https://10.0.0.1:8443")
    b = elector(api, clock, "b", "https://10.0.0.2:8443")
    a.on_lead = lambda how, until: taken.append(("a", how))
    b.on_lead = lambda how, until: taken.append(("b", how))
    await a.step()
    await b.step()
    assert (a.is_leader(), b.is_leader()) == (True, False)
    assert (b.holder, b.leader_endpoint) == ("a", "https://10.0.0.1:8443")  # where b forwards
    clock.now += 5
    await a.step()  # renews
    await b.step()  # sees a new version: its wait starts again
    clock.now += 14
    await b.step()
    assert not b.is_leader()
    clock.now += 1  # 15 s without a change: a is gone
    await b.step()
    assert b.is_leader() and api.lease is not None and api.lease["spec"]["leaseTransitions"] == 1
    assert api.lease["metadata"]["annotations"] == {"gpuforge.io/leader-endpoint": "https://10.0.0.2:8443"}
    await a.step()  # a sees b hold it
    assert not a.is_leader() and a.leader_endpoint == "https://10.0.0.2:8443"
    b.release_ok = True
    await b._release()
    assert api.lease["spec"]["holderIdentity"] is None and api.lease["metadata"]["annotations"] == {}
    await a.step()  # released: taken at once
    assert a.is_leader()
    assert taken == [
        ("a", Takeover.CREATED),
        ("a", Takeover.CONTINUED),
        ("b", Takeover.EXPIRED),
        ("a", Takeover.RELEASED),
    ]


async def test_a_leader_that_cannot_renew_stops_at_its_deadline() -> None:
    api, clock = MemoryApi(), Clock()
    leadership = Leadership(
        Timing(timedelta(seconds=15), timedelta(seconds=5), timedelta(seconds=5)), monotonic=clock
    )
    a = elector(api, clock, "a", "https://a", leadership)
    await a.step()
    assert leadership.gate.role is Role.WAITING and leadership.gate.admit_from == clock.now + 25  # created
    leadership.syncing(1)
    leadership.synced(1)
    assert leadership.refusal() is None
    api.unreachable = True
    clock.now += 10  # its renewal began 10 s ago: the renew deadline
    assert not a.is_leader() and "could not renew" in (leadership.refusal() or "")
    assert not leadership.may_write()


async def test_a_lease_kept_by_nobody_else_resumes_with_a_new_term() -> None:
    api, clock = MemoryApi(), Clock()
    leadership = Leadership(
        Timing(timedelta(seconds=15), timedelta(seconds=5), timedelta(seconds=5)), monotonic=clock
    )
    a = elector(api, clock, "a", "https://a", leadership)
    await a.step()
    leadership.syncing(1)
    leadership.synced(1)
    leadership.ledger.load(quota_from_object(quota("q")))
    clock.now += 11
    assert not a.is_leader()
    await a.step()  # its own Lease, unrenewed but untaken: renewed, as a new term
    assert leadership.gate.role is Role.WAITING and leadership.gate.term == 2
    assert leadership.gate.admit_from == clock.now + 10 and len(leadership.ledger) == 0


@pytest.mark.parametrize(
    ("role", "admit_in", "unreachable", "released"),
    [
        (Role.ADMITTING, -1.0, False, True),  # everything written: released
        (Role.ADMITTING, -1.0, True, False),  # could not write: left to expire
        (Role.WAITING, 5.0, False, False),  # still waiting out the previous leader: left to expire
    ],
)
async def test_a_handover_releases_the_lease_only_when_nothing_is_left_unwritten(
    role: Role, admit_in: float, unreachable: bool, released: bool
) -> None:
    api = MemoryApi([quota("q")])
    shell = Shell(api)
    clock = Clock()
    shell.leadership.monotonic = clock
    lead = elector(api, clock, "a", "https://a", shell.leadership)
    await lead.step()
    gate = shell.leadership.gate
    shell.leadership.gate = type(gate)(role, gate.term, clock.now + admit_in, gate.leading_until)
    ledger = shell.leadership.ledger
    ledger.load(quota_from_object(api.quotas["q"]))
    ledger.charge("q", quota_from_object(api.quotas["q"]).status, 0.0)  # an admission not written yet
    api.unreachable = unreachable
    writer = asyncio.create_task(shell.writer.run())
    await _hand_over(shell.leadership, shell.writer, lead)
    writer.cancel()
    api.unreachable = False
    await lead._release()
    assert shell.leadership.gate.role in (Role.STOPPING, Role.FOLLOWER)
    assert api.lease is not None and (api.lease["spec"]["holderIdentity"] is None) is released


async def test_a_new_term_waits_lists_afresh_then_admits() -> None:
    """A takeover: nothing is decided before the wait is over and the cluster is listed again; the
    ledger then holds what the previous leader wrote (its reservation) and what exists."""
    earlier = {
        "uid": "r1",
        "workload": "Deployment/ns/pending",
        "delta": {GPU: "1"},
        "expected": {GPU: "1"},
        "created": "2099-01-01T00:00:00Z",  # far in the future: never expires in this test
        "generation": 1,
    }
    api = MemoryApi([quota("q", hard=3, used=1, reservations=[earlier])], [deployment("w", "q", replicas=1)])
    shell = Shell(api, debounce_seconds=0.01)
    run = asyncio.create_task(shell.controller.run())
    try:
        await asyncio.sleep(0.05)
        lists = api.lists
        shell.leadership.took(Takeover.EXPIRED)
        gate = shell.leadership.gate
        shell.leadership.gate = type(gate)(
            gate.role, gate.term, shell.leadership.now() + 0.2, gate.leading_until
        )
        request = parse_review(json.dumps(create("a")).encode())
        early = await shell.handlers.workloads(request)
        assert isinstance(early, Denied) and "admits in" in early.message
        for _ in range(100):
            if shell.leadership.gate.role is Role.ADMITTING:
                break
            await asyncio.sleep(0.02)
        assert shell.leadership.gate.role is Role.ADMITTING and api.lists > lists  # listed again
        held = shell.leadership.ledger.quota("q")
        assert held is not None and held.status.used == {GPU: 2}  # the workload and the reservation
        assert isinstance(await shell.handlers.workloads(request), Allowed)
        second = parse_review(json.dumps(create("b")).encode())
        assert isinstance(await shell.handlers.workloads(second), Denied)  # 3 of 3
        shell.leadership.lost()
        assert len(shell.leadership.ledger) == 0
        later = await shell.handlers.workloads(parse_review(json.dumps(create("c")).encode()))
        assert isinstance(later, Denied) and "not the GpuQuota leader" in later.message
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


def create(name: str) -> dict[str, Any]:
    obj = deployment(name, "q")
    obj["metadata"].pop("resourceVersion")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"req-{name}",
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "operation": "CREATE",
            "namespace": "ns",
            "name": name,
            "object": obj,
        },
    }


async def test_a_follower_shows_the_usage_the_leader_wrote() -> None:
    shell = Shell(MemoryApi())
    shell.controller._listener("GpuQuota")("MODIFIED", quota("shown-by-follower", used=7))
    used = REGISTRY.get_sample_value("gpuforge_quota_used", {"quota": "shown-by-follower", "key": GPU})
    hard = REGISTRY.get_sample_value("gpuforge_quota_hard", {"quota": "shown-by-follower", "key": GPU})
    assert (used, hard) == (7.0, 16.0)
    assert len(shell.leadership.ledger) == 0  # a follower holds no ledger
