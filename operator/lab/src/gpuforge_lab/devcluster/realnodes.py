"""Real kubelet nodes of the local control plane: the Ansible lab's Debian 12 hosts, each running a kubelet of
the cluster's release and containerd 1.7 (CDI enabled), joined with a client certificate signed by the
cluster's CA. Only the GPUs are pretend: each host sees the lab's simulated hardware files.

Hosts share the machine's network (nothing leaves it): every kubelet listens on loopback ports of its own, and
pods get a bridge of their node's own, with no route off the machine. No image is ever pulled: the sandbox
(pause), workload and plugin images are built here and imported into each node's containerd.

Each host has the imitation driver's `nvidia-smi` (the lab's stub, reading the simulated hardware) where a
host-installed driver puts it, so operands that look for the driver under the driver root find one. Pods
reach the API server as in-cluster clients do, at `kubernetes.default`'s service IP: a DNAT rule on the
node's bridge stands in for kube-proxy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from gpuforge import compat
from gpuforge_lab.devcluster import pki
from gpuforge_lab.devcluster.build import NODE_PROGRAMS, Binaries, build_nodes

PACKAGE_DIR = Path(__file__).parent
NODE_IMAGE_DIR = PACKAGE_DIR / "nodeimage"
LAB_SCRIPT = PACKAGE_DIR.parents[4] / "tests" / "ansible" / "lab.py"
CLUSTER_LABEL = "io.gpuforge.devcluster"
# Set on every real node, so tests and `status` tell them from kwok's.
REAL_NODE_LABEL = "gpuforge.io/real-node"
IMAGE_REPOSITORY = "localhost/gpuforge"
# The DRA kubelet plugin's image: it needs a shell besides its program (the rendered DaemonSet's init
# container runs `sh -c`), so it is not a one-file image like the other node programs.
DRA_PLUGIN_PROGRAM = "gpu-kubelet-plugin"
DRA_PLUGIN_REPOSITORY = f"{IMAGE_REPOSITORY}/{DRA_PLUGIN_PROGRAM}"
# The release tags it also carries on the nodes, so a GpuStack with `dra.image: DRA_PLUGIN_REPOSITORY`
# finds it: the releases whose gpu-kubelet-plugin flags and failures it follows (v25.12.0's feature gates).
DRA_PLUGIN_RELEASES = ("v25.12.0", "v0.4.0")
# The driver the hosts pretend to have installed: the lab's 580 branch (tests/ansible/nvidia_packages.py).
HOST_DRIVER_VERSION = "580.95.05"
HOST_CUDA_VERSION = "13.0"
NVIDIA_SMI_STUB = LAB_SCRIPT.parent / "stubs" / "nvidia-smi"
# The imitation toolkit's nvidia-container-runtime (runc, giving a container that asks for GPUs through
# NVIDIA_VISIBLE_DEVICES the simulated driver): the file the imitation toolkit package installs too.
NVIDIA_RUNTIME_STUB = LAB_SCRIPT.parent / "stubs" / "nvidia-container-runtime"
# Where the collection's playbooks are, for a pool bootstrapped with one (Pool.bootstrap).
COLLECTION_ROOT = LAB_SCRIPT.parents[2]
# How long a bootstrap playbook may take: about two minutes on an idle machine (driver, toolkit, NFD).
BOOTSTRAP_TIMEOUT_SECONDS = 1200.0
# The machine's iptables rules a node adds carry this comment prefix, so removing the node finds them.
RULE_COMMENT_PREFIX = "gpuforge-node:"
# The pretend device plugin is also tagged as each NVIDIA release, so the operator's rendered DaemonSet
# runs it with nothing but `devicePlugin.image` changed (the tag is the release, as the renderer writes it).
DEVICE_PLUGIN_REPOSITORY = f"{IMAGE_REPOSITORY}/k8s-device-plugin"
# What each program's image declares besides its entry point. NVIDIA's device plugin image asks the
# nvidia runtime for every GPU's driver files (k8s-device-plugin deployments/container/Dockerfile).
IMAGE_ENV = {"gpu-device-plugin": {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}}


# How long a host may take to start containerd, and its kubelet to turn Ready. A few seconds on an idle
# machine; minutes on one that also runs the rest of the test suite and builds.
BOOT_TIMEOUT_SECONDS = 300.0


log = logging.getLogger(__name__)


class RealNodeError(RuntimeError):
    pass


@dataclass(frozen=True)
class RealNode:
    name: str
    container: str
    kubelet_port: int
    healthz_port: int
    gpus: tuple[str, ...]
    # The collection's playbook (playbooks/<name>) run on the host before its kubelet starts; None: the
    # host gets the lab's own containerd configuration, nvidia-smi and runtime.
    bootstrap: str | None = None


def _lab() -> ModuleType:
    """The Ansible lab (tests/ansible/lab.py): its host image, hardware files and way of booting hosts."""
    spec = importlib.util.spec_from_file_location("gpuforge_ansible_lab", LAB_SCRIPT)
    if spec is None or spec.loader is None or not LAB_SCRIPT.is_file():
        raise RealNodeError(f"real nodes need the lab of a gpuforge checkout ({LAB_SCRIPT} is missing)")
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def _run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    if result.returncode != 0:
        raise RealNodeError(f"{' '.join(command[:4])} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return result


def can_boot_hosts() -> str | None:
    """None where this machine can boot real nodes; else why not."""
    if shutil.which("podman") is None:
        return "real nodes boot lab hosts with podman, which is not installed"
    if os.geteuid() != 0:
        return "real nodes boot privileged lab hosts: rootful podman (run as root)"
    return None


# Every real node is a systemd host running containerd and a kubelet, each holding several inotify
# instances; with the kernel's default of 128 per user, a few hosts beside the machine's own services
# exhaust them and containerd fails with "too many open files" (the limit kind documents raising too).
INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
MIN_INOTIFY_INSTANCES = 512


def raise_inotify_limit(
    limit_file: Path = INOTIFY_INSTANCES, minimum: int = MIN_INOTIFY_INSTANCES
) -> int | None:
    """Raise the machine's inotify instance limit to `minimum` if it is lower (real nodes run as root);
    the old limit when it was raised, else None."""
    try:
        current = int(limit_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if current >= minimum:
        return None
    try:
        limit_file.write_text(f"{minimum}\n")
    except OSError:
        return None
    return current


def _image_exists(ref: str) -> bool:
    return subprocess.run(["podman", "image", "exists", ref], check=False).returncode == 0


def node_image() -> str:
    """The lab's Debian 12 host image plus Debian 13's containerd and the CNI plugins (cached by digest)."""
    base = str(_lab().build_image("debian12"))
    containerfile = (NODE_IMAGE_DIR / "Containerfile").read_bytes()
    digest = hashlib.sha256(containerfile + base.encode()).hexdigest()[:12]
    ref = f"{IMAGE_REPOSITORY}-realnode:{digest}"
    if not _image_exists(ref):
        _run(
            [
                "podman",
                "build",
                "--network",
                "host",
                "--build-arg",
                f"BASE={base}",
                "-t",
                ref,
                str(NODE_IMAGE_DIR),
            ]
        )
    return ref


def program_image_ref(binaries: Binaries, program: str) -> str:
    return f"{IMAGE_REPOSITORY}/{program}:{binaries.directory.parent.name.lower()}"


def program_images(binaries: Binaries) -> dict[str, Path]:
    """Each static node program as a one-file image archive beside the build (built once per build key)."""
    archives: dict[str, Path] = {}
    images_dir = binaries.directory.parent / "images"
    images_dir.mkdir(exist_ok=True)
    for program in NODE_PROGRAMS:
        if program == DRA_PLUGIN_PROGRAM:
            continue
        env = "".join(f"ENV {key}={value}\n" for key, value in IMAGE_ENV.get(program, {}).items())
        containerfile = f'FROM scratch\nCOPY {program} /{program}\n{env}ENTRYPOINT ["/{program}"]\n'
        recipe = hashlib.sha256(containerfile.encode()).hexdigest()[:8]
        archive = images_dir / f"{program}-{recipe}.tar"
        ref = program_image_ref(binaries, program)
        if not archive.is_file():
            with tempfile.TemporaryDirectory() as context:
                shutil.copy2(binaries.path(program), Path(context) / program)
                (Path(context) / "Containerfile").write_text(containerfile)
                _run(["podman", "build", "-t", ref, context])
            partial = archive.with_suffix(".partial")
            _run(["podman", "save", "--format", "docker-archive", "-o", str(partial), ref])
            partial.rename(archive)
        archives[program] = archive
    return archives


DRA_PLUGIN_CONTAINERFILE = """ARG BASE
FROM ${BASE} AS userland
FROM scratch
# A POSIX shell and sleep from the host image's Debian, with the C library they link: enough for the
# rendered DaemonSet's wait-for-driver init container.
COPY --from=userland /bin/dash /bin/sh
COPY --from=userland /bin/sleep /bin/sleep
COPY --from=userland /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/libc.so.6
COPY --from=userland /lib64/ld-linux-x86-64.so.2 /lib64/ld-linux-x86-64.so.2
COPY gpu-kubelet-plugin /usr/bin/gpu-kubelet-plugin
ENV PATH=/usr/bin:/bin
ENTRYPOINT ["/usr/bin/gpu-kubelet-plugin"]
"""


def dra_plugin_image(binaries: Binaries, base: str) -> Path:
    """The pretend DRA kubelet plugin's image as an archive beside the build (built once per build key);
    its reference is program_image_ref(binaries, DRA_PLUGIN_PROGRAM)."""
    images_dir = binaries.directory.parent / "images"
    images_dir.mkdir(exist_ok=True)
    archive = images_dir / f"{DRA_PLUGIN_PROGRAM}.tar"
    if not archive.is_file():
        ref = program_image_ref(binaries, DRA_PLUGIN_PROGRAM)
        with tempfile.TemporaryDirectory() as context:
            shutil.copy2(binaries.path(DRA_PLUGIN_PROGRAM), Path(context) / DRA_PLUGIN_PROGRAM)
            (Path(context) / "Containerfile").write_text(DRA_PLUGIN_CONTAINERFILE)
            _run(["podman", "build", "--build-arg", f"BASE={base}", "-t", ref, context])
        partial = archive.with_suffix(".partial")
        _run(["podman", "save", "--format", "docker-archive", "-o", str(partial), ref])
        partial.rename(archive)
    return archive


def nvidia_smi_stub() -> str:
    """The imitation driver's nvidia-smi, stamped with the version the hosts pretend to run."""
    text = NVIDIA_SMI_STUB.read_text()
    return text.replace("@DRIVER_VERSION@", HOST_DRIVER_VERSION).replace("@CUDA_VERSION@", HOST_CUDA_VERSION)


