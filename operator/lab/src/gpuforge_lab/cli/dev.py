"""`gpuforge dev`: the local control plane with simulated GPU nodes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import yaml
from rich.console import Console
from rich.table import Table

from gpuforge_lab.devcluster.build import (
    BuildError,
    build,
    build_nodes,
    cached_binaries,
    load_versions,
    verify_hashes,
)
from gpuforge_lab.devcluster.cluster import (
    MAX_NICE,
    AlreadyRunning,
    ClusterError,
    DevCluster,
    NotRunning,
    list_clusters,
)
from gpuforge_lab.devcluster.helm import ensure_helm
from gpuforge_lab.devcluster.pools import BOOTSTRAP_PLAYBOOKS, Pool, PoolError, load_pools, uniform_pools
from gpuforge_lab.devcluster.profiles import DEFAULT_PROFILE, SUPPORTED_MINORS, ProfileError, parse_profile
from gpuforge_lab.devcluster.realnodes import (
    RealNodeError,
    can_boot_hosts,
    node_image,
    program_images,
    running_hosts,
)

EXIT_FAILURE = 1
EXIT_NOT_RUNNING = 3
_PROFILE_HELP = (
    "resource.k8s.io versions to serve, like the release named: "
    + ", ".join(f"1.{m}" for m in SUPPORTED_MINORS)
    + "; add +betas to 1.34+ to serve v1beta1/v1beta2 too"
)

err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)


def _fail(message: str, code: int = EXIT_FAILURE) -> None:
    err.print(f"[red]error:[/] {message}")
    sys.exit(code)


def _check_profile(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        parse_profile(value)
    except ProfileError as error:
        raise click.BadParameter(str(error)) from None
    return value


@click.group(short_help="Local control plane with simulated GPU nodes.")
def dev() -> None:
    """Local control plane: real kube-apiserver, etcd, controller-manager, scheduler; kwok for GPU nodes."""


@dev.command("build")
@click.option("--force", is_flag=True, help="Rebuild even if the cache is complete.")
@click.option("--verify", is_flag=True, help="Also check every cached binary against its recorded hash.")
@click.option(
    "--real-nodes",
    is_flag=True,
    help="Also the real nodes' kubelet, programs, images and host image (where podman can boot hosts).",
)
def build_command(force: bool, verify: bool, real_nodes: bool) -> None:
    """Build (or find in the cache) the pinned control-plane binaries."""
    try:
        binaries = build(err, force=force)
    except BuildError as error:
        _fail(str(error))
        return
    if verify:
        broken = verify_hashes(binaries)
        if broken:
            err.print(f"[yellow]corrupt in cache: {', '.join(broken)}; rebuilding[/]")
            binaries = build(err, force=True)
    versions = load_versions()
    err.print(
        f"Control plane ready: Kubernetes {versions.kubernetes}, etcd {versions.etcd}, kwok {versions.kwok} "
        f"in {binaries.directory}"
    )
    if real_nodes:
        _build_real_nodes(force)


def _build_real_nodes(force: bool) -> None:
    reason = can_boot_hosts()
    if reason is not None:
        err.print(f"[yellow]No real-node build: {reason}[/]")
        return
    try:
        node_binaries = build_nodes(err, force=force)
        with err.status("Building the real nodes' host image and program images"):
            image = node_image()
            program_images(node_binaries)
    except (BuildError, RealNodeError) as error:
        _fail(str(error))
        return
    err.print(f"Real nodes ready: {node_binaries.directory}, host image {image}")


@dev.command("helm")
def helm_command() -> None:
    """Build (or find in the cache) the pinned helm; print its path."""
    try:
        helm = ensure_helm(err)
    except BuildError as error:
        _fail(str(error))
        return
    out.print(str(helm), highlight=False)


@dev.group()
def cluster() -> None:
    """Start, inspect, upgrade and stop local clusters."""


_name_option = click.option("--name", default="default", show_default=True, help="Cluster name.")


@cluster.command()
@_name_option
@click.option(
    "--api-profile", default=DEFAULT_PROFILE, show_default=True, callback=_check_profile, help=_PROFILE_HELP
)
@click.option(
    "--nodes", type=click.IntRange(min=0), help="A uniform pool of N simulated GPU nodes (default 4)."
)
@click.option(
    "--pools",
    "pools_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML file with GPU node pools (see examples/pools.yaml).",
)
@click.option(
    "--real-nodes",
    type=click.IntRange(min=0),
    default=0,
    help="Also boot N real kubelet nodes (lab hosts under rootful podman) with pretend GPUs.",
)
@click.option(
    "--real-nodes-bootstrap",
    type=click.Choice(BOOTSTRAP_PLAYBOOKS),
    help="Run this playbook of the collection on the --real-nodes hosts before they join "
    "(driver, toolkit and containerd's nvidia runtime from the roles).",
)
@click.option(
    "--fleet-nice",
    type=click.IntRange(0, MAX_NICE),
    default=0,
    show_default=True,
    help="Lower the simulated fleet's CPU priority (kwok and the GPU agent): under contention it yields "
    "the CPU to the control plane, as kubelets on their own machines would. Node patches answer faster "
    "at thousands of nodes; the simulated nodes' own steps take longer.",
)
def up(
    name: str,
    api_profile: str,
    nodes: int | None,
    pools_file: Path | None,
    real_nodes: int,
    real_nodes_bootstrap: str | None,
    fleet_nice: int,
) -> None:
    """Start a cluster and print its kubeconfig path when every part is healthy."""
    if nodes is not None and pools_file is not None:
        raise click.UsageError("--nodes and --pools exclude each other")
    if real_nodes_bootstrap and not real_nodes:
        raise click.UsageError("--real-nodes-bootstrap needs --real-nodes N")
    try:
        pools = load_pools(pools_file) if pools_file else uniform_pools(4 if nodes is None else nodes)
    except PoolError as error:
        _fail(str(error))
        return
    if real_nodes:
        if any(pool.name == "real" for pool in pools):
            raise click.UsageError("--real-nodes adds a pool named 'real'; the pools file has one already")
        pools = [*pools, Pool("real", real_nodes, real=True, bootstrap=real_nodes_bootstrap)]
    dev_cluster = DevCluster(name)
    try:
        seconds = dev_cluster.up(api_profile, pools, console=err, fleet_nice=fleet_nice)
    except AlreadyRunning as error:
        _fail(str(error), EXIT_FAILURE)
        return
    except (ClusterError, BuildError, RealNodeError) as error:
        _fail(str(error))
        return
    count = sum(p.count for p in pools if not p.real)
    real = sum(p.count for p in pools if p.real)
    err.print(
        f"[green]Cluster {name!r} up in {seconds:.1f}s[/]: API profile {api_profile}, "
        f"{count} simulated GPU nodes, {real} real nodes.\n"
        f"  export KUBECONFIG={dev_cluster.kubeconfig}"
    )
    out.print(str(dev_cluster.kubeconfig), highlight=False)


@cluster.command()
@_name_option
@click.option("--all", "all_clusters", is_flag=True, help="Stop every local cluster.")
def down(name: str, all_clusters: bool) -> None:
    """Stop exactly the processes `up` started."""
    targets = list_clusters() if all_clusters else [DevCluster(name)]
    for target in targets:
        stopped = target.down()
        if stopped:
            err.print(f"Cluster {target.name!r}: stopped {', '.join(stopped)}")
        elif not all_clusters:
            err.print(f"Cluster {target.name!r} is not running")


@cluster.command()
@_name_option
@click.option(
    "--output", "-o", type=click.Choice(["table", "json", "yaml"]), default="table", show_default=True
)
def status(name: str, output: str) -> None:
    """Health of every component of the cluster."""
    dev_cluster = DevCluster(name)
    state = dev_cluster.load_state()
    if state is None:
        _fail(f"cluster {name!r} does not exist", EXIT_NOT_RUNNING)
        return
    components = dev_cluster.status()
    hosts = set(running_hosts(name)) if state.real_nodes else set()
    profile = parse_profile(state.profile)
    document = {
        "name": name,
        "profile": state.profile,
        "servedResourceVersions": list(profile.served_versions),
        "kubeconfig": str(dev_cluster.kubeconfig),
        "components": [c.__dict__ for c in components],
        "realNodes": [
            {"name": node, "container": record["container"], "running": record["container"] in hosts}
            for node, record in sorted(state.real_nodes.items())
        ],
        "lockedFeatureGateDifferences": list(profile.locked_differences),
    }
    if output == "json":
        out.print_json(json.dumps(document))
    elif output == "yaml":
        out.print(yaml.safe_dump(document, sort_keys=False), end="", highlight=False)
    else:
        table = Table(title=f"cluster {name} (API profile {state.profile})")
        for column in ("component", "pid", "running", "healthy", "detail"):
            table.add_column(column)
        for c in components:
            table.add_row(
                c.name,
                str(c.pid or "-"),
                "yes" if c.running else "[red]no[/]",
                "yes" if c.healthy else "[red]no[/]",
                c.detail[:60],
            )
        out.print(table)
        if state.real_nodes:
            nodes_table = Table(title="real nodes (all others are kwok)")
            for column in ("node", "host container", "running"):
                nodes_table.add_column(column)
            for node, record in sorted(state.real_nodes.items()):
                container = record["container"]
                nodes_table.add_row(node, container, "yes" if container in hosts else "[red]no[/]")
            out.print(nodes_table)
        out.print(
            f"resource.k8s.io served: {', '.join(profile.served_versions)}; "
            f"kubeconfig {dev_cluster.kubeconfig}"
        )
    if not components or not all(c.running and c.healthy for c in components):
        sys.exit(EXIT_NOT_RUNNING if not any(c.running for c in components) else EXIT_FAILURE)


@cluster.command()
@_name_option
def kubeconfig(name: str) -> None:
    """Print the admin kubeconfig path of a cluster."""
    dev_cluster = DevCluster(name)
    if dev_cluster.load_state() is None:
        _fail(f"cluster {name!r} does not exist", EXIT_NOT_RUNNING)
    out.print(str(dev_cluster.kubeconfig), highlight=False)


@cluster.command()
@_name_option
@click.option("--api-profile", required=True, callback=_check_profile, help=_PROFILE_HELP)
def upgrade(name: str, api_profile: str) -> None:
    """Restart the control plane with another API profile on the same etcd data."""
    dev_cluster = DevCluster(name)
    try:
        seconds = dev_cluster.upgrade(api_profile, console=err)
    except NotRunning as error:
        _fail(str(error), EXIT_NOT_RUNNING)
        return
    except ClusterError as error:
        _fail(str(error))
        return
    profile = parse_profile(api_profile)
    err.print(
        f"[green]Cluster {name!r} now serves resource.k8s.io {', '.join(profile.served_versions)}[/] "
        f"(restart took {seconds:.1f}s; objects kept)"
    )


@cluster.command("add-nodes")
@_name_option
@click.option(
    "--pools", "pools_file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
def add_nodes(name: str, pools_file: Path) -> None:
    """Register more simulated GPU nodes from a pools file."""
    try:
        names = DevCluster(name).add_pools(load_pools(pools_file), console=err)
    except (PoolError, ClusterError) as error:
        _fail(str(error))
        return
    err.print(f"{len(names)} nodes Ready")


@cluster.command()
@_name_option
@click.argument("node")
@click.option("--not-ready", "action", flag_value="not-ready", help="Make the node report NotReady.")
@click.option("--ready", "action", flag_value="ready", help="Make the node Ready again.")
@click.option("--delete", "action", flag_value="delete", help="Remove the node (it is gone).")
def node(name: str, node: str, action: str | None) -> None:
    """Inject a node failure: NotReady, Ready again, or gone."""
    if action is None:
        raise click.UsageError("choose one of --not-ready, --ready, --delete")
    dev_cluster = DevCluster(name)
    if action == "delete":
        dev_cluster.delete_node(node)
    else:
        dev_cluster.set_node_health(node, ready=action == "ready")
    err.print(f"node {node}: {action}")


@dev.command("binaries")
def binaries_command() -> None:
    """Print the directory of the cached binaries (exit 3 if not built)."""
    binaries = cached_binaries()
    if binaries is None:
        _fail("not built yet: run `gpuforge dev build`", EXIT_NOT_RUNNING)
        return
    out.print(str(binaries.directory), highlight=False)
