"""`gpuforge status` (GPU stacks and upgrade states, summed up by pool, or per node with --nodes) and
`gpuforge plan` (what the upgrade engine would do next, by pool, or each step in order with --nodes,
without doing it).

Both read the cluster once through gpuforge.k8s (lists side by side in pages, pods chosen by server-side
selectors), build the planner's snapshot with `gpuforge.upgrade.convert`, and print. The row, summary and
step builders are pure, so they are unit-tested; summaries keep a table short on thousands of nodes.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import click
import orjson
import yaml
from rich import box
from rich.console import Console
from rich.table import Table

from gpuforge.constants import COMPONENT_LABEL, DRA_DRIVER_GPU, GFD_PRODUCT_LABEL, SIM_POOL_LABEL, STACK_LABEL
from gpuforge.upgrade import plan as make_plan
from gpuforge.upgrade.model import (
    FAILURE_ANNOTATION,
    Cordon,
    DeletePods,
    Desired,
    EvictPods,
    Mode,
    NodeState,
    Plan,
    SetAnnotations,
    SetLabels,
    Snapshot,
    Uncordon,
)

OUTPUTS = click.Choice(["table", "json", "yaml"])
# Options `status` and `plan` both take.
_output_option = click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True)
_kubeconfig_option = click.option(
    "--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config)."
)

_STATE_STYLE = {
    NodeState.UPGRADE_DONE: "green",
    NodeState.UPGRADE_FAILED: "bold red",
    NodeState.ROLLBACK_REQUIRED: "red",
    NodeState.ROLLBACK_VALIDATION_REQUIRED: "red",
    NodeState.ROLLED_BACK: "yellow",
    NodeState.UPGRADE_REQUIRED: "cyan",
}


# --- pure row builders -----------------------------------------------------------------------------


def _age(since: datetime | None, now: datetime) -> str:
    if since is None:
        return "-"
    seconds = max(0, int((now - since).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def status_rows(snapshot: Snapshot) -> list[dict[str, Any]]:
    """One row per node: pool, mode, version, state, since, and why it failed."""
    rows = []
    for node in snapshot.nodes:
        on = [m for m in (Mode.DEVICE_PLUGIN, Mode.DRA) if node.deploy_value(m) is not None]
        mode = "both!" if len(on) > 1 else (on[0].value if on else "none")
        versions = sorted({p.version for p in node.operands if not p.deleting})
        state = node.state
        rows.append(
            {
                "node": node.name,
                "stack": node.labels.get(STACK_LABEL, ""),
                "pool": node.labels.get(SIM_POOL_LABEL) or node.labels.get(GFD_PRODUCT_LABEL, ""),
                "mode": mode,
                "version": ",".join(versions) or "-",
                "ready": all(p.ready for p in node.operands) and bool(node.operands),
                "cordoned": node.unschedulable,
                "state": state.value if state else "-",
                "since": _age(node.state_since, snapshot.now),
                "failure": node.annotations.get(FAILURE_ANNOTATION, ""),
            }
        )
    return rows


def _counted(values: Sequence[str]) -> dict[str, int]:
    """How many times each value occurs, most frequent first (ties by value)."""
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def pool_summary(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`status_rows` summed up by pool (in pool order): how many nodes, in which mode, at which version
    and upgrade state, how many not ready, cordoned or failed; the failed nodes by name."""
    pools: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        pools.setdefault(row["pool"], []).append(row)
    return [
        {
            "pool": pool,
            "nodes": len(members),
            "modes": _counted([r["mode"] for r in members]),
            "versions": _counted([r["version"] for r in members]),
            "states": _counted([r["state"] for r in members]),
            "notReady": sum(1 for r in members if not r["ready"]),
            "cordoned": sum(1 for r in members if r["cordoned"]),
            "failed": sorted(r["node"] for r in members if r["failure"]),
        }
        for pool, members in sorted(pools.items())
    ]


