"""Golden-file support for the render tests: `pytest --update-golden` (or GPUFORGE_UPDATE_GOLDEN=1)
rewrites the files under tests/golden/render instead of comparing with them."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False, help="rewrite golden files")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    # getoption's default covers runs where this conftest was not an initial one (option not registered).
    return bool(request.config.getoption("--update-golden", default=False)) or bool(
        os.environ.get("GPUFORGE_UPDATE_GOLDEN")
    )
