#!/usr/bin/env python3
"""Test lab for the gpuforge.nodes collection: real Debian 12 hosts and imitation NVIDIA repositories.

A host is a rootful podman container (runc) booted with systemd from a debootstrap image, reached over SSH on
a loopback port (host network, so it also reaches the repository server on 127.0.0.1). Only the GPU hardware
is simulated: each host gets a "hardware" directory describing its GPUs, NVSwitches and Secure Boot state,
mounted over /sys/bus/pci/devices, /sys/firmware and /var/lib/gpuforge-sim, which the imitation driver's
stub `nvidia-smi` reads. Everything else (apt, dpkg, systemd, containerd, sshd) is the real Debian software.

Used by the molecule scenarios, the benchmark and the demo:

    lab.py image                                # build or reuse the cached host image
    lab.py up --name demo --host node1=h100:8,nvswitch:4 --host node2=t4:1
    lab.py down --name demo

`up` prints a JSON document with the inventory path, the hosts and the repository URLs.

Labs of one name are one lab: `up` replaces what runs under that name. Two checkouts running the same
scenarios at once keep apart with GPUFORGE_LAB_PREFIX (put before every container name and lab label, e.g.
"a-") and GPUFORGE_LAB_STATE (the state directory, which the molecule scenarios read too).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import imitation_repo
import real_ctk
from gpuforge_lab.devcluster.image import debian_image
from gpuforge_lab.devcluster.realnodes import remove_containers

# Bump when the image recipe changes; the cache key also covers the package list.
IMAGE_RECIPE_VERSION = "3"
IMAGE_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "python3-debian",
    "containerd",
    "kmod",
    "initramfs-tools",
    "procps",
    "iproute2",
)
# Host operating systems: Debian 12 is what the roles support; Debian 13 serves as a real unsupported OS.
SUITES = {"debian12": "bookworm", "debian13": "trixie"}
DEFAULT_OS = "debian12"
LAB_LABEL = "io.gpuforge.lab"
STATE_ROOT = Path(os.environ.get("GPUFORGE_LAB_STATE", "/tmp/gpuforge-ansible-lab"))
# Namespace of the podman objects (containers, labels), so labs of another checkout are never touched.
LAB_PREFIX = os.environ.get("GPUFORGE_LAB_PREFIX", "")
# runc instead of crun and explicit ulimits: this sandbox lacks CAP_SYS_RESOURCE and runs cgroup v1+v2 hybrid.
PODMAN_RUN_COMPAT = ("--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")


def log(message: str) -> None:
    print(f"lab: {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, **kwargs)  # type: ignore[call-overload, no-any-return]


# --- Host image ---------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Beside the control-plane build: under GPUFORGE_CACHE, else $XDG_CACHE_HOME/gpuforge or ~/.cache."""
    return real_ctk.cache_root()


def image_version(os_name: str = DEFAULT_OS) -> str:
    suite = SUITES[os_name]
    digest = hashlib.sha256(" ".join((IMAGE_RECIPE_VERSION, suite, *IMAGE_PACKAGES)).encode())
    return f"{suite}-{IMAGE_RECIPE_VERSION}-{digest.hexdigest()[:10]}"


def image_ref(os_name: str = DEFAULT_OS) -> str:
    return f"localhost/gpuforge-node:{image_version(os_name)}"


def _tarball(os_name: str) -> Path:
    return cache_dir() / f"gpuforge-node-{image_version(os_name)}.tar.zst"


