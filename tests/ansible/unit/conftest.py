"""Make the checkout importable as the collection gpuforge.nodes (via collections/, see mk/ansible.mk)."""

from __future__ import annotations

import sys
from pathlib import Path

COLLECTIONS = Path(__file__).resolve().parents[3] / "collections"
if not (COLLECTIONS / "ansible_collections/gpuforge/nodes").exists():
    raise RuntimeError(
        f"{COLLECTIONS}/ansible_collections/gpuforge/nodes is missing: run `make ansible-collection`"
    )
sys.path.insert(0, str(COLLECTIONS))
