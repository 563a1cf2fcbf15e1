"""Build a local, signed imitation of NVIDIA's apt repositories (and the kernel headers a host needs).

Layout mirrors the real servers so the roles only swap a base URL:

    compute/cuda/repos/debian12/x86_64/      flat CUDA repository: branches 570 (two versions), 580 and 590,
                                             Debian's names and "=" dependency graph, pinning packages
    libnvidia-container/stable/deb/amd64/    flat container toolkit repository (key: ../../../gpgkey)
    kernel/                                  linux-headers-<running kernel> (the host's distribution archive)

Packages are stubs built with dpkg-deb: their files sit where the real ones do, and the binaries the roles run
(`nvidia-smi`, `nvidia-ctk`, the daemons) behave like the real ones against SIMULATED GPUs. The driver
packages come from one table, nvidia_packages.py, which names the source of each fact: Debian's names, source
packages and "=" dependencies (`nvidia-driver` -> `nvidia-driver-libs (= v)` -> ... ), so a role that pins
only some packages of a branch while a newer branch is in the repository hits the real "held broken
packages" failure. A throwaway GPG key signs every repository (InRelease and Release.gpg).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nvidia_packages

STAMP = ".complete"
STUBS = Path(__file__).resolve().parent / "stubs"
CUDA_REPO = "compute/cuda/repos/debian12/x86_64"
TOOLKIT_REPO = "libnvidia-container/stable/deb/amd64"
KERNEL_REPO = "kernel"
CUDA_KEY_NAME = "3bf863cc.pub"

TOOLKIT_VERSIONS = ("1.17.8", "1.18.1")
LIBDIR = "usr/lib/x86_64-linux-gnu"


@dataclass
class Package:
    name: str
    version: str
    description: str
    depends: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # path in package -> content (usr/bin/*: executable)
    postinst: str = ""
    architecture: str = "amd64"
    pre_depends: list[str] = field(default_factory=list)
    recommends: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    conffiles: list[str] = field(default_factory=list)
    source: str = ""
    blobs: dict[str, Path] = field(default_factory=dict)  # path in package -> file copied as it is


@dataclass(frozen=True)
class Member:
    """One package of a family that is released together: every member carries the family's version."""

    name: str
    description: str
    # Other members ("a | b" for alternatives), each pinned to the family's exact version like NVIDIA's
    # packages; an entry that already carries a version constraint is kept as it is.
    depends: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()


def family(version: str, members: list[Member]) -> list[Package]:
    """The members as packages of one version, their dependencies on each other pinned with "="."""

    def pinned(dependency: str) -> str:
        if "(" in dependency:
            return dependency
        return " | ".join(f"{alternative} (= {version})" for alternative in dependency.split(" | "))

    return [
        Package(
            member.name,
            version,
            member.description,
            depends=[pinned(dependency) for dependency in member.depends],
            conflicts=list(member.conflicts),
            files=dict(member.files),
        )
        for member in members
    ]


def _stub(name: str, **replacements: str) -> str:
    text = (STUBS / name).read_text()
    for key, value in replacements.items():
        text = text.replace(f"@{key}@", value)
    return text


def _library(name: str, soname: str, description: str) -> Member:
    return Member(name, description, files=((f"{LIBDIR}/{soname}", "imitation\n"),))


def _daemon(
    name: str, binary: str, unit: str, unit_description: str, description: str, version: str
) -> Member:
    service = (
        f"[Unit]\nDescription={unit_description} (gpuforge imitation)\n\n"
        f"[Service]\nExecStart=/usr/bin/{binary}\nRestart=on-failure\n\n[Install]\nWantedBy=multi-user.target\n"
    )
    program = _stub("simulated-daemon", DAEMON=binary, VERSION=version)
    return Member(
        name,
        description,
        files=((f"usr/bin/{binary}", program), (f"lib/systemd/system/{unit}.service", service)),
    )


def _payload(
    spec: nvidia_packages.DriverPackage, branch: nvidia_packages.Branch, upstream: str
) -> dict[str, str]:
    kind, _, rest = spec.payload.partition(":")
    if kind == "smi":
        return {"usr/bin/nvidia-smi": _stub("nvidia-smi", DRIVER_VERSION=upstream, CUDA_VERSION=branch.cuda)}
    if kind == "library":
        return {f"{LIBDIR}/{rest.format(u=upstream)}": "imitation\n"}
    if kind == "dkms":
        dkms_conf = f'PACKAGE_NAME="{rest}"\nPACKAGE_VERSION="{upstream}"\nAUTOINSTALL="yes"\n'
        return {f"usr/src/{rest}-{upstream}/dkms.conf": dkms_conf}
    if kind == "daemon":
        binary, unit = rest.split(":")
        member = _daemon(spec.name, binary, unit, unit, spec.name, upstream)
        return dict(member.files)
    return {}


