"""Make the checkout importable as the collection gpuforge.nodes (via collections/, see mk/ansible.mk)."""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.utils.collection_loader import AnsibleCollectionConfig  # type: ignore[import-untyped]
from ansible.utils.collection_loader._collection_finder import (  # type: ignore[import-untyped]
    _AnsibleCollectionFinder,
)

COLLECTIONS = Path(__file__).resolve().parents[3] / "collections"
if not (COLLECTIONS / "ansible_collections/gpuforge/nodes").exists():
    raise RuntimeError(
        f"{COLLECTIONS}/ansible_collections/gpuforge/nodes is missing: run `make ansible-collection`"
    )
# Ansible's own collection loader, not a sys.path entry: the role render tests template with the collection's
# filters, which Ansible imports through that loader (a second copy imported by path would shadow them).
if AnsibleCollectionConfig.collection_finder is None:
    _AnsibleCollectionFinder(paths=[str(COLLECTIONS)])._install()
# The imitation repository's package table (tests/ansible/nvidia_packages.py) drives the render tables.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
