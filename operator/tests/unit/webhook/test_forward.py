"""Followers forward to the leader over real TLS (in-process servers): the leader's answer comes back,
the leader is verified with the webhook's CA, and when no leader can answer the request is denied,
never allowed."""

import json
import ssl
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuforge.quota.convert import quota_from_object
from gpuforge.webhook.certs import generate_ca, issue_serving_cert
from gpuforge.webhook.forward import FORWARDED_HEADER, Forwarder
from gpuforge.webhook.review import parse_review
from gpuforge.webhook.server import CertReloader, make_app, serving

from .fakes import MemoryApi, Shell, quota
from .test_leader import create


def certificates(directory: Path, name: str) -> CertReloader:
    """A CA and a serving certificate for 127.0.0.1, as every replica of one webhook has."""
    now = datetime.now(UTC)
    ca = generate_ca(now)
    pair = issue_serving_cert(ca, ["127.0.0.1", "localhost"], now)
    for file, data in (
        (f"{name}-ca.crt", ca.cert_pem),
        (f"{name}.crt", pair.cert_pem),
        (f"{name}.key", pair.key_pem),
    ):
        (directory / file).write_bytes(data)
    return CertReloader(
        directory / f"{name}.crt", directory / f"{name}.key", ca_file=directory / f"{name}-ca.crt"
    )


class Replicas:
    """A leader and a follower serving over TLS; `holder` is what the follower last read of the Lease."""

    def __init__(self, reloader: CertReloader) -> None:
        self.holder = {"name": "leader-0", "endpoint": ""}
        self.follower_url = ""
        self.pokes = 0
        self.shedding = False  # routing says the follower should take no calls
        self.forwarder = Forwarder(
            "follower-0",
            lambda: (self.holder["name"], self.holder["endpoint"]),
            lambda: reloader.client_context,
            reloader.peer_name,
            timeout=2.0,
            on_unreachable=self.poked,
        )

    def poked(self) -> None:
        self.pokes += 1


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[Replicas]:
    leader = Shell(MemoryApi([quota("q", hard=1)]))
    leader.admitting()
    leader.leadership.ledger.load(quota_from_object(leader.api.quotas["q"]))
    leader.leadership.ledger.recomputed("q", None)
    follower = Shell(MemoryApi())  # a follower: never decides
    shared = certificates(tmp_path, "webhook")
    replicas = Replicas(shared)
    async with AsyncExitStack() as stack:
        app = make_app(leader.handlers)
        (leader_port,) = (await stack.enter_async_context(serving(app, "127.0.0.1", [0], shared))).ports
        replicas.holder["endpoint"] = f"https://127.0.0.1:{leader_port}"
        stack.push_async_callback(replicas.forwarder.close)
        app = make_app(follower.handlers, replicas.forwarder, lambda: replicas.shedding)
        (follower_port,) = (await stack.enter_async_context(serving(app, "127.0.0.1", [0], shared))).ports
        replicas.follower_url = f"https://127.0.0.1:{follower_port}"
        yield replicas


async def post(url: str, review: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/validate-workloads", json=review, ssl=False, headers=headers or {}) as response,
    ):
        assert response.status == 200
        answer: dict[str, Any] = (await response.json())["response"]
        return answer


async def test_the_leader_decides_what_a_follower_is_sent(replicas: Replicas) -> None:
    first = await post(replicas.follower_url, create("a"))
    assert first["allowed"] is True and first["uid"] == "req-a"
    second = await post(replicas.follower_url, create("b"))
    assert second["allowed"] is False and "only 0 is left" in second["status"]["message"]
    unlabelled = create("c")
    unlabelled["request"]["object"]["metadata"]["labels"] = {}
    replicas.holder["name"] = ""
    assert (await post(replicas.follower_url, unlabelled))["allowed"] is True  # answered on the spot


async def test_no_leader_means_denied_and_try_again(replicas: Replicas) -> None:
    replicas.holder["name"] = ""
    answer = await post(replicas.follower_url, create("a"))
    assert answer["allowed"] is False and answer["status"]["code"] == 503
    assert "no leader yet; try again" in answer["status"]["message"]


async def test_an_unreachable_leader_means_denied_and_a_fresh_look_at_the_lease(replicas: Replicas) -> None:
    replicas.holder["endpoint"] = "https://127.0.0.1:9"
    answer = await post(replicas.follower_url, create("a"))
    assert answer["allowed"] is False and "did not answer" in answer["status"]["message"]
    assert replicas.pokes == 1


async def test_a_leader_is_verified_with_the_webhooks_ca(replicas: Replicas, tmp_path: Path) -> None:
    stranger = certificates(tmp_path, "stranger")  # serves a certificate of another CA
    impostor = Shell(MemoryApi([quota("q", hard=100)]))
    impostor.admitting()
    async with serving(make_app(impostor.handlers), "127.0.0.1", [0], stranger) as served:
        (port,) = served.ports
        replicas.holder["endpoint"] = f"https://127.0.0.1:{port}"
        answer = await post(replicas.follower_url, create("a"))
    assert answer["allowed"] is False and "did not answer" in answer["status"]["message"]
    assert "CERTIFICATE_VERIFY_FAILED" in answer["status"]["message"]
    with pytest.raises(ssl.SSLError):
        replicas.forwarder.client_context().load_verify_locations(cadata="not a certificate")


async def test_a_forwarded_request_is_never_forwarded_again(replicas: Replicas) -> None:
    answer = await post(replicas.follower_url, create("a"), {FORWARDED_HEADER: "another-follower"})
    assert answer["allowed"] is False and "not the GpuQuota leader" in answer["status"]["message"]


async def test_the_answer_must_be_for_the_request(replicas: Replicas) -> None:
    review = create("a")
    body = json.dumps(review).encode()
    other = json.loads(body)
    other["request"]["uid"] = "someone-else"
    request = parse_review(json.dumps(other).encode())
    answer = await replicas.forwarder.forward("/validate-workloads", body, request)
    assert not isinstance(answer, dict) and "not for this request" in answer.message


async def test_a_follower_that_takes_no_calls_closes_the_connection_it_answered_on(
    replicas: Replicas,
) -> None:
    for shedding, closes in ((False, False), (True, True)):
        replicas.shedding = shedding
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{replicas.follower_url}/validate-workloads", json=create("a"), ssl=False
            ) as response,
        ):
            assert response.status == 200 and (await response.json())["response"]["uid"] == "req-a"
            assert (response.headers.get("Connection", "").lower() == "close") is closes
