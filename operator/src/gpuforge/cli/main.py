"""Entry point of the `gpuforge` command.

Subcommands live in their own modules and are imported only when used, so `gpuforge dev ...` does not
pay for importing kopf. Other distributions add subcommands through the `gpuforge.commands` entry point
group (name = "module:command"); the lab (gpuforge-lab) adds `dev` and `demo` that way, so the runtime
never imports it. Exit codes: 0 success, 1 failure, 2 usage error (click's), 3 not found/not running.
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import click

from gpuforge import __version__

COMMANDS_GROUP = "gpuforge.commands"
# Added by the lab distribution; named here only to say where they come from when it is not installed.
LAB_COMMANDS = frozenset({"dev", "demo"})

# subcommand name -> (module, attribute, short help)
_SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "operator": ("gpuforge.cli.operator", "operator", "Run the GpuStack operator."),
    "webhook": ("gpuforge.cli.webhook", "webhook", "Run the GpuQuota admission webhook."),
    "status": ("gpuforge.cli.status", "status", "GPU stacks and upgrade states by pool (--nodes: per node)."),
    "plan": ("gpuforge.cli.status", "plan", "What an upgrade or migration would do next."),
    "quota": ("gpuforge.cli.quota", "quota", "Inspect GpuQuota trees."),
}


def _added_commands() -> dict[str, EntryPoint]:
    """Subcommands installed distributions register; the runtime's own names cannot be taken over."""
    return {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP) if ep.name not in _SUBCOMMANDS}


def _load(entry_point: EntryPoint) -> click.Command:
    command = entry_point.load()
    if not isinstance(command, click.Command):
        raise click.ClickException(f"{COMMANDS_GROUP} entry point {entry_point.value} is not a click command")
    return command


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*_SUBCOMMANDS, *_added_commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = _SUBCOMMANDS.get(cmd_name)
        if entry is None:
            added = _added_commands().get(cmd_name)
            return None if added is None else _load(added)
        module_name, attribute, _ = entry
        command: Any = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name in LAB_COMMANDS and self.get_command(ctx, name) is None:
            ctx.fail(f"No such command '{name}': it comes with gpuforge-lab, which is not installed.")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, _, help_text) in _SUBCOMMANDS.items()]
        for name, entry_point in _added_commands().items():
            # Imported only to list them; a broken one is shown as such rather than breaking --help.
            try:
                rows.append((name, _load(entry_point).get_short_help_str(limit=60)))
            except Exception as error:
                rows.append((name, f"(cannot be loaded: {error})"))
        with formatter.section("Commands"):
            formatter.write_dl(sorted(rows))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuforge")
def cli() -> None:
    """gpuforge: GPU nodes on Kubernetes.

    Shell completion: eval "$(_GPUFORGE_COMPLETE=bash_source gpuforge)" (zsh_source, fish_source).
    """


def main() -> None:
    cli(prog_name="gpuforge")
