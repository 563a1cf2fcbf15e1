from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuforge_lab.devcluster import build


@pytest.fixture
def fake_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUFORGE_CACHE", str(tmp_path))
    versions = build.load_versions()
    bin_dir = tmp_path / "controlplane" / build.build_key(versions) / "bin"
    bin_dir.mkdir(parents=True)
    entries = {}
    for name in build.BINARIES:
        path = bin_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode())
        path.chmod(0o755)
        entries[name] = {"size": path.stat().st_size, "sha256": build._sha256(path)}
    (bin_dir.parent / "manifest.json").write_text(json.dumps({"binaries": entries}))
    return bin_dir


def test_complete_cache_is_reused(fake_cache: Path) -> None:
    binaries = build.cached_binaries()
    assert binaries is not None and binaries.directory == fake_cache
    assert build.verify_hashes(binaries) == []


def test_missing_manifest_means_partial_build(fake_cache: Path) -> None:
    (fake_cache.parent / "manifest.json").unlink()
    assert build.cached_binaries() is None


def test_truncated_binary_means_broken_cache(fake_cache: Path) -> None:
    (fake_cache / "kube-apiserver").write_bytes(b"")
    assert build.cached_binaries() is None


def test_same_size_corruption_is_found_by_verify(fake_cache: Path) -> None:
    (fake_cache / "etcd").write_bytes(b"ETCD")
    binaries = build.cached_binaries()
    assert binaries is not None
    assert build.verify_hashes(binaries) == ["etcd"]


def test_key_names_the_pinned_versions() -> None:
    versions = build.load_versions()
    key = build.build_key(versions)
    assert versions.kubernetes in key and versions.etcd in key and versions.kwok in key


@pytest.mark.parametrize(("text", "parsed"), [("go1.26.8", (1, 26, 8)), ("go1.27", (1, 27, 0)), ("", (0,))])
def test_go_version_parsing(text: str, parsed: tuple[int, ...]) -> None:
    assert build._parse_go_version(text) == parsed
