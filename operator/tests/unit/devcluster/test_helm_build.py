"""helm's build from the Go module proxy: its pin, its cache key, and that it stays apart from the control
plane's (adding or bumping helm never rebuilds Kubernetes)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from gpuforge_lab.devcluster import build, helm


def test_the_pin_is_the_wrapper_modules_require() -> None:
    version = helm.helm_version()
    assert version.startswith("v3.")
    assert helm.helm_key().startswith(f"helm-{version}_")


def test_helm_is_outside_the_control_plane_and_node_recipes() -> None:
    recipe = [*build._recipe_files(nodes=False), *build._recipe_files(nodes=True)]
    assert not any(path.is_relative_to(helm.HELM_GOMOD) for path in recipe)
    assert (helm.HELM_GOMOD / "go.sum").is_file()


def test_ldflags_stamp_the_version_and_client_go_minor() -> None:
    flags = helm._ldflags()
    assert f"internal/version.version={helm.helm_version()}" in flags
    minor = helm._required("k8s.io/client-go").split(".")[1]
    assert f"pkg/chartutil.k8sVersionMinor={minor}" in flags


def fake_helm(cache: Path, script: str) -> Path:
    """A cached 'helm' with a matching manifest: complete as far as sizes go."""
    bin_dir = cache / "tools" / helm.helm_key() / "bin"
    bin_dir.mkdir(parents=True)
    path = bin_dir / "helm"
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    entry = {"size": path.stat().st_size, "sha256": build._sha256(path)}
    (bin_dir.parent / "manifest.json").write_text(json.dumps({"binaries": {"helm": entry}}))
    return path


def test_a_cached_helm_reporting_the_pin_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFORGE_CACHE", str(tmp_path))
    path = fake_helm(tmp_path, f"#!/bin/sh\necho {helm.helm_version()}\n")
    assert helm.ensure_helm() == path


def test_a_cached_helm_that_cannot_run_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFORGE_CACHE", str(tmp_path))
    fake_helm(tmp_path, "#!/bin/sh\nexit 1\n")  # sizes match the manifest, but it does not run
    cached = build.build_kind
    forced: list[bool] = []

    def build_kind(kind: build.BuildKind, console: Any = None, force: bool = False) -> build.Binaries:
        forced.append(force)
        if force:  # what a rebuild leaves behind
            shutil.rmtree(tmp_path / "tools")
            fake_helm(tmp_path, f"#!/bin/sh\necho {helm.helm_version()}\n")
        return cached(kind, console)

    monkeypatch.setattr(helm, "build_kind", build_kind)
    assert helm.ensure_helm().read_text().endswith(f"echo {helm.helm_version()}\n")
    assert forced == [False, True]


def test_cached_binaries_reads_the_tool_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFORGE_CACHE", str(tmp_path))
    assert build.cached_binaries(kind=helm.HELM) is None
    fake_helm(tmp_path, "#!/bin/sh\n")
    binaries = build.cached_binaries(kind=helm.HELM)
    assert binaries is not None and os.access(binaries.path("helm"), os.X_OK)
