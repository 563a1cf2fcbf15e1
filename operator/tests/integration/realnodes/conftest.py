"""Real-node tests boot podman hosts: they run only when selected with `-m realnode`."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "realnode" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="boots real kubelet nodes under podman; select with -m realnode")
    for item in items:
        if "realnode" in item.keywords:
            item.add_marker(skip)