def driver_packages(branch: nvidia_packages.Branch, upstream: str, version: str) -> list[Package]:
    """Every package of one driver version, as the table in nvidia_packages.py describes it."""

    def fields(entries: tuple[str, ...]) -> list[str]:
        return [nvidia_packages.fill(entry, branch.branch, upstream, version) for entry in entries]

    return [
        Package(
            nvidia_packages.fill(spec.name, branch.branch, upstream, version),
            version,
            f"{spec.name} (gpuforge imitation; {spec.origin})",
            depends=fields(spec.depends),
            pre_depends=fields(spec.pre_depends),
            recommends=fields(spec.recommends),
            provides=fields(spec.provides),
            conflicts=fields(spec.conflicts),
            files=_payload(spec, branch, upstream),
            source=spec.source,
        )
        for spec in nvidia_packages.DRIVER_PACKAGES
        if spec.since <= int(branch.branch) <= spec.until
    ]


def shared_packages() -> list[Package]:
    return [
        Package(
            spec.name, spec.version, f"{spec.name} (gpuforge imitation; {spec.origin})", source=spec.source
        )
        for spec in nvidia_packages.SHARED_PACKAGES
    ]


def pinning_package(branch: str) -> Package:
    path = nvidia_packages.PINNING_FILE.format(b=branch)
    return Package(
        f"nvidia-driver-pinning-{branch}",
        nvidia_packages.PINNING_VERSION.format(b=branch),
        f"Locks the NVIDIA driver to branch {branch} (gpuforge imitation)",
        # One pinning package at a time, the Debian way: each provides and conflicts with the virtual name.
        provides=["nvidia-driver-pinning"],
        conflicts=["nvidia-driver-pinning"],
        files={path: nvidia_packages.pinning_preferences(branch)},
        conffiles=["/" + path],
        architecture="all",
        source="nvidia-driver-pinning",
    )


def cuda_repository_packages() -> list[Package]:
    packages = shared_packages()
    for branch in nvidia_packages.BRANCHES:
        for upstream, version in nvidia_packages.package_versions(branch):
            packages += driver_packages(branch, upstream, version)
        if branch.pinning:
            packages.append(pinning_package(branch.branch))
    return packages


# Toolkit 1.18 added a systemd path and service that regenerate the CDI spec when the kernel's module list
# changes (deployments/systemd/nvidia-cdi-refresh.{service,path,env}, v1.18.1); the package enables them.
CDI_REFRESH_ENV = "etc/nvidia-container-toolkit/nvidia-cdi-refresh.env"
CDI_REFRESH_SERVICE = """[Unit]
Description=Refresh the NVIDIA CDI specification (gpuforge imitation)
ConditionPathExists=|/usr/bin/nvidia-smi
ConditionPathExists=|/usr/sbin/nvidia-smi
ConditionPathExists=/usr/bin/nvidia-ctk
After=multi-user.target

[Service]
Type=oneshot
Environment=NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml
EnvironmentFile=-/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env
ExecCondition=/usr/bin/grep -qE '/(nvidia|nvidia-current)\\\\.ko' /lib/modules/%v/modules.dep
ExecStart=/usr/bin/nvidia-ctk cdi generate
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""
CDI_REFRESH_PATH = """[Unit]
Description=Refresh the NVIDIA CDI specification when the kernel modules change (gpuforge imitation)

[Path]
PathChanged=/lib/modules/%v/modules.dep
PathChanged=/lib/modules/%v/modules.dep.bin

[Install]
WantedBy=multi-user.target
"""
CDI_REFRESH_POSTINST = """#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemctl --no-reload enable nvidia-cdi-refresh.path nvidia-cdi-refresh.service >/dev/null 2>&1 || true
fi
"""


# With NVIDIA's real nvidia-ctk (real_ctk.py): it answers everything but `cdi generate`, which needs NVML
# and a GPU and so stays with the imitation (simulated GPUs).
REAL_CTK = "usr/libexec/gpuforge/nvidia-ctk"
SIMULATED_CTK = "usr/libexec/gpuforge/nvidia-ctk-simulated"
CTK_WRAPPER = f"""#!/bin/sh
# nvidia-ctk (gpuforge lab): NVIDIA's own binary, except `cdi generate`, which sees the simulated GPUs.
if [ "$1" = cdi ] && [ "$2" = generate ]; then
    exec /{SIMULATED_CTK} "$@"
