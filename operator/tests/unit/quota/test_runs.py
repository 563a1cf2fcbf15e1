"""Every GPU-hour charged, however short the pod: the pod journal, table by table."""

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from gpuforge.quota.reconcile import PodRun, accrue
from gpuforge.quota.runs import PodJournal, Run, charging_workload, run_part

GPU = "requests.nvidia.com/gpu"
CASH = f"cash/{GPU}"
LABEL = "gpuforge.io/quota"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)


def stamp(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def owner(kind: str, name: str, uid: str) -> dict[str, Any]:
    group = "batch/v1" if kind == "Job" else "apps/v1"
    return {"apiVersion": group, "kind": kind, "name": name, "uid": uid, "controller": True}


def pod(
    name: str,
    *,
    label: str = "",
    owners: tuple[dict[str, Any], ...] = (),
    started: datetime | None = None,
    finished: datetime | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending"}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    }
    if started is not None:
        spec["nodeName"] = "node-1"
        status = {"phase": "Running", "startTime": stamp(started)}
    if finished is not None:
        status["phase"] = "Succeeded"
        status["containerStatuses"] = [{"state": {"terminated": {"finishedAt": stamp(finished)}}}]
    metadata: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if label:
        metadata["labels"] = {LABEL: label}
    if owners:
        metadata["ownerReferences"] = list(owners)
    return {"metadata": metadata, "spec": spec, "status": status}


def workload(
    kind: str, name: str, *, label: str = "", template_label: str = "", owned_by: str = ""
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if label:
        metadata["labels"] = {LABEL: label}
    if owned_by:
        metadata["ownerReferences"] = [owner("Deployment", owned_by, f"uid-{owned_by}")]
    template = {"metadata": {"labels": {LABEL: template_label} if template_label else {}}, "spec": {}}
    return {"kind": kind, "metadata": metadata, "spec": {"template": template}}


class Cluster:
    """Workload controllers by (kind, namespace, name), as the webhook's caches hold them."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {(o["kind"], "ns", o["metadata"]["name"]): o for o in objects}

    def __call__(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.objects.get((kind, namespace, name))

    def delete(self, kind: str, name: str) -> None:
        del self.objects[(kind, "ns", name)]


def charged(journal: PodJournal, quota: str, since: datetime, until: datetime) -> Decimal:
    """GPU-hours a pass over [since, until) charges `quota` (as the controller does)."""
    runs = [PodRun({GPU: Decimal(1)}, *run.window) for run in journal.runs(quota)]
    return accrue(runs, since, until, speedup=3600).get(CASH, Decimal(0))


def test_a_pod_that_starts_and_ends_between_two_passes_is_charged_whole() -> None:
    journal, cluster = PodJournal(), Cluster()
    # Pass at T0; the pod is created, runs 3 s, finishes and is deleted; the next pass at T0 + 60 s.
    journal.observe("ADDED", pod("p", label="q"), cluster, T0 + S)
    journal.observe("MODIFIED", pod("p", label="q", started=T0 + 2 * S), cluster, T0 + 2 * S)
    journal.observe(
        "MODIFIED", pod("p", label="q", started=T0 + 2 * S, finished=T0 + 5 * S), cluster, T0 + 5 * S
    )
    journal.observe(
        "DELETED", pod("p", label="q", started=T0 + 2 * S, finished=T0 + 5 * S), cluster, T0 + 6 * S
    )
    assert charged(journal, "q", T0, T0 + 60 * S) == 3  # 3 s at 3600x: three GPU-hours
    journal.drain("q")
    assert charged(journal, "q", T0 + 60 * S, T0 + 120 * S) == 0  # charged once


@pytest.mark.parametrize(
    ("events", "hours"),
    [
        # Deleted while running (no finish time in its status): until its deletion was seen.
        ([("ADDED", 2, None, 10)], 8),
        # Deleted after it finished: until it finished.
        ([("ADDED", 2, 4, 10)], 2),
        # Never scheduled: nothing.
        ([("ADDED", None, None, 10)], 0),
    ],
)
def test_an_ended_pod_is_charged_from_its_status(
    events: list[tuple[str, int | None, int | None, int]], hours: int
) -> None:
    journal, cluster = PodJournal(), Cluster()
    for event, started, finished, deleted in events:
        body = pod(
            "p",
            label="q",
            started=T0 + started * S if started is not None else None,
            finished=T0 + finished * S if finished is not None else None,
        )
        journal.observe(event, body, cluster, T0 + S)
        journal.observe("DELETED", body, cluster, T0 + deleted * S)
    assert charged(journal, "q", T0, T0 + 60 * S) == hours


def test_a_running_pod_is_charged_only_for_the_pass_window() -> None:
    journal, cluster = PodJournal(), Cluster()
    journal.observe("ADDED", pod("p", label="q", started=T0 - 100 * S), cluster, T0)
    assert charged(journal, "q", T0, T0 + 10 * S) == 10
    journal.drain("q")
    assert charged(journal, "q", T0 + 10 * S, T0 + 25 * S) == 15  # still running: stays in the journal


def test_surge_pods_of_a_rolling_update_are_charged_while_they_run() -> None:
    # Deployment d (labelled on itself only): its old and new ReplicaSets, one pod each during the surge.
    cluster = Cluster(
        workload("Deployment", "d", label="q"),
        workload("ReplicaSet", "d-old", owned_by="d"),
        workload("ReplicaSet", "d-new", owned_by="d"),
    )
    journal = PodJournal()
    old = pod("old", owners=(owner("ReplicaSet", "d-old", "uid-d-old"),), started=T0 - 100 * S)
    surge = pod("surge", owners=(owner("ReplicaSet", "d-new", "uid-d-new"),), started=T0 + 2 * S)
    journal.observe("ADDED", old, cluster, T0)
    journal.observe("ADDED", surge, cluster, T0 + 2 * S)
    # The rollout ends: the old pod goes 3 s later, between two passes.
    journal.observe("DELETED", old, cluster, T0 + 5 * S)
    assert charged(journal, "q", T0, T0 + 10 * S) == 5 + 8  # old until its deletion, surge since it started


def test_orphaned_pods_stay_charged_until_they_end() -> None:
    deployment = workload("Deployment", "d", label="q")
    replica_set = workload("ReplicaSet", "d-1", owned_by="d")
    cluster = Cluster(deployment, replica_set)
    journal = PodJournal()
    running = pod("p", owners=(owner("ReplicaSet", "d-1", "uid-d-1"),), started=T0 - 10 * S)
    assert journal.observe("ADDED", running, cluster, T0) == "q"
    # kubectl delete deployment d --cascade=orphan: the Deployment goes, its ReplicaSet loses its owner
    # and names no quota (the label was on the Deployment only); the pod runs on.
    cluster.delete("Deployment", "d")
    del replica_set["metadata"]["ownerReferences"]
    assert journal.observe("MODIFIED", running, cluster, T0 + S) == "q"
    assert charged(journal, "q", T0, T0 + 10 * S) == 10
    journal.drain("q")
    # The orphaned pod ends: charged until then, then no more.
    ended = pod(
        "p", owners=(owner("ReplicaSet", "d-1", "uid-d-1"),), started=T0 - 10 * S, finished=T0 + 12 * S
    )
    journal.observe("DELETED", ended, cluster, T0 + 13 * S)
    assert charged(journal, "q", T0 + 10 * S, T0 + 20 * S) == 2
    journal.drain("q")
    assert journal.runs("q") == []


def test_a_pod_whose_job_was_deleted_first_keeps_its_quota() -> None:
    # A Job deleted in the background goes before its pods: the pod's deletion names no owner that exists.
    cluster = Cluster(workload("Job", "j", template_label="q"))
    journal = PodJournal()
    running = pod("p", owners=(owner("Job", "j", "uid-j"),), started=T0)
    journal.observe("ADDED", running, cluster, T0)
    cluster.delete("Job", "j")
    assert journal.observe("DELETED", running, cluster, T0 + 4 * S) == "q"
    assert charged(journal, "q", T0, T0 + 10 * S) == 4


def test_a_pod_deleted_while_not_watched_is_charged_from_its_last_state() -> None:
    # A relist finds the pod gone: the informer reports the stored copy, which holds no status.
    journal, cluster = PodJournal(), Cluster()
    journal.observe("ADDED", pod("p", label="q", started=T0), cluster, T0)
    journal.observe(
        "DELETED", {"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"}}, cluster, T0 + 7 * S
    )
    assert charged(journal, "q", T0, T0 + 10 * S) == 7


@pytest.mark.parametrize(
    ("pod_label", "cluster", "expected"),
    [
        # Charged to the owner it names when that owner exists, at that uid, for the same quota.
        ("q", Cluster(workload("Job", "j", template_label="q")), ("Job", "j")),
        # The owner is charged elsewhere (or to nothing): the labelled pod pays itself.
        ("q", Cluster(workload("Job", "j", template_label="other")), ("Pod", "p")),
        ("q", Cluster(workload("Job", "j")), ("Pod", "p")),
        # The owner does not exist: the pod's own label, if any.
        ("q", Cluster(), ("Pod", "p")),
        ("", Cluster(), None),
        # Unlabelled pod of a labelled owner: the owner.
        ("", Cluster(workload("Job", "j", label="q")), ("Job", "j")),
    ],
)
def test_charging_workload(pod_label: str, cluster: Cluster, expected: tuple[str, str] | None) -> None:
    found = charging_workload(pod("p", label=pod_label, owners=(owner("Job", "j", "uid-j"),)), cluster)
    assert (None if found is None else (found["kind"], found["metadata"]["name"])) == expected


def test_a_relabelled_pod_moves_to_its_new_quota() -> None:
    journal, cluster = PodJournal(), Cluster()
    journal.observe("ADDED", pod("p", label="a", started=T0), cluster, T0)
    journal.observe("MODIFIED", pod("p", label="b", started=T0), cluster, T0 + 4 * S)
    assert charged(journal, "a", T0, T0 + 10 * S) == 4
    assert charged(journal, "b", T0 + 4 * S, T0 + 10 * S) == 6


def test_ended_pods_of_quotas_that_do_not_exist_are_dropped() -> None:
    journal, cluster = PodJournal(), Cluster()
    journal.observe("DELETED", pod("p", label="gone", started=T0), cluster, T0 + S)
    journal.forget_except({"q"})
    assert journal.runs("gone") == []


def test_the_cache_keeps_only_what_a_run_needs() -> None:
    full = pod("p", label="q", started=T0, finished=T0 + S)
    full["metadata"]["labels"]["app"] = "x"
    full["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    full["spec"]["containers"][0]["image"] = "registry.example/work:1"
    full["spec"]["volumes"] = [{"name": "data"}]
    full["status"]["podIP"] = "10.0.0.1"
    kept = run_part(full)
    assert kept["metadata"]["labels"] == {LABEL: "q"}
    assert "managedFields" not in kept["metadata"]
    assert kept["spec"]["containers"] == [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    assert "volumes" not in kept["spec"] and "podIP" not in kept["status"]
    assert Run("q", kept).window == Run("q", full).window == (T0, T0 + S)


def test_a_pod_seen_before_its_owner_is_charged_once_the_owner_is_known() -> None:
    # The pod's watch delivered it before the ReplicaSet's and Deployment's watches delivered them.
    cluster = Cluster()
    journal = PodJournal()
    running = pod("p", owners=(owner("ReplicaSet", "d-1", "uid-d-1"),), started=T0)
    assert journal.observe("ADDED", running, cluster, T0) == ""
    cluster.objects[("Deployment", "ns", "d")] = workload("Deployment", "d", label="q")
    cluster.objects[("ReplicaSet", "ns", "d-1")] = workload("ReplicaSet", "d-1", owned_by="d")
    journal.resolve(cluster, T0 + S)
    assert charged(journal, "q", T0, T0 + 10 * S) == 10
    assert journal.unresolved == 0


def test_a_pod_of_an_owner_naming_no_quota_is_not_looked_at_again() -> None:
    cluster = Cluster(workload("ReplicaSet", "d-1"))
    journal = PodJournal()
    journal.observe(
        "ADDED", pod("p", owners=(owner("ReplicaSet", "d-1", "uid-d-1"),), started=T0), cluster, T0
    )
    assert journal.unresolved == 0
