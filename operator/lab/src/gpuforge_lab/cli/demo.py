"""`gpuforge demo`: the whole story on this machine, no cluster and no GPU needed.

1. bootstrap a real Debian host with playbooks/site.yml against the imitation NVIDIA repositories;
2. start a local cluster with three GPU pools (one H100 node a real kubelet where podman can boot it), the
   operator and the quota webhook;
3. apply GpuStacks in device-plugin mode and show the nodes advertising GPUs, a GPU pod on the real node;
4. apply a quota tree and submit workloads: some admitted, one denied;
5. migrate the H100 pool to DRA node by node, with a live view, while workloads keep running;
6. show `gpuforge status` and `gpuforge quota tree`, and how to explore and clean up.
Each step fails loudly (exit 1) if what it shows does not happen.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from gpuforge.clock import WaitTimeout, wait_for
from gpuforge.constants import (
    DEPLOY_DEVICE_PLUGIN_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    GPU_RESOURCE,
    NODE_STATE_LABEL,
    SIM_POOL_LABEL,
)
from gpuforge_lab.devcluster.build import build_nodes
from gpuforge_lab.devcluster.cluster import DevCluster, free_ports
from gpuforge_lab.devcluster.pools import GpuSpec, Pool, Taint
from gpuforge_lab.devcluster.realnodes import (
    DEVICE_PLUGIN_REPOSITORY,
    DRA_PLUGIN_REPOSITORY,
    REAL_NODE_LABEL,
    can_boot_hosts,
    program_image_ref,
)
from gpuforge_lab.workloads import gpu_deployment

# Wide enough for the node table when the output is a log rather than a terminal.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 150)
H100_PRODUCT = "NVIDIA-H100-80GB-HBM3"
# GPU Feature Discovery's product label per model on the demo's pools: it proves a workload's model.
PRODUCTS = {"H100": H100_PRODUCT, "L4": "NVIDIA-L4"}
H100 = GpuSpec(product="NVIDIA H100 80GB HBM3", count=8, memory_mib=81559, compute_capability="9.0",
               architecture="Hopper")  # fmt: skip
# One more H100 node, run by a real kubelet (the cluster's, 1.36) with pretend GPUs. Only GPU pods that
# tolerate the taint land there: the workloads' images exist on kwok's nodes alone.
REAL_H100_POOL = Pool(
    name="h100-real", count=1, real=True, gpu=H100, taints=(Taint("nvidia.com/gpu", "NoSchedule", "present"),)
)
DEMO_POOLS = (
    Pool(name="h100", count=3, kubelet_version="v1.34.2", gpu=H100),
    Pool(name="a100", count=3, gpu=GpuSpec()),
    Pool(
        name="l4",
        count=2,
        gpu=GpuSpec(product="NVIDIA L4", count=1, memory_mib=23034, compute_capability="8.9",
                    architecture="Ada Lovelace", mig_capable=False),
    ),
)  # fmt: skip


class DemoError(RuntimeError):
    pass


def _repo_root() -> Path:
    """The checkout the demo runs from (it applies the example and deploy files there)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "galaxy.yml").exists() and (parent / "operator").is_dir():
            return parent
    raise DemoError("run the demo from a gpuforge checkout (make demo)")


def step(number: int, title: str, text: str) -> None:
    console.print()
    console.rule(f"[bold]Step {number}: {title}")
    console.print(text)


