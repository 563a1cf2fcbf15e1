"""The HTTPS server of the quota webhook (aiohttp): AdmissionReview endpoints, metrics, health, and
serving-certificate reload without a restart.

Endpoints: POST /validate-workloads, /validate-scale, /validate-gpuquotas; GET /metrics, /healthz.
A body that is not a well-formed AdmissionReview (or is too large) gets HTTP 400 and one log line.
A follower answers what needs no quota at once and forwards the rest to the leader (webhook.forward).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpuforge.quota.admission import Allowed, Decision, Denied
from gpuforge.webhook import metrics
from gpuforge.webhook.admission import AdmissionHandlers, safely, trivially_allowed
from gpuforge.webhook.certs import first_host
from gpuforge.webhook.forward import FORWARDED_HEADER, Forwarder
from gpuforge.webhook.manifests import QUOTAS_PATH, SCALE_PATH, WORKLOADS_PATH
from gpuforge.webhook.review import MAX_BODY_BYTES, AdmissionRequest, BadReview, parse_review, review_response

log = logging.getLogger(__name__)

Handler = Callable[[AdmissionRequest], Awaitable[Decision]]


def _result(decision: Decision) -> str:
    if isinstance(decision, Allowed):
        return "allowed"
    if decision.reason in ("Invalid", "NotFound"):
        return "invalid"
    if decision.code >= 500:
        return "error"
    return "denied"


async def _read_body(request: web.Request) -> bytes:
    """The whole body, up to one byte past the limit. (`content.read(n)` returns what has arrived so far,
    which under load is part of a body split over several TLS records.)"""
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_BODY_BYTES:
        chunk = await request.content.read(MAX_BODY_BYTES + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _answer(review: AdmissionRequest, decision: Decision) -> dict[str, Any]:
    if isinstance(decision, Denied):
        return review_response(review, False, decision.message, decision.code, decision.reason)
    return review_response(review, True)


def make_app(
    handlers: AdmissionHandlers,
    forwarder: Forwarder | None = None,
    sheds_connections: Callable[[], bool] = lambda: False,
) -> web.Application:
    """The webhook's routes. With a `forwarder`, a follower sends what needs the ledger to the leader.
    While `sheds_connections()` (calls are routed to the leader, webhook.routing), a follower closes each
    connection a caller made to it after answering, so the caller's next connection reaches the leader."""
    app = web.Application(client_max_size=MAX_BODY_BYTES + 1)

    def endpoint(name: str, handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def serve(request: web.Request) -> web.Response:
            started = time.perf_counter()
            try:
                if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
                    raise BadReview(f"body of {request.content_length} bytes is larger than {MAX_BODY_BYTES}")
                body = await _read_body(request)
                review = parse_review(body)
            except BadReview as error:
                metrics.BAD_REVIEWS.inc()
                log.warning("400 on %s from %s: %s", request.path, request.remote, error)
                return web.json_response({"error": str(error)}, status=400)
            if (
                forwarder is not None
                and handlers.leadership.is_follower()
                and FORWARDED_HEADER not in request.headers  # else: it came here as the leader; deny
                and not trivially_allowed(review, handlers.cached_default_quota(review.namespace))
            ):
                forwarded = await forwarder.forward(request.path, body, review)
                response = _answer(review, forwarded) if isinstance(forwarded, Denied) else forwarded
            else:
                decision = await safely(handler, review)
                if isinstance(decision, Denied) and decision.key.startswith("cash/"):
                    metrics.BUDGET_DENIALS.labels(decision.quota, decision.key).inc()
                metrics.ADMISSIONS.labels(name, _result(decision)).inc()
                response = _answer(review, decision)
            metrics.ADMISSION_LATENCY.labels(name).observe(time.perf_counter() - started)
            answer = web.Response(body=orjson.dumps(response), content_type="application/json")
            if FORWARDED_HEADER not in request.headers and sheds_connections():
                answer.force_close()
            return answer

        return serve

    async def metrics_endpoint(_: web.Request) -> web.Response:
        body = generate_latest(metrics.REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_post(WORKLOADS_PATH, endpoint("workloads", handlers.workloads))
    app.router.add_post(SCALE_PATH, endpoint("scale", handlers.scale))
    app.router.add_post(QUOTAS_PATH, endpoint("gpuquotas", handlers.quotas))
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", healthz)
    return app


@dataclass
class CertReloader:
    """An SSLContext whose certificate follows the files: new handshakes use the new certificate.

    Secrets mounted in a pod are swapped by symlink; stat() follows it, so a new inode, mtime or size of
    any file triggers a reload. A half-written pair fails to load and is retried on the next poll.

    `client_context` trusts `ca_file` (the CA bundle the replicas' certificates chain to; without one,
    the serving certificate itself): a follower verifies the leader with it before forwarding.
    """

    cert_file: Path
    key_file: Path
    interval: float = 5.0
    ca_file: Path | None = None
    client_context: ssl.SSLContext = field(init=False)

    def __post_init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.load_cert_chain(self.cert_file, self.key_file)
        self.client_context = self._client_context()
        self._seen = self._fingerprint()

    def _client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file or self.cert_file))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    @property
    def peer_name(self) -> str:
        """The name another replica's certificate must carry (the first one of ours: they are the same)."""
        return first_host(self.cert_file.read_bytes())

    def _fingerprint(self) -> tuple[int, ...]:
        # The inode too: a Secret volume swap points the names at new files, whatever their times.
        files = [self.cert_file, self.key_file, *([self.ca_file] if self.ca_file else [])]
        return tuple(value for path in files for value in _stat(path))

    def reload_if_changed(self) -> bool:
        try:
            current = self._fingerprint()
        except OSError:
            return False
        if current == self._seen:
            return False
        try:
            self.context.load_cert_chain(self.cert_file, self.key_file)
            self.client_context = self._client_context()
        except (ssl.SSLError, OSError) as error:
            log.warning("new serving certificate not loadable yet: %s", error)
            return False
        self._seen = current
        metrics.CERT_RELOADS.inc()
        log.info("reloaded serving certificate from %s", self.cert_file)
        return True

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.reload_if_changed()


def _stat(path: Path) -> tuple[int, int, int]:
    info = os.stat(path)
    return info.st_ino, info.st_mtime_ns, info.st_size


@dataclass
class Served:
    ports: list[int]  # as bound (a port given as 0 is the one picked)
    runner: web.AppRunner  # to add a site later


def tls_site(runner: web.AppRunner, host: str, port: int, context: ssl.SSLContext) -> web.TCPSite:
    """One HTTPS listener of the webhook."""
    return web.TCPSite(runner, host, port, ssl_context=context, backlog=512)


@contextlib.asynccontextmanager
async def serving(
    app: web.Application, host: str, ports: Sequence[int], reloader: CertReloader
) -> AsyncIterator[Served]:
    """Serve `app` over TLS on each of `ports` until the block exits (0 picks a free port)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    bound: list[int] = []
    for port in ports:
        site = tls_site(runner, host, port, reloader.context)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        bound.append(int(sockets[0].getsockname()[1]) if sockets else port)
    watcher = asyncio.create_task(reloader.watch())
    try:
        yield Served(bound, runner)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await runner.cleanup()
