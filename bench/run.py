"""Run every benchmark (bench/bench_*.py), write bench/results/<name>.json, print one table.

Each benchmark script is run as `python bench/bench_<name>.py --out bench/results/<name>.json` and writes a
JSON list of {"name", "value", "unit", "target"?, "ok"?, "note"?}. Figures are medians of repeated runs
measured in that one run; this machine has 2 cores and is noisy, so compare ratios rather than absolutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

BENCH_DIR = Path(__file__).parent
RESULTS = BENCH_DIR / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("only", nargs="*", help="benchmark names to run (default: all)")
    args = parser.parse_args()
    console = Console()
    RESULTS.mkdir(exist_ok=True)
    scripts = sorted(BENCH_DIR.glob("bench_*.py"))
    if args.only:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in args.only]
    failed: list[str] = []
    table = Table(title="gpuforge benchmarks")
    for column in ("benchmark", "figure", "value", "target", "ok"):
        table.add_column(column)
    for script in scripts:
        name = script.stem.removeprefix("bench_")
        out = RESULTS / f"{name}.json"
        console.print(f"[bold]==> {name}[/]")
        started = time.monotonic()
        result = subprocess.run([sys.executable, str(script), "--out", str(out)], check=False)
        console.print(f"    {name} took {time.monotonic() - started:.0f}s")
        if result.returncode != 0 or not out.exists():
            failed.append(name)
            table.add_row(name, "[red]failed to run[/]", "", "", "[red]no[/]")
            continue
        for row in json.loads(out.read_text()):
            ok = row.get("ok")
            value = row["value"]
            shown = f"{value:.3g}" if isinstance(value, float) else str(value)
            table.add_row(
                name,
                row["name"],
                f"{shown} {row.get('unit', '')}".strip(),
                str(row.get("target", "")),
                "" if ok is None else ("yes" if ok else "[red]no[/]"),
            )
    console.print(table)
    if failed:
        console.print(f"[red]benchmarks that failed to run: {', '.join(failed)}[/]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
