"""The one table the imitation CUDA repository for Debian 12 is generated from, each fact with its source.

Sources, named in the `origin` of each row:

- DEBIAN: the control fields of Debian 12's own packages (bookworm non-free/contrib, nvidia-graphics-drivers
  535.261.03-1 and nvidia-open-gpu-kernel-modules 535.261.03-1), read with `apt-cache show` from
  deb.debian.org. NVIDIA's CUDA repository for Debian is built from the same packaging, so its names and its
  `=` dependency graph are Debian's.
- CUDA-REPO: NVIDIA's CUDA repository for Debian 12 (driver-installation-guide: "Debian" and "Recent
  updates"): it names the open modules `nvidia-kernel-open-dkms` (Debian: `nvidia-open-kernel-dkms`), carries
  every branch side by side (570, 580, 590 ...), versions its packages `<driver>-1`, ships
  `nvidia-persistenced`, `nvidia-modprobe` and the fabric manager at the driver's version, and, from
  branch 580, `nvidia-driver-pinning-<branch>` to lock a branch (install it before the driver).
- FORUM: NVIDIA developer forum t/353805: `cuda-drivers-580` depends on `nvidia-driver (>= 580...)` only,
  so it pulls in 590 once the repository carries it.
- ASSUMED: not confirmed from a primary source; chosen to be as strict as the confirmed facts around it.

Dependencies on Debian packages outside the NVIDIA set (libc6, dkms, xserver-xorg-core, libgl1, debconf,
glx-alternative-nvidia ...) are left out: the lab hosts see no Debian archive, and none of them ties versions
of the driver together. Everything that does (`=` dependencies, versioned virtual packages such as
`nvidia-kernel-<version>` and `firmware-nvidia-gsp (= <upstream>)`) is kept exactly.

Placeholders in the fields: {v} the package version (`580.95.05-1`), {u} the upstream driver version
(`580.95.05`), {b} the branch (`580`).
"""

from __future__ import annotations

from dataclasses import dataclass

DEBIAN = "Debian 12 control fields (apt-cache show, bookworm non-free/contrib)"
CUDA_REPO = "NVIDIA CUDA repository for Debian 12 (driver-installation-guide)"
ASSUMED = "assumed (not confirmed from a primary source)"


@dataclass(frozen=True)
class Branch:
    """A driver branch as the CUDA repository carries it."""

    branch: str
    versions: tuple[str, ...]  # upstream driver versions, oldest first
    cuda: str  # the CUDA version nvidia-smi reports
    pinning: bool  # the repository carries nvidia-driver-pinning-<branch>
    origin: str


BRANCHES: tuple[Branch, ...] = (
    # Two versions, so "newest of the branch" and "exactly this older version" differ.
    Branch("570", ("570.158.01", "570.172.08"), "12.8", False, CUDA_REPO + "; no pinning package before 580"),
    Branch("580", ("580.95.05",), "13.0", True, CUDA_REPO + " (Recent updates: pinning packages)"),
    # The newer branch that a partial pin on an older branch resolves to (FORUM).
    Branch("590", ("590.44.01",), "13.1", True, CUDA_REPO + " (Recent updates: 590 and later)"),
)


@dataclass(frozen=True)
class DriverPackage:
    """One binary package of a driver version."""

    name: str
    source: str  # the source package, which `Package: src:<source>` in apt preferences matches
    origin: str
    depends: tuple[str, ...] = ()
    pre_depends: tuple[str, ...] = ()
    recommends: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    # What the imitation puts into the package: "smi", "library:<soname>", "dkms:<module source>",
    # "daemon:<binary>:<unit>", or "" for a package without files the roles look at.
    payload: str = ""
    # Only in branches from this one on (the fabric manager lost its branch suffix with 580), or before it.
    since: int = 0
    until: int = 10_000


GRAPHICS = "nvidia-graphics-drivers"
OPEN_MODULES = "nvidia-open-gpu-kernel-modules"