@dataclass
class Demo:
    root: Path
    cluster: DevCluster
    log_dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    # --- helpers -------------------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        result = self.cluster.kubectl(*args, input=input, check=False)
        if check and result.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)} failed:\n{result.stderr.strip()}")
        return result.stdout if result.returncode == 0 else result.stderr

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def gpuforge(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        result = subprocess.run(
            [sys.executable, "-m", "gpuforge", *args], env=env, text=True, capture_output=True, check=False
        )
        if check and result.returncode != 0:
            raise DemoError(
                f"gpuforge {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-2000:]}"
            )
        return result

    def start(self, name: str, *args: str) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        # A fresh log per run: the demo waits for lines in it, which an earlier run's log already has.
        log = (self.log_dir / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "gpuforge", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop_processes(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def check_processes(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-20:]
                raise DemoError(f"{name} exited ({process.returncode}):\n" + "\n".join(tail))

    def nodes(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get_json("nodes")["items"]
        return sorted(items, key=lambda n: n["metadata"]["name"])

    def slices_by_node(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for item in self.get_json("resourceslices")["items"]:
            node = item["spec"].get("nodeName") or ""
            counts[node] = counts.get(node, 0) + len(item["spec"].get("devices", []))
        return counts

    def node_table(self, title: str) -> Table:
        slices = self.slices_by_node()
        table = Table(title=title)
        for column in (
            "node",
            "pool",
            "GPU",
            "kubelet",
            "stack",
            "nvidia.com/gpu allocatable",
            "DRA devices",
            "state",
            "cordoned",
        ):
            table.add_column(column)
        for node in self.nodes():
            labels = node["metadata"].get("labels", {})
            if "nvidia.com/gpu.present" not in labels:
                continue
            node_name = node["metadata"]["name"]
            name = f"{node_name} (real)" if labels.get(REAL_NODE_LABEL) == "true" else node_name
            stack = (
                "device plugin"
                if labels.get(DEPLOY_DEVICE_PLUGIN_LABEL) == "true"
                else "DRA"
                if labels.get(DEPLOY_DRA_KUBELET_PLUGIN_LABEL) == "true"
                else "-"
            )
            table.add_row(
                name,
                labels.get(SIM_POOL_LABEL, ""),
                labels.get("nvidia.com/gpu.product", "").removeprefix("NVIDIA-"),
                node["status"]["nodeInfo"]["kubeletVersion"],
                stack,
                # allocatable: what the scheduler can place (a stopped plugin's GPUs stay in capacity)
                (node["status"].get("allocatable") or {}).get(GPU_RESOURCE, "-"),
                str(slices.get(node_name, "-")),
                labels.get(NODE_STATE_LABEL, "-"),
                "yes" if node["spec"].get("unschedulable") else "",
            )
        return table

    # --- steps ---------------------------------------------------------------------------------------
    def bootstrap_host(self) -> None:
        step(
            1,
            "bootstrap a real Debian host with Ansible",
            "A Debian 12 container with systemd (podman) plays a GPU node; a local imitation of NVIDIA's\n"
            "apt repositories serves the driver and toolkit. Only the GPUs are simulated: the stub\n"
            "nvidia-smi reports one H100. playbooks/site.yml installs the driver, the container toolkit\n"
            "and the NFD features.",
        )
        if shutil.which("podman") is None:
            console.print(
                "[yellow]podman is not available here: skipping step 1 (the cluster steps still run).[/]"
            )
            return
        lab = [sys.executable, str(self.root / "tests/ansible/lab.py")]
        subprocess.run([*lab, "down", "--name", "demo"], capture_output=True, check=False)
        started = subprocess.run(
            [*lab, "up", "--name", "demo", "--host", "gpu-node-1=h100:1"],
            capture_output=True,
            text=True,
            check=False,
        )
        if started.returncode != 0:
            console.print(
                f"[yellow]Cannot start a Debian host here ({started.stderr.strip()[-300:]}): "
                "skipping step 1.[/]"
            )
            return
        try:
            lab_info = json.loads(started.stdout)
            inventory = str(lab_info["inventory"])
            console.print(f"$ ansible-playbook -i {inventory} playbooks/site.yml")
            playbook = subprocess.run(
                [
                    str(Path(sys.executable).parent / "ansible-playbook"),
                    "-i",
                    inventory,
                    "playbooks/site.yml",
                ],
                cwd=self.root,
                capture_output=True,
                text=True,
                check=False,
            )
            recap = playbook.stdout[playbook.stdout.rfind("PLAY RECAP") :].strip()
            console.print(recap or playbook.stdout[-1500:])
            if playbook.returncode != 0:
                # Ansible reports a playbook it cannot even load (a role it cannot resolve) on stderr.
                raise DemoError(
                    f"ansible-playbook playbooks/site.yml failed ({playbook.returncode}):\n"
                    f"{playbook.stdout[-3000:]}{playbook.stderr[-3000:]}"
                )
            features = subprocess.run(
                ["podman", "exec", str(lab_info["hosts"][0]["container"]), "sh", "-c",
                 "cat /etc/kubernetes/node-feature-discovery/features.d/*"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            console.print(
                Panel(features.stdout.strip() or features.stderr.strip(), title="NFD features written")
            )
        finally:
            subprocess.run([*lab, "down", "--name", "demo"], capture_output=True, check=False)

    def start_cluster(self, profile: str) -> None:
        step(
            2,
            "start a local cluster, the operator and the quota webhook",
            "Real etcd, kube-apiserver, controller-manager and scheduler; kwok plays 8 GPU nodes in three\n"
            "pools (H100 on kubelet 1.34, A100, L4), and one more H100 node is a real kubelet 1.36 with\n"
            "containerd in a Debian host under podman. The operator and the webhook run on this machine.",
        )
        self.cluster.down()
        pools: tuple[Pool, ...] = DEMO_POOLS
        cannot = can_boot_hosts()
        if cannot is None:
            pools = (*DEMO_POOLS, REAL_H100_POOL)
        else:
            console.print(f"[yellow]no real node: {cannot}[/]")
        seconds = self.cluster.up(profile, pools, console=Console(stderr=True, soft_wrap=True))
        console.print(f"cluster up in {seconds:.1f}s; KUBECONFIG={self.cluster.kubeconfig}")
        real = self.cluster.real_node_names()
        console.print(
            f"real kubelet nodes: {', '.join(real)}; every other node is kwok's"
            if real
            else "all nodes are kwok's"
        )
        deploy = self.root / "operator" / "deploy"
        self.kubectl("apply", "--server-side", "-f", str(deploy / "crds"))
        self.kubectl(
            "wait", "--for=condition=Established", "crd/gpustacks.gpuforge.io", "crd/gpuquotas.gpuforge.io"
        )
        self.start(
            "operator", "operator", "run", "--liveness-port", "0", "--metrics-port", str(free_ports(1)[0])
        )
        self.start("webhook", "webhook", "run", "--register", "--port", "0", "--name", "gpuforge-demo-quota")
        wait_for(
            "the quota webhook to register",
            lambda: (
                "gpuforge-demo-quota" in self.kubectl("get", "validatingwebhookconfigurations", "-o", "name")
            ),
            timeout=60,
        )
        self.check_processes()
        console.print("operator and webhook running (logs in " + str(self.log_dir) + ")")

    def device_plugin(self) -> None:
        step(
            3,
            "hand out GPUs with the NVIDIA device plugin",
            "Two GpuStacks in device-plugin mode: 'training' on the H100 pool, 'shared' on the others.\n"
            "On the real node, 'training-real' runs the operator's own DaemonSet with only the image\n"
            "changed; the real kubelet registers what the plugin serves.",
        )
        real = bool(self.cluster.real_node_names())
        stacks = [
            _stack("training", "devicePlugin", [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100_PRODUCT]},
                {"key": REAL_NODE_LABEL, "operator": "DoesNotExist"},
            ]),
            _stack("shared", "devicePlugin", [
                {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]},
                {"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": [H100_PRODUCT]},
            ]),
        ]  # fmt: skip
        if real:
            # The operator's own DaemonSets on the real node, only the images replaced by the pretend plugins.
            real_stack = _stack("training-real", "devicePlugin", [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100_PRODUCT]},
                {"key": REAL_NODE_LABEL, "operator": "Exists"},
            ])  # fmt: skip
            real_stack["spec"]["devicePlugin"]["image"] = DEVICE_PLUGIN_REPOSITORY
            real_stack["spec"]["dra"]["image"] = DRA_PLUGIN_REPOSITORY
            stacks.append(real_stack)
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(stacks))
        console.print("$ kubectl apply -f gpustacks.yaml   (training: H100 pool, shared: A100 + L4)")
        names = [stack["metadata"]["name"] for stack in stacks]
        wait_for("the GpuStacks Ready", lambda: self.stacks_ready(names), timeout=180)
        wait_for("every GPU node advertising nvidia.com/gpu", self.all_advertising, timeout=120)
        console.print(self.node_table("GPU nodes after the device plugin rolled out"))
        console.print(self.kubectl("get", "gpustacks"))
        if real:
            self.gpu_pod_on_real_node()

    def gpu_pod_on_real_node(self) -> None:
        """A pod asking for one GPU on the real node: containerd starts it with the CDI device the plugin
        named, and the pod prints what it got."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gpu-check", "namespace": "default"},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {REAL_NODE_LABEL: "true"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [
                    {
                        "name": "gpu-check",
                        "image": program_image_ref(build_nodes(), "gpu-workload"),
                        "imagePullPolicy": "Never",
                        "resources": {"limits": {GPU_RESOURCE: 1}},
                    }
                ],
            },
        }
        self.kubectl("apply", "-f", "-", input=json.dumps(pod))
        wait_for(
            "the GPU pod on the real node to finish",
            lambda: self.kubectl("get", "pod", "gpu-check", "-o", "jsonpath={.status.phase}") == "Succeeded",
            timeout=120,
        )
        console.print(Panel(self.kubectl("logs", "gpu-check").strip(), title="GPU pod on the real node"))

    def stacks_ready(self, names: list[str]) -> bool:
        self.check_processes()
        stacks = {s["metadata"]["name"]: s for s in self.get_json("gpustacks")["items"]}
        for name in names:
            conditions = (stacks.get(name, {}).get("status") or {}).get("conditions") or []
            if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                return False
        return True

    def all_advertising(self) -> bool:
        for node in self.nodes():
            gpu_node = "nvidia.com/gpu.present" in node["metadata"].get("labels", {})
            if gpu_node and int((node["status"].get("capacity") or {}).get(GPU_RESOURCE, "0")) == 0:
                return False
        return True

    def quota(self) -> None:
        step(
            4,
            "limit GPUs with a hierarchical quota",
            "A tree org -> research -> research-vision, and org -> inference. Workloads name their quota\n"
            "with the label gpuforge.io/quota; the webhook admits whole workloads or nothing, and only\n"
            "from the namespaces each quota names.",
        )
        # The webhook admits once a previous process's admissions could be visible (10 s after it started).
        webhook_log = self.log_dir / "webhook.log"
        wait_for(
            "the quota webhook to admit",
            lambda: "admitting GpuQuota requests" in webhook_log.read_text(errors="replace"),
            timeout=60,
        )
        self.kubectl("apply", "-f", str(self.root / "examples" / "quota-tree.yaml"))
        self.kubectl("create", "namespace", "ml")
        admitted = [
            _workload("vision-train", "research-vision", replicas=2, gpus=1, model="H100"),
            _workload("serving", "inference", replicas=2, gpus=1, model="L4"),
        ]
        for workload in admitted:
            self.kubectl("apply", "-n", "ml", "-f", "-", input=yaml.safe_dump(workload))
            quota_name = workload["metadata"]["labels"]["gpuforge.io/quota"]
            replicas = workload["spec"]["replicas"]
            console.print(
                f"[green]admitted[/] {workload['metadata']['name']} ({replicas} x 1 GPU, quota {quota_name})"
            )
        denied = _workload("vision-big", "research-vision", replicas=1, gpus=1, model="H100")
        result = self.cluster.kubectl(
            "apply", "-n", "ml", "-f", "-", input=yaml.safe_dump(denied), check=False
        )
        if result.returncode == 0:
            raise DemoError(
                "vision-big should have been denied: research-vision has 4 H100s and all are in use"
            )
        console.print(f"[red]denied[/] vision-big: {result.stderr.strip()}")
        # Tenancy: a quota admits only the namespaces it names (inference: ml and serving).
        self.kubectl("create", "namespace", "elsewhere")
        stray = _workload("stray", "inference", replicas=1, gpus=1)
        result = self.cluster.kubectl(
            "apply", "-n", "elsewhere", "-f", "-", input=yaml.safe_dump(stray), check=False
        )
        if result.returncode == 0 or '"elsewhere"' not in result.stderr:
            raise DemoError(
                "stray should have been denied: GpuQuota inference admits namespaces ml and serving"
            )
        console.print(f"[red]denied[/] stray: {result.stderr.strip()}")
        wait_for(
            "the quota workloads Running",
            lambda: (
                self.ready_replicas("ml", "vision-train") == 2 and self.ready_replicas("ml", "serving") == 2
            ),
            timeout=120,
        )
        console.print(self.gpuforge("quota", "tree").stdout)

    def ready_replicas(self, namespace: str, name: str) -> int:
        deployment = self.get_json("deployment", name, "-n", namespace)
        return int((deployment.get("status") or {}).get("readyReplicas") or 0)

    def migrate(self) -> None:
        step(
            5,
            "migrate the H100 pool from the device plugin to DRA, node by node",
            'kubectl patch gpustack training --type merge -p \'{"spec":{"mode":"dra"}}\'\n'
            "Each node is cordoned, its GPU pods move, the device plugin leaves, the DRA kubelet plugin\n"
            "starts and publishes ResourceSlices, and the node is uncordoned; one node at a time.\n"
            "The workloads on the other pools keep running throughout.",
        )
        stacks = ["training", *(["training-real"] if self.cluster.real_node_names() else [])]
        for name in stacks:
            self.kubectl(
                "patch", "gpustack", name, "--type", "merge", "-p", json.dumps({"spec": {"mode": "dra"}})
            )
        deadline = time.monotonic() + 300
        with Live(self.node_table("migrating"), console=console, refresh_per_second=2) as live:
            while True:
                self.check_processes()
                live.update(self.node_table("migrating the H100 pool to DRA"))
                if self.h100_on_dra() and self.real_on_dra() and self.stacks_ready(stacks):
                    break
                if time.monotonic() > deadline:
                    raise DemoError("the migration did not finish within 5 minutes; see `gpuforge status`")
                time.sleep(1)
        violations = self.cluster.violations()
        if violations:
            raise DemoError(f"a node advertised GPUs through both stacks at once: {violations[:3]}")
        if self.ready_replicas("ml", "serving") != 2:
            raise DemoError("the inference workload on the L4 pool stopped serving during the migration")
        console.print(
            "[green]H100 pool on DRA; no node ever advertised through both stacks; serving kept running.[/]"
        )
        real = set(self.cluster.real_node_names())
        for node in self.nodes():
            name = node["metadata"]["name"]
            if name in real:
                capacity = (node["status"].get("capacity") or {}).get(GPU_RESOURCE, "0")
                console.print(
                    f"{name} (real) is on DRA too, through its real kubelet. The kubelet still counts the "
                    f"device plugin's {capacity} GPUs in capacity (allocatable 0) for its five-minute grace "
                    "period; the switch did not wait for it."
                )

    def real_on_dra(self) -> bool:
        """Every real H100 node publishes ResourceSlices, offers no nvidia.com/gpu and is uncordoned."""
        slices = self.slices_by_node()
        real = set(self.cluster.real_node_names())
        for node in self.nodes():
            name = node["metadata"]["name"]
            if name not in real:
                continue
            allocatable = int((node["status"].get("allocatable") or {}).get(GPU_RESOURCE, "0"))
            if allocatable != 0 or slices.get(name, 0) == 0 or node["spec"].get("unschedulable"):
                return False
        return True

    def h100_on_dra(self) -> bool:
        slices = self.slices_by_node()
        for node in self.nodes():
            labels = node["metadata"].get("labels", {})
            if labels.get("nvidia.com/gpu.product") != H100_PRODUCT or REAL_NODE_LABEL in labels:
                continue
            name = node["metadata"]["name"]
            capacity = int((node["status"].get("capacity") or {}).get(GPU_RESOURCE, "0"))
            if capacity != 0 or slices.get(name, 0) == 0 or node["spec"].get("unschedulable"):
                return False
        return True

    def summary(self, kept: bool) -> None:
        step(6, "where things stand", "")
        console.print(self.gpuforge("status").stdout)
        console.print(self.gpuforge("quota", "tree").stdout)
        if kept:
            console.print(
                f"Explore: export KUBECONFIG={self.cluster.kubeconfig}; kubectl get gpustacks,gpuquotas,"
                "resourceslices; gpuforge plan; gpuforge status.\n"
                "Clean up: press Ctrl-C here (stops the operator and webhook), then "
                f"`gpuforge dev cluster down --name {self.cluster.name}`."
            )
        else:
            console.print(
                "To explore afterwards, run `gpuforge demo --keep`; this run cleans up after itself."
            )


def _stack(name: str, mode: str, expressions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": name},
        "spec": {
            "mode": mode,
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": expressions}]},
            "namespace": "gpuforge-operands",
            "devicePlugin": {"version": "v0.20.0"},
            "dra": {"version": "v25.12.0", "extendedResourceMapping": True},
            "upgradePolicy": {
                "maxUnavailable": 1,
                "drain": {"enable": True, "force": True, "timeoutSeconds": 60},
            },
        },
    }


def _workload(name: str, quota: str, replicas: int, gpus: int, model: str = "") -> dict[str, Any]:
    return gpu_deployment(
        name,
        quota,
        gpus=gpus,
        replicas=replicas,
        model=model,
        requests={"cpu": "1", "memory": "4Gi"},
        node_selector={"nvidia.com/gpu.product": PRODUCTS[model]} if model else None,
    )


@contextlib.contextmanager
def _interrupt_is_clean() -> Iterator[None]:
    try:
        yield
    except KeyboardInterrupt:
        console.print("\ninterrupted")


@click.command(short_help="The whole story on the local control plane.")
@click.option("--name", default="demo", show_default=True, help="Name of the local cluster the demo starts.")
@click.option("--keep", is_flag=True, help="Leave everything running at the end, until Ctrl-C.")
@click.option("--skip-ansible", is_flag=True, help="Skip step 1 (the Debian host).")
@click.option("--api-profile", default="1.36", show_default=True, help="API profile of the demo cluster.")
def demo(name: str, keep: bool, skip_ansible: bool, api_profile: str) -> None:
    """Run the whole story on a local control plane: provision, hand out, limit and migrate GPUs."""
    root = _repo_root()
    cluster = DevCluster(name)
    log_dir = cluster.state_dir.parent / f"{name}-demo-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    run = Demo(root=root, cluster=cluster, log_dir=log_dir)
    started = time.monotonic()
    failed = False
    try:
        if not skip_ansible:
            run.bootstrap_host()
        run.start_cluster(api_profile)
        run.device_plugin()
        run.quota()
        run.migrate()
        run.summary(kept=keep)
        console.print(f"\n[bold green]Demo finished in {time.monotonic() - started:.0f}s.[/]")
        if keep:
            with _interrupt_is_clean():
                while True:
                    run.check_processes()
                    time.sleep(2)
    except (DemoError, WaitTimeout) as error:
        failed = True
        console.print(f"\n[bold red]Demo failed:[/] {error}")
        console.print(f"Logs: {log_dir} and {cluster.log_dir}")
    finally:
        run.stop_processes()
        if not keep or failed:
            cluster.down()
    if failed:
        sys.exit(1)
