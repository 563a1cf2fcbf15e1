"""The local control plane: real etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and kwok
playing the kubelets of simulated GPU nodes, plus the simulated GPU node agent (gpuforge_lab.sim).

Every process runs on free loopback ports with its state, logs, certificates and kubeconfigs in one
directory. The processes this module starts are recorded (pid and kernel start time) in `state.json`, so
`down` stops exactly those, and a second `up` finds the first one running.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from gpuforge_lab.devcluster import pki, realnodes
from gpuforge_lab.devcluster.build import Binaries, build
from gpuforge_lab.devcluster.pools import (
    SIM_HEALTH_ANNOTATION,
    Pool,
    lab_gpu_models,
    real_node_patch,
    render_nodes,
)
from gpuforge_lab.devcluster.profiles import DEFAULT_PROFILE, ApiProfile, parse_profile

PACKAGE_DIR = Path(__file__).parent
STAGES_FILE = PACKAGE_DIR / "kwok-stages.yaml"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
# The simulated agent keeps a stopped device plugin's devices in capacity this long by default: kubelet's
# five minutes (gpuforge_lab.sim.agent.KUBELET_PLUGIN_STOP_GRACE_SECONDS) scaled down, so a cluster's
# capacity settles soon after a switch (`up(plugin_stop_grace=...)` changes it). No switch waits for it:
# the upgrade engine reads allocatable, which drops at once, as it must on a real kubelet.
SIM_PLUGIN_STOP_GRACE_SECONDS = 5.0
# Order matters: started in this order, stopped in reverse.
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "gpu-agent",
)
CONTROL_PLANE_RESTARTED_ON_UPGRADE = COMPONENTS[1:]
# The simulated fleet: thousands of kubelets and their GPU plugins, which on a real cluster run on their
# own machines, not on the control plane's cores. `up(fleet_nice=N)` lowers its CPU priority.
SIMULATED_FLEET = ("kwok", "gpu-agent")
MAX_NICE = 19
# kwok renews a node's lease every quarter of its duration: 1200 s is one write per node every 300 s,
# 17 writes/s for 5,000 nodes (40 s, a kubelet's default, would be 500/s: the API server's whole CPU here).
NODE_LEASE_SECONDS = 1200
# Nodes `wait_nodes_ready` may wait for per second on this machine, on top of its fixed timeout.
NODES_READY_PER_SECOND = 20


class ClusterError(RuntimeError):
    pass


class AlreadyRunning(ClusterError):
    pass


class NotRunning(ClusterError):
    pass


def state_root() -> Path:
    explicit = os.environ.get("GPUFORGE_STATE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "gpuforge" / "clusters"


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports, free now. Every socket stays bound until all are picked: closed
    one by one, the kernel may hand the same port out twice (it once gave the controller-manager and the
    scheduler the same one; the scheduler exited, and its health check was answered by the other)."""
    with contextlib.ExitStack() as stack:
        sockets = [
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)
        ]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def _proc_start_time(pid: int) -> int | None:
    """Kernel start time of a process (ticks since boot): tells a pid reused by another process apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields after it are space separated.
    after_name = stat.rsplit(")", 1)[1].split()
    state = after_name[0]
    if state == "Z":
        return None
    return int(after_name[19])


def _lower_priority(group: int, nice: int) -> None:
    """Lower the CPU priority of process group `group`, a session of its own: every thread's nice
    (threads started later inherit it) and the session's autogroup, which is what the kernel weighs
    against other sessions when it groups by session. Best effort: a kernel without autogroup scheduling
    has no file to write, and the cluster runs the same without either."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PGRP, group, nice)
    with contextlib.suppress(OSError):
        Path(f"/proc/{group}/autogroup").write_text(str(nice))


@dataclass
class ProcessRecord:
    pid: int
    start_time: int
    command: list[str]
    log: str

    def alive(self) -> bool:
        return _proc_start_time(self.pid) == self.start_time


@dataclass
class ClusterState:
    name: str
    profile: str
    ports: dict[str, int]
    processes: dict[str, ProcessRecord] = field(default_factory=dict)
    pools: list[dict[str, Any]] = field(default_factory=list)
    # Real kubelet nodes (lab hosts under podman): name -> their RealNode fields.
    real_nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    # Seconds the simulated agent keeps a stopped device plugin's devices in capacity.
    plugin_stop_grace: float = SIM_PLUGIN_STOP_GRACE_SECONDS
    # The simulated fleet's nice value (0: it competes with the control plane as an equal).
    fleet_nice: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        raw = json.loads(text)
        processes = {name: ProcessRecord(**record) for name, record in raw.pop("processes").items()}
        return cls(processes=processes, **raw)


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    detail: str


