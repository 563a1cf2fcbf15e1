"""The operator image, built without any container registry.

The base is a Debian 12 root filesystem made by debootstrap (python3 and what `minbase` brings, no
systemd), cached as a tarball under `cache_root()/image` keyed by its recipe and imported with
`podman import`. On top of it `podman build` (operator/Dockerfile) copies the gpuforge wheel and its
pinned dependencies, installed beforehand for Debian 12's CPython 3.11 by the host's pip.

The image is tagged with the package version and labelled with a digest of everything it is built
from, so `ensure_image()` rebuilds it only when that digest changes (or the image is gone).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuforge import __version__
from gpuforge_lab.devcluster.build import cache_root

Log = Callable[[str], None]

# Bump when the base recipe changes in a way its package list does not show.
BASE_RECIPE_VERSION = "1"
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3",)
# Debian 12's interpreter; the dependencies are installed for it, not for the host's.
BASE_PYTHON = "3.11"
# Wheels that run on bookworm's glibc 2.36 (pip does not widen an explicit --platform to older tags).
BASE_PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
# What the base does not need at run time (documentation, translations, apt's downloaded lists).
BASE_PRUNED = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/lib/apt/lists")
USER_ID = 65532
IMAGE_NAME = "localhost/gpuforge-operator"
SOURCE_URL = "https://github.com/gpuforge/gpuforge"
DIGEST_LABEL = "io.gpuforge.image.digest"

OPERATOR_DIR = Path(__file__).resolve().parents[4]
DOCKERFILE = OPERATOR_DIR / "Dockerfile"
# The image ships the runtime alone: neither the lab's package nor the places its modules had in gpuforge.
LAB_PATHS = (
    "gpuforge_lab/",
    "gpuforge/devcluster/",
    "gpuforge/sim/",
    "gpuforge/testing/",
    "gpuforge/cli/dev.py",
    "gpuforge/cli/demo.py",
    "gpuforge/quota/workloads.py",
)


class ImageError(Exception):
    pass


@dataclass(frozen=True)
class Image:
    ref: str
    digest: str
    size_bytes: int


def _stderr(message: str) -> None:
    print(f"image: {message}", file=sys.stderr, flush=True)


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, check=True, text=True, **kwargs)  # type: ignore[call-overload, no-any-return]
    except subprocess.CalledProcessError as error:
        raise ImageError(f"{' '.join(cmd[:3])} failed ({error.returncode}): {error.stderr or ''}") from error


# --- base --------------------------------------------------------------------------------------------


def base_key() -> str:
    recipe = " ".join((BASE_RECIPE_VERSION, BASE_SUITE, *BASE_PACKAGES, *BASE_PRUNED, str(USER_ID)))
    return f"{BASE_SUITE}-{BASE_RECIPE_VERSION}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"


def base_ref() -> str:
    return f"localhost/gpuforge-base:{base_key()}"


def base_dir() -> Path:
    return cache_root() / "image"


def base_tarball() -> Path:
    return base_dir() / f"gpuforge-base-{base_key()}.tar.zst"


def _tarball_is_sound(path: Path) -> bool:
    return path.is_file() and subprocess.run(["zstd", "-q", "-t", str(path)], check=False).returncode == 0


def _debootstrap(rootfs: Path, suite: str, packages: Sequence[str], log: Log) -> None:
    mirror = os.environ.get("GPUFORGE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    log(f"debootstrap {suite} from {mirror} (a minute or two)")
    _run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(rootfs), mirror],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def debian_image(
    ref: str,
    tarball: Path,
    suite: str,
    packages: Sequence[str],
    prepare: Callable[[Path], None],
    log: Log,
    *,
    stale: str,
    force: bool = False,
) -> str:
    """A Debian minbase root filesystem (debootstrap of `suite` with `packages`, then `prepare`d) as the
    podman image `ref`, imported from the cached `tarball`, which is made again when missing or broken
    (then the other tarballs beside it matching `stale` are removed). Shared by the operator's base
    image and the Ansible lab's hosts."""
    if not force and subprocess.run(["podman", "image", "exists", ref], check=False).returncode == 0:
        return ref
    if force or not _tarball_is_sound(tarball):
        tarball.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=tarball.parent, prefix="rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            _debootstrap(rootfs, suite, packages, log)
            prepare(rootfs)
            partial = tarball.with_suffix(".partial")
            with partial.open("wb") as out:
                tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
                _run(["zstd", "-q", "-T2", "-3"], stdin=tar.stdout, stdout=out)
                if tar.wait() != 0:
                    raise ImageError(f"tar of the {suite} rootfs failed")
            partial.rename(tarball)
        for old in tarball.parent.glob(stale):
            if old != tarball:
                old.unlink()
    log(f"importing {tarball.name} as {ref}")
    with tarball.open("rb") as src:
        unzstd = subprocess.Popen(["zstd", "-q", "-d", "-c"], stdin=src, stdout=subprocess.PIPE)
        _run(["podman", "import", "--quiet", "-", ref], stdin=unzstd.stdout, stdout=subprocess.DEVNULL)
        unzstd.wait()
    return ref


