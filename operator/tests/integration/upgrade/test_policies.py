"""The upgrade policy on the real local control plane: drain (eviction API, PodDisruptionBudgets, force),
waitForCompletion, a device-plugin release that never becomes Ready (rollback and halt), and the nodes
that are left alone (paused, the skip label, a node under maintenance by the day-2 Ansible upgrade).

One small cluster; each test has a pool of its own and a GpuStack selecting just that pool (by the
simulator's pool label), so the tests are independent of each other and of their order. The operator
runs as a subprocess with its ServiceAccount's credentials (the shipped RBAC). Every rollout runs under
the `Sampler` (the engine's invariants) and, where order matters, a `Recorder` checking it moment by moment.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuforge.constants import (
    COMPONENT_LABEL,
    DEPLOY_DEVICE_PLUGIN_LABEL,
    DEPLOY_DRA_KUBELET_PLUGIN_LABEL,
    MAINTENANCE_ANNOTATION,
    NODE_STATE_LABEL,
    SIM_POOL_LABEL,
    UPGRADE_SKIP_LABEL,
)
from gpuforge.upgrade.model import (
    FAILURE_ANNOTATION,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    STATE_SINCE_ANNOTATION,
    parse_time,
)
from gpuforge_lab.devcluster.pools import GpuSpec, Pool

from .helpers import (
    Moment,
    Operator,
    Recorder,
    Sampler,
    apply,
    condition,
    kube_json,
    later_pass,
    merge_patch_stack,
    sample_nodes,
    stack_status,
    wait_for,
)

pytestmark = pytest.mark.cluster

GPUS = 2
POOL_SIZES = {"drain": 3, "jobs": 2, "back": 2, "halt": 2, "hold": 3}
POOLS = tuple(Pool(name=name, count=count, gpu=GpuSpec(count=GPUS)) for name, count in POOL_SIZES.items())
OLD, NEW = "v0.19.3", "v0.20.0"
NEVER_READY = f"{NEW}-sim-never-ready"


@pytest.fixture(scope="module")
def cluster(cluster_factory: Callable[..., Any]) -> Any:
    return cluster_factory(profile="1.36", pools=POOLS, name="upgrade-policy")


@pytest.fixture(scope="module")
def operator(cluster: Any, operator_factory: Callable[[Any], Operator]) -> Operator:
    return operator_factory(cluster)


def names(pool: str) -> list[str]:
    return [f"{pool}-{i}" for i in range(POOL_SIZES[pool])]


def stack(
    pool: str, policy: dict[str, Any], mode: str = "devicePlugin", version: str = OLD
) -> dict[str, Any]:
    """A GpuStack named after `pool` serving only that pool's nodes, in a namespace of its own."""
    return {
        "apiVersion": "gpuforge.io/v1alpha1",
        "kind": "GpuStack",
        "metadata": {"name": pool},
        "spec": {
            "mode": mode,
            "namespace": f"gpuforge-{pool}",
            "devicePlugin": {"version": version},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": SIM_POOL_LABEL, "operator": "In", "values": [pool]}]}
                ]
            },
            "upgradePolicy": policy,
        },
    }


def plugin_pods(cluster: Any, pool: str) -> dict[str, tuple[str, str]]:
    """Node -> (uid, image tag) of the device-plugin pods of the pool's stack."""
    pods = kube_json(cluster, "pods", "-n", f"gpuforge-{pool}", "-l", f"{COMPONENT_LABEL}=device-plugin")[
        "items"
    ]
    return {
        p["spec"]["nodeName"]: (p["metadata"]["uid"], p["spec"]["containers"][0]["image"].rsplit(":", 1)[1])
        for p in pods
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
    }