def step_summary(steps: Sequence[Mapping[str, Any]], pool_of: Mapping[str, str]) -> list[dict[str, Any]]:
    """`plan_steps` summed up by pool and move (from -> to), in the order of each group's first step: how
    many nodes and the first of them."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for step in steps:
        key = (pool_of.get(step["node"], ""), step["from"], step["to"])
        groups.setdefault(key, []).append(step["node"])
    return [
        {"pool": pool, "from": origin, "to": to, "nodes": len(names), "first": names[:3]}
        for (pool, origin, to), names in groups.items()
    ]


def names_in_short(names: Sequence[str], shown: int = 5) -> str:
    """A list of node names for a line of text: the first `shown`, then how many more."""
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def plan_steps(result: Plan) -> list[dict[str, Any]]:
    """The plan as ordered, printable steps."""
    steps = []
    for transition in result.transitions:
        actions = []
        for action in transition.actions:
            if isinstance(action, Cordon):
                actions.append("cordon")
            elif isinstance(action, Uncordon):
                actions.append("uncordon")
            elif isinstance(action, SetLabels):
                actions.extend(f"label {k}={'-' if v is None else v}" for k, v in action.values.items())
            elif isinstance(action, SetAnnotations):
                actions.extend(f"annotate {k}" for k in action.values)
            elif isinstance(action, EvictPods):
                actions.append("evict " + ", ".join(map(str, action.pods)))
            elif isinstance(action, DeletePods):
                actions.append("delete " + ", ".join(map(str, action.pods)))
        steps.append(
            {
                "node": transition.node,
                "from": transition.from_state.value if transition.from_state else "-",
                "to": transition.to_state.value if transition.to_state else "(released)",
                "actions": actions,
                "why": transition.message,
            }
        )
    return steps


def plan_report(result: Plan, elsewhere: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`elsewhere`: selected nodes left to another installation (node -> why), which the plan skips."""
    return {
        "target": result.target,
        "forwardOnly": [
            {"from": f.origin, "nodes": list(f.nodes), "message": f.message} for f in result.forward_only
        ],
        "steps": plan_steps(result),
        "holds": [
            {"reason": h.reason.value, "nodes": list(h.nodes), "message": h.message} for h in result.holds
        ],
        "refusals": [
            {"reason": r.reason.value, "nodes": list(r.nodes), "message": r.message} for r in result.refusals
        ],
        "failed": list(result.failed),
        "servedElsewhere": [{"node": n, "reason": why} for n, why in sorted((elsewhere or {}).items())],
    }


def _emit(data: Any, output: str) -> None:
    if output == "json":  # orjson: the standard library indents in pure Python, 16x slower on 5,000 rows
        click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False), nl=False)


# --- reading the cluster -------------------------------------------------------------------------------


class NotInstalled(click.ClickException):
    """Nothing of gpuforge's in this cluster yet: exit code 3, like `dev cluster status` on no cluster."""

    exit_code = 3


def _read(
    kubeconfig: str | None, stack_name: str | None, status_only: bool = False
) -> tuple[Snapshot, Mapping[str, Any] | None, dict[str, str]]:
    """Snapshot of the nodes (of one GpuStack, or all GPU nodes), the GpuStack object, and the nodes
    another installation serves (node -> why), which the operator leaves alone. The lists are read side
    by side, in pages, without finished pods, in protobuf, each object decoded into the fields read here
    and in `gpuforge.upgrade.convert` only (`gpuforge.k8s.shapes_protobuf`). `status_only`: only what
    `status` shows (on 5,000 nodes, 60 MB where a plan reads 76): the pods gpuforge deploys and NVIDIA
    plugin pods (chosen by the API server; a plan needs the workloads too), and neither ResourceSlices
    nor ResourceClaims, so nothing on the nodes another installation serves (an empty mapping)."""
    from gpuforge.k8s import shapes_protobuf
    from gpuforge.k8s.client import ApiError, Kube, node_facts, plugin_nodes, slices_per_node
    from gpuforge.render.placement import served_elsewhere
    from gpuforge.upgrade.convert import snapshot_from_objects

    try:
        kube = Kube.from_kubeconfig(kubeconfig, plain=True)
        served = kube.served_versions()
        stacks = list(kube.list_objects("/apis/gpuforge.io/v1alpha1/gpustacks"))
    except ApiError as error:
        if error.status == 404:
            raise NotInstalled(
                "the GpuStack CRD is not installed in this cluster (kubectl apply -k operator/deploy)"
            ) from None
        raise click.ClickException(str(error)) from None
    stack = next((s for s in stacks if s.get("metadata", {}).get("name") == stack_name), None)
    if stack_name and stack is None:
        raise click.ClickException(f"GpuStack {stack_name} not found")
    if stack is None and len(stacks) == 1:
        stack = stacks[0]
    with _collector_paused():
        read = kube.list_side_by_side(collections_read(served, status_only), shapes_protobuf.OF_COLLECTIONS)
    nodes, pods = read["nodes"], read["pods"]
    slices, claims = read.get("slices", []), read.get("claims", [])
    name = (stack or {}).get("metadata", {}).get("name")
    selects = _selector(stack)
    names = [
        n["metadata"]["name"]
        for n in nodes
        if name is None
        or (n.get("metadata", {}).get("labels") or {}).get(STACK_LABEL) == name
        or selects(n.get("metadata", {}).get("labels") or {})
    ]
    now = datetime.now().astimezone()
    elsewhere: dict[str, str] = {}
    if not status_only:
        with_plugin = plugin_nodes(pods)
        per_node = slices_per_node(s for s in slices if (s.get("spec") or {}).get("driver") == DRA_DRIVER_GPU)
        elsewhere = {
            n["metadata"]["name"]: why
            for n in nodes
            if (why := served_elsewhere(node_facts(n, per_node, with_plugin), now))
        }
    snapshot = snapshot_from_objects(
        nodes, pods, slices, now=now, claims=claims, served_resource_versions=served, names=names
    )
    if name is None:
        gpu = [n for n in snapshot.nodes if n.operands or n.state is not None or STACK_LABEL in n.labels]
        snapshot = Snapshot(tuple(gpu), snapshot.now, snapshot.served_resource_versions)
    return snapshot, stack, elsewhere


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the lists are decoded, and what they hold left out of
    its scans afterwards (`gc.freeze`). Decoding builds a tree of dicts per object, without cycles, that
    lives as long as the command; the collector would scan the growing heap again and again, and once
    more at the first allocations after it: two thirds of the decoding time on 1,000 nodes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def collections_read(
    served: frozenset[str], status_only: bool
) -> dict[str, tuple[str, Mapping[str, str] | None]]:
    """The lists `_read` reads, by name: (path, server-side selectors). `served`: the resource.k8s.io
    versions the API server serves (ResourceSlices and ResourceClaims are read in the newest)."""
    collections: dict[str, tuple[str, Mapping[str, str] | None]] = {
        "nodes": ("/api/v1/nodes", None),
        "pods": ("/api/v1/pods", pod_query(operand_pods_only=status_only)),
    }
    version = next((v for v in ("v1", "v1beta2", "v1beta1") if v in served), None)
    if version is not None and not status_only:
        collections["slices"] = (f"/apis/resource.k8s.io/{version}/resourceslices", None)
        collections["claims"] = (f"/apis/resource.k8s.io/{version}/resourceclaims", None)
    return collections


