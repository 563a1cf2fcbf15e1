"""`gpuforge operator run`: the GpuStack operator against the current kubeconfig (or in-cluster)."""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path

import click


@click.group()
def operator() -> None:
    """Run the GpuStack operator."""


@operator.command()
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="KUBECONFIG",
    help="Kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, then in-cluster).",
)
@click.option(
    "--liveness-port",
    default=8080,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Serve kopf's liveness probe at :PORT/healthz (0: off).",
)
@click.option(
    "--metrics-port",
    default=9090,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics at :PORT/metrics (0: off).",
)
@click.option(
    "--bind", default="0.0.0.0", show_default=True, help="Address for the liveness and metrics ports."
)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="Debug logs.")
def run(
    kubeconfig: Path | None, liveness_port: int, metrics_port: int, bind: str, log_format: str, verbose: bool
) -> None:
    """Reconcile GpuStacks until interrupted."""
    import kopf
    from prometheus_client import start_http_server

    from gpuforge.handlers import metrics
    from gpuforge.k8s.client import Kube

    if kubeconfig is not None:
        os.environ["KUBECONFIG"] = str(kubeconfig)  # kopf's own login reads the same file
    kopf.configure(
        verbose=verbose, log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL
    )
    logging.getLogger("gpuforge").setLevel(logging.DEBUG if verbose else logging.INFO)
    kube = Kube.from_kubeconfig(
        str(kubeconfig) if kubeconfig else None,
        on_request=metrics.count_request,
        on_answer=metrics.time_request,
    )
    if metrics_port:
        start_http_server(metrics_port, addr=bind)
    importlib.import_module("gpuforge.handlers.stack")
    try:  # the GpuQuota handlers, when that part is installed
        importlib.import_module("gpuforge.handlers.quota")
    except ModuleNotFoundError as err:
        if err.name != "gpuforge.handlers.quota":
            raise
    kopf.run(
        standalone=True,  # one replica (Recreate); no peering objects needed
        clusterwide=True,
        liveness_endpoint=f"http://{bind}:{liveness_port}/healthz" if liveness_port else None,
        memo=kopf.Memo(kube=kube),
    )