DRIVER_PACKAGES: tuple[DriverPackage, ...] = (
    DriverPackage(
        "nvidia-driver",
        GRAPHICS,
        DEBIAN,
        depends=(
            "nvidia-driver-libs (= {v})",
            "nvidia-driver-bin (= {v})",
            "xserver-xorg-video-nvidia (= {v})",
            "nvidia-vdpau-driver (= {v})",
            "nvidia-alternative (= {v})",
            "nvidia-kernel-dkms (= {v}) | nvidia-kernel-{u} | nvidia-open-kernel-{u}",
            "nvidia-support",
        ),
        pre_depends=("nvidia-installer-cleanup", "nvidia-legacy-check (>= 495)"),
        recommends=("libnvidia-cfg1 (= {v})", "nvidia-persistenced (>= {b})"),
        provides=("nvidia-driver-any",),
    ),
    DriverPackage(
        "nvidia-driver-libs",
        GRAPHICS,
        DEBIAN,
        depends=("libgl1-nvidia-glvnd-glx (= {v})", "nvidia-egl-icd (= {v})"),
        provides=("nvidia-driver-libs-any",),
    ),
    DriverPackage("libgl1-nvidia-glvnd-glx", GRAPHICS, DEBIAN, depends=("libglx-nvidia0 (= {v})",)),
    DriverPackage(
        "libglx-nvidia0",
        GRAPHICS,
        DEBIAN,
        depends=("nvidia-alternative (= {v})", "libnvidia-eglcore (= {v})", "libnvidia-glcore (= {v})"),
    ),
    DriverPackage(
        "nvidia-egl-icd", GRAPHICS, DEBIAN, depends=("nvidia-egl-common", "libegl-nvidia0 (= {v})")
    ),
    DriverPackage("nvidia-egl-common", GRAPHICS, DEBIAN),
    DriverPackage(
        "libegl-nvidia0",
        GRAPHICS,
        DEBIAN,
        depends=("nvidia-alternative (= {v})", "libnvidia-eglcore (= {v})"),
    ),
    DriverPackage("libnvidia-eglcore", GRAPHICS, DEBIAN, depends=("libnvidia-glvkspirv (= {v})",)),
    DriverPackage("libnvidia-glcore", GRAPHICS, DEBIAN, depends=("libnvidia-glvkspirv (= {v})",)),
    DriverPackage("libnvidia-glvkspirv", GRAPHICS, DEBIAN),
    DriverPackage(
        "nvidia-driver-bin",
        GRAPHICS,
        DEBIAN,
        depends=("nvidia-alternative (= {v})", "libnvidia-ml1 (>= 319) | libnvidia-ml.so.1 (>= 319)"),
    ),
    DriverPackage(
        "xserver-xorg-video-nvidia",
        GRAPHICS,
        DEBIAN,
        depends=("nvidia-alternative (= {v})", "nvidia-support", "libnvidia-glcore (= {v})"),
    ),
    DriverPackage("nvidia-vdpau-driver", GRAPHICS, DEBIAN, depends=("nvidia-alternative (= {v})",)),
    DriverPackage(
        "nvidia-alternative",
        GRAPHICS,
        DEBIAN,
        provides=("nvidia-alternative--kmod-alias", "nvidia-alternative-{u}", "nvidia-alternative-any"),
    ),
    DriverPackage("nvidia-legacy-check", GRAPHICS, DEBIAN, pre_depends=("nvidia-installer-cleanup",)),
    DriverPackage(
        "nvidia-kernel-support",
        GRAPHICS,
        DEBIAN,
        depends=(
            "nvidia-alternative (= {v})",
            "nvidia-alternative--kmod-alias",
            "nvidia-kernel-common (>= 20151021)",
            "nvidia-modprobe (>= {b})",
        ),
        provides=("nvidia-kernel-support--v1", "nvidia-kernel-support-any"),
    ),
    DriverPackage(
        "nvidia-kernel-dkms",
        GRAPHICS,
        DEBIAN,
        depends=("firmware-nvidia-gsp (= {u}) | firmware-nvidia-gsp-{u}", "nvidia-kernel-support--v1"),
        pre_depends=("nvidia-installer-cleanup",),
        provides=("nvidia-kernel-{u}", "nvidia-kernel-dkms-any (= {u})"),
        payload="dkms:nvidia-current",
    ),
    DriverPackage(
        "firmware-nvidia-gsp",
        GRAPHICS,
        DEBIAN,
        provides=("firmware-nvidia-gsp (= {u})", "firmware-nvidia-gsp-{u}"),
    ),
    DriverPackage(
        "nvidia-smi",
        GRAPHICS,
        DEBIAN,
        depends=("nvidia-alternative (= {v})", "libnvidia-ml1 (= {v})"),
        payload="smi",
    ),
    DriverPackage(
        "libnvidia-ml1",
        GRAPHICS,
        DEBIAN,
        depends=("nvidia-alternative (= {v})",),
        provides=("libnvidia-ml.so.1 (= {u})",),
        payload="library:libnvidia-ml.so.{u}",
    ),
    DriverPackage(
        "libcuda1",
        GRAPHICS,
        DEBIAN,
        depends=(
            "nvidia-support",
            "nvidia-alternative (= {v})",
            "libnvidia-ptxjitcompiler1 (= {v})",
            "libnvidia-pkcs11-openssl3 (= {v})",
        ),
        pre_depends=("nvidia-legacy-check (>= 495)",),
        provides=("libcuda.so.1 (= {u})", "libcuda1-any"),
        payload="library:libcuda.so.{u}",
    ),
    DriverPackage("libnvidia-ptxjitcompiler1", GRAPHICS, DEBIAN),
    DriverPackage("libnvidia-pkcs11-openssl3", GRAPHICS, DEBIAN, depends=("nvidia-alternative (= {v})",)),
    DriverPackage(
        "libnvidia-cfg1",
        GRAPHICS,
        DEBIAN,
        depends=("nvidia-alternative (= {v})",),
        provides=("libnvidia-cfg.so.1 (= {u})", "libnvidia-cfg1-any"),
    ),
    # The open modules: Debian's control fields under the CUDA repository's name.
    DriverPackage(
        "nvidia-kernel-open-dkms",
        OPEN_MODULES,
        DEBIAN + "; named as in the " + CUDA_REPO,
        depends=("firmware-nvidia-gsp (= {u}) | firmware-nvidia-gsp-{u}", "nvidia-open-kernel-support--v1"),
        pre_depends=("nvidia-installer-cleanup",),
        provides=("nvidia-open-kernel-{u}", "nvidia-open-kernel-dkms-any (= {u})"),
        payload="dkms:nvidia-current-open",
    ),
    DriverPackage(
        "nvidia-open-kernel-support",
        OPEN_MODULES,
        DEBIAN,
        depends=(
            "nvidia-alternative-{u}",
            "nvidia-kernel-common (>= 20151021)",
            "nvidia-modprobe (>= {b})",
        ),
        provides=(
            "nvidia-kernel-support-any",
            "nvidia-open-kernel-support--v1",
            "nvidia-open-kernel-support-{u}",
        ),
        conflicts=("nvidia-open-kernel-support-{u}",),
    ),
    # Own source packages in Debian, versioned like the driver in the CUDA repository.
    DriverPackage(
        "nvidia-persistenced",
        "nvidia-persistenced",
        DEBIAN + "; version as in the " + CUDA_REPO,
        depends=("libnvidia-cfg1 | libnvidia-cfg.so.1 | libnvidia-cfg1-any",),
        payload="daemon:nvidia-persistenced:nvidia-persistenced",
    ),
    DriverPackage("nvidia-modprobe", "nvidia-modprobe", DEBIAN + "; version as in the " + CUDA_REPO),
    DriverPackage(
        "nvidia-fabricmanager",
        "nvidia-fabricmanager",
        CUDA_REPO + " (cloud-native-stack playbooks/nvidia-driver.yaml: unsuffixed from 580)",
        payload="daemon:nv-fabricmanager:nvidia-fabricmanager",
        since=580,
    ),
    DriverPackage(
        "nvidia-fabricmanager-{b}",
        "nvidia-fabricmanager",
        CUDA_REPO + " (cloud-native-stack playbooks/nvidia-driver.yaml: suffixed up to 570)",
        payload="daemon:nv-fabricmanager:nvidia-fabricmanager",
        until=579,
    ),
    # The trap users hit (FORUM): ">=" only, so the newest branch satisfies it.
    DriverPackage(
        "cuda-drivers-{b}",
        "cuda-drivers",
        "NVIDIA developer forum t/353805 (Depends as quoted there, nvidia-settings/-xconfig left out)",
        depends=("nvidia-driver (>= {u})", "nvidia-driver-cuda (>= {u})", "nvidia-kernel-dkms (>= {u})"),
    ),
    DriverPackage(
        "nvidia-driver-cuda",
        GRAPHICS,
        "NVIDIA developer forum t/353805 (exists); its dependencies: " + ASSUMED,
        depends=("libcuda1 (= {v})", "nvidia-smi (= {v})"),
    ),
)