def _prepare_base(rootfs: Path) -> None:
    for pruned in BASE_PRUNED:
        shutil.rmtree(rootfs / pruned, ignore_errors=True)
    shutil.rmtree(rootfs / "var/cache/apt", ignore_errors=True)
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    # The unprivileged user the operator runs as (no home, no shell), written here so the image build
    # itself runs no command inside the image.
    with (rootfs / "etc/passwd").open("a") as passwd:
        passwd.write(f"gpuforge:x:{USER_ID}:{USER_ID}:gpuforge:/nonexistent:/usr/sbin/nologin\n")
    with (rootfs / "etc/group").open("a") as group:
        group.write(f"gpuforge:x:{USER_ID}:\n")


def ensure_base(log: Log = _stderr, force: bool = False) -> str:
    """The base image's reference: imported from the cached tarball, which is rebuilt if missing or broken."""
    return debian_image(
        base_ref(),
        base_tarball(),
        BASE_SUITE,
        BASE_PACKAGES,
        _prepare_base,
        log,
        stale="gpuforge-base-*.tar.zst",
        force=force,
    )


# --- operator image ----------------------------------------------------------------------------------


def _sources() -> Iterator[Path]:
    yield OPERATOR_DIR / "pyproject.toml"
    yield DOCKERFILE
    for path in sorted((OPERATOR_DIR / "src").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(".pyc"):
            yield path


def image_digest() -> str:
    """A digest of everything the image is built from: base recipe, Dockerfile, pyproject and sources."""
    digest = hashlib.sha256(base_key().encode())
    for path in _sources():
        digest.update(str(path.relative_to(OPERATOR_DIR)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def image_ref(version: str = __version__) -> str:
    return f"{IMAGE_NAME}:{version}"


def _labels(ref: str) -> dict[str, str]:
    completed = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{json .Labels}}", ref],
        check=False,
        capture_output=True,
        text=True,
    )
    if completed.returncode != 0:
        return {}
    labels = json.loads(completed.stdout or "null")
    return dict(labels) if isinstance(labels, dict) else {}


def image_size(ref: str) -> int:
    out = _run(["podman", "image", "inspect", "--format", "{{.Size}}", ref], capture_output=True).stdout
    return int(out.strip())


_PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet")


def build_runtime_wheel(wheels: Path, log: Log = _stderr) -> Path:
    """The wheel of the runtime distribution `gpuforge` (operator/pyproject.toml), written into `wheels`."""
    log("building the gpuforge wheel")
    # From a copy: setuptools leaves build/ in the source tree, and a stale build/lib would put files
    # deleted since into the wheel.
    source = wheels.parent / "source"
    source.mkdir()
    shutil.copy2(OPERATOR_DIR / "pyproject.toml", source / "pyproject.toml")
    shutil.copytree(
        OPERATOR_DIR / "src",
        source / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
    )
    _run([*_PIP, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(source)], stderr=subprocess.PIPE)
    wheel = next(wheels.glob("gpuforge-*.whl"))
    strays = lab_files(wheel)
    if strays:
        raise ImageError(f"{wheel.name} carries the lab, which the image must not ship: {', '.join(strays)}")
    return wheel


def lab_files(wheel: Path) -> list[str]:
    """What in `wheel` belongs to the lab (gpuforge-lab), or the names the lab's modules had in gpuforge."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    return [name for name in names if name.startswith(LAB_PATHS)]


def _install_packages(site: Path, wheels: Path, log: Log) -> None:
    """The gpuforge wheel and its pinned dependencies, installed for the base's CPython."""
    wheel = build_runtime_wheel(wheels, log)
    log(f"installing {wheel.name} and its dependencies for CPython {BASE_PYTHON}")
    _run(
        [
            *_PIP,
            "install",
            "--target",
            str(site),
            "--only-binary=:all:",
            "--implementation=cp",
            f"--python-version={BASE_PYTHON}",
            *(f"--platform={platform}" for platform in BASE_PLATFORMS),
            str(wheel),
        ],
        stderr=subprocess.PIPE,
    )
    # Console scripts carry the host interpreter's path; the image runs `python3 -m gpuforge`.
    shutil.rmtree(site / "bin", ignore_errors=True)


def build_image(log: Log = _stderr, force_base: bool = False) -> Image:
    """Build the operator image (and the base, if needed); return its reference."""
    base = ensure_base(log, force=force_base)
    ref, digest = image_ref(), image_digest()
    with tempfile.TemporaryDirectory(prefix="gpuforge-image-") as tmp:
        context = Path(tmp)
        _install_packages(context / "site-packages", context / "wheels", log)
        log(f"podman build {ref}")
        _run(
            [
                "podman",
                "build",
                "--quiet",
                "--file",
                str(DOCKERFILE),
                "--build-arg",
                f"BASE={base}",
                "--build-arg",
                f"VERSION={__version__}",
                "--build-arg",
                f"SOURCE={SOURCE_URL}",
                "--label",
                f"{DIGEST_LABEL}={digest}",
                "--tag",
                ref,
                str(context),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    return Image(ref, digest, image_size(ref))


def ensure_image(log: Log = _stderr) -> Image:
    """The operator image for the current sources: reused when its digest label matches, else built."""
    ref, digest = image_ref(), image_digest()
    if _labels(ref).get(DIGEST_LABEL) == digest:
        return Image(ref, digest, image_size(ref))
    return build_image(log)


def main() -> None:
    """`python -m gpuforge_lab.devcluster.image`: build (or reuse) the image; print its reference and size."""
    built = ensure_image()
    print(f"{built.ref} ({built.size_bytes / 1e6:.0f} MB, digest {built.digest})")


if __name__ == "__main__":
    main()