fi
exec /{REAL_CTK} "$@"
"""


def toolkit_packages(upstream: str, real_ctk: Path | None = None) -> list[Package]:
    runtime = _stub("nvidia-container-runtime")
    cli = "#!/bin/sh\necho 'nvidia-container-cli (gpuforge imitation): SIMULATED GPUs only' >&2\nexit 1\n"
    packages = family(
        f"{upstream}-1",
        [
            Member(
                "nvidia-container-toolkit",
                "NVIDIA Container toolkit (gpuforge imitation)",
                depends=("nvidia-container-toolkit-base", "libnvidia-container-tools"),
            ),
            Member(
                "nvidia-container-toolkit-base",
                "NVIDIA Container Toolkit Base (gpuforge imitation)",
                files=(
                    ("usr/bin/nvidia-ctk", _stub("nvidia-ctk", TOOLKIT_VERSION=upstream)),
                    ("usr/bin/nvidia-container-runtime", runtime),
                ),
            ),
            Member(
                "libnvidia-container-tools",
                "NVIDIA container runtime library (command-line tools, gpuforge imitation)",
                depends=("libnvidia-container1",),
                files=(("usr/bin/nvidia-container-cli", cli),),
            ),
            _library(
                "libnvidia-container1",
                f"libnvidia-container.so.{upstream}",
                "NVIDIA container runtime library (gpuforge imitation)",
            ),
        ],
    )
    if tuple(int(part) for part in upstream.split(".")[:2]) >= (1, 18):
        base = next(package for package in packages if package.name == "nvidia-container-toolkit-base")
        base.files.update(
            {
                "lib/systemd/system/nvidia-cdi-refresh.service": CDI_REFRESH_SERVICE,
                "lib/systemd/system/nvidia-cdi-refresh.path": CDI_REFRESH_PATH,
                CDI_REFRESH_ENV: "# NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml\n",
            }
        )
        base.conffiles.append("/" + CDI_REFRESH_ENV)
        base.postinst = CDI_REFRESH_POSTINST
    if real_ctk is not None:
        base = next(package for package in packages if package.name == "nvidia-container-toolkit-base")
        base.files[SIMULATED_CTK] = base.files.pop("usr/bin/nvidia-ctk")
        base.files["usr/bin/nvidia-ctk"] = CTK_WRAPPER
        base.blobs[REAL_CTK] = real_ctk
    return packages


def kernel_packages(kernel_release: str) -> list[Package]:
    header_files = ((f"usr/src/linux-headers-{kernel_release}/Makefile", "# imitation\n"),)
    return family(
        "1-1",
        [
            Member(
                f"linux-headers-{kernel_release}",
                "Header files for the lab host's running kernel"
                " (gpuforge imitation of the distribution archive)",
                files=header_files,
            )
        ],
    )


def _build_deb(package: Package, out_dir: Path, work: Path) -> None:
    root = work / f"{package.name}_{package.version}"
    (root / "DEBIAN").mkdir(parents=True)
    for rel, content in package.files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(0o755 if rel.startswith(("usr/bin/", "usr/libexec/")) else 0o644)
    for rel, origin in package.blobs.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(origin, path)
        path.chmod(0o755)
    control = [
        f"Package: {package.name}",
        f"Version: {package.version}",
        f"Architecture: {package.architecture}",
        "Maintainer: gpuforge test lab <lab@gpuforge.invalid>",
        "Section: non-free/libs",
        "Priority: optional",
    ]
    if package.source and package.source != package.name:
        control.append(f"Source: {package.source}")
    for name, entries in (
        ("Pre-Depends", package.pre_depends),
        ("Depends", package.depends),
        ("Recommends", package.recommends),
        ("Provides", package.provides),
        ("Conflicts", package.conflicts),
    ):
        if entries:
            control.append(f"{name}: " + ", ".join(entries))
    control.append(f"Description: {package.description}")
    (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
    if package.conffiles:
        (root / "DEBIAN/conffiles").write_text("".join(f"{path}\n" for path in package.conffiles))
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


def build(out: Path, kernel_release: str, real_ctk: dict[str, Path] | None = None) -> Path:
    """Build every repository under `out` (replacing it); return `out`.

    `real_ctk` maps toolkit versions to NVIDIA's real nvidia-ctk binary for that version (see real_ctk.py).
    """
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
            CUDA_REPO: cuda_repository_packages(),
            TOOLKIT_REPO: [
                pkg
                for upstream in TOOLKIT_VERSIONS
                for pkg in toolkit_packages(upstream, (real_ctk or {}).get(upstream))
            ],
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
