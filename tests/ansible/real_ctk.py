"""NVIDIA's real nvidia-ctk, built from the Go module proxy and cached outside the checkout.

The imitation toolkit package carries this binary for everything but `cdi generate` (which needs NVML and a
GPU, so its view of the GPUs stays simulated): `runtime configure` runs NVIDIA's own code against the lab's
real containerd, and `cdi list` reads the specs with NVIDIA's own CDI parsing.

    $GPUFORGE_CACHE/ansible/nvidia-ctk/<version>/nvidia-ctk          the binary
    $GPUFORGE_CACHE/ansible/nvidia-ctk/<version>/nvidia-ctk.sha256   its checksum, written after a build

A binary whose checksum does not match, or that does not run, is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gpuforge_lab.devcluster.build import go_environment

MODULE = "github.com/NVIDIA/nvidia-container-toolkit"
VERSION = "1.18.1"
GO = Path(os.environ.get("GPUFORGE_GO", "/usr/local/go/bin/go"))


def cache_root() -> Path:
    """The lab's cache, beside the control-plane build (lab.cache_dir)."""
    explicit = os.environ.get("GPUFORGE_CACHE")
    if explicit:
        return Path(explicit) / "ansible"
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "gpuforge" / "ansible"


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _sound(binary: Path, checksum: Path, version: str) -> bool:
    if not (binary.is_file() and checksum.is_file()):
        return False
    if checksum.read_text().split()[0] != _sha256(binary):
        return False
    result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    return result.returncode == 0 and version in result.stdout


def _build(target: Path, version: str) -> None:
    root = cache_root()
    # The control-plane build's Go environment (module and build caches shared with it); the module's own
    # go.sum pins the toolkit's dependencies.
    env = go_environment()
    env["CGO_ENABLED"] = "1"
    with tempfile.TemporaryDirectory(dir=root, prefix="nvidia-ctk-") as tmp:
        env["GOBIN"] = tmp
        # The version as NVIDIA's Makefile stamps it, so `nvidia-ctk --version` reports it.
        ldflags = f"-X {MODULE}/internal/info.version={version}"
        subprocess.run(
            [str(GO), "install", f"-ldflags={ldflags}", f"{MODULE}/cmd/nvidia-ctk@v{version}"],
            env=env,
            check=True,
            cwd=tmp,
        )
        shutil.move(str(Path(tmp) / "nvidia-ctk"), target)


def ensure(version: str = VERSION) -> Path | None:
    """The cached binary, built when missing or broken; None when Go or the build is not available."""
    directory = cache_root() / "nvidia-ctk" / version
    binary = directory / "nvidia-ctk"
    checksum = directory / "nvidia-ctk.sha256"
    if _sound(binary, checksum, version):
        return binary
    if not GO.is_file():
        print(
            f"real_ctk: {GO} not found; the toolkit package carries the imitation nvidia-ctk", file=sys.stderr
        )
        return None
    print(f"real_ctk: building nvidia-ctk v{version} from the Go module proxy", file=sys.stderr)
    directory.mkdir(parents=True, exist_ok=True)
    checksum.unlink(missing_ok=True)
    try:
        _build(binary, version)
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"real_ctk: build failed ({exc}); using the imitation nvidia-ctk", file=sys.stderr)
        return None
    checksum.write_text(f"{_sha256(binary)}  nvidia-ctk\n")
    return binary if _sound(binary, checksum, version) else None


if __name__ == "__main__":
    print(ensure())