@dataclass(frozen=True)
class SharedPackage:
    """A package of the set whose version does not follow the driver (one version for every branch)."""

    name: str
    source: str
    version: str
    origin: str
    depends: tuple[str, ...] = ()


SHARED_PACKAGES: tuple[SharedPackage, ...] = (
    SharedPackage("nvidia-support", "nvidia-support", "20220217+3~deb12u1", DEBIAN),
    SharedPackage("nvidia-kernel-common", "nvidia-support", "20220217+3~deb12u1", DEBIAN),
    SharedPackage("nvidia-installer-cleanup", "nvidia-support", "20220217+3~deb12u1", DEBIAN),
)

# The pinning package of a branch: an apt preferences file locking every source package of the driver to the
# branch. Its name and "install it before the driver" are CUDA_REPO facts; its version and the file's exact
# contents are ASSUMED (the Ubuntu ones carry versions like 610-2ubuntu1, not the driver's).
PINNING_SOURCES: tuple[str, ...] = (
    GRAPHICS,
    OPEN_MODULES,
    "nvidia-persistenced",
    "nvidia-modprobe",
    "nvidia-fabricmanager",
)
PINNING_VERSION = "{b}-1"
PINNING_FILE = "etc/apt/preferences.d/nvidia-driver-pinning-{b}"
PINNING_PRIORITY = 1000