def kubelet_config(node: RealNode, address: str) -> dict[str, Any]:
    """Kubelet settings for a host that shares the machine's network and runs on cgroup v1 in a container."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": node.kubelet_port,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.healthz_port,
        "readOnlyPort": 0,
        # Only the API server on this machine reaches it; it presents no client certificate to kubelets.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "cgroupDriver": "cgroupfs",
        # The sandbox runs a cgroup v1 hierarchy that a container cannot fully own.
        "failCgroupV1": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "localStorageCapacityIsolation": False,
        "protectKernelDefaults": False,
        # The imported images can never be pulled again: never collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi"},
        "resolvConf": "/etc/resolv.conf",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "nodeStatusReportFrequency": "10s",
    }


def containerd_config(sandbox_image: str, nvidia_runtime: bool = True) -> str:
    """containerd's main configuration; without `nvidia_runtime`, what a host has before the
    nvidia_container_toolkit role adds its drop-in (the role writes the nvidia runtime there)."""
    nvidia = """    # What gpuforge's nvidia_container_toolkit role adds (`nvidia-ctk runtime configure`, not
    # the default): a runtime named nvidia, here the lab's stand-in for nvidia-container-runtime.
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
        BinaryName = "/usr/local/bin/nvidia-container-runtime"
"""
    return f"""version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  # No CAP_SYS_RESOURCE in this sandbox: a pod may not ask for a lower OOM score than containerd's.
  restrict_oom_score_adj = true
  disable_apparmor = true
  # The host is itself a container on a cgroup v1 hybrid hierarchy, which runc cannot lay out for a pod's
  # containers; containers then share the host's cgroups (no per-pod limits on these nodes).
  disable_cgroup = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    # The host's root is itself an overlay; the native snapshotter works on anything.
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
{nvidia if nvidia_runtime else ""}  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
"""


def bridge_name(container: str) -> str:
    """The node's CNI bridge: in the machine's network namespace, so named after the host container."""
    return "gf" + hashlib.sha256(container.encode()).hexdigest()[:12]


def cni_config(container: str, subnet: str) -> dict[str, Any]:
    """A bridge of the node's own, the pods' gateway, without masquerade: pods reach each other, the
    machine (the kubelet probes them; they reach the API server through service_route) and nothing
    beyond it. The hosts share the machine's network namespace, so the bridge lives there."""
    return {
        "cniVersion": "1.0.0",
        "name": "gpuforge-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge_name(container),
                # The default route too: in-cluster clients dial kubernetes.default's service IP.
                "isDefaultGateway": True,
                "ipMasq": False,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]]},
            },
            {"type": "loopback"},
        ],
    }