def serving(cluster: Any, pool: str, version: str, nodes: list[str] | None = None) -> bool:
    """Every one of `nodes` (default: the pool) runs the device plugin at `version`, advertises all its
    GPUs, is schedulable and in state upgrade-done."""
    nodes = nodes if nodes is not None else names(pool)
    pods = plugin_pods(cluster, pool)
    with cluster.api_client() as api_client:
        view = sample_nodes(api_client)
    return all(
        pods.get(n, ("", ""))[1] == version
        and view[n].gpus == GPUS
        and not view[n].unschedulable
        and view[n].labels.get(NODE_STATE_LABEL) == "upgrade-done"
        for n in nodes
    )


def deploy(cluster: Any, pool: str, policy: dict[str, Any]) -> None:
    apply(cluster, stack(pool, policy))
    wait_for(f"the device plugin {OLD} on pool {pool}", lambda: serving(cluster, pool, OLD), timeout=120)


def hold_nodes(status: dict[str, Any], reason: str) -> list[str]:
    return next((h["nodes"] for h in status.get("upgrade", {}).get("holds", []) if h["reason"] == reason), [])


def node_events(cluster: Any, node: str) -> list[dict[str, Any]]:
    events = kube_json(
        cluster,
        "events",
        "-n",
        "default",
        f"--field-selector=involvedObject.kind=Node,involvedObject.name={node}",
    )["items"]
    return [e for e in events if e["source"].get("component") == "gpuforge-operator"]


def workload(name: str, node: str, **extra: Any) -> dict[str, Any]:
    """A pod template pinned to `node` through the scheduler (nodeSelector), so a cordon keeps its
    replacements off the node."""
    return {
        "metadata": {"labels": {"app": name}, **extra.pop("metadata", {})},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "main", "image": "registry.example/app:1", **extra.pop("container", {})}],
            **extra,
        },
    }


def deployment(name: str, namespace: str, node: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": workload(name, node),
        },
    }


def bare_pod(name: str, namespace: str, node: str) -> dict[str, Any]:
    """A pod no controller recreates: evicted only with force."""
    template = workload(name, node)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        **template,
        "metadata": {**template["metadata"], "name": name, "namespace": namespace},
    }


def running(cluster: Any, namespace: str, selector: str) -> dict[str, str]:
    """Pod name -> uid of the Running pods matching `selector`."""
    pods = kube_json(cluster, "pods", "-n", namespace, "-l", selector)["items"]
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


# --- drain ---------------------------------------------------------------------------------------------


