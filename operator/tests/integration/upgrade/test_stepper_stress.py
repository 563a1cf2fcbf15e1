"""The upgrade engine's shell between whole passes under load: a whole migration driven only by quick steps
and slot filling, with random patch latencies, plugin reactions on timers and many writes in flight on
the Writer's threads, never has more nodes cordoned than maxUnavailable and finishes every node.

No cluster (the in-memory world of tests/unit/k8s/stepper_world.py), but real threads and real time:
its interleavings differ from run to run, so it lives with the integration tests, not the unit suite.
"""

from __future__ import annotations

import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "unit" / "k8s"))

from stepper_world import VERSIONS, Cluster

from gpuforge.constants import DEPLOY_DEVICE_PLUGIN_LABEL, DEPLOY_DRA_KUBELET_PLUGIN_LABEL
from gpuforge.k8s.upgrade import Applied, StepContext, Stepper, Writer
from gpuforge.upgrade import plan
from gpuforge.upgrade.model import Desired, IntOrPercent, Mode, NodeState, Policy

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("nodes", "budget"), [(40, 4), (3, 3), (1, 1)])
def test_a_migration_by_quick_steps_and_slot_filling_keeps_max_unavailable_and_finishes(
    nodes: int, budget: int
) -> None:
    """With nodes left waiting, and with every node started by the one whole pass."""
    names = [f"n{i:02d}" for i in range(nodes)]
    cluster = Cluster(names, budget=budget, latency=0.01, seed=7)
    desired = Desired(Mode.DRA, VERSIONS, frozenset(names), stack="gpus")
    policy = Policy(max_unavailable=IntOrPercent(budget), max_parallel=0)
    writer = Writer(cluster, cluster, workers=8)  # type: ignore[arg-type]
    reports: list[Applied] = []
    changed: set[str] = set()
    lock = threading.Lock()

    def look_again(name: str) -> None:
        with lock:
            changed.add(name)

    stepper = Stepper(cluster, cluster, writer, reports.append, look_again)  # type: ignore[arg-type]

    def whole_pass() -> None:
        mark = writer.mark()
        snapshot = cluster.snapshot(set(names))
        result = plan(snapshot, desired, policy)
        stepper.use(StepContext.of(result, desired, policy, "v1", frozenset({"v1"})), mark)
        stepper.whole_pass(result, snapshot, mark, time.monotonic(), {})

    # One whole pass: its queue goes stale at once (nodes it lists start and finish), and quick steps
    # and slot filling must do the rest by themselves.
    whole_pass()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with lock:
            look, changed = set(names) | changed, set()
        stepper.quick(look, time.monotonic(), datetime.now(UTC))
        time.sleep(0.005)
        if set(cluster.states().values()) == {NodeState.UPGRADE_DONE.value} and not writer.mark().in_flight:
            break
    for timer in cluster.timers:
        timer.join(5)
    writer.close()

    assert set(cluster.states().values()) == {NodeState.UPGRADE_DONE.value}, cluster.states()
    assert cluster.most_cordoned <= budget, (
        f"{cluster.most_cordoned} nodes cordoned at once, allowed {budget}"
    )
    assert cluster.most_cordoned == budget  # and the slots were used
    for obj in cluster.nodes.values():
        labels = obj["metadata"]["labels"]
        assert DEPLOY_DEVICE_PLUGIN_LABEL not in labels and labels[DEPLOY_DRA_KUBELET_PLUGIN_LABEL] == "true"
        assert not obj["spec"].get("unschedulable")
    starts = sum(1 for e in cluster.events if "started" in e)
    assert starts == len(names), f"{starts} admissions for {len(names)} nodes"
    reactions = [step for applied in reports for step, _ in applied.reactions]
    assert reactions.count(NodeState.UPGRADE_DONE.value) == len(names)
