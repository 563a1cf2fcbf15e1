"""The `gpuforge` group: its own subcommands, and those installed distributions add by entry point."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import click
import pytest
from click.testing import CliRunner

from gpuforge.cli import main


@click.command(short_help="Added by another distribution.")
def added() -> None:
    click.echo("added ran")


def _entry_points(*pairs: tuple[str, str]) -> list[EntryPoint]:
    return [EntryPoint(name, value, main.COMMANDS_GROUP) for name, value in pairs]


def test_installed_lab_adds_dev_and_demo() -> None:
    result = CliRunner().invoke(main.cli, ["--help"])
    assert result.exit_code == 0
    for name in ("demo", "dev", "operator", "plan", "quota", "status", "webhook"):
        assert f"  {name} " in result.output
    assert "Local control plane with simulated GPU nodes." in result.output


@pytest.mark.parametrize(
    ("pairs", "args", "exit_code", "expected"),
    [
        ([("extra", f"{__name__}:added")], ["extra"], 0, "added ran"),
        ([("extra", f"{__name__}:added")], ["--help"], 0, "Added by another distribution."),
        # The runtime's own names stay its own.
        ([("status", f"{__name__}:added")], ["status", "--help"], 0, "GPU nodes by pool"),
        ([("extra", "gpuforge.nowhere:command")], ["--help"], 0, "extra     (cannot be loaded"),
        ([("extra", "gpuforge:__version__")], ["extra"], 1, "is not a click command"),
        ([], ["extra"], 2, "No such command 'extra'"),
        ([], ["dev", "cluster", "up"], 2, "No such command 'dev': it comes with gpuforge-lab"),
    ],
)
def test_commands_added_by_entry_point(
    monkeypatch: pytest.MonkeyPatch,
    pairs: list[tuple[str, str]],
    args: list[str],
    exit_code: int,
    expected: str,
) -> None:
    monkeypatch.setattr(main, "entry_points", lambda group: _entry_points(*pairs))
    result = CliRunner().invoke(main.cli, args)
    assert result.exit_code == exit_code, result.output
    assert expected in result.output
