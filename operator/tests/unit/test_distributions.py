"""The two distributions: the runtime `gpuforge` (what the operator image ships), the lab `gpuforge-lab`."""

from __future__ import annotations

import tomllib
import zipfile
from pathlib import Path

import pytest

import gpuforge
import gpuforge_lab
from gpuforge_lab.devcluster import image

OPERATOR_DIR = Path(__file__).resolve().parents[2]
RUNTIME = tomllib.loads((OPERATOR_DIR / "pyproject.toml").read_text())["project"]
LAB = tomllib.loads((OPERATOR_DIR / "lab" / "pyproject.toml").read_text())["project"]


@pytest.mark.slow
def test_runtime_wheel_ships_no_lab(tmp_path: Path) -> None:
    wheel = image.build_runtime_wheel(tmp_path / "wheels", log=lambda _: None)
    assert image.lab_files(wheel) == []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {"gpuforge/cli/main.py", "gpuforge/constants.py", "gpuforge/render/templates/_pod.j2"} <= names
    assert not [name for name in names if name.endswith((".go", "go.mod", "Containerfile"))]


def test_lab_files_names_what_belongs_to_the_lab(tmp_path: Path) -> None:
    wheel = tmp_path / "gpuforge-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("gpuforge/cli/main.py", "gpuforge/sim/agent.py", "gpuforge_lab/__init__.py"):
            archive.writestr(name, "")
    assert image.lab_files(wheel) == ["gpuforge/sim/agent.py", "gpuforge_lab/__init__.py"]


def test_lab_requires_the_runtime_of_its_own_release() -> None:
    assert gpuforge_lab.__version__ == gpuforge.__version__
    assert f"gpuforge=={gpuforge.__version__}" in LAB["dependencies"]


@pytest.mark.parametrize("project", [RUNTIME, LAB], ids=["gpuforge", "gpuforge-lab"])
def test_no_pytest_plugin_loads_itself(project: dict[str, object]) -> None:
    entry_points = project.get("entry-points", {})
    assert isinstance(entry_points, dict)
    assert "pytest11" not in entry_points
