"""Entry point of the `gpuforge` command.

Subcommands live in their own modules and are imported only when used, so `gpuforge dev ...` does not
pay for importing kopf. Exit codes: 0 success, 1 failure, 2 usage error (click's), 3 not found/not running.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from gpuforge import __version__

# subcommand name -> (module, attribute, short help)
_SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "dev": ("gpuforge_lab.cli.dev", "dev", "Local control plane with simulated GPU nodes."),
    "operator": ("gpuforge.cli.operator", "operator", "Run the GpuStack operator."),
    "webhook": ("gpuforge.cli.webhook", "webhook", "Run the GpuQuota admission webhook."),
    "status": ("gpuforge.cli.status", "status", "Per-node table of GPU stacks and upgrade states."),
    "plan": ("gpuforge.cli.status", "plan", "What an upgrade or migration would do next."),
    "quota": ("gpuforge.cli.quota", "quota", "Inspect GpuQuota trees."),
    "demo": ("gpuforge_lab.cli.demo", "demo", "The whole story on the local control plane."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = _SUBCOMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attribute, _ = entry
        command: Any = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, _, help_text) in sorted(_SUBCOMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuforge")
def cli() -> None:
    """gpuforge: GPU nodes on Kubernetes.

    Shell completion: eval "$(_GPUFORGE_COMPLETE=bash_source gpuforge)" (zsh_source, fish_source).
    """


def main() -> None:
    cli(prog_name="gpuforge")