def free_subnet(container: str, taken: set[str]) -> str:
    """A /24 of the pod CIDR for the node's bridge that no route of the machine uses yet, starting at one
    chosen by the container's name (bridges of every cluster share the machine's routing table), and not
    in `taken`, to which it is added."""
    used = _run(["ip", "-4", "route", "show"]).stdout
    start = int(hashlib.sha256(container.encode()).hexdigest()[:4], 16)
    for offset in range(256):
        subnet = f"10.244.{(start + offset) % 256}.0/24"
        if subnet not in taken and f"{subnet} " not in used:
            taken.add(subnet)
            return subnet
    raise RealNodeError("no free /24 left in 10.244.0.0/16 for a node's pods")


def service_route(container: str, apiserver_port: int) -> list[list[str]]:
    """Commands that let the node's pods reach the API server at kubernetes.default's service IP, which
    in-cluster clients (the DRA kubelet plugin) use: the bridge, made before CNI does, routes to loopback,
    and a DNAT rule limited to it sends the service's port to the API server (which listens on loopback)."""
    bridge = bridge_name(container)
    return [
        ["ip", "link", "add", bridge, "type", "bridge"],
        ["ip", "link", "set", bridge, "up"],
        ["sysctl", "-q", "-w", f"net.ipv4.conf.{bridge}.route_localnet=1"],
        [
            "iptables", "-t", "nat", "-I", "PREROUTING", "-i", bridge,
            "-d", f"{pki.KUBERNETES_SERVICE_IP}/32", "-p", "tcp", "--dport", "443",
            "-m", "comment", "--comment", f"{RULE_COMMENT_PREFIX}{container}",
            "-j", "DNAT", "--to-destination", f"127.0.0.1:{apiserver_port}",
        ],
    ]  # fmt: skip