def test_drain_evicts_first_and_a_blocking_pdb_holds_the_node_until_the_timeout(
    cluster: Any, operator: Operator
) -> None:
    """drain-0 runs a pod whose PodDisruptionBudget allows no disruption, drain-1 two movable pods,
    drain-2 a bare pod (evicted only with force); a DaemonSet runs everywhere and is never evicted.
    While drain-0 is held, the day-2 Ansible upgrade marks it under maintenance for a while."""
    pool, ns, timeout = "drain", "drain-work", 20
    nodes = names(pool)
    policy = {
        "maxUnavailable": 1,
        "maxParallel": 1,
        "maxFailures": 0,  # the blocked node must not stop the others
        "drain": {"enable": True, "force": True, "timeoutSeconds": timeout},
    }
    deploy(cluster, pool, policy)
    cluster.kubectl("create", "namespace", ns)
    documents: list[dict[str, Any]] = [
        deployment("guarded", ns, "drain-0"),
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guarded", "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        },
        deployment("movable", ns, "drain-1", replicas=2),
        bare_pod("scratch", ns, "drain-2"),
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": ns},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {
                        "nodeSelector": {SIM_POOL_LABEL: pool},
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [{"name": "main", "image": "registry.example/agent:1"}],
                    },
                },
            },
        },
    ]
    for document in documents:
        apply(cluster, document)
    wait_for(
        "the workloads running", lambda: len(running(cluster, ns, "app in (guarded,movable,scratch)")) == 4
    )
    wait_for("the DaemonSet on every node", lambda: len(running(cluster, ns, "app=agent")) == len(nodes))
    guarded = running(cluster, ns, "app=guarded")
    movable = running(cluster, ns, "app=movable")
    agents = running(cluster, ns, "app=agent")
    plugins = plugin_pods(cluster, pool)
    originals = (
        set(guarded.values()) | set(movable.values()) | set(running(cluster, ns, "app=scratch").values())
    )

    def evicted_before_the_change(moment: Moment) -> str | None:
        """While an original non-DaemonSet pod is still on a node, its plugin pod is the original one."""
        for node in nodes:
            here = [p for p in moment.pods_on(node) if p["metadata"]["uid"] in originals]
            if not here:
                continue
            plugin = [
                p["metadata"]["uid"]
                for p in moment.pods_on(node)
                if p["metadata"].get("labels", {}).get(COMPONENT_LABEL) == "device-plugin"
            ]
            if plugin != [plugins[node][0]]:
                return f"{node}: plugin pods {plugin} while {here[0]['metadata']['name']} is still there"
        return None

    with (
        Sampler(cluster, set(nodes), 1) as sampler,
        Recorder(cluster, [evicted_before_the_change]) as recorder,
    ):
        merge_patch_stack(cluster, pool, {"spec": {"devicePlugin": {"version": NEW}}})

        def blocked() -> dict[str, Any]:
            status = stack_status(cluster, pool)
            return status if "drain-0" in hold_nodes(status, "EvictionBlocked") else {}

        status = wait_for("the PodDisruptionBudget to hold drain-0", blocked, timeout=60)
        assert "PodDisruptionBudget" in next(
            h["message"] for h in status["upgrade"]["holds"] if h["reason"] == "EvictionBlocked"
        )
        with cluster.api_client() as api_client:
            view = sample_nodes(api_client)
        assert view["drain-0"].labels[NODE_STATE_LABEL] == "drain-required" and view["drain-0"].unschedulable
        assert plugin_pods(cluster, pool)["drain-0"] == plugins["drain-0"]  # not changed

        # The day-2 Ansible upgrade takes the node mid-way: nothing is done to it (it does not even
        # fail at its timeout) until the maintenance ends; its step timer keeps running.
        cluster.kubectl("annotate", "node", "drain-0", f"{MAINTENANCE_ANNOTATION}=driver-upgrade")
        wait_for(
            "the maintenance hold",
            lambda: hold_nodes(stack_status(cluster, pool), "Maintenance") == ["drain-0"],
            timeout=30,
        )
        # Past the drain timeout (the node's own timer), and a whole pass planned after it.
        since = parse_time(
            kube_json(cluster, "node", "drain-0")["metadata"]["annotations"][STATE_SINCE_ANNOTATION]
        )
        assert since is not None
        wait_for(
            "the drain timeout to pass",
            lambda: datetime.now(UTC) > since + timedelta(seconds=timeout),
            timeout=timeout + 30,
        )
        later_pass(cluster, operator, pool, "drain-1")
        node = kube_json(cluster, "node", "drain-0")
        assert node["metadata"]["labels"][NODE_STATE_LABEL] == "drain-required"
        assert node["spec"].get("unschedulable") is True
        assert plugin_pods(cluster, pool)["drain-0"] == plugins["drain-0"]
        cluster.kubectl("annotate", "node", "drain-0", f"{MAINTENANCE_ANNOTATION}-")

        def settled() -> dict[str, Any]:
            status = stack_status(cluster, pool)
            done = serving(cluster, pool, NEW, ["drain-1", "drain-2"])
            return status if done and status.get("upgrade", {}).get("failed") else {}

        status = wait_for("drain-1 and drain-2 upgraded, drain-0 failed", settled, timeout=120)
    sampler.assert_kept()
    recorder.assert_kept()
    assert cluster.violations() == []

    # drain-0: held until the timeout (waited for above, on its own timer), then given back uncordoned,
    # still serving the old release.
    (failed,) = status["upgrade"]["failed"]
    assert failed["node"] == "drain-0" and "PodDisruptionBudget" in failed["reason"], failed
    assert f"{ns}/guarded" in failed["reason"]
    degraded = condition(status, "Degraded")
    assert degraded["status"] == "True" and "drain-0" in degraded["message"]
    with cluster.api_client() as api_client:
        view = sample_nodes(api_client)
    assert view["drain-0"].labels[NODE_STATE_LABEL] == "upgrade-failed"
    assert not view["drain-0"].unschedulable and view["drain-0"].gpus == GPUS
    assert plugin_pods(cluster, pool)["drain-0"] == plugins["drain-0"]
    warnings = [e for e in node_events(cluster, "drain-0") if e["reason"] == "UpgradeFailed"]
    assert warnings and "PodDisruptionBudget" in warnings[-1]["message"], warnings
    # The eviction API was used: the budget held (a DELETE would have ignored it) ...
    assert running(cluster, ns, "app=guarded") == guarded
    # ... the movable pods and the bare pod (force) were evicted; DaemonSet pods never are.
    assert not set(running(cluster, ns, "app=movable").values()) & set(movable.values())
    assert cluster.kubectl("get", "pod", "-n", ns, "scratch", check=False).returncode != 0
    assert running(cluster, ns, "app=agent") == agents

    # The budget lifted and the node relabelled for a retry: it is drained and upgraded.
    cluster.kubectl("delete", "pdb", "-n", ns, "guarded")
    cluster.kubectl("label", "node", "drain-0", f"{NODE_STATE_LABEL}=upgrade-required", "--overwrite")
    with Sampler(cluster, set(nodes), 1) as sampler:
        wait_for("drain-0 upgraded after the retry", lambda: serving(cluster, pool, NEW), timeout=120)
    sampler.assert_kept()
    assert not set(running(cluster, ns, "app=guarded").values()) & set(guarded.values())
    assert running(cluster, ns, "app=agent") == agents


