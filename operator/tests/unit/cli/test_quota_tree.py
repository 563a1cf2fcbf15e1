"""`gpuforge quota tree` on a narrow terminal: resource keys are printed whole, other columns give way."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from gpuforge.cli.quota import render_table, render_tree
from gpuforge.quota.convert import quota_from_object

KEYS = (
    "requests.nvidia.com/gpu",
    "requests.nvidia.com/gpu.A100-SXM4-80GB",
    "requests.nvidia.com/gpu.H100-80GB-HBM3",
    "cash/requests.nvidia.com/gpu.H100-80GB-HBM3",
)


def _quota(name: str, parent: str = "") -> Any:
    hard = dict.fromkeys(KEYS, "64")
    used = dict.fromkeys(KEYS, "40")
    return quota_from_object(
        {
            "metadata": {"name": name},
            "spec": {"parent": parent, "hard": hard},
            "status": {"used": used, "selfUsed": used},
        }
    )


QUOTAS = [
    _quota("org"),
    _quota("research-department", "org"),
    _quota("vision-team-training", "research-department"),
]


@pytest.mark.parametrize("render", [render_tree, render_table], ids=["tree", "table"])
def test_keys_are_never_elided_at_80_columns(render: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    console = Console(record=True, force_terminal=False)
    assert console.width == 80
    console.print(render(QUOTAS))
    output = console.export_text()
    assert "…" not in "".join(line for line in output.splitlines() if "requests." in line)
    for key in KEYS:
        assert any(key in line for line in output.splitlines()), f"{key} not printed whole:\n{output}"
    assert max(len(line) for line in output.splitlines()) <= 80
