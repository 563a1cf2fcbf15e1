"""`gpuforge quota`: look at GpuQuota trees."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
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


def _bar(used: Decimal, hard: Decimal) -> Text:
    fraction = float(used / hard) if hard else (1.0 if used else 0.0)
    filled = min(BAR_WIDTH, round(fraction * BAR_WIDTH))
    style = "red" if fraction >= 1 else "yellow" if fraction >= 0.8 else "green"
    bar = Text("█" * filled, style=style)
    bar.append("░" * (BAR_WIDTH - filled), style="dim")
    return bar


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


def render_tree(quotas: list[GpuQuota]) -> Tree:
    by_parent: dict[str, list[GpuQuota]] = {}
    names = {item.name for item in quotas}
    for item in quotas:
        parent = item.parent if item.parent in names else ""
        by_parent.setdefault(parent, []).append(item)
    root = Tree("[bold]GpuQuotas[/bold]")

    def add(node: Tree, item: GpuQuota) -> None:
        table = Table.grid(padding=(0, 1))
        for key, used, self_used, hard in _key_rows(item):
            unit = " h" if is_cash_key(key) else ""
            table.add_row(
                Text(key, style="cyan"),
                _bar(used, hard),
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
    table = Table(title="GpuQuotas")
    for column in ("Quota", "Parent", "Key", "Usage", "Used", "Own", "Hard"):
        table.add_column(column)
    for item in sorted(quotas, key=lambda q: (q.parent, q.name)):
        for key, used, self_used, hard in _key_rows(item):
            table.add_row(
                item.name,
                item.parent or "-",
                key,
                _bar(used, hard),
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