def pinning_preferences(branch: str) -> str:
    sources = " ".join(f"src:{source}" for source in PINNING_SOURCES)
    return (
        f"# Keep the NVIDIA driver on branch {branch} (nvidia-driver-pinning-{branch}).\n"
        f"Package: {sources}\nPin: version {branch}.*\nPin-Priority: {PINNING_PRIORITY}\n"
    )


def package_versions(branch: Branch) -> list[tuple[str, str]]:
    """(upstream version, package version) of every driver version of a branch."""
    return [(upstream, f"{upstream}-1") for upstream in branch.versions]


def fill(text: str, branch: str, upstream: str, version: str) -> str:
    return text.format(b=branch, u=upstream, v=version)


# NVIDIA's CUDA repository for RHEL/Rocky/AlmaLinux 8 and 9: the same driver versions (BRANCHES) as RPMs of
# the module streams nvidia-driver:<branch>-open / -dkms. No RPM repository is built from this table (none is
# reachable from the test machine to check it against); the render tests of the role's dnf path read it.
RHEL = "NVIDIA CUDA repository for RHEL (driver-installation-guide: Red Hat, kernel modules)"
RHEL_EPOCH = "NVIDIA driver-installation-guide, Version locking (RPMs carry epoch 3)"


@dataclass(frozen=True)
class RpmPackage:
    """One RPM of a driver version in the CUDA repository for RHEL."""

    name: str
    source: str  # the source RPM's name
    epoch: str
    origin: str
    modules: str = ""  # "open" or "proprietary" for a kernel module package; "" for both
    release: str = "1.el{major}"  # {major}: the RHEL major version


RPM_PACKAGES: tuple[RpmPackage, ...] = (
    RpmPackage("nvidia-driver", "nvidia-driver", "3", RHEL + "; epoch: " + RHEL_EPOCH),
    RpmPackage("nvidia-driver-libs", "nvidia-driver", "3", RHEL + "; epoch: " + RHEL_EPOCH),
    RpmPackage("nvidia-driver-cuda", "nvidia-driver", "3", RHEL + "; epoch: " + RHEL_EPOCH),
    RpmPackage(
        "nvidia-driver-cuda-libs", "nvidia-driver", "3", ASSUMED + " (a dependency the role never names)"
    ),
    RpmPackage(
        "nvidia-kmod-common", "nvidia-kmod-common", "3", ASSUMED + " (a dependency the role never names)"
    ),
    RpmPackage("kmod-nvidia-open-dkms", "kmod-nvidia-open-dkms", "3", RHEL, modules="open"),
    RpmPackage("kmod-nvidia-latest-dkms", "kmod-nvidia-latest-dkms", "3", RHEL, modules="proprietary"),
    RpmPackage("nvidia-persistenced", "nvidia-persistenced", "3", RHEL + "; epoch: " + RHEL_EPOCH),
    RpmPackage("nvidia-modprobe", "nvidia-modprobe", "3", RHEL + "; epoch: " + RHEL_EPOCH),
    # cloud-native-stack playbooks/nvidia-driver.yaml installs nvidia-fabric-manager-<version>-1.
    RpmPackage(
        "nvidia-fabric-manager",
        "nvidia-fabric-manager",
        "0",
        "cloud-native-stack playbooks/nvidia-driver.yaml (name, release -1); no epoch: " + ASSUMED,
        release="1",
    ),
)


def rpm_version(package: RpmPackage, upstream: str, major: str) -> str:
    """The package's version as rpm prints it with %{EPOCH}:%{VERSION}-%{RELEASE}."""
    epoch = package.epoch if package.epoch != "0" else "(none)"
    return f"{epoch}:{upstream}-{package.release.format(major=major)}"
