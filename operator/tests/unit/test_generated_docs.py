"""The reference pages are generated from the CRDs and the compatibility data; they must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_generated_docs_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "docs" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