# --- waitForCompletion ---------------------------------------------------------------------------------


def job(name: str, namespace: str, node: str, duration: str) -> dict[str, Any]:
    """A Job whose pod uses a GPU (nvidia.com/gpu) and, simulated, runs for `duration`."""
    template = workload(
        name,
        node,
        metadata={"annotations": {"sim.gpuforge.io/run-duration": duration}},
        container={"resources": {"limits": {"nvidia.com/gpu": 1}}},
        restartPolicy="Never",
    )
    template["metadata"]["labels"]["role"] = "train"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"backoffLimit": 0, "template": template},
    }


def test_wait_for_completion_holds_the_node_until_its_jobs_finish_or_the_timeout(
    cluster: Any, operator: Operator
) -> None:
    """A device plugin -> DRA move of two nodes: jobs-0's training job finishes after 20 s and the node
    moves only then; jobs-1's runs for 10 minutes and is evicted when the 45 s timeout is up."""
    pool, ns, timeout = "jobs", "jobs-work", 45
    nodes = names(pool)
    policy = {
        "maxUnavailable": 2,
        "maxParallel": 0,
        "waitForCompletion": {"podSelector": "role=train", "timeoutSeconds": timeout},
    }
    deploy(cluster, pool, policy)
    cluster.kubectl("create", "namespace", ns)
    apply(cluster, job("short", ns, "jobs-0", "20s"))
    apply(cluster, job("long", ns, "jobs-1", "600s"))
    pods = wait_for(
        "both jobs running", lambda: (r := running(cluster, ns, "role=train")) and len(r) == 2 and r
    )
    by_job = {name.rsplit("-", 1)[0]: uid for name, uid in pods.items()}
    job_uids = set(by_job.values())

    def waits_while_its_job_runs(moment: Moment) -> str | None:
        """A node whose job pod still runs is in (at most) wait-for-jobs-required, device plugin on."""
        for node in nodes:
            if any(p["metadata"]["uid"] in job_uids for p in moment.pods_on(node)):
                labels = moment.nodes[node]["metadata"].get("labels", {})
                state = labels.get(NODE_STATE_LABEL, "")
                if state not in (
                    "upgrade-done",
                    "upgrade-required",
                    "wait-for-jobs-required",
                    "drain-required",
                ):
                    return f"{node} is {state} while its job pod runs"
                if (
                    labels.get(DEPLOY_DEVICE_PLUGIN_LABEL) != "true"
                    or DEPLOY_DRA_KUBELET_PLUGIN_LABEL in labels
                ):
                    return f"{node} changed stack while its job pod runs"
        return None

    with (
        Sampler(cluster, set(nodes), 2) as sampler,
        Recorder(cluster, [waits_while_its_job_runs]) as recorder,
    ):
        merge_patch_stack(cluster, pool, {"spec": {"mode": "dra"}})
        wait_for(
            "both nodes waiting for their jobs",
            lambda: all(
                n.labels.get(NODE_STATE_LABEL) == "wait-for-jobs-required"
                for name, n in sample_nodes_of(cluster, nodes).items()
            ),
            timeout=30,
        )
        waiting_since = parse_time(
            kube_json(cluster, "node", "jobs-1")["metadata"]["annotations"][STATE_SINCE_ANNOTATION]
        )
        assert waiting_since is not None

        def moved(node: str) -> bool:
            labels = sample_nodes_of(cluster, [node])[node].labels
            return DEPLOY_DEVICE_PLUGIN_LABEL not in labels

        wait_for("jobs-0 to move after its job finished", lambda: moved("jobs-0"), timeout=60)
        assert not moved("jobs-1"), "jobs-1 moved before its wait timed out"
        wait_for("jobs-1 to move after the timeout", lambda: moved("jobs-1"), timeout=60)

        def on_dra() -> bool:
            view = sample_nodes_of(cluster, nodes)
            status = stack_status(cluster, pool)
            return status.get("upgrade", {}).get("complete") and all(
                v.slices == 1 and v.gpus == 0 and not v.unschedulable for v in view.values()
            )

        wait_for("both nodes on DRA", on_dra, timeout=120)
    sampler.assert_kept()
    recorder.assert_kept()
    assert cluster.violations() == []

    short = kube_json(cluster, "job", "-n", ns, "short")["status"]
    assert short.get("succeeded") == 1  # finished, not evicted
    # Why each went on, as the operator said on the Node: jobs-0 because its job was done, jobs-1 at the
    # timeout (not a moment measured here, which a loaded machine would stretch).
    assert any("no jobs to wait for" in e["message"] for e in node_events(cluster, "jobs-0"))
    (gave_up,) = [e for e in node_events(cluster, "jobs-1") if "waited long enough for jobs" in e["message"]]
    # Both times are the cluster's, in whole seconds (which keeps the bound: floor(a) - floor(b) >= t).
    gave_up_at = parse_time(gave_up["firstTimestamp"])
    assert gave_up_at is not None and gave_up_at - waiting_since >= timedelta(seconds=timeout), (
        f"jobs-1 gave up waiting at {gave_up_at}, entered the wait at {waiting_since}, timeout {timeout}s"
    )
    long = kube_json(cluster, "job", "-n", ns, "long")["status"]
    assert not long.get("succeeded")
    assert by_job["long"] not in running(cluster, ns, "role=train").values()  # evicted


