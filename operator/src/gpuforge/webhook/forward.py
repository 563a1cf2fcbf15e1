"""Followers forward admission requests to the leader, over TLS, and relay its answer.

The leader publishes its endpoint (`https://<pod IP>:<port>`) in an annotation of the Lease it holds
(gpuforge.quota.leader.LEADER_ENDPOINT_ANNOTATION); followers read the Lease every couple of seconds.
Whoever can write that Lease could point followers elsewhere, so the annotation is not trusted alone:
the connection is verified with the webhook's CA against the name every replica's serving certificate
carries (all replicas serve the same certificate, issued for the Service's names), so only a holder of
that certificate's key can answer. A forwarded request carries FORWARDED_HEADER: a replica that is no
longer the leader when it arrives denies it rather than forward it again.

If no leader is known or it cannot be reached, the request is denied with a message saying to try again:
never allowed.
"""

from __future__ import annotations

import logging
import math
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import orjson

from gpuforge.quota.admission import Denied
from gpuforge.webhook import metrics
from gpuforge.webhook.admission import unavailable
from gpuforge.webhook.review import AdmissionRequest

log = logging.getLogger(__name__)

FORWARDED_HEADER: Final = "X-Gpuforge-Forwarded-By"


@dataclass
class Forwarder:
    identity: str  # this replica, in FORWARDED_HEADER
    leader: Callable[[], tuple[str, str]]  # (holder identity, endpoint) as last read from the Lease
    client_context: Callable[[], ssl.SSLContext]  # trusts the webhook's CA (reloaded when it rotates)
    server_name: str  # the name the leader's certificate must carry
    timeout: float = 4.0  # under the API server's webhook timeout
    on_unreachable: Callable[[], None] | None = None  # read the Lease again soon
    own_endpoint: Callable[[], str] = lambda: ""  # where this replica serves (what it would publish)
    _session: aiohttp.ClientSession | None = field(default=None, init=False)
    _warned: dict[str, float] = field(default_factory=dict, init=False)  # endpoint -> when last logged

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def forward(self, path: str, body: bytes, review: AdmissionRequest) -> dict[str, Any] | Denied:
        """The leader's AdmissionReview answer to `body`, or a denial saying why there is none."""
        holder, endpoint = self.leader()
        if not holder or not endpoint:
            metrics.FORWARDED.labels("no_leader").inc()
            why = f"the GpuQuota leader {holder} published no endpoint" if holder else "no leader yet"
            return unavailable(why)
        if endpoint == self.own_endpoint():  # an earlier process at this address: it is gone
            metrics.FORWARDED.labels("no_leader").inc()
            return unavailable(
                f"the Lease still names {holder}, an earlier process at this address; it expires soon"
            )
        started = time.perf_counter()
        try:
            async with self._http().post(
                endpoint.rstrip("/") + path,
                data=body,
                headers={"Content-Type": "application/json", FORWARDED_HEADER: self.identity},
                ssl=self.client_context(),
                server_hostname=self.server_name,
            ) as response:
                text = await response.text()
                if response.status != 200:
                    raise aiohttp.ClientResponseError(
                        response.request_info, (), status=response.status, message=text[:200]
                    )
            answer = orjson.loads(text)
            inner = answer.get("response") if isinstance(answer, dict) else None
            if not isinstance(inner, dict) or inner.get("uid") != review.uid:
                raise ValueError("the answer is not for this request")
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, ssl.SSLError) as error:
            metrics.FORWARDED.labels("unreachable").inc()
            now = time.monotonic()
            if now - self._warned.get(endpoint, -math.inf) >= 10.0:  # once per outage, not per request
                self._warned[endpoint] = now
                log.warning(
                    "could not forward to leader %s at %s (%s): denying until it answers",
                    holder,
                    endpoint,
                    error,
                )
            if self.on_unreachable is not None:
                self.on_unreachable()
            reason = str(error) or type(error).__name__
            return unavailable(f"the GpuQuota leader {holder} at {endpoint} did not answer ({reason})")
        metrics.FORWARDED.labels("answered").inc()
        metrics.FORWARD_LATENCY.observe(time.perf_counter() - started)
        result: dict[str, Any] = answer
        return result
