"""Build a local, signed imitation of NVIDIA's apt repositories (and the kernel headers a host needs).

Layout mirrors the real servers so the roles only swap a base URL:

    compute/cuda/repos/debian12/x86_64/      flat CUDA repository: driver branches 570 and 580, Debian names
    libnvidia-container/stable/deb/amd64/    flat container toolkit repository (key: ../../../gpgkey)
    kernel/                                  linux-headers-<running kernel> (the host's distribution archive)

Packages are stubs built with dpkg-deb: their files sit where the real ones do, and the binaries the roles run
(`nvidia-smi`, `nvidia-ctk`, the daemons) behave like the real ones against SIMULATED GPUs. Dependencies use
exact versions like NVIDIA's (`nvidia-driver` depends on `nvidia-smi (= v)` ...), so a role that upgrades
only one package of a branch hits the real "held broken packages" failure. A throwaway GPG key signs every
repository (InRelease and Release.gpg).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

STAMP = ".complete"
STUBS = Path(__file__).resolve().parent / "stubs"
CUDA_REPO = "compute/cuda/repos/debian12/x86_64"
TOOLKIT_REPO = "libnvidia-container/stable/deb/amd64"
KERNEL_REPO = "kernel"
CUDA_KEY_NAME = "3bf863cc.pub"

# Driver branch -> (versions, CUDA version reported by nvidia-smi). Two versions in 570 so "newest of the
# branch" is exercised; fabric manager lost its branch suffix with 580, like NVIDIA's packages.
DRIVER_BRANCHES: dict[str, tuple[tuple[str, ...], str]] = {
    "570": (("570.158.01", "570.172.08"), "12.8"),
    "580": (("580.95.05",), "13.0"),
}
TOOLKIT_VERSIONS = ("1.17.8", "1.18.1")
LIBDIR = "usr/lib/x86_64-linux-gnu"


@dataclass
class Package:
    name: str
    version: str
    description: str
    depends: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # path in package -> content
    executables: frozenset[str] = frozenset()
    postinst: str = ""
    architecture: str = "amd64"


def _stub(name: str, **replacements: str) -> str:
    text = (STUBS / name).read_text()
    for key, value in replacements.items():
        text = text.replace(f"@{key}@", value)
    return text


def _daemon_unit(description: str, binary: str) -> str:
    return (
        f"[Unit]\nDescription={description} (gpuforge imitation)\n\n"
        f"[Service]\nExecStart={binary}\nRestart=on-failure\n\n[Install]\nWantedBy=multi-user.target\n"
    )


def driver_packages(branch: str, upstream: str, cuda: str) -> list[Package]:
    version = f"{upstream}-1"
    exact = f"(= {version})"
    smi = _stub("nvidia-smi", DRIVER_VERSION=upstream, CUDA_VERSION=cuda)
    persistenced = _stub("simulated-daemon", DAEMON="nvidia-persistenced", VERSION=upstream)
    fabricmanager = _stub("simulated-daemon", DAEMON="nv-fabricmanager", VERSION=upstream)
    dkms_conf = f'PACKAGE_NAME="nvidia-current"\nPACKAGE_VERSION="{upstream}"\nAUTOINSTALL="yes"\n'
    fabric_name = "nvidia-fabricmanager" if int(branch) >= 580 else f"nvidia-fabricmanager-{branch}"
    return [
        Package(
            "nvidia-driver",
            version,
            "NVIDIA metapackage (gpuforge imitation)",
            depends=[
                f"nvidia-kernel-dkms {exact} | nvidia-kernel-open-dkms {exact}",
                f"nvidia-smi {exact}",
                f"libcuda1 {exact}",
                f"nvidia-persistenced {exact}",
            ],
        ),
        Package(
            "nvidia-kernel-dkms",
            version,
            "NVIDIA binary kernel module DKMS source (gpuforge imitation: builds nothing)",
            conflicts=["nvidia-kernel-open-dkms"],
            files={f"usr/src/nvidia-current-{upstream}/dkms.conf": dkms_conf},
        ),
        Package(
            "nvidia-kernel-open-dkms",
            version,
            "NVIDIA open kernel module DKMS source (gpuforge imitation: builds nothing)",
            conflicts=["nvidia-kernel-dkms"],
            files={f"usr/src/nvidia-current-open-{upstream}/dkms.conf": dkms_conf},
        ),
        Package(
            "nvidia-smi",
            version,
            "NVIDIA System Management Interface (gpuforge imitation: SIMULATED GPUs)",
            depends=[f"libnvidia-ml1 {exact}"],
            files={"usr/bin/nvidia-smi": smi},
            executables=frozenset({"usr/bin/nvidia-smi"}),
        ),
        Package(
            "libnvidia-ml1",
            version,
            "NVIDIA Management Library (gpuforge imitation)",
            files={f"{LIBDIR}/libnvidia-ml.so.{upstream}": "imitation\n"},
        ),
        Package(
            "libcuda1",
            version,
            "NVIDIA CUDA driver library (gpuforge imitation)",
            files={f"{LIBDIR}/libcuda.so.{upstream}": "imitation\n"},
        ),
        Package(
            "nvidia-persistenced",
            version,
            "daemon to maintain persistent software state in the NVIDIA driver (gpuforge imitation)",
            files={
                "usr/bin/nvidia-persistenced": persistenced,
                "lib/systemd/system/nvidia-persistenced.service": _daemon_unit(
                    "NVIDIA Persistence Daemon", "/usr/bin/nvidia-persistenced"
                ),
            },
            executables=frozenset({"usr/bin/nvidia-persistenced"}),
        ),
        Package(
            fabric_name,
            version,
            "NVIDIA Fabric Manager for NVSwitch systems (gpuforge imitation)",
            files={
                "usr/bin/nv-fabricmanager": fabricmanager,
                "lib/systemd/system/nvidia-fabricmanager.service": _daemon_unit(
                    "NVIDIA fabric manager service", "/usr/bin/nv-fabricmanager"
                ),
            },
            executables=frozenset({"usr/bin/nv-fabricmanager"}),
        ),
        # The trap NVIDIA users hit: a branch metapackage whose ">=" dependency pulls in newer branches.
        Package(
            f"cuda-drivers-{branch}",
            version,
            "CUDA driver metapackage",
            depends=[f"nvidia-driver (>= {branch})"],
        ),
    ]


def toolkit_packages(upstream: str) -> list[Package]:
    version = f"{upstream}-1"
    exact = f"(= {version})"
    runtime = (
        '#!/bin/sh\n# nvidia-container-runtime (gpuforge imitation): hands over to runc.\nexec runc "$@"\n'
    )
    cli = "#!/bin/sh\necho 'nvidia-container-cli (gpuforge imitation): SIMULATED GPUs only' >&2\nexit 1\n"
    return [
        Package(
            "nvidia-container-toolkit",
            version,
            "NVIDIA Container toolkit (gpuforge imitation)",
            depends=[f"nvidia-container-toolkit-base {exact}", f"libnvidia-container-tools {exact}"],
        ),
        Package(
            "nvidia-container-toolkit-base",
            version,
            "NVIDIA Container Toolkit Base (gpuforge imitation)",
            files={
                "usr/bin/nvidia-ctk": _stub("nvidia-ctk", TOOLKIT_VERSION=upstream),
                "usr/bin/nvidia-container-runtime": runtime,
            },
            executables=frozenset({"usr/bin/nvidia-ctk", "usr/bin/nvidia-container-runtime"}),
        ),
        Package(
            "libnvidia-container-tools",
            version,
            "NVIDIA container runtime library (command-line tools, gpuforge imitation)",
            depends=[f"libnvidia-container1 {exact}"],
            files={"usr/bin/nvidia-container-cli": cli},
            executables=frozenset({"usr/bin/nvidia-container-cli"}),
        ),
        Package(
            "libnvidia-container1",
            version,
            "NVIDIA container runtime library (gpuforge imitation)",
            files={f"{LIBDIR}/libnvidia-container.so.{upstream}": "imitation\n"},
        ),
    ]


def kernel_packages(kernel_release: str) -> list[Package]:
    return [
        Package(
            f"linux-headers-{kernel_release}",
            "1-1",
            "Header files for the lab host's running kernel (gpuforge imitation of the distribution archive)",
            files={f"usr/src/linux-headers-{kernel_release}/Makefile": "# imitation\n"},
        )
    ]


def _build_deb(package: Package, out_dir: Path, work: Path) -> None:
    root = work / f"{package.name}_{package.version}"
    (root / "DEBIAN").mkdir(parents=True)
    for rel, content in package.files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(0o755 if rel in package.executables else 0o644)
    control = [
        f"Package: {package.name}",
        f"Version: {package.version}",
        f"Architecture: {package.architecture}",
        "Maintainer: gpuforge test lab <lab@gpuforge.invalid>",
        "Section: non-free/libs",
        "Priority: optional",
    ]
    if package.depends:
        control.append("Depends: " + ", ".join(package.depends))
    if package.conflicts:
        control.append("Conflicts: " + ", ".join(package.conflicts))
    control.append(f"Description: {package.description}")
    (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
    if package.postinst:
        (root / "DEBIAN/postinst").write_text(package.postinst)
        (root / "DEBIAN/postinst").chmod(0o755)
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root), str(out_dir)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _index_and_sign(repo: Path, gnupg_home: Path, key_file: Path) -> None:
    packages = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."], cwd=repo, check=True, capture_output=True, text=True
    ).stdout
    (repo / "Packages").write_text(packages)
    subprocess.run(["gzip", "-9kf", "Packages"], cwd=repo, check=True)
    release = subprocess.run(
        ["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=gpuforge-imitation", "release", "."],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (repo / "Release").write_text(release)
    gpg = ["gpg", "--homedir", str(gnupg_home), "--batch", "--yes", "--quiet"]
    subprocess.run([*gpg, "--clearsign", "-o", "InRelease", "Release"], cwd=repo, check=True)
    subprocess.run([*gpg, "--armor", "--detach-sign", "-o", "Release.gpg", "Release"], cwd=repo, check=True)
    shutil.copy(key_file, repo / (CUDA_KEY_NAME if repo.name == "x86_64" else "repo.pub"))


def build(out: Path, kernel_release: str) -> Path:
    """Build every repository under `out` (replacing it); return `out`."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpuforge-repo-") as tmp:
        work = Path(tmp)
        gnupg_home = work / "gnupg"
        gnupg_home.mkdir(mode=0o700)
        gpg = ["gpg", "--homedir", str(gnupg_home), "--batch", "--quiet", "--passphrase", ""]
        subprocess.run(
            [*gpg, "--quick-gen-key", "gpuforge imitation repository (throwaway)", "ed25519", "sign", "1d"],
            check=True,
            stderr=subprocess.DEVNULL,
        )
        key_file = out / "gpuforge-imitation.asc"
        with key_file.open("w") as handle:
            subprocess.run([*gpg, "--armor", "--export"], check=True, stdout=handle)

        repos = {
            CUDA_REPO: [
                pkg
                for branch, (versions, cuda) in DRIVER_BRANCHES.items()
                for upstream in versions
                for pkg in driver_packages(branch, upstream, cuda)
            ],
            TOOLKIT_REPO: [pkg for upstream in TOOLKIT_VERSIONS for pkg in toolkit_packages(upstream)],
            KERNEL_REPO: kernel_packages(kernel_release),
        }
        for rel, packages in repos.items():
            repo = out / rel
            repo.mkdir(parents=True)
            for package in packages:
                _build_deb(package, repo, work / "debs")
            _index_and_sign(repo, gnupg_home, key_file)
        shutil.copy(key_file, out / "libnvidia-container/gpgkey")
    (out / STAMP).write_text("ok\n")
    return out


def distro_sources(out: Path, base_url: str) -> str:
    """A deb822 source for the host's distribution archive (the kernel headers), key inlined."""
    key = (out / "gpuforge-imitation.asc").read_text().strip().splitlines()
    inline = "\n".join(" " + (line if line.strip() else ".") for line in key)
    return f"Types: deb\nURIs: {base_url}/{KERNEL_REPO}/\nSuites: /\nSigned-By:\n{inline}\n"


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1]), kernel_release=sys.argv[2] if len(sys.argv) > 2 else os.uname().release))