def pod_query(operand_pods_only: bool) -> dict[str, str]:
    """The server-side selectors of the pods `_read` lists: never finished pods (they hold no device)."""
    query = {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}
    if operand_pods_only:
        query["labelSelector"] = COMPONENT_LABEL
    return query


def _selector(stack: Mapping[str, Any] | None) -> Callable[[Mapping[str, str]], bool]:
    """Whether the stack's spec.nodeSelector picks a node (by its labels)."""
    if stack is None:
        return lambda labels: False
    from gpuforge.api.convert import ModelError, from_dict
    from gpuforge.api.gpustack import GpuStackSpec
    from gpuforge.render.placement import selects

    try:
        spec = from_dict(GpuStackSpec, stack.get("spec"), "spec")
    except ModelError as error:
        raise click.ClickException(str(error)) from None
    return lambda labels: selects(spec.node_selector, labels)


def desired_from_stack(stack: Mapping[str, Any], selected: Sequence[str]) -> Desired:
    spec = stack.get("spec") or {}
    try:
        mode = Mode(spec.get("mode", Mode.DEVICE_PLUGIN.value))
    except ValueError:
        raise click.ClickException(f"spec.mode: unknown mode {spec.get('mode')!r}") from None
    from gpuforge.api.gpustack import DEFAULT_DEVICE_PLUGIN_VERSION, DEFAULT_DRA_DRIVER_VERSION

    versions = {
        Mode.DEVICE_PLUGIN: (spec.get("devicePlugin") or {}).get("version", DEFAULT_DEVICE_PLUGIN_VERSION),
        Mode.DRA: (spec.get("dra") or {}).get("version", DEFAULT_DRA_DRIVER_VERSION),
    }
    return Desired(mode, versions, frozenset(selected), stack=stack.get("metadata", {}).get("name", ""))


# --- commands ------------------------------------------------------------------------------------------


_nodes_option = click.option(
    "--nodes", "per_node", is_flag=True, help="One row per node instead of a summary per pool."
)


@click.command()
@click.option("--stack", "stack_name", help="Only the nodes of this GpuStack.")
@_nodes_option
@_output_option
@_kubeconfig_option
def status(stack_name: str | None, per_node: bool, output: str, kubeconfig: str | None) -> None:
    """GPU nodes by pool: mode, version, upgrade state; --nodes for one row per node."""
    snapshot, _, _ = _read(kubeconfig, stack_name, status_only=True)
    rows = status_rows(snapshot)
    if output != "table":
        _emit(rows if per_node else {"pools": pool_summary(rows), "nodes": rows}, output)
        return
    if not per_node:
        _print_pool_summary(rows)
        return
    table = Table(title=f"GPU nodes ({len(rows)})", header_style="bold")
    for column in ("node", "pool", "mode", "version", "state", "since", "failure"):
        table.add_column(column, overflow="fold")
    for row in rows:
        style = _STATE_STYLE.get(NodeState(row["state"])) if row["state"] != "-" else None
        version = row["version"] + ("" if row["ready"] else " (not ready)")
        node = row["node"] + (" ⛔" if row["cordoned"] else "")
        table.add_row(
            node,
            row["pool"],
            row["mode"],
            version,
            f"[{style}]{row['state']}[/]" if style else row["state"],
            row["since"],
            row["failure"],
        )
    Console().print(table)


