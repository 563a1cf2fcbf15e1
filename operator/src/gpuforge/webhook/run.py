"""`gpuforge webhook run`: wire the HTTPS server, leadership, the ledger and its writer, the usage
controller and (optionally) registration.

Replicas elect a leader through a Lease; the leader decides admissions from its in-memory ledger and
writes them behind, the others forward admission requests to it. Without election (`--no-leader-elect`,
or `--register`, which serves one local process) this process is the leader.

With `--register` the webhook serves on loopback with a CA it generates, registers its own
ValidatingWebhookConfigurations (a `url` client config and that CA as caBundle) and removes them when it
stops, so a local control plane whose pods do not really run can call a webhook on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from gpuforge.heap import Heap
from gpuforge.k8s.quota import QuotaApi
from gpuforge.quota.leader import Timing
from gpuforge.webhook import metrics
from gpuforge.webhook.admission import AdmissionHandlers, Clock, utc_now
from gpuforge.webhook.certs import generate_ca, issue_serving_cert
from gpuforge.webhook.controller import UsageController
from gpuforge.webhook.forward import Forwarder
from gpuforge.webhook.leader import LeaderElector, default_identity, default_namespace
from gpuforge.webhook.leadership import Leadership
from gpuforge.webhook.manifests import ClientTarget, FailurePolicy, render_webhook_configurations
from gpuforge.webhook.routing import Endpoint, PodLabel, RouteMode, Router
from gpuforge.webhook.server import CertReloader, Served, make_app, serving
from gpuforge.webhook.writeback import WriteBehind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WebhookOptions:
    host: str = "127.0.0.1"
    port: int = 8443
    cert_file: Path | None = None
    key_file: Path | None = None
    # The CA bundle the replicas' certificates chain to: put in caBundle when registering, and trusted
    # when a follower forwards to the leader.
    ca_file: Path | None = None
    kubeconfig: Path | None = None
    register: bool = False
    name: str = "gpuforge-quota"
    failure_policy: FailurePolicy = "Fail"
    # timeoutSeconds of the webhook configurations that call this webhook (registered with it, or by the
    # operator): a new leader waits it out, with persist_seconds, before admitting.
    timeout_seconds: int = 5
    resync_seconds: float = 300.0
    # GpuQuota status writes a second, all quotas together (0: no limit).
    status_writes_per_second: float = 10.0
    accrual_seconds: float = 60.0
    speedup: float = 1.0
    cert_check_seconds: float = 5.0
    crd_file: Path | None = None
    # Replicas elect one leader through a Lease (None: elect unless --register, which serves one process).
    leader_elect: bool | None = None
    lease_namespace: str | None = None  # default: the pod's namespace, `default` outside a cluster
    lease_name: str | None = None  # default: <name>-controller
    lease_seconds: float = 15.0
    # How long the API server may take to store an object after this webhook admitted it.
    persist_seconds: float = 5.0
    # Where followers reach this replica: https://<advertise_host>:<port>. Default host: the pod's IP
    # ($POD_IP), else the serving host.
    advertise_host: str | None = None
    # How the API server's calls reach the leader only (webhook.routing): "pod-label" (in a cluster: the
    # Service selects the label; needs $POD_NAME) or "none" (every replica takes calls; followers
    # forward). Only with leader election.
    route: RouteMode = "none"


@dataclass
class RunningWebhook:
    port: int
    url: str
    ca_bundle: bytes
    api: QuotaApi
    controller: UsageController
    leadership: Leadership


def _self_signed(directory: Path, host: str, clock: Clock) -> tuple[Path, Path, bytes]:
    ca = generate_ca(clock())
    pair = issue_serving_cert(ca, [host, "localhost"], clock())
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    key.chmod(0o600)
    return cert, key, ca.cert_pem


async def apply_crd(api: QuotaApi, path: Path) -> None:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    await api.apply_object(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", document["metadata"]["name"], document
    )
    await api.wait_crd_established(document["metadata"]["name"])


def advertised_host(options: WebhookOptions) -> str:
    host = options.advertise_host or os.environ.get("POD_IP") or options.host
    if host in ("", "0.0.0.0", "::"):  # a wildcard bind: no address to reach
        host = socket.gethostbyname(socket.gethostname())
    return f"[{host}]" if ":" in host else host


# How a replica joins the webhook's address, given what it serves: the default is its pod's label
# (`--route=pod-label`); the benchmark, whose replicas share a port on one host, passes its own.
EndpointFactory = Callable[[Served, CertReloader], Endpoint]


@contextlib.asynccontextmanager
async def running_webhook(
    options: WebhookOptions, clock: Clock = utc_now, endpoint: EndpointFactory | None = None
) -> AsyncIterator[RunningWebhook]:
    """Serve, lead or follow, reconcile and (optionally) register until the block exits; then hand over
    (stop admitting, write what the ledger holds, release the Lease) and unregister. With `endpoint`,
    calls are routed to the leader through it, whatever `options.route` says."""
    api = QuotaApi.from_kubeconfig(options.kubeconfig)
    with tempfile.TemporaryDirectory(prefix="gpuforge-webhook-") as scratch:
        ca_file = options.ca_file
        if options.cert_file and options.key_file:
            cert, key = options.cert_file, options.key_file
            ca_bundle = options.ca_file.read_bytes() if options.ca_file else cert.read_bytes()
        else:
            cert, key, ca_bundle = _self_signed(Path(scratch), options.host, clock)
            ca_file = Path(scratch) / "ca.crt"
            ca_file.write_bytes(ca_bundle)
        reloader = CertReloader(cert, key, options.cert_check_seconds, ca_file=ca_file)
        leadership = Leadership(
            Timing(
                lease_duration=timedelta(seconds=options.lease_seconds),
                webhook_timeout=timedelta(seconds=options.timeout_seconds),
                persist=timedelta(seconds=options.persist_seconds),
            )
        )
        writer = WriteBehind(
            api, leadership.ledger, leadership.may_write, rate=options.status_writes_per_second
        )
        controller = UsageController(
            api,
            leadership,
            writer,
            clock,
            resync_seconds=options.resync_seconds,
            accrual_seconds=options.accrual_seconds,
            speedup=options.speedup,
        )
        handlers = AdmissionHandlers(
            api,
            leadership,
            writer,
            controller.count,
            controller.workload_caches,
            clock,
            namespaces=controller.namespaces,
            container_defaults=controller.container_defaults,
            device_classes=controller.device_class_map,
        )
        elect = options.leader_elect if options.leader_elect is not None else not options.register
        identity = default_identity()
        elector = (
            LeaderElector(
                api,
                options.lease_namespace or default_namespace(),
                options.lease_name or f"{options.name}-controller",
                identity=identity,
                clock=clock,
                duration=timedelta(seconds=options.lease_seconds),
                renew_seconds=options.lease_seconds / 3,
                retry_seconds=min(2.0, options.lease_seconds / 5),
                renew_deadline=timedelta(seconds=options.lease_seconds * 2 / 3),
                on_lead=leadership.took,
                on_lose=leadership.lost,
            )
            if elect
            else None
        )
        forwarder = (
            Forwarder(
                identity,
                lambda: (elector.holder, elector.leader_endpoint),
                lambda: reloader.client_context,
                reloader.peer_name,
                timeout=max(1.0, options.timeout_seconds - 1.0),
                on_unreachable=elector.poke,
                own_endpoint=lambda: elector.endpoint,
            )
            if elector is not None
            else None
        )
        route = options.route if elector is not None and endpoint is None else "none"
        pod = _pod_name() if route == "pod-label" else ""
        router: Router | None = None
        registered: list[str] = []
        tasks: list[asyncio.Task[None]] = []
        try:
            if options.crd_file is not None:
                await apply_crd(api, options.crd_file)
            app = make_app(handlers, forwarder, lambda: router is not None and router.sheds_connections())
            async with serving(app, options.host, [options.port], reloader) as served:
                bound = served.ports
                url = f"https://{options.host}:{bound[0]}"
                if options.register:
                    target = ClientTarget(ca_bundle=ca_bundle, url=url)
                    for configuration in render_webhook_configurations(
                        target,
                        name=options.name,
                        failure_policy=options.failure_policy,
                        timeout_seconds=options.timeout_seconds,
                    ):
                        await api.apply_webhook_configuration(configuration)
                        registered.append(configuration["metadata"]["name"])
                    log.info("registered %s -> %s", ", ".join(registered), url)
                tasks.append(asyncio.create_task(writer.run()))
                tasks.append(asyncio.create_task(controller.run()))
                if elector is not None:
                    elector.endpoint = f"https://{advertised_host(options)}:{bound[0]}"
                    joins: Endpoint | None = (
                        endpoint(served, reloader)
                        if endpoint is not None
                        else PodLabel(api, default_namespace(), pod)
                        if route == "pod-label"
                        else None
                    )
                    if joins is not None:
                        router = Router(joins, leadership, elector)
                        elector.routed = router.routed
                        tasks.append(asyncio.create_task(router.run()))
                    tasks.append(asyncio.create_task(elector.run()))
                else:
                    leadership.start()
                try:
                    yield RunningWebhook(bound[0], url, ca_bundle, api, controller, leadership)
                finally:
                    await _hand_over(leadership, writer, elector)
        finally:
            for task in reversed(tasks):  # the elector first: it releases the Lease (if it may)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for name in registered:
                try:
                    await api.delete_webhook_configuration(name)
                except Exception as error:
                    log.warning("could not remove ValidatingWebhookConfiguration %s: %s", name, error)
            if forwarder is not None:
                await forwarder.close()
            await api.close()


def _pod_name() -> str:
    name = os.environ.get("POD_NAME")
    if not name:
        raise ValueError("pod-label routing needs $POD_NAME (the downward API: metadata.name)")
    return name


async def _hand_over(leadership: Leadership, writer: WriteBehind, elector: LeaderElector | None) -> None:
    """Stop admitting and write everything admitted; only then may the Lease be released, so that the
    next leader can admit at once (it reads every admission from the quotas' status)."""
    if leadership.is_follower():
        return
    # Released early, the Lease would tell the next leader that earlier leaders' admissions are visible.
    waited_out = leadership.now() >= leadership.gate.admit_from
    leadership.stopping()
    started = time.monotonic()
    written = await writer.flush(timeout=3.0)
    if elector is not None:
        elector.release_ok = written and waited_out
    if written:
        log.info("stopped admitting; everything admitted is written (%.3fs)", time.monotonic() - started)
    else:
        log.warning("stopping with admissions not written: the next leader waits for the Lease to expire")


async def run_until_signalled(options: WebhookOptions, endpoint: EndpointFactory | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with running_webhook(options, endpoint=endpoint) as webhook:
        metrics.time_gc_pauses()
        lag_probe = asyncio.create_task(metrics.probe_event_loop_lag())
        gc.freeze()  # what start-up made (modules, clients, certificates) stays
        webhook.controller.heap = Heap(thaw_every=options.resync_seconds)
        log.info("GpuQuota webhook serving on %s", webhook.url)
        print(f"serving on {webhook.url}", flush=True)
        try:
            await stop.wait()
        finally:
            lag_probe.cancel()