def remove_bridge(container: str) -> None:
    """Delete the node's bridge and DNAT rules: they outlive the host, in the machine's network namespace."""
    subprocess.run(["ip", "link", "delete", bridge_name(container)], capture_output=True, check=False)
    rules = subprocess.run(
        ["iptables", "-t", "nat", "-S", "PREROUTING"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    for rule in rules:
        if f"{RULE_COMMENT_PREFIX}{container}" in rule and rule.startswith("-A "):
            spec = shlex.split(rule)[1:]
            subprocess.run(["iptables", "-t", "nat", "-D", *spec], capture_output=True, check=False)


def machine_address() -> str:
    """The machine's own non-loopback IPv4 address: a kubelet may not report a loopback node IP. Choosing
    it sends nothing (a UDP connect only asks the kernel for the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            address = str(probe.getsockname()[0])
        except OSError as error:
            raise RealNodeError(
                f"real nodes need a non-loopback IPv4 address on this machine: {error}"
            ) from error
    if address.startswith("127."):
        raise RealNodeError("real nodes need a non-loopback IPv4 address on this machine")
    return address


KUBELET_UNIT = """[Unit]
Description=kubelet of a gpuforge real node
After=containerd.service
Requires=containerd.service

[Service]
ExecStart=/usr/local/bin/kubelet --config=/etc/gpuforge-node/kubelet.yaml \\
  --kubeconfig=/etc/gpuforge-node/kubelet.kubeconfig --hostname-override={name} --node-ip={address} \\
  --node-labels={labels} --v=1
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


BINFMT_UNITS = (
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    "proc-sys-fs-binfmt_misc.mount",
)


def container_name(cluster: str, node: str) -> str:
    return f"gpuforge-node-{cluster}-{node}"


def start_nodes(
    cluster: str,
    state_dir: Path,
    pki_dir: Path,
    server: str,
    nodes: list[RealNode],
) -> None:
    """Boot the hosts, import the images and start their kubelets (returns once every kubelet runs)."""
    raised_from = raise_inotify_limit()
    if raised_from is not None:
        log.warning(
            "raised fs.inotify.max_user_instances from %d to %d for the real nodes",
            raised_from,
            MIN_INOTIFY_INSTANCES,
        )
    lab = _lab()
    binaries = build_nodes()
    image = node_image()
    archives = program_images(binaries)
    archives[DRA_PLUGIN_PROGRAM] = dra_plugin_image(binaries, str(_lab().build_image("debian12")))
    sandbox_image = program_image_ref(binaries, "pause")
    address = machine_address()
    apiserver_port = urllib.parse.urlsplit(server).port or 443
    subnets: set[str] = set()
    for node in nodes:
        node_dir = state_dir / "nodes" / node.name
        config_dir = node_dir / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        identity = pki.node_identity(node.name)
        pki.issue_client(pki_dir, identity)
        files = {
            "kubelet.kubeconfig": pki.kubeconfig(pki_dir, identity, server, "local"),
            "kubelet.yaml": yaml.safe_dump(kubelet_config(node, address)),
            "containerd.toml": containerd_config(sandbox_image, nvidia_runtime=node.bootstrap is None),
            "10-gpuforge.conflist": json.dumps(
                cni_config(node.container, free_subnet(node.container, subnets))
            ),
            "nvidia-smi": nvidia_smi_stub(),
            "kubelet.service": KUBELET_UNIT.format(
                name=node.name, address=address, labels=f"{REAL_NODE_LABEL}=true"
            ),
            "nvidia-container-runtime": NVIDIA_RUNTIME_STUB.read_text(),
        }
        for file_name, content in files.items():
            (config_dir / file_name).write_text(content)
        (config_dir / "nvidia-container-runtime").chmod(0o755)
        (config_dir / "nvidia-smi").chmod(0o755)
        remove_bridge(node.container)  # what a host of this name left behind (a crash before `down`)
        for command in service_route(node.container, apiserver_port):
            _run(command)
        hardware = node_dir / "hardware"
        lab.write_hardware(lab.HostSpec(name=node.name, gpus=list(node.gpus)), hardware)
        for directory in ("containerd", "kubelet"):
            (node_dir / directory).mkdir(exist_ok=True)
        # A bootstrapped host gets these from the roles' packages and edits (the driver's nvidia-smi, the
        # toolkit's runtime, an `imports` line in config.toml): plain files of its own, not mounts.
        lab_driver = [
            f"{config_dir}/containerd.toml:/etc/containerd/config.toml:ro",
            f"{config_dir}/nvidia-smi:/usr/bin/nvidia-smi:ro",
            f"{config_dir}/nvidia-container-runtime:/usr/local/bin/nvidia-container-runtime:ro",
        ]
        lab.run_systemd_host(
            node.container,
            node.name,
            {CLUSTER_LABEL: cluster},
            image,
            hardware,
            [
                f"{config_dir}:/etc/gpuforge-node:ro",
                *(lab_driver if node.bootstrap is None else []),
                f"{config_dir}/10-gpuforge.conflist:/etc/cni/net.d/10-gpuforge.conflist:ro",
                f"{config_dir}/kubelet.service:/etc/systemd/system/kubelet.service:ro",
                f"{binaries.path('kubelet')}:/usr/local/bin/kubelet:ro",
                f"{archives['pause'].parent}:/opt/gpuforge-images:ro",
                f"{node_dir}/containerd:/var/lib/containerd",
                f"{node_dir}/kubelet:/var/lib/kubelet",
                # Masked: a node needs no extra binary formats, and in a container systemd-binfmt can hang
                # on the binfmt_misc automount, holding sysinit.target (and so containerd) for minutes.
                *(f"/dev/null:/etc/systemd/system/{unit}:ro" for unit in BINFMT_UNITS),
            ],
            # A cgroup namespace of its own: runc inside lays out its containers' cgroup mounts from it.
            podman_args=("--cgroupns", "private"),
        )
    for node in nodes:
        _wait_for_containerd(node)
    bootstrapped = [node for node in nodes if node.bootstrap is not None]
    if bootstrapped:
        bootstrap_hosts(state_dir, bootstrapped)
    for node in nodes:
        # systemd makes every mount shared when it boots a machine, but leaves a container's root
        # private; a hostPath of / with HostToContainer propagation (the device plugin's driver root)
        # needs it shared, as on the hosts the roles build.
        _exec(node, "mount", "--make-rshared", "/")
        for archive in archives.values():
            _exec(node, "ctr", "-n", "k8s.io", "images", "import", "--snapshotter", "native",
                  f"/opt/gpuforge-images/{archive.name}")  # fmt: skip
        for tag in device_plugin_tags():
            _exec(node, "ctr", "-n", "k8s.io", "images", "tag", "--force",
                  program_image_ref(binaries, "gpu-device-plugin"), tag)  # fmt: skip
        dra_plugin = program_image_ref(binaries, DRA_PLUGIN_PROGRAM)
        for release in DRA_PLUGIN_RELEASES:
            _exec(node, "ctr", "-n", "k8s.io", "images", "tag", "--force", dra_plugin,
                  f"{DRA_PLUGIN_REPOSITORY}:{release}")  # fmt: skip
        _exec(node, "systemctl", "start", "kubelet.service")


def bootstrap_inventory(nodes: list[RealNode], repo_url: str) -> dict[str, Any]:
    """An inventory of the hosts reached through podman (no SSH), pointed at the imitation repositories."""
    return {
        "all": {
            "children": {
                "gpu_nodes": {
                    "hosts": {
                        node.name: {
                            "ansible_host": node.container,
                            "ansible_connection": "containers.podman.podman",
                        }
                        for node in nodes
                    }
                }
            },
            "vars": {
                "ansible_python_interpreter": "/usr/bin/python3",
                # Already root in the host; the playbook's `become` then needs no sudo (hosts have none).
                "ansible_become_method": "su",
                **_lab().repository_vars(repo_url),
            },
        }
    }


def bootstrap_hosts(state_dir: Path, nodes: list[RealNode]) -> None:
    """Run each node's playbook of the collection on its host, as on a machine the roles build: the driver
    and toolkit from the imitation NVIDIA repositories, containerd's nvidia runtime and CDI from the
    toolkit role's drop-in, the CDI spec from nvidia-ctk. containerd restarts on what the roles wrote."""
    lab = _lab()
    work_dir = state_dir / "bootstrap"  # the repositories, inventory and playbook log
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    # The checkout as the collection gpuforge.nodes, without touching the checkout.
    link = work_dir / "collections" / "ansible_collections" / "gpuforge" / "nodes"
    link.parent.mkdir(parents=True)
    link.symlink_to(COLLECTION_ROOT)
    port = lab.start_repo_server(work_dir)
    try:
        repo_url = f"http://127.0.0.1:{port}"
        # The host's own distribution archive, as in the Ansible lab: the running kernel's headers.
        sources = work_dir / "distro.sources"
        sources.write_text(lab.imitation_repo.distro_sources(work_dir / "repo", repo_url))
        for node in nodes:
            config = state_dir / "nodes" / node.name / "config" / "containerd.toml"
            _run(["podman", "cp", str(config), f"{node.container}:/etc/containerd/config.toml"])
            _run(["podman", "cp", str(sources),
                  f"{node.container}:/etc/apt/sources.list.d/debian-lab.sources"])  # fmt: skip
            _exec(node, "systemctl", "restart", "containerd.service")
        inventory = work_dir / "inventory.yml"
        inventory.write_text(json.dumps(bootstrap_inventory(nodes, repo_url), indent=2) + "\n")
        for playbook in sorted({str(node.bootstrap) for node in nodes}):
            hosts = ",".join(node.name for node in nodes if node.bootstrap == playbook)
            _run_playbook(work_dir, inventory, playbook, hosts)
    finally:
        lab.stop_repo_server(work_dir)
    for node in nodes:
        # Whether or not a handler did: the kubelet must find containerd on the roles' configuration.
        _exec(node, "systemctl", "restart", "containerd.service")
        _wait_for_containerd(node)


def _run_playbook(work_dir: Path, inventory: Path, playbook: str, hosts: str) -> None:
    log_path = work_dir / f"{Path(playbook).stem}.log"
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(work_dir / "collections"),
        "ANSIBLE_CONFIG": str(COLLECTION_ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
    }
    # The one beside this Python (the checkout's venv pins ansible and its containers.podman collection).
    ansible_playbook = Path(sys.executable).parent / "ansible-playbook"
    if not ansible_playbook.is_file():
        raise RealNodeError(f"bootstrapping a real node needs ansible-playbook beside {sys.executable}")
    command = [
        str(ansible_playbook),
        "-i", str(inventory), "--limit", hosts, str(COLLECTION_ROOT / "playbooks" / playbook),
    ]  # fmt: skip
    log.info("bootstrapping %s with %s (log: %s)", hosts, playbook, log_path)
    with log_path.open("w") as output:
        result = subprocess.run(
            command, cwd=COLLECTION_ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
            timeout=BOOTSTRAP_TIMEOUT_SECONDS, check=False,
        )  # fmt: skip
    if result.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise RealNodeError(
            f"playbooks/{playbook} failed on {hosts} ({result.returncode}, {log_path}):\n{tail}"
        )


def device_plugin_tags() -> list[str]:
    """The pretend plugin under the name of every device-plugin release gpuforge knows."""
    return [
        f"{DEVICE_PLUGIN_REPOSITORY}:{release.version}" for release in compat.load().device_plugin_releases
    ]


def _exec(node: RealNode, *command: str) -> str:
    return _run(["podman", "exec", node.container, *command]).stdout


def _wait_for_containerd(node: RealNode, timeout: float = BOOT_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        probe = subprocess.run(
            ["podman", "exec", node.container, "ctr", "version"], capture_output=True, check=False
        )
        if probe.returncode == 0:
            return
        time.sleep(0.5)
    raise RealNodeError(f"containerd of {node.name} did not start (podman logs {node.container})")


def remove_containers(label: str) -> list[str]:
    """Remove every podman container labelled `label` (key=value), running or not; idempotent. Returns
    the removed container names. (The Ansible lab removes its hosts with it too.) Without podman there
    is none to remove."""
    if shutil.which("podman") is None:
        return []
    names = subprocess.run(
        ["podman", "ps", "--all", "--format", "{{.Names}}", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if names:
        subprocess.run(["podman", "rm", "--force", "--time", "0", *names], capture_output=True, check=False)
    return names


def remove_nodes(cluster: str) -> list[str]:
    """Remove every real node host of the cluster; idempotent. Returns the removed container names."""
    names = remove_containers(f"{CLUSTER_LABEL}={cluster}")
    for name in names:
        remove_bridge(name)
    return names


def running_hosts(cluster: str) -> list[str]:
    return subprocess.run(
        ["podman", "ps", "--format", "{{.Names}}", "--filter", f"label={CLUSTER_LABEL}={cluster}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