def sample_nodes_of(cluster: Any, nodes: list[str]) -> dict[str, Any]:
    with cluster.api_client() as api_client:
        view = sample_nodes(api_client)
    return {n: view[n] for n in nodes}


# --- a device-plugin release that never becomes Ready ------------------------------------------------


def test_device_plugin_release_never_ready_is_rolled_back_while_the_rest_keep_serving(
    cluster: Any, operator: Operator
) -> None:
    pool = "back"
    nodes = names(pool)
    policy = {
        "maxUnavailable": 1,
        "maxParallel": 1,
        "onFailure": "rollback",
        "stepTimeouts": {"validation": 10},
    }
    deploy(cluster, pool, policy)
    before = plugin_pods(cluster, pool)
    with Sampler(cluster, set(nodes), 1) as sampler:
        merge_patch_stack(cluster, pool, {"spec": {"devicePlugin": {"version": NEVER_READY}}})

        def settled() -> dict[str, Any]:
            status = stack_status(cluster, pool)
            rolled_back = status.get("upgrade", {}).get("nodes", {}).get("rolled-back")
            moving = condition(status, "Progressing").get("status") == "True"
            return status if rolled_back and not moving else {}

        status = wait_for("the failed node rolled back", settled, timeout=120)
        later_pass(cluster, operator, pool, "back-1")  # and the next pass starts nothing else
    sampler.assert_kept()
    assert cluster.violations() == []

    (failed,) = status["upgrade"]["failed"]
    assert failed["node"] == "back-0" and "not Ready" in failed["reason"], failed
    degraded = condition(status, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "UpgradeFailed"
    assert "back-0" in degraded["message"]
    assert hold_nodes(stack_status(cluster, pool), "Halted") == ["back-1"]
    view = sample_nodes_of(cluster, nodes)
    after = plugin_pods(cluster, pool)
    # back-0: pinned to the release it ran, served by that release's DaemonSet, advertising, uncordoned.
    assert view["back-0"].labels[DEPLOY_DEVICE_PLUGIN_LABEL] == OLD
    assert view["back-0"].labels[NODE_STATE_LABEL] == "rolled-back"
    assert view["back-0"].gpus == GPUS and not view["back-0"].unschedulable
    assert after["back-0"][1] == OLD and after["back-0"][0] != before["back-0"][0]
    # back-1 never stopped serving: the same plugin pod as before.
    assert after["back-1"] == before["back-1"] and view["back-1"].gpus == GPUS
    assert view["back-1"].labels[NODE_STATE_LABEL] == "upgrade-required"


def test_device_plugin_release_never_ready_with_halt_stops_the_rollout(
    cluster: Any, operator: Operator
) -> None:
    pool = "halt"
    nodes = names(pool)
    deploy(cluster, pool, {"maxUnavailable": 1, "maxParallel": 1, "stepTimeouts": {"validation": 10}})
    before = plugin_pods(cluster, pool)
    with Sampler(cluster, set(nodes), 1) as sampler:
        merge_patch_stack(cluster, pool, {"spec": {"devicePlugin": {"version": NEVER_READY}}})

        def settled() -> dict[str, Any]:
            status = stack_status(cluster, pool)
            failed = status.get("upgrade", {}).get("nodes", {}).get("upgrade-failed")
            moving = condition(status, "Progressing").get("status") == "True"
            return status if failed and not moving else {}

        status = wait_for("the rollout halted", settled, timeout=120)
        later_pass(cluster, operator, pool, "halt-1")  # and the next pass starts nothing else
    sampler.assert_kept()
    assert cluster.violations() == []

    (failed,) = status["upgrade"]["failed"]
    assert failed["node"] == "halt-0" and "not Ready" in failed["reason"], failed
    assert "halt-0" in condition(status, "Degraded")["message"]
    assert hold_nodes(stack_status(cluster, pool), "Halted") == ["halt-1"]
    node = kube_json(cluster, "node", "halt-0")
    # Left as it failed, for a person to look at: cordoned, labelled failed, the reason on the node.
    assert node["metadata"]["labels"][NODE_STATE_LABEL] == "upgrade-failed"
    assert node["spec"].get("unschedulable") is True
    assert "not Ready" in node["metadata"]["annotations"][FAILURE_ANNOTATION]
    after = plugin_pods(cluster, pool)
    assert after["halt-0"][1] == NEVER_READY
    # Nothing else moved.
    assert after["halt-1"] == before["halt-1"]
    view = sample_nodes_of(cluster, nodes)
    assert view["halt-1"].gpus == GPUS and not view["halt-1"].unschedulable
    assert view["halt-1"].labels[NODE_STATE_LABEL] == "upgrade-required"
    assert [e for e in node_events(cluster, "halt-0") if e["reason"] == "UpgradeFailed"]


# --- nodes left alone ----------------------------------------------------------------------------------


def test_paused_skipped_and_maintenance_nodes_are_left_alone(cluster: Any, operator: Operator) -> None:
    """hold-0 carries the skip label; hold-1 is under maintenance by the day-2 Ansible driver upgrade
    (annotated and cordoned, as roles/driver_upgrade does); hold-2 moves once the policy is unpaused."""
    pool = "hold"
    nodes = names(pool)
    deploy(cluster, pool, {"maxUnavailable": 3, "maxParallel": 0})
    before = plugin_pods(cluster, pool)
    cluster.kubectl("label", "node", "hold-0", f"{UPGRADE_SKIP_LABEL}=true")
    cluster.kubectl("annotate", "node", "hold-1", f"{MAINTENANCE_ANNOTATION}=driver-upgrade")
    cluster.kubectl("cordon", "hold-1")

    with Sampler(cluster, set(nodes), 3, cordoned_by_others={"hold-1"}) as sampler:
        merge_patch_stack(
            cluster, pool, {"spec": {"devicePlugin": {"version": NEW}, "upgradePolicy": {"paused": True}}}
        )

        def held() -> dict[str, Any]:
            status = stack_status(cluster, pool)
            ok = (
                hold_nodes(status, "Paused") == ["hold-2"]
                and hold_nodes(status, "Skipped") == ["hold-0"]
                and hold_nodes(status, "Maintenance") == ["hold-1"]
            )
            return status if ok else {}

        wait_for("the holds in the status", held, timeout=60)
        later_pass(cluster, operator, pool, "hold-2")
        assert plugin_pods(cluster, pool) == before  # paused: nothing moved
        view = sample_nodes_of(cluster, nodes)
        assert not view["hold-0"].unschedulable and not view["hold-2"].unschedulable

        merge_patch_stack(cluster, pool, {"spec": {"upgradePolicy": {"paused": False}}})
        wait_for("hold-2 upgraded", lambda: serving(cluster, pool, NEW, ["hold-2"]), timeout=90)
        later_pass(cluster, operator, pool, "hold-2")
        after = plugin_pods(cluster, pool)
        assert after["hold-0"] == before["hold-0"] and after["hold-1"] == before["hold-1"]
        status = stack_status(cluster, pool)
        assert hold_nodes(status, "Skipped") == ["hold-0"]
        assert hold_nodes(status, "Maintenance") == ["hold-1"]
        node = kube_json(cluster, "node", "hold-1")
        assert node["spec"].get("unschedulable") is True  # still the maintenance's cordon
        assert node["metadata"]["labels"][NODE_STATE_LABEL] == "upgrade-done"  # as it was: not touched
        assert INITIAL_UNSCHEDULABLE_ANNOTATION not in node["metadata"].get("annotations", {})
    sampler.assert_kept()

    # The skip label removed and the maintenance over (the role uncordons and drops its annotation):
    # both are upgraded in turn.
    cluster.kubectl("label", "node", "hold-0", f"{UPGRADE_SKIP_LABEL}-")
    cluster.kubectl("annotate", "node", "hold-1", f"{MAINTENANCE_ANNOTATION}-")
    cluster.kubectl("uncordon", "hold-1")
    with Sampler(cluster, set(nodes), 3) as sampler:
        wait_for("every node upgraded", lambda: serving(cluster, pool, NEW), timeout=120)
    sampler.assert_kept()
    assert cluster.violations() == []