class DevCluster:
    """A local control plane identified by its name; state lives in `state_root()/<name>`."""

    def __init__(self, name: str = "default", root: Path | None = None) -> None:
        self.name = name
        self.state_dir = (root or state_root()) / name
        self._binaries: Binaries | None = None

    # --- paths ---------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "admin.kubeconfig"

    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def violations_file(self) -> Path:
        """Written by the simulated agent: every moment a node advertised GPUs through both stacks."""
        return self.state_dir / "agent" / "violations.jsonl"

    def load_state(self) -> ClusterState | None:
        try:
            return ClusterState.from_json(self.state_file.read_text())
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _save_state(self, state: ClusterState) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(state.to_json())
        tmp.replace(self.state_file)

    @property
    def profile(self) -> ApiProfile:
        state = self.load_state()
        if state is None:
            raise NotRunning(f"cluster {self.name!r} has no state in {self.state_dir}")
        return parse_profile(state.profile)

    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            self._binaries = build()
        return self._binaries

    @property
    def kubectl_path(self) -> Path:
        return self.binaries.path("kubectl")

    def running(self) -> bool:
        state = self.load_state()
        return state is not None and any(record.alive() for record in state.processes.values())

    # --- lifecycle -----------------------------------------------------------------------------
    def up(
        self,
        profile: str = DEFAULT_PROFILE,
        pools: Sequence[Pool] = (),
        console: Console | None = None,
        wait_nodes: bool = True,
        plugin_stop_grace: float = SIM_PLUGIN_STOP_GRACE_SECONDS,
        fleet_nice: int = 0,
    ) -> float:
        """Start everything and return the seconds it took; raise AlreadyRunning if it runs already.

        `fleet_nice` (0-19) lowers the simulated fleet's CPU priority, every thread and its session's
        autogroup, so that under contention it yields the CPU to the control plane. Each component is a
        session of its own, and a kernel that groups by session shares the CPU evenly between them: at
        5,000 nodes kwok then gets the CPU on the same terms as the API server, which on a real cluster
        has machines of its own. Yielding shortens the API server's answers and lengthens the fleet's own
        steps."""
        if not 0 <= fleet_nice <= MAX_NICE:
            raise ValueError(f"fleet_nice must be 0-{MAX_NICE} (a nice value), not {fleet_nice}")
        console = console or Console(stderr=True, soft_wrap=True)
        api_profile = parse_profile(profile)
        if self.running():
            raise AlreadyRunning(
                f"cluster {self.name!r} is already running (kubeconfig {self.kubeconfig}); "
                f"`gpuforge dev cluster down --name {self.name}` stops it"
            )
        self._binaries = build(console)
        started = time.monotonic()
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)  # a stopped cluster's leftovers: start clean
        self.log_dir.mkdir(parents=True)
        pki.write_pki(self.pki_dir)
        names = ("etcd", "etcd-peer", "apiserver", "kcm", "scheduler", "kwok")
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        state = ClusterState(
            name=self.name,
            profile=api_profile.name,
            ports=ports,
            pools=[_pool_to_dict(p) for p in pools],
            plugin_stop_grace=plugin_stop_grace,
            fleet_nice=fleet_nice,
        )
        self._write_configs(state)
        self._save_state(state)
        try:
            with console.status(f"Starting control plane {self.name!r} (API profile {api_profile.name})"):
                self._start(state, "etcd")
                self._start_control_plane(state, api_profile)
            if pools:
                self.add_pools(pools, console=console, wait=wait_nodes)
        except BaseException:
            self.down()
            raise
        return time.monotonic() - started

    def _start_control_plane(self, state: ClusterState, profile: ApiProfile) -> None:
        self._start(state, "kube-apiserver", profile)
        for component in ("kube-controller-manager", "kube-scheduler", "kwok", "gpu-agent"):
            self._start(state, component, profile)
        self._wait_for(
            "the default ServiceAccount",
            lambda: self._kubectl_ok("get", "serviceaccount", "default", "-n", "default"),
            timeout=60,
        )

    def down(self, timeout: float = 15.0) -> list[str]:
        """Stop exactly the processes `up` started (newest first) and return their names."""
        state = self.load_state()
        if state is None:
            return []
        # Known components newest first, then anything else recorded (e.g. by an older gpuforge).
        order = [c for c in reversed(COMPONENTS) if c in state.processes]
        order += [c for c in state.processes if c not in order]
        stopped = self._stop(state, order, timeout)
        stopped += realnodes.remove_nodes(self.name)
        state.real_nodes.clear()
        self._save_state(state)
        return stopped

    def _stop(self, state: ClusterState, components: Iterable[str], timeout: float) -> list[str]:
        stopped: list[str] = []
        for name in components:
            record = state.processes.pop(name, None)
            if record is None or not record.alive():
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while record.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if record.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(record.pid, signal.SIGKILL)
                while record.alive():
                    time.sleep(0.05)
            stopped.append(name)
        return stopped

    def upgrade(self, profile: str, console: Console | None = None) -> float:
        """Restart the control plane with another API profile on the same etcd data (objects preserved)."""
        console = console or Console(stderr=True, soft_wrap=True)
        api_profile = parse_profile(profile)
        state = self.load_state()
        if state is None or not self.running():
            raise NotRunning(f"cluster {self.name!r} is not running")
        started = time.monotonic()
        with console.status(f"Restarting control plane {self.name!r} with API profile {api_profile.name}"):
            self._stop(state, reversed(CONTROL_PLANE_RESTARTED_ON_UPGRADE), 15.0)
            state.profile = api_profile.name
            self._write_configs(state)
            self._save_state(state)
            self._start_control_plane(state, api_profile)
        return time.monotonic() - started

    # --- configuration -------------------------------------------------------------------------
    def _write_configs(self, state: ClusterState) -> None:
        server = f"https://127.0.0.1:{state.ports['apiserver']}"
        component_server = server
        files = {
            "admin.kubeconfig": pki.kubeconfig(self.pki_dir, pki.ADMIN, server, f"gpuforge-{self.name}"),
            "kwok.kubeconfig": pki.kubeconfig(self.pki_dir, pki.KWOK, server, "local"),
            "controller-manager.kubeconfig": pki.kubeconfig(
                self.pki_dir, pki.CONTROLLER_MANAGER, component_server, "local"
            ),
            "scheduler.kubeconfig": pki.kubeconfig(self.pki_dir, pki.SCHEDULER, component_server, "local"),
        }
        scheduler_config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            # Thousands of simulated nodes: let the scheduler talk to the API server at full speed.
            "clientConnection": {
                "kubeconfig": str(self.state_dir / "scheduler.kubeconfig"),
                "qps": 1000,
                "burst": 2000,
            },
            "leaderElection": {"leaderElect": False},
        }
        files["scheduler.yaml"] = yaml.safe_dump(scheduler_config)
        for name, content in files.items():
            path = self.state_dir / name
            path.write_text(content)
            path.chmod(0o600)
        shutil.copy(STAGES_FILE, self.state_dir / "kwok-stages.yaml")

    def _command(self, component: str, state: ClusterState, profile: ApiProfile | None) -> list[str]:
        ports = state.ports
        pki_dir = self.pki_dir
        binaries = self.binaries
        if component == "etcd":
            peer = f"http://127.0.0.1:{ports[component + '-peer']}"
            client = f"http://127.0.0.1:{ports[component]}"
            return [
                str(binaries.path("etcd")),
                "--name=gpuforge",
                f"--data-dir={self.state_dir / component}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=gpuforge={peer}",
                # A throwaway test cluster: durability against power loss is not worth the fsync latency.
                "--unsafe-no-fsync",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ]
        assert profile is not None
        older = profile.needs_older_components
        component_gates = profile.component_feature_gates
        if component == "kube-apiserver":
            port = ports["apiserver"]
            return [
                str(binaries.path("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
                f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
                f"--client-ca-file={pki_dir / 'ca.crt'}",
                f"--service-account-key-file={pki_dir / 'sa.pub'}",
                f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction,ValidatingAdmissionWebhook,MutatingAdmissionWebhook,"
                "ValidatingAdmissionPolicy",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--runtime-config={profile.runtime_config()}",
                *([f"--feature-gates={profile.feature_gates}"] if profile.feature_gates else []),
                "--allow-privileged=true",
                # Real nodes' names resolve nowhere: reach their kubelets (logs, exec) by address.
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                # The loopback address cannot be an Endpoints address: nobody needs kubernetes.default here.
                "--endpoint-reconciler-type=none",
                "--max-requests-inflight=2000",
                "--max-mutating-requests-inflight=1000",
                # /debug/pprof, to the admin only (RBAC): the benchmarks' --profile samples the API server.
                "--profiling=true",
                "--v=1",
            ]
        if component == "kube-controller-manager":
            kubeconfig = self.state_dir / "controller-manager.kubeconfig"
            return [
                str(binaries.path("beta/kube-controller-manager" if older else "kube-controller-manager")),
                f"--kubeconfig={kubeconfig}",
                *_secure_serving(kubeconfig, ports["kcm"]),
                f"--service-account-private-key-file={pki_dir / 'sa.key'}",
                f"--root-ca-file={pki_dir / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki_dir / 'ca.crt'}",
                f"--cluster-signing-key-file={pki_dir / 'ca.key'}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--leader-elect=false",
                "--kube-api-qps=1000",
                "--kube-api-burst=2000",
                "--concurrent-daemonset-syncs=4",
                # Simulated nodes go NotReady only when told to (kwok sets the condition at once); on a
                # loaded machine their lease renewals can lag past the 50 s default, and the node
                # lifecycle controller would then mark plugin pods NotReady for good (kwok's stages
                # never make a Running pod Ready again). Three renewal periods of kwok's leases (below).
                f"--node-monitor-grace-period={3 * NODE_LEASE_SECONDS // 4}s",
                *([f"--feature-gates={component_gates}"] if component_gates else []),
                "--v=1",
            ]
        if component == "kube-scheduler":
            kubeconfig = self.state_dir / "scheduler.kubeconfig"
            return [
                str(binaries.path("beta/kube-scheduler" if older else "kube-scheduler")),
                f"--config={self.state_dir / 'scheduler.yaml'}",
                *_secure_serving(kubeconfig, ports["scheduler"]),
                *([f"--feature-gates={component_gates}"] if component_gates else []),
                "--v=1",
            ]
        if component == "kwok":
            return [
                str(binaries.path("kwok")),
                f"--kubeconfig={self.state_dir / 'kwok.kubeconfig'}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--config={self.state_dir / 'kwok-stages.yaml'}",
                f"--server-address=127.0.0.1:{ports['kwok']}",
                f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
                f"--cidr={POD_CIDR}",
            ]
        if component == "gpu-agent":
            return [
                sys.executable,
                "-m",
                "gpuforge_lab.sim.agent",
                f"--kubeconfig={self.kubeconfig}",
                f"--state-dir={self.state_dir / 'agent'}",
                f"--device-plugin-stop-grace={state.plugin_stop_grace}",
            ]
        raise ValueError(component)

    # --- processes -----------------------------------------------------------------------------
    def _start(self, state: ClusterState, component: str, profile: ApiProfile | None = None) -> None:
        command = self._command(component, state, profile)
        log_path = self.log_dir / f"{component}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                start_new_session=True,  # its own process group: down() signals the group
            )
        if component in SIMULATED_FLEET and state.fleet_nice:
            _lower_priority(process.pid, state.fleet_nice)
        start_time = None
        while start_time is None:
            start_time = _proc_start_time(process.pid)
            if start_time is None and process.poll() is not None:
                raise ClusterError(f"{component} exited at once; see {log_path}:\n{_tail(log_path)}")
        state.processes[component] = ProcessRecord(process.pid, start_time, command, str(log_path))
        self._save_state(state)
        self._wait_for(
            f"{component} to be healthy",
            lambda: self._healthy(component, state)[0],
            timeout=90,
            process=process,
            log_path=log_path,
        )

    def _wait_for(
        self,
        what: str,
        check: Callable[[], bool],
        timeout: float,
        process: subprocess.Popen[bytes] | None = None,
        log_path: Path | None = None,
    ) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while time.monotonic() < deadline:
            if check():
                return
            if process is not None and process.poll() is not None:
                tail = _tail(log_path) if log_path else ""
                raise ClusterError(f"waiting for {what}: the process exited ({process.returncode}):\n{tail}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        tail = _tail(log_path) if log_path else ""
        raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}\n{tail}")

    def _ssl_context(self, client: bool) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        if client:
            context.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        return context

    def _healthy(self, component: str, state: ClusterState) -> tuple[bool, str]:
        ports = state.ports
        profile = parse_profile(state.profile)
        if component == "etcd":
            url, context = f"http://127.0.0.1:{ports[component]}/health", None
        elif component == "kube-apiserver":
            url = f"https://127.0.0.1:{ports['apiserver']}/readyz"
            if profile.needs_older_components:
                # Its own v1 ResourceSlice informer cannot sync while v1 is off (see profiles.py).
                url += "?exclude=informer-sync"
            context = self._ssl_context(client=True)
        elif component in ("kube-controller-manager", "kube-scheduler"):
            port = ports["kcm" if component == "kube-controller-manager" else "scheduler"]
            url = f"https://127.0.0.1:{port}/healthz"
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # self-signed serving certs of their own
        elif component == "kwok":
            url, context = f"http://127.0.0.1:{ports['kwok']}/healthz", None
        elif component == "gpu-agent":
            ready = (self.state_dir / "agent" / "ready").exists()
            return ready, "watching plugin pods" if ready else "starting"
        else:
            raise ValueError(component)
        try:
            with urllib.request.urlopen(url, context=context, timeout=2) as response:
                body = response.read(200).decode(errors="replace")
                return response.status == 200, body.strip() or "ok"
        except (urllib.error.URLError, OSError) as error:
            return False, str(getattr(error, "reason", error))

    def status(self) -> list[ComponentStatus]:
        state = self.load_state()
        if state is None:
            return []
        result = []
        for component in [*COMPONENTS, *(c for c in state.processes if c not in COMPONENTS)]:
            record = state.processes.get(component)
            if record is None:
                continue
            alive = record.alive()
            if component not in COMPONENTS:
                result.append(ComponentStatus(component, record.pid, alive, False, "unknown component"))
                continue
            healthy, detail = self._healthy(component, state) if alive else (False, "not running")
            result.append(ComponentStatus(component, record.pid, alive, healthy, detail))
        return result

    # --- API helpers ---------------------------------------------------------------------------
    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient for the admin user."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig), client_configuration=configuration
        )
        configuration.connection_pool_maxsize = 32
        return client.ApiClient(configuration)

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=check,
            input=input,
        )

    def _kubectl_ok(self, *args: str) -> bool:
        return self.kubectl(*args, check=False).returncode == 0

    def add_pools(
        self, pools: Sequence[Pool], console: Console | None = None, wait: bool = True
    ) -> list[str]:
        """Register the pools' nodes (kwok makes them Ready) and return their names."""
        from kubernetes import client

        state = self.load_state()
        if state is None:
            raise NotRunning(f"cluster {self.name!r} is not running")
        real_names = self._add_real_nodes(state, [p for p in pools if p.real], console)
        profile = parse_profile(state.profile)
        nodes = render_nodes(pools, profile.default_kubelet_version)
        with self.api_client() as api_client:
            core: Any = client.CoreV1Api(api_client)

            def create(node: dict[str, Any]) -> None:
                try:
                    # the answer as bytes: turning it into a client object is most of this call's CPU
                    core.create_node(node, _preload_content=False).read()
                except client.ApiException as error:
                    if error.status != 409:
                        raise

            with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(create, nodes))
        state.pools.extend(_pool_to_dict(p) for p in pools)
        self._save_state(state)
        names = [node["metadata"]["name"] for node in nodes]
        if wait and names:
            self.wait_nodes_ready(names, console=console)
        if real_names:
            self.wait_nodes_ready(real_names, timeout=realnodes.BOOT_TIMEOUT_SECONDS, console=console)
            with self.api_client() as patch_client:
                nodes_api: Any = client.CoreV1Api(patch_client)
                for real_pool in pools:
                    if real_pool.real:
                        for name in real_pool.node_names():
                            nodes_api.patch_node(name, real_node_patch(real_pool))
        return [*names, *real_names]

    def _add_real_nodes(
        self, state: ClusterState, pools: Sequence[Pool], console: Console | None
    ) -> list[str]:
        """Boot a lab host with a real kubelet per node of the real pools; they register themselves."""
        count = sum(pool.count for pool in pools)
        if not count:
            return []
        ports = iter(free_ports(2 * count))
        nodes = [
            realnodes.RealNode(
                name=name,
                container=realnodes.container_name(self.name, name),
                kubelet_port=next(ports),
                healthz_port=next(ports),
                gpus=lab_gpu_models(pool.gpu),
                bootstrap=pool.bootstrap,
            )
            for pool in pools
            for name in pool.node_names()
        ]
        server = f"https://127.0.0.1:{state.ports['apiserver']}"
        status = (console or Console(stderr=True)).status(f"Starting {count} real node(s)")
        with status:
            try:
                realnodes.start_nodes(self.name, self.state_dir, self.pki_dir, server, nodes)
            finally:
                state.real_nodes.update({node.name: asdict(node) for node in nodes})
                self._save_state(state)
        return [node.name for node in nodes]

    def real_node_names(self) -> list[str]:
        state = self.load_state()
        return sorted(state.real_nodes) if state else []

    def wait_nodes_ready(
        self, names: Sequence[str], timeout: float | None = None, console: Console | None = None
    ) -> None:
        """Wait until every named node is Ready: by default 180 s plus the time kwok needs for that many
        nodes here. Reads the nodes a page at a time from the API server's watch cache as plain JSON:
        a list turned into client objects costs seconds of this process's CPU per 1,000 nodes."""
        if timeout is None:
            timeout = 180 + len(names) / NODES_READY_PER_SECOND
        wanted = set(names)
        deadline = time.monotonic() + timeout
        with self.api_client() as api_client:
            while True:
                ready = {name for name in self._ready_node_names(api_client) if name in wanted}
                if ready == wanted:
                    return
                if time.monotonic() > deadline:
                    missing = sorted(wanted - ready)
                    raise ClusterError(f"{len(missing)} nodes not Ready after {timeout:.0f}s: {missing[:10]}")
                time.sleep(0.25 if len(wanted) <= 100 else 2)

    @staticmethod
    def _ready_node_names(api_client: Any, page: int = 500) -> set[str]:
        from kubernetes import client

        core: Any = client.CoreV1Api(api_client)
        ready: set[str] = set()
        token: str | None = None
        while True:
            response = core.list_node(
                limit=page,
                _continue=token or None,
                resource_version="0" if token is None else None,
                _preload_content=False,
            )
            listing = json.loads(response.data)
            ready.update(
                item["metadata"]["name"]
                for item in listing["items"]
                if any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (item.get("status") or {}).get("conditions") or []
                )
            )
            token = listing["metadata"].get("continue")
            if not token:
                return ready

    def set_node_health(self, name: str, ready: bool) -> None:
        """Failure injection: make kwok report the node NotReady (ready=False) or Ready again."""
        value = None if ready else "not-ready"
        patch = {"metadata": {"annotations": {SIM_HEALTH_ANNOTATION: value}}}
        from kubernetes import client

        with self.api_client() as api_client:
            core: Any = client.CoreV1Api(api_client)
            core.patch_node(name, patch)
            if not ready:
                # kwok reacts to the annotation; make sure the condition flips even between its heartbeats.
                self._wait_for(
                    f"{name} NotReady",
                    lambda: not _node_ready(core.read_node(name)),
                    timeout=30,
                )

    def delete_node(self, name: str) -> None:
        self.kubectl("delete", "node", name, "--wait=false")

    def violations(self) -> list[dict[str, Any]]:
        try:
            lines = self.violations_file.read_text().splitlines()
        except OSError:
            return []
        return [json.loads(line) for line in lines if line.strip()]


def _secure_serving(kubeconfig: Path, port: int) -> list[str]:
    """Flags of a component serving its health on loopback, delegating authentication and authorization
    to the API server with its own kubeconfig (controller-manager and scheduler alike)."""
    return [
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
    ]


def _node_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


def _pool_to_dict(pool: Pool) -> dict[str, Any]:
    return {"name": pool.name, "count": pool.count, "gpu": None if pool.gpu is None else pool.gpu.__dict__}


def _tail(path: Path | None, lines: int = 25) -> str:
    if path is None:
        return ""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def list_clusters(root: Path | None = None) -> list[DevCluster]:
    base = root or state_root()
    if not base.is_dir():
        return []
    return [DevCluster(path.name, base) for path in sorted(base.iterdir()) if (path / "state.json").exists()]