def _print_pool_summary(rows: Sequence[Mapping[str, Any]]) -> None:
    def shown(counts: Mapping[str, int]) -> str:
        # A pool that is all one value shows just it; a mixed one, a line per value with its count.
        if len(counts) == 1:
            return next(iter(counts))
        return "\n".join(f"{value} {count}" for value, count in counts.items())

    # Fits 80 columns: a simple rule under the header, the node count beside the pool's name, and the
    # counts' headers on two lines; only the failed nodes' names fold.
    table = Table(
        title=f"GPU nodes ({len(rows)}) by pool; --nodes for each node",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for column in ("pool (nodes)", "mode", "version", "state"):
        table.add_column(column, no_wrap=True)
    for column in ("not\nready", "cor-\ndoned"):
        table.add_column(column, justify="right", min_width=5)
    table.add_column("failed", overflow="fold")
    for pool in pool_summary(rows):
        table.add_row(
            f"{pool['pool'] or '-'} ({pool['nodes']})",
            shown(pool["modes"]),
            shown(pool["versions"]),
            shown(pool["states"]),
            str(pool["notReady"]),
            str(pool["cordoned"]),
            names_in_short(pool["failed"]) or "0",
        )
    Console().print(table)


@click.command()
@click.option("--stack", "stack_name", help="The GpuStack to plan for (default: the only one).")
@click.option(
    "--nodes", "per_node", is_flag=True, help="Each step and every node named, not a summary by pool."
)
@_output_option
@_kubeconfig_option
def plan(stack_name: str | None, per_node: bool, output: str, kubeconfig: str | None) -> None:
    """What the upgrade engine would do next, by pool; --nodes for each step in order."""
    from gpuforge.upgrade.convert import PolicyError, policy_from_spec

    snapshot, stack, elsewhere = _read(kubeconfig, stack_name)
    if stack is None:
        raise click.ClickException("no GpuStack to plan for (name one with --stack)")
    try:
        policy = policy_from_spec((stack.get("spec") or {}).get("upgradePolicy"))
    except PolicyError as error:
        raise click.ClickException(str(error)) from None
    from gpuforge import compat
    from gpuforge.k8s.upgrade import dra_support

    selects = _selector(stack)
    picked = [n.name for n in snapshot.nodes if selects(n.labels)]
    # As the operator does: a node another installation serves is not the stack's to move.
    selected = [name for name in picked if name not in elsewhere]
    left = {name: elsewhere[name] for name in picked if name in elsewhere}
    desired = dataclasses.replace(desired_from_stack(stack, selected), dra_support=dra_support(compat.load()))
    result = make_plan(snapshot, desired, policy)
    report = plan_report(result, left)
    if output != "table":
        _emit(report, output)
        return
    names: Callable[[Sequence[str]], str] = (lambda n: ", ".join(n)) if per_node else names_in_short
    console = Console()
    console.print(f"[bold]Target[/] {report['target']}")
    for warning in report["forwardOnly"]:  # before the steps: it must be read before the move starts
        console.print(
            f"[bold yellow]forward-only[/] {warning['message']} (nodes {names(warning['nodes'])})",
            highlight=False,
        )
    if not report["steps"]:
        console.print("nothing to do now")
    elif per_node:
        for index, step in enumerate(report["steps"], 1):
            console.print(f"{index:>3}. [bold]{step['node']}[/] {step['from']} → {step['to']}: {step['why']}")
            for action in step["actions"]:
                console.print(f"       • {action}", highlight=False)
    else:
        pool_of = {
            n.name: n.labels.get(SIM_POOL_LABEL) or n.labels.get(GFD_PRODUCT_LABEL, "")
            for n in snapshot.nodes
        }
        table = Table(
            title=f"Next steps ({len(report['steps'])}) by pool; --nodes for each", header_style="bold"
        )
        for column in ("pool", "move", "nodes", "first"):
            table.add_column(column, overflow="fold")
        for group in step_summary(report["steps"], pool_of):
            table.add_row(
                group["pool"] or "-",
                f"{group['from']} → {group['to']}",
                str(group["nodes"]),
                ", ".join(group["first"]),
            )
        console.print(table)
    for hold in report["holds"]:
        console.print(f"[yellow]waiting[/] {hold['reason']}: {hold['message']} ({names(hold['nodes'])})")
    for refusal in report["refusals"]:
        console.print(f"[red]refused[/] {refusal['reason']}: {refusal['message']}")
    for node in report["servedElsewhere"]:
        console.print(
            f"[dim]left to another installation[/] {node['node']}: {node['reason']}", highlight=False
        )
