"""What every benchmark writes to its --out file: a JSON list of rows (name, value, unit and, where there
is one, the target and whether it was met) that run.py reads into one table. Not a benchmark itself (run.py
runs bench_*.py only); it imports nothing of the operator, so the Ansible benchmarks can use it too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass
class Result:
    name: str
    value: float
    unit: str
    target: str | None = None
    ok: bool | None = None
    note: str | None = None


def write_rows(out: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(list(rows), indent=2) + "\n")


def print_rows(rows: Sequence[Mapping[str, Any]], name_width: int, missed: str) -> None:
    """One line a row; a row with a target ends in "ok" or `missed`."""
    for row in rows:
        mark = "" if "ok" not in row else ("  ok" if row["ok"] else f"  {missed}")
        print(f"{row['name']:<{name_width}} {row['value']:>10} {row['unit']}{mark}")


def write_results(out: Path, results: Sequence[Result]) -> None:
    write_rows(out, [asdict(result) for result in results])
