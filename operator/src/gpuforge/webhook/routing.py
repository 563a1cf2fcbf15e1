"""Route the API server's calls to the leader: only the leader stays an endpoint of the webhook's address.

Every replica can take a call: a follower forwards what needs the ledger to the leader (webhook.forward).
That hop costs the follower's event loop and a second TLS exchange on every call that lands on it, so
with routing on, the leader makes itself an endpoint and the followers step out once the leader says
(in the Lease) that it takes the calls: `gpuforge.quota.leader.takes_calls` decides, this module applies.
A follower also closes each connection it answers on (`Connection: close`), so the API server's next
call opens a new connection, which reaches the leader. Whatever still reaches a follower is forwarded
as before: routing never decides who admits.

How a replica becomes (or stops being) an endpoint: `PodLabel`, the replica labels its own pod
`gpuforge.io/quota-webhook-endpoint` true or false and the webhook's Service selects `true` (the pod
template starts every replica as `true`, so a replica that has not decided yet, or an older version
during an upgrade, still takes calls), as CloudNativePG routes its read-write Service to the primary.
`Endpoint` is the seam: the benchmark, whose replicas share one port on one host instead of a Service,
brings its own (bench/bench_quota.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Literal, Protocol

import aiohttp

from gpuforge.constants import QUOTA_WEBHOOK_ENDPOINT_LABEL
from gpuforge.k8s.quota import ApiError, QuotaApi
from gpuforge.quota.leader import takes_calls
from gpuforge.webhook import metrics
from gpuforge.webhook.leader import LeaderElector
from gpuforge.webhook.leadership import Leadership

log = logging.getLogger(__name__)

RouteMode = Literal["none", "pod-label"]


class Endpoint(Protocol):
    async def set(self, takes: bool) -> None:
        """Make this replica an endpoint of the webhook's address, or not. Raises on failure."""


@dataclass
class PodLabel:
    api: QuotaApi
    namespace: str
    pod: str

    async def set(self, takes: bool) -> None:
        value = "true" if takes else "false"
        await self.api.label_pod(self.namespace, self.pod, QUOTA_WEBHOOK_ENDPOINT_LABEL, value)


@dataclass
class Router:
    endpoint: Endpoint
    leadership: Leadership
    elector: LeaderElector
    poll_seconds: float = 0.5  # how often the decision is looked at (it is pure: no request)
    reassert_seconds: float = 30.0  # the label is set again this often (someone may have changed it)
    retry_seconds: float = 2.0
    applied: bool | None = field(default=None, init=False)  # what the endpoint was last set to
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def __post_init__(self) -> None:
        self.leadership.listeners.append(self._wake.set)  # a new role: decide now, not at the next poll

    def wanted(self) -> bool:
        holder = self.elector.holder
        other = holder if holder != self.elector.identity else ""
        return takes_calls(self.leadership.gate.role, other, self.elector.holder_routed)

    def routed(self) -> bool:
        """This replica is an endpoint (what the leader publishes in the Lease)."""
        return self.applied is True

    def sheds_connections(self) -> bool:
        """A follower that should not take calls closes the connections it answers on."""
        return self.leadership.is_follower() and self.applied is False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last_set = -float("inf")
        while True:
            wanted = self.wanted()
            if wanted != self.applied or loop.time() - last_set >= self.reassert_seconds:
                try:
                    await self.endpoint.set(wanted)
                except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as error:
                    log.warning(
                        "could not %s the webhook's endpoints: %s", "join" if wanted else "leave", error
                    )
                    await asyncio.sleep(self.retry_seconds)
                    continue
                if wanted != self.applied:
                    log.info("%s the webhook's endpoints", "joined" if wanted else "left")
                    if wanted:
                        # A leader publishes `routed` now, not at its next renewal (a replica that
                        # joins while it takes the Lease may have written it without); a follower
                        # merely reads the Lease sooner.
                        self.elector.poke()
                self.applied, last_set = wanted, loop.time()
                metrics.TAKES_CALLS.set(1.0 if wanted else 0.0)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_seconds):
                    await self._wake.wait()
