"""`gpuforge webhook run`: wire the HTTPS server, the usage controller and (optionally) registration.

With `--register` the webhook serves on loopback with a CA it generates, registers its own
ValidatingWebhookConfigurations (a `url` client config and that CA as caBundle) and removes them when it
stops, so a local control plane whose pods do not really run can call a webhook on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from gpuforge.api.gpuquota import KIND as QUOTA_KIND
from gpuforge.k8s.quota import Informer, QuotaApi
from gpuforge.webhook.admission import AdmissionHandlers, Clock, utc_now
from gpuforge.webhook.certs import generate_ca, issue_serving_cert
from gpuforge.webhook.controller import UsageController
from gpuforge.webhook.leader import LeaderElector, default_namespace
from gpuforge.webhook.manifests import ClientTarget, FailurePolicy, render_webhook_configurations
from gpuforge.webhook.server import CertReloader, make_app, serving

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WebhookOptions:
    host: str = "127.0.0.1"
    port: int = 8443
    cert_file: Path | None = None
    key_file: Path | None = None
    ca_file: Path | None = None  # the CA to put in caBundle when registering with given certificates
    kubeconfig: Path | None = None
    register: bool = False
    name: str = "gpuforge-quota"
    failure_policy: FailurePolicy = "Fail"
    timeout_seconds: int = 5
    controller: bool = True
    resync_seconds: float = 300.0
    accrual_seconds: float = 60.0
    speedup: float = 1.0
    cert_check_seconds: float = 5.0
    crd_file: Path | None = None
    reuse_port: bool = False  # several replicas on one host share the port (benchmark)
    # Only the holder of this Lease runs the usage controller's writes (replicas elect one).
    leader_elect: bool = True
    lease_namespace: str | None = None  # default: the pod's namespace, `default` outside a cluster
    lease_name: str | None = None  # default: <name>-controller
    lease_seconds: float = 15.0


@dataclass
class RunningWebhook:
    port: int
    url: str
    ca_bundle: bytes
    api: QuotaApi
    controller: UsageController | None


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


@contextlib.asynccontextmanager
async def running_webhook(options: WebhookOptions, clock: Clock = utc_now) -> AsyncIterator[RunningWebhook]:
    """Serve, reconcile and (optionally) register until the block exits; then unregister."""
    api = QuotaApi.from_kubeconfig(options.kubeconfig)
    with tempfile.TemporaryDirectory(prefix="gpuforge-webhook-") as scratch:
        if options.cert_file and options.key_file:
            cert, key = options.cert_file, options.key_file
            ca_bundle = options.ca_file.read_bytes() if options.ca_file else cert.read_bytes()
        else:
            cert, key, ca_bundle = _self_signed(Path(scratch), options.host, clock)
        reloader = CertReloader(cert, key, options.cert_check_seconds)
        quota_cache = Informer(api, QUOTA_KIND)  # admissions decide from it, writes keep it fresh
        handlers = AdmissionHandlers(api, clock, quota_cache=quota_cache)
        elector = (
            LeaderElector(
                api,
                options.lease_namespace or default_namespace(),
                options.lease_name or f"{options.name}-controller",
                clock=clock,
                duration=timedelta(seconds=options.lease_seconds),
                renew_seconds=options.lease_seconds / 3,
                retry_seconds=min(2.0, options.lease_seconds / 5),
                renew_deadline=timedelta(seconds=options.lease_seconds * 2 / 3),
            )
            if options.controller and options.leader_elect
            else None
        )
        controller = (
            UsageController(
                api,
                clock,
                resync_seconds=options.resync_seconds,
                accrual_seconds=options.accrual_seconds,
                speedup=options.speedup,
                writer=handlers.writer,
                leader=elector,
            )
            if options.controller
            else None
        )
        registered: list[str] = []
        controller_task: asyncio.Task[None] | None = None
        elector_task: asyncio.Task[None] | None = None
        cache_task: asyncio.Task[None] | None = None
        try:
            if options.crd_file is not None:
                await apply_crd(api, options.crd_file)
            cache_task = asyncio.create_task(quota_cache.run())
            async with serving(
                make_app(handlers), options.host, options.port, reloader, options.reuse_port
            ) as port:
                url = f"https://{options.host}:{port}"
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
                if elector is not None:
                    elector_task = asyncio.create_task(elector.run())
                if controller is not None:
                    controller_task = asyncio.create_task(controller.run(run_quota_informer=False))
                yield RunningWebhook(port, url, ca_bundle, api, controller)
        finally:
            # The controller stops before the Lease is released (the elector's last act), so no write
            # of this replica overlaps the next leader's.
            for task in (controller_task, elector_task, cache_task):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            for name in registered:
                try:
                    await api.delete_webhook_configuration(name)
                except Exception as error:
                    log.warning("could not remove ValidatingWebhookConfiguration %s: %s", name, error)
            await api.close()


async def run_until_signalled(options: WebhookOptions) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with running_webhook(options) as webhook:
        log.info("GpuQuota webhook serving on %s", webhook.url)
        print(f"serving on {webhook.url}", flush=True)
        await stop.wait()