def _prepare_host(rootfs: Path) -> None:
    # Hosts must not reach the internet through apt: they only know the imitation repositories.
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True)
    (rootfs / "var/lib/apt/lists").mkdir(parents=True, exist_ok=True)
    for lists in (rootfs / "var/lib/apt/lists").glob("*_dists_*"):
        lists.unlink()
    (rootfs / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/ssh/sshd_config.d/10-gpuforge-lab.conf").write_text(
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n"
    )
    (rootfs / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    (rootfs / "etc/hostname").write_text("gpuforge-node\n")
    # Units that make no sense in a container (and slow its boot down).
    for unit in ("systemd-networkd-wait-online.service", "getty@tty1.service", "e2scrub_reap.service"):
        (rootfs / "etc/systemd/system" / unit).unlink(missing_ok=True)
        with contextlib.suppress(FileExistsError):
            (rootfs / "etc/systemd/system" / unit).symlink_to("/dev/null")
    (rootfs / "var/lib/gpuforge-sim").mkdir(parents=True, exist_ok=True)


def build_image(os_name: str = DEFAULT_OS, force: bool = False) -> str:
    """Return the podman image reference, building or importing it when missing or broken."""
    suite = SUITES[os_name]
    return debian_image(
        image_ref(os_name),
        _tarball(os_name),
        suite,
        IMAGE_PACKAGES,
        _prepare_host,
        log,
        stale=f"gpuforge-node-{suite}-*.tar.zst",
        force=force,
    )


# --- Simulated hardware -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_mib: int
    compute_cap: str
    mig_capable: bool
    pci_device_id: str


GPU_MODELS: dict[str, GpuModel] = {
    "t4": GpuModel("Tesla T4", 15360, "7.5", False, "0x1eb8"),
    "a100": GpuModel("NVIDIA A100 80GB PCIe", 81920, "8.0", True, "0x20b5"),
    "h100": GpuModel("NVIDIA H100 80GB HBM3", 81559, "9.0", True, "0x2330"),
    "l40s": GpuModel("NVIDIA L40S", 46068, "8.9", False, "0x26b9"),
    "l4": GpuModel("NVIDIA L4", 23034, "8.9", False, "0x27b8"),
}
NVSWITCH_PCI_DEVICE_ID = "0x22a3"


@dataclass
class HostSpec:
    """What hardware a lab host pretends to have, parsed from e.g. `h100:8,nvswitch:4,secure-boot`."""

    name: str
    gpus: list[str] = field(default_factory=list)
    nvswitches: int = 0
    secure_boot: bool = False
    os: str = DEFAULT_OS
    # Debian's real archive (its scenario writes the sources) instead of the imitation's kernel headers.
    debian_archive: bool = False

    @classmethod
    def parse(cls, text: str) -> HostSpec:
        name, _, spec = text.partition("=")
        host = cls(name=name)
        for item in filter(None, spec.split(",")):
            key, _, count = item.partition(":")
            if key == "secure-boot":
                host.secure_boot = True
            elif key == "debian-archive":
                host.debian_archive = True
            elif key == "os" and count in SUITES:
                host.os = count
            elif key == "nvswitch":
                host.nvswitches = int(count or 1)
            elif key in GPU_MODELS:
                host.gpus += [key] * int(count or 1)
            elif key != "none":
                raise SystemExit(f"lab: unknown hardware {key!r} in {text!r}; known: {sorted(GPU_MODELS)}")
        return host


def write_hardware(spec: HostSpec, directory: Path) -> None:
    """Describe the simulated hardware as the files the host will see."""
    shutil.rmtree(directory, ignore_errors=True)
    pci = directory / "pci"
    pci.mkdir(parents=True)
    gpus = []
    for index, key in enumerate(spec.gpus):
        model = GPU_MODELS[key]
        bus_id = f"0000:{0x18 + index * 0x10:02x}:00.0"
        gpus.append(
            {
                "index": index,
                "name": model.name,
                "uuid": "GPU-" + hashlib.md5(f"{spec.name}/{index}".encode()).hexdigest(),
                "memory_mib": model.memory_mib,
                "compute_cap": model.compute_cap,
                "mig_capable": model.mig_capable,
                "pci_bus_id": bus_id,
            }
        )
        _pci_device(pci / bus_id, "0x10de", model.pci_device_id, "0x030200")
    for index in range(spec.nvswitches):
        _pci_device(pci / f"0000:{0xA0 + index:02x}:00.0", "0x10de", NVSWITCH_PCI_DEVICE_ID, "0x068000")
    _pci_device(pci / "0000:00:00.0", "0x8086", "0x1237", "0x060000")  # a host bridge, so GPUs are not alone
    (directory / "gpus.json").write_text(
        json.dumps({"simulated": True, "gpus": gpus, "nvswitches": spec.nvswitches}, indent=2) + "\n"
    )
    efivars = directory / "firmware/efi/efivars"
    efivars.mkdir(parents=True)
    # UEFI variable file: 4 attribute bytes, then the value (1 = Secure Boot enabled).
    secure_boot = efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
    secure_boot.write_bytes(b"\x06\x00\x00\x00" + (b"\x01" if spec.secure_boot else b"\x00"))


def _pci_device(path: Path, vendor: str, device: str, pci_class: str) -> None:
    path.mkdir(parents=True)
    (path / "vendor").write_text(vendor + "\n")
    (path / "device").write_text(device + "\n")
    (path / "class").write_text(pci_class + "\n")


# --- Lab lifecycle ------------------------------------------------------------------------------------


@dataclass
class LabHost:
    name: str
    container: str
    address: str
    port: int
    user: str
    identity_file: str


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            if sock.recv(4).startswith(b"SSH"):
                return True
        time.sleep(0.2)
    return False


def _real_ctk() -> dict[str, Path]:
    """NVIDIA's nvidia-ctk for the toolkit version it is built for (once, then cached); empty without Go."""
    binary = real_ctk.ensure(real_ctk.VERSION)
    return {real_ctk.VERSION: binary} if binary else {}


def start_repo_server(state: Path) -> int:
    """Build the imitation repositories under `state` (once) and serve them on a loopback port (returned).

    Also how the local control plane bootstraps its real nodes with the collection's playbooks."""
    repo = state / "repo"
    if not (repo / imitation_repo.STAMP).is_file():
        imitation_repo.build(repo, kernel_release=os.uname().release, real_ctk=_real_ctk())
    port = _free_port()
    log_file = (state / "repo-server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(repo), str(port)],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    (state / "repo-server.pid").write_text(f"{server.pid}\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return port
        time.sleep(0.1)
    raise SystemExit("lab: the repository server did not start")


def stop_repo_server(state: Path) -> None:
    pid_file = state / "repo-server.pid"
    if pid_file.is_file():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


def repository_vars(repo_url: str) -> dict[str, str]:
    """The roles' variables that point them at the imitation repositories served at `repo_url`."""
    return {
        "nvidia_driver_repo_base_url": f"{repo_url}/compute/cuda/repos",
        "nvidia_container_toolkit_repo_base_url": f"{repo_url}/libnvidia-container",
    }


def run_systemd_host(
    container: str,
    hostname: str,
    labels: dict[str, str],
    image: str,
    hardware: Path,
    volumes: list[str],
    podman_args: tuple[str, ...] = (),
) -> None:
    """Boot a host: a privileged systemd container on the host network, seeing `hardware` as its GPUs.

    Also the way the local control plane starts its real kubelet nodes (gpuforge_lab.devcluster.realnodes).
    """
    subprocess.run(["podman", "rm", "--force", "--time", "0", container], check=False, capture_output=True)
    label_args = [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}")]
    hardware_volumes = [
        f"{hardware}:/var/lib/gpuforge-sim:ro",
        f"{hardware}/pci:/sys/bus/pci/devices:ro",
        f"{hardware}/firmware:/sys/firmware:ro",
    ]
    run(
        [
            "podman",
            "run",
            "--detach",
            "--quiet",
            *PODMAN_RUN_COMPAT,
            "--name",
            container,
            "--hostname",
            hostname,
            *label_args,
            *podman_args,
            "--network",
            "host",
            "--privileged",
            "--systemd",
            "always",
            "--restart",
            "always",
            *(arg for volume in (*hardware_volumes, *volumes) for arg in ("--volume", volume)),
            image,
            "/sbin/init",
        ],
        stdout=subprocess.DEVNULL,
    )


def debian_archive_cache(os_name: str) -> Path:
    """apt's download directory for hosts on Debian's real archive, kept across labs.

    apt names each .deb by package, version and architecture and checks it against the index's hash before
    using it, so a rerun downloads only versions it has not seen (the driver set is hundreds of MB).
    """
    archives = cache_dir() / "debian-archive" / SUITES[os_name]
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    return archives


def _start_host(lab: str, state: Path, spec: HostSpec, image: str) -> LabHost:
    container = f"{LAB_PREFIX}gpuforge-lab-{lab}-{spec.name}"
    hardware = state / "hw" / spec.name
    write_hardware(spec, hardware)
    port = _free_port()
    sshd = state / "sshd" / f"{spec.name}.conf"
    sshd.parent.mkdir(exist_ok=True)
    sshd.write_text(f"Port {port}\nListenAddress 127.0.0.1\n")
    volumes = [
        f"{sshd}:/etc/ssh/sshd_config.d/20-lab-port.conf:ro",
        f"{state}/ssh/id_ed25519.pub:/root/.ssh/authorized_keys:ro",
    ]
    if spec.debian_archive:
        volumes.append(f"{debian_archive_cache(spec.os)}:/var/cache/apt/archives")
    else:
        # The host's own distribution archive: here only the kernel headers of the running kernel.
        volumes.append(f"{state}/distro.sources:/etc/apt/sources.list.d/debian-lab.sources:ro")
    run_systemd_host(container, spec.name, {LAB_LABEL: f"{LAB_PREFIX}{lab}"}, image, hardware, volumes)
    return LabHost(spec.name, container, "127.0.0.1", port, "root", str(state / "ssh/id_ed25519"))


def _inotify_hint() -> str:
    """Why hosts may not boot: every systemd host takes inotify instances from one per-user kernel limit."""
    limit_file = Path("/proc/sys/fs/inotify/max_user_instances")
    if not limit_file.is_file():
        return ""
    in_use = 0
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            in_use += sum(1 for fd in fd_dir.iterdir() if os.readlink(fd) == "anon_inode:inotify")
    limit = int(limit_file.read_text())
    if in_use < limit * 0.9:
        return ""
    return (
        f"; {in_use} inotify instances in use, fs.inotify.max_user_instances is {limit}: systemd in a new "
        "host cannot start its units. Stop labs you no longer need (podman ps) or raise the limit."
    )


def lab_state(lab: str) -> Path:
    return STATE_ROOT / lab


def up(lab: str, specs: list[HostSpec]) -> dict[str, object]:
    """Start (replacing any previous lab of that name) the repository server and the hosts."""
    down(lab)
    state = lab_state(lab)
    state.mkdir(parents=True)
    images = {spec.os: build_image(spec.os) for spec in specs}
    (state / "ssh").mkdir()
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(state / "ssh/id_ed25519")])
    repo_port = start_repo_server(state)
    distro_sources = state / "distro.sources"
    distro_sources.write_text(imitation_repo.distro_sources(state / "repo", f"http://127.0.0.1:{repo_port}"))
    hosts = [_start_host(lab, state, spec, images[spec.os]) for spec in specs]
    # Generous: on a loaded 2-core machine several systemd hosts booting at once take a while.
    for host in hosts:
        if not _wait_for_port(host.port, timeout=120):
            raise SystemExit(
                f"lab: sshd of {host.name} did not come up (podman logs {host.container}){_inotify_hint()}"
            )
    repo_url = f"http://127.0.0.1:{repo_port}"
    lab_vars = repository_vars(repo_url)
    inventory = {
        "all": {
            "children": {
                "gpu_nodes": {
                    "hosts": {
                        host.name: {
                            "ansible_host": host.address,
                            "ansible_port": host.port,
                            "lab_container": host.container,
                        }
                        for host in hosts
                    }
                }
            },
            "vars": {
                "ansible_user": "root",
                # Every host runs Debian's python3: no interpreter discovery round trip per host and run.
                "ansible_python_interpreter": "/usr/bin/python3",
                "ansible_ssh_private_key_file": str(state / "ssh/id_ed25519"),
                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                **lab_vars,
            },
        }
    }
    inventory_path = state / "inventory.yml"
    inventory_path.write_text(json.dumps(inventory, indent=2) + "\n")  # JSON is valid YAML
    result: dict[str, object] = {
        "lab": lab,
        "inventory": str(inventory_path),
        "repo_url": repo_url,
        "vars": lab_vars,
        "hosts": [asdict(host) for host in hosts],
        # The shape molecule's default driver reads (molecule_instance_config).
        "instance_config": [
            {
                "instance": host.name,
                "address": host.address,
                "port": host.port,
                "user": host.user,
                "identity_file": host.identity_file,
            }
            for host in hosts
        ],
    }
    (state / "lab.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def down(lab: str) -> None:
    """Remove the lab's containers and stop its repository server; idempotent."""
    remove_containers(f"{LAB_LABEL}={LAB_PREFIX}{lab}")
    state = lab_state(lab)
    stop_repo_server(state)
    shutil.rmtree(state, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    image = sub.add_parser("image", help="build or reuse the cached Debian 12 host image")
    image.add_argument("--rebuild", action="store_true", help="rebuild even if the cache looks sound")
    image.add_argument("--os", choices=sorted(SUITES), default=DEFAULT_OS)
    repo = sub.add_parser("repo", help="build the imitation repositories into a directory")
    repo.add_argument("directory", type=Path)
    start = sub.add_parser("up", help="start the repository server and hosts; print JSON with the inventory")
    start.add_argument("--name", required=True, help="lab name (several labs can run side by side)")
    start.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="e.g. node1=h100:8,nvswitch:4, node2=t4:1,secure-boot, node3=none, node4=l4:1,os:debian13",
    )
    start.add_argument("--hosts", type=int, default=0, help="add N hosts named nodeN with one L4 each")
    stop = sub.add_parser("down", help="remove a lab's hosts and stop its repository server")
    stop.add_argument("--name", required=True)
    args = parser.parse_args(argv)

    if args.command == "image":
        print(build_image(args.os, force=args.rebuild))
    elif args.command == "repo":
        imitation_repo.build(args.directory, kernel_release=os.uname().release, real_ctk=_real_ctk())
        print(args.directory)
    elif args.command == "up":
        specs = [HostSpec.parse(text) for text in args.host]
        specs += [HostSpec.parse(f"node{i + 1}=l4:1") for i in range(args.hosts)]
        if not specs:
            parser.error("give at least one --host or --hosts N")
        print(json.dumps(up(args.name, specs), indent=2))
    elif args.command == "down":
        down(args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
