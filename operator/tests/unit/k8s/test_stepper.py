"""The upgrade engine's shell between whole passes (gpuforge.k8s.upgrade.Writer and Stepper), against an
in-memory stand-in for the API server's Nodes (no cluster: the real one is in tests/integration/upgrade).

- A node with a write in flight gets no other write until it lands, and whoever was left out is told
  when it lands; a step planned from a view older than our latest write to its node is left out.
- Admissions in flight count as landed when slots are weighed, uncordons only once landed.
- The admission that fills a finished node's slot is timed from that node's last patch landing.

A whole migration under random patch latencies and real threads is in
tests/integration/upgrade/test_stepper_stress.py (it takes seconds, and its interleavings vary by run).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from stepper_world import Cluster, node

from gpuforge.constants import DEPLOY_DEVICE_PLUGIN_LABEL, NODE_STATE_LABEL
from gpuforge.k8s.upgrade import Applied, Stepper, Writer, overlaid
from gpuforge.upgrade.model import NodeState, SetLabels, Transition, Uncordon


def transition(name: str, *actions: Any, ends: bool = False) -> Transition:
    if ends:
        return Transition(name, NodeState.VALIDATION_REQUIRED, NodeState.UPGRADE_DONE, actions, "done")
    return Transition(name, NodeState.WAIT_OLD_GONE, NodeState.VALIDATION_REQUIRED, actions, "step")


def delay_patches(cluster: Cluster, wait: Callable[[], object]) -> None:
    """Each node patch answers only after `wait()` returns."""
    patch = cluster.patch_node

    def slow_patch(name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        wait()
        return patch(name, body)

    cluster.patch_node = slow_patch  # type: ignore[method-assign]


def test_a_node_with_a_write_in_flight_gets_no_other_until_it_lands() -> None:
    cluster = Cluster(["a"], budget=1)
    release = threading.Event()
    delay_patches(cluster, lambda: release.wait(5))
    writer = Writer(cluster, cluster)  # type: ignore[arg-type]
    snapshot = cluster.snapshot({"a"})
    retried: list[str] = []
    first = list(
        writer.submit(
            [transition("a", SetLabels({"x": "1"}))], snapshot, writer.mark(), lambda _: None
        ).values()
    )
    second = writer.submit(
        [transition("a", SetLabels({"x": "2"}))],
        snapshot,
        writer.mark(),
        lambda _: None,
        None,
        retried.append,
    )
    assert len(first) == 1 and second == {} and retried == []
    assert set(writer.mark().in_flight) == {"a"}
    release.set()
    first[0].result(5)
    assert retried == ["a"] and writer.mark().in_flight == {}
    assert cluster.nodes["a"]["metadata"]["labels"]["x"] == "1"
    writer.close()


def test_a_step_planned_before_our_latest_write_to_its_node_landed_is_left_out() -> None:
    cluster = Cluster(["a", "b"], budget=1)
    writer = Writer(cluster, cluster)  # type: ignore[arg-type]
    snapshot = cluster.snapshot({"a", "b"})
    old = writer.mark()
    writer.submit([transition("a", SetLabels({"x": "1"}))], snapshot, old, lambda _: None)["a"].result(5)
    retried: list[str] = []
    stale = writer.submit(
        [transition("a", SetLabels({"x": "2"})), transition("b", SetLabels({"x": "2"}))],
        snapshot,
        old,
        lambda _: None,
        None,
        retried.append,
    )
    # b went; a is looked at again
    assert list(stale) == ["b"] and stale["b"].result(5).transitions == 1 and retried == ["a"]
    fresh = writer.submit([transition("a", SetLabels({"x": "3"}))], snapshot, writer.mark(), lambda _: None)
    assert fresh["a"].result(5).transitions == 1
    assert cluster.nodes["a"]["metadata"]["labels"]["x"] == "3"
    writer.close()


def test_a_closed_writer_starts_no_step_and_lets_the_writes_in_flight_land() -> None:
    cluster = Cluster(["a", "b"], budget=1)
    writer = Writer(cluster, cluster)  # type: ignore[arg-type]
    snapshot = cluster.snapshot({"a", "b"})
    landed = writer.submit([transition("a", SetLabels({"x": "1"}))], snapshot, writer.mark(), lambda _: None)
    writer.close()
    assert landed["a"].done() and cluster.nodes["a"]["metadata"]["labels"]["x"] == "1"
    late = writer.submit([transition("b", SetLabels({"x": "1"}))], snapshot, writer.mark(), lambda _: None)
    assert late == {} and "x" not in cluster.nodes["b"]["metadata"].get("labels", {})


def test_admissions_in_flight_count_as_landed_uncordons_only_once_landed() -> None:
    nodes = [node("a"), node("b")]
    nodes[1]["spec"]["unschedulable"] = True
    admission = Transition(
        "a",
        NodeState.UPGRADE_REQUIRED,
        NodeState.WAIT_OLD_GONE,
        (SetLabels({NODE_STATE_LABEL: "wait-old-gone", DEPLOY_DEVICE_PLUGIN_LABEL: None}),),
        "started",
    )
    done = Transition("b", NodeState.VALIDATION_REQUIRED, NodeState.UPGRADE_DONE, (Uncordon(),), "done")
    a, b = overlaid(nodes, {"a": admission, "b": done})
    assert a["metadata"]["labels"][NODE_STATE_LABEL] == "wait-old-gone"
    assert DEPLOY_DEVICE_PLUGIN_LABEL not in a["metadata"]["labels"]
    assert "resourceVersion" not in a["metadata"]  # never mistaken for the stored copy
    assert b is nodes[1] and b["spec"]["unschedulable"] is True
    assert DEPLOY_DEVICE_PLUGIN_LABEL in nodes[0]["metadata"]["labels"]  # the cached copy is untouched


def test_a_freed_slot_is_filled_as_a_reaction_to_the_landing_that_freed_it() -> None:
    """The uncordon's reaction runs from its cause to its landing; the next admission's from that
    landing on, so a slot's cycle counts the uncordon's round trip once."""
    cluster = Cluster(["a"], budget=1)
    delay_patches(cluster, lambda: time.sleep(0.05))
    writer = Writer(cluster, cluster)  # type: ignore[arg-type]
    reports: list[Applied] = []
    stepper = Stepper(cluster, cluster, writer, reports.append, lambda _: None)  # type: ignore[arg-type]
    fills: list[float | None] = []
    stepper.fill = fills.append  # type: ignore[method-assign]
    caused = time.monotonic()
    done = transition("a", Uncordon(), ends=True)
    futures = writer.submit([done], cluster.snapshot({"a"}), writer.mark(), lambda _: caused, stepper._landed)
    futures["a"].result(5)
    writer.close()
    ((entered, reaction),) = reports[0].reactions
    assert entered == "upgrade-done" and reaction >= 0.05
    (slot_freed,) = fills
    assert slot_freed is not None and slot_freed >= caused + reaction
