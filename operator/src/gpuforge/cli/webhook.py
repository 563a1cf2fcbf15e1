"""`gpuforge webhook`: run the GpuQuota admission webhook (its leader election and usage controller)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import click


@click.group()
def webhook() -> None:
    """Run the GpuQuota admission webhook."""


@webhook.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.option("--port", default=8443, show_default=True, type=int, help="HTTPS port (0 picks a free one).")
@click.option(
    "--cert", "cert_file", type=click.Path(exists=True, path_type=Path), help="Serving certificate (PEM)."
)
@click.option(
    "--key", "key_file", type=click.Path(exists=True, path_type=Path), help="Its private key (PEM)."
)
@click.option(
    "--ca",
    "ca_file",
    type=click.Path(exists=True, path_type=Path),
    help="CA bundle of the serving certificates: registered as caBundle, and trusted to reach the leader.",
)
@click.option("--kubeconfig", type=click.Path(exists=True, path_type=Path), envvar="KUBECONFIG")
@click.option(
    "--register/--no-register",
    default=False,
    help="Register ValidatingWebhookConfigurations pointing at this process (removed on exit).",
)
@click.option("--name", default="gpuforge-quota", show_default=True, help="Prefix of the configurations.")
@click.option("--failure-policy", type=click.Choice(["Fail", "Ignore"]), default="Fail", show_default=True)
@click.option(
    "--timeout",
    "timeout_seconds",
    default=5,
    show_default=True,
    type=click.IntRange(1, 30),
    help="timeoutSeconds of the webhook configurations calling this webhook (registered with it or not).",
)
@click.option("--resync", "resync_seconds", default=300.0, show_default=True, help="Full resync period (s).")
@click.option(
    "--status-writes-per-second",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.0),
    help="GpuQuota status writes a second, all quotas together (0: no limit); each write carries every "
    "admission to its quota since the last one.",
)
@click.option(
    "--accrual", "accrual_seconds", default=60.0, show_default=True, help="Budget accrual period (s)."
)
@click.option(
    "--speedup",
    default=1.0,
    show_default=True,
    help="Budget clock multiplier (3600: a second counts as an hour).",
)
@click.option(
    "--leader-elect/--no-leader-elect",
    "leader_elect",
    default=None,
    help="Replicas elect one leader through a Lease; it admits, the others forward to it "
    "(--no-leader-elect: this process is the only replica). Default: elect, unless --register.",
)
@click.option(
    "--lease-namespace",
    help="Namespace of the leader's Lease (default: the pod's namespace; outside a cluster `default`).",
)
@click.option("--lease-name", help="Name of the Lease (default: <name>-controller).")
@click.option(
    "--lease-duration",
    "lease_seconds",
    default=15.0,
    show_default=True,
    type=click.FloatRange(3.0, 300.0),
    help="Seconds a crashed leader's Lease blocks the others; renewed every third of it.",
)
@click.option(
    "--persist-seconds",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0.0, 60.0),
    help="How long the API server may take to store an admitted object; a new leader waits it out "
    "(with --timeout) before admitting, after a leader that stopped without handing over.",
)
@click.option(
    "--advertise-host",
    help="Address followers forward to (default: $POD_IP, else --host).",
)
@click.option(
    "--route",
    type=click.Choice(["none", "pod-label"]),
    default="none",
    show_default=True,
    help="Send the API server's calls to the leader only (with election): pod-label (in a cluster: each "
    "replica labels its pod gpuforge.io/quota-webhook-endpoint, which the Service selects; needs $POD_NAME). "
    "Followers still forward whatever reaches them.",
)
@click.option("--crd", "crd_file", type=click.Path(exists=True, path_type=Path), help="Apply this CRD first.")
@click.option("-v", "--verbose", is_flag=True)
def run(verbose: bool, **kwargs: object) -> None:
    """Serve the webhook over HTTPS; with --register, on loopback with a self-generated CA."""
    from gpuforge.webhook.run import WebhookOptions, run_until_signalled

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    options = WebhookOptions(**kwargs)  # type: ignore[arg-type]
    if bool(options.cert_file) != bool(options.key_file):
        raise click.UsageError("--cert and --key go together")
    asyncio.run(run_until_signalled(options))
