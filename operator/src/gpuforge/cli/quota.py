"""`gpuforge quota`: look at GpuQuota trees."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from gpuforge.api.gpuquota import GpuQuota, is_cash_key
from gpuforge.quota.convert import QuotaSpecError, quota_from_object, quota_to_object
from gpuforge.quota.quantity import format_quantity

BAR_WIDTH = 20


@click.group()
def quota() -> None:
    """Inspect GpuQuota trees."""


def _bar(used: Decimal, hard: Decimal, width: int = BAR_WIDTH) -> Text:
    fraction = float(used / hard) if hard else (1.0 if used else 0.0)
    filled = min(width, round(fraction * width))
    style = "red" if fraction >= 1 else "yellow" if fraction >= 0.8 else "green"
    bar = Text("█" * filled, style=style)
    bar.append("░" * (width - filled), style="dim")
    return bar


class _UsageBar:
    """A usage bar of up to BAR_WIDTH cells that shrinks to 4 when the terminal is narrow."""

    def __init__(self, used: Decimal, hard: Decimal) -> None:
        self.used = used
        self.hard = hard

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(4, BAR_WIDTH)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield _bar(self.used, self.hard, max(1, min(BAR_WIDTH, options.max_width)))


def _load(kubeconfig: Path | None) -> list[GpuQuota]:
    from gpuforge.k8s.quota import ApiError, QuotaApi

    async def fetch() -> list[dict[str, Any]]:
        async with QuotaApi.from_kubeconfig(kubeconfig) as api:
            return await api.list_quotas()

    try:
        raw_quotas = asyncio.run(fetch())
    except ApiError as error:
        raise click.ClickException(f"cannot list GpuQuotas: {error}") from None
    quotas = []
    for raw in raw_quotas:
        try:
            quotas.append(quota_from_object(raw))
        except QuotaSpecError as error:
            click.echo(f"skipping GpuQuota {raw.get('metadata', {}).get('name')}: {error}", err=True)
    return quotas


def _key_rows(item: GpuQuota) -> list[tuple[str, Decimal, Decimal, Decimal]]:
    return [
        (key, item.status.used.get(key, Decimal(0)), item.status.self_used.get(key, Decimal(0)), hard)
        for key, hard in sorted(item.hard.items())
    ]


def _add_key_column(table: Table, header: str, rows: list[tuple[str, Decimal, Decimal, Decimal]]) -> None:
    """A key column as wide as its longest key: keys often differ only at the end
    (`requests.nvidia.com/gpu.A100` and `...gpu.H100`), so the usage bar and figures give way instead."""
    width = max((len(key) for key, *_ in rows), default=len(header))
    table.add_column(header, min_width=max(width, len(header)), no_wrap=True, overflow="fold")


def render_tree(quotas: list[GpuQuota]) -> Tree:
    by_parent: dict[str, list[GpuQuota]] = {}
    names = {item.name for item in quotas}
    for item in quotas:
        parent = item.parent if item.parent in names else ""
        by_parent.setdefault(parent, []).append(item)
    root = Tree("[bold]GpuQuotas[/bold]")

    def add(node: Tree, item: GpuQuota) -> None:
        rows = _key_rows(item)
        table = Table.grid(padding=(0, 1))
        _add_key_column(table, "", rows)
        table.add_column()  # the usage bar: the column that gives way
        table.add_column(no_wrap=True)
        table.add_column(no_wrap=True)
        for key, used, self_used, hard in rows:
            unit = " h" if is_cash_key(key) else ""
            table.add_row(
                Text(key, style="cyan"),
                _UsageBar(used, hard),
                f"{format_quantity(used)}/{format_quantity(hard)}{unit}",
                Text(f"own {format_quantity(self_used)}", style="dim"),
            )
        spent = [c for c in item.status.conditions if c.status == "True" and c.type != "Reconciled"]
        label = Text(item.name, style="bold")
        for condition in spent:
            label.append(f"  {condition.type}", style="red")
        child = node.add(label)
        child.add(table)
        for sub in sorted(by_parent.get(item.name, []), key=lambda q: q.name):
            add(child, sub)

    for top in sorted(by_parent.get("", []), key=lambda q: q.name):
        add(root, top)
    return root


def render_table(quotas: list[GpuQuota]) -> Table:
    rows = {item.name: _key_rows(item) for item in quotas}
    table = Table(title="GpuQuotas")
    table.add_column("Quota", overflow="fold")
    table.add_column("Parent", overflow="fold")
    _add_key_column(table, "Key", [row for item_rows in rows.values() for row in item_rows])
    table.add_column("Usage")  # the usage bar: gives way first
    for column in ("Used", "Own", "Hard"):
        table.add_column(column, no_wrap=True)
    for item in sorted(quotas, key=lambda q: (q.parent, q.name)):
        for key, used, self_used, hard in rows[item.name]:
            table.add_row(
                item.name,
                item.parent or "-",
                key,
                _UsageBar(used, hard),
                format_quantity(used),
                format_quantity(self_used),
                format_quantity(hard),
            )
    return table


@quota.command()
@click.option("--kubeconfig", type=click.Path(exists=True, path_type=Path), envvar="KUBECONFIG")
@click.option(
    "--output", "-o", type=click.Choice(["tree", "table", "json", "yaml"]), default="tree", show_default=True
)
def tree(kubeconfig: Path | None, output: str) -> None:
    """The quota hierarchy with a usage bar per key."""
    quotas = _load(kubeconfig)
    if output in ("json", "yaml"):
        documents = [quota_to_object(item) for item in sorted(quotas, key=lambda q: q.name)]
        click.echo(
            json.dumps(documents, indent=2)
            if output == "json"
            else yaml.safe_dump(documents, sort_keys=False)
        )
        return
    console = Console()
    if not quotas:
        console.print("no GpuQuotas")
        return
    console.print(render_tree(quotas) if output == "tree" else render_table(quotas))
