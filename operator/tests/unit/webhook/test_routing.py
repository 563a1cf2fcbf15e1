"""Routing the API server's calls to the leader (webhook.routing) against an in-memory Lease: the
leader joins the endpoints and says so in the Lease, a follower leaves once it reads that, and joins
again when the Lease is released; a failed change is retried."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from gpuforge.webhook.leader import LeaderElector
from gpuforge.webhook.leadership import Leadership
from gpuforge.webhook.metrics import REGISTRY
from gpuforge.webhook.routing import Router

from .fakes import TIMING, MemoryApi


class Recorded:
    """An endpoint that records what it was set to (and can fail)."""

    def __init__(self) -> None:
        self.calls: list[bool] = []
        self.failures = 0

    async def set(self, takes: bool) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError("the API server is away")
        self.calls.append(takes)


class Replica:
    def __init__(self, api: MemoryApi, identity: str) -> None:
        self.leadership = Leadership(TIMING)
        self.elector = LeaderElector(
            api,  # type: ignore[arg-type]
            "ns",
            "l",
            identity=identity,
            endpoint=f"https://{identity}:8443",
            on_lead=self.leadership.took,
            on_lose=self.leadership.lost,
        )
        self.endpoint = Recorded()
        self.router = Router(
            self.endpoint, self.leadership, self.elector, poll_seconds=0.01, retry_seconds=0.01
        )
        self.elector.routed = self.router.routed


@contextlib.asynccontextmanager
async def routing(*replicas: Replica) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(replica.router.run()) for replica in replicas]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until(condition: object, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.005)


async def test_the_leader_takes_the_calls_and_the_follower_steps_out_until_the_lease_is_released() -> None:
    api = MemoryApi()
    a, b = Replica(api, "a"), Replica(api, "b")
    async with routing(a, b):
        await until(lambda: a.router.applied and b.router.applied)  # no leader yet: both take calls
        await a.elector.step()  # a leads, already an endpoint: its Lease says it takes the calls
        assert api.lease is not None
        assert api.lease["metadata"]["annotations"]["gpuforge.io/leader-routed"] == "true"
        await b.elector.step()
        await until(lambda: b.router.applied is False)
        assert REGISTRY.get_sample_value("gpuforge_quota_takes_calls") == 0.0  # b, which set it last
        assert b.router.sheds_connections() and not a.router.sheds_connections()
        assert b.endpoint.calls == [True, False] and a.endpoint.calls == [True]
        a.elector.release_ok = True
        await a.elector._release()  # a clean stop: the Lease names nobody
        await b.elector.step()  # b takes over the released Lease at once
        await until(lambda: b.router.applied is True)
        assert b.endpoint.calls == [True, False, True] and not b.router.sheds_connections()


async def test_a_failed_change_is_retried() -> None:
    api = MemoryApi()
    a = Replica(api, "a")
    a.endpoint.failures = 2
    async with routing(a):
        await until(lambda: a.router.applied is True)
    assert a.endpoint.calls == [True]


async def test_a_leader_that_is_no_endpoint_yet_does_not_say_it_routes() -> None:
    api = MemoryApi()
    a, b = Replica(api, "a"), Replica(api, "b")
    await a.elector.step()  # a's router has not run: it has not joined the endpoints
    assert api.lease is not None and "gpuforge.io/leader-routed" not in api.lease["metadata"]["annotations"]
    await b.elector.step()
    assert b.elector.holder == "a" and not b.elector.holder_routed and b.router.wanted()
