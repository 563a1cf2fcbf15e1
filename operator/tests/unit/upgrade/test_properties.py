"""Property tests: random clusters, policies and crashes, run through the simulated world until done.

At every observed moment (after each applied plan and after each tick of the world):
- no node has both deploy labels on, advertises through both stacks, or has a pod holding GPUs from one
  stack while the other advertises them;
- no more nodes are out of service (cordoned or NotReady) than maxUnavailable, or than were already out;
- a node cordoned by someone else is never uncordoned;
- planning twice from one snapshot (in any node order) gives the same plan: a restart resumes exactly;
- `advance` (one node's next step, between whole plans) gives exactly the plan's steps for nodes in
  flight, from the whole snapshot or from any part of it; some rounds use it instead of `plan`;
- a snapshot of the nodes that weigh on admission plus a prefix of the plan's queue admits exactly what
  the whole snapshot admits among those nodes; some rounds admit that way, with the queue of an earlier
  plan, as the operator does when it fills freed slots.
At the end:
- every healthy node is upgrade-done (unless the failure budget halted the rollout), so one broken node
  does not stop the others; nothing is left in flight;
- a node that was schedulable before is schedulable again, except a failed node we hold with halt.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from upgrade_world import SimNode, SimOperand, SimPod, World, settled_node

from gpuforge.constants import MAINTENANCE_ANNOTATION, NODE_STATE_LABEL, UPGRADE_SKIP_LABEL
from gpuforge.upgrade import advance, plan
from gpuforge.upgrade.labelselector import LabelSelector
from gpuforge.upgrade.model import (
    DEPLOY_LABELS,
    IN_FLIGHT_STATES,
    INITIAL_UNSCHEDULABLE_ANNOTATION,
    Desired,
    Drain,
    IntOrPercent,
    Mode,
    NodeState,
    OnFailure,
    Plan,
    PodDeletion,
    PodRef,
    Policy,
    Snapshot,
    StepTimeouts,
    Transition,
    WaitForCompletion,
)
from gpuforge.upgrade.planner import AdmissionCounts, count_weights, weighs_on_admission, weight_of

DP, DRA = Mode.DEVICE_PLUGIN, Mode.DRA
OLD = {DP: "v0.17.0", DRA: "v25.8.0"}
NEW = {DP: "v0.18.0", DRA: "v25.12.0"}

TICK_SECONDS = 30  # the simulated world's default tick
WAIT_TIMEOUT = 120  # the waitForCompletion timeout the generator draws (besides 0)


@st.composite
def node_spec(draw: st.DrawFn, index: int, target: Mode) -> tuple[SimNode, set[str]]:
    """A node, plus its traits: 'broken' (target never Ready), 'blocked' (a pod no one may evict)."""
    name = f"n{index:02d}"
    start = draw(st.sampled_from([DP, DRA, None]))
    traits: set[str] = set()
    if start is None:
        node = SimNode(name, {"nvidia.com/gpu.count": "4"})
    else:
        version = draw(st.sampled_from([OLD[start], NEW[start]]))
        node = settled_node(name, start, version)
        for i in range(draw(st.integers(0, 3))):
            training = draw(st.booleans())
            blocked = draw(st.integers(0, 9)) == 0
            finishes_in = draw(st.integers(1, 8)) if training else None
            node.pods.append(
                SimPod(
                    PodRef("jobs", f"{name}-job{i}"),
                    start,
                    labels={"app": "train" if training else "web"},
                    finishes_in=finishes_in,
                    pdb_blocked=blocked,
                )
            )
            if blocked and not training:
                traits.add("blocked")
            if blocked and finishes_in is not None and finishes_in * TICK_SECONDS > WAIT_TIMEOUT:
                # A job no one may evict that outlives waitForCompletion's timeout fails the node.
                traits.add("slow-blocked-job")
    if draw(st.integers(0, 9)) == 0:
        node.unschedulable = True
        traits.add("cordoned")
    if draw(st.integers(0, 9)) == 0:
        node.ready = False
        traits.add("not-ready")
    if draw(st.integers(0, 6)) == 0:
        node.broken.add(NEW[target])
        traits.add("broken")
    if draw(st.integers(0, 19)) == 0:
        node.labels[UPGRADE_SKIP_LABEL] = "true"
        traits.add("skip")
    if draw(st.integers(0, 19)) == 0:
        node.annotations[MAINTENANCE_ANNOTATION] = "driver-upgrade"
        traits.add("maintenance")
    return node, traits


@st.composite
def scenario(
    draw: st.DrawFn,
) -> tuple[list[tuple[SimNode, set[str]]], Desired, Policy, int, float, list[int]]:
    target = draw(st.sampled_from([DP, DRA]))
    count = draw(st.integers(1, 10))
    nodes = [draw(node_spec(i, target)) for i in range(count)]
    want = Desired(mode=target, versions=NEW, selected=frozenset(n.name for n, _ in nodes))
    policy = Policy(
        max_unavailable=draw(
            st.one_of(
                st.builds(IntOrPercent, st.integers(1, 3)),
                st.builds(IntOrPercent, st.integers(10, 60), st.just(True)),
            )
        ),
        max_parallel=draw(st.integers(0, 3)),
        wait_for_completion=WaitForCompletion(
            LabelSelector.parse("app=train") if draw(st.booleans()) else LabelSelector(),
            timeout_seconds=draw(st.sampled_from([0, WAIT_TIMEOUT])),
        ),
        pod_deletion=PodDeletion(force=draw(st.booleans()), timeout_seconds=300),
        drain=Drain(enable=draw(st.integers(0, 4)) == 0, timeout_seconds=300),
        timeouts=StepTimeouts(wait_old_gone=300, operand_restart=300, validation=300, rollback=600),
        on_failure=draw(st.sampled_from([OnFailure.HALT, OnFailure.ROLLBACK])),
        max_failures=draw(st.sampled_from([0, 0, 1, 3])),
    )
    seed = draw(st.integers(0, 2**16))
    new_pod_rate = draw(st.sampled_from([0.0, 0.0, 0.3]))
    crashes = draw(st.lists(st.integers(0, 400), max_size=6))
    return nodes, want, policy, seed, new_pod_rate, crashes


def unavailable(world: World) -> int:
    return sum(1 for n in world.nodes.values() if n.unschedulable or not n.ready)


def check_moment(world: World, budget: int, pre_cordoned: set[str]) -> None:
    for name, node in world.nodes.items():
        assert not (node.deploy_value(DP) and node.deploy_value(DRA)), f"{name}: both deploy labels on"
        assert not world.advertises_both(name), f"{name}: advertises through both stacks"
        assert not world.double_allocation(name), f"{name}: GPUs held from one stack, advertised by the other"
        if name in pre_cordoned:
            assert node.unschedulable, f"{name}: someone else's cordon was lifted"
    assert unavailable(world) <= budget, f"{unavailable(world)} nodes out of service, allowed {budget}"


def check_replan(snapshot: Snapshot, want: Desired, policy: Policy, first: Plan) -> None:
    shuffled = list(snapshot.nodes)
    random.Random(len(shuffled)).shuffle(shuffled)
    assert plan(replace(snapshot, nodes=tuple(shuffled)), want, policy) == first
    in_flight = tuple(
        t for t in first.transitions if t.from_state in IN_FLIGHT_STATES and t.node in want.selected
    )
    assert advance(snapshot, want, policy) == in_flight
    part = {n.name for n in shuffled[: len(shuffled) // 2]}
    sub = replace(snapshot, nodes=tuple(n for n in snapshot.nodes if n.name in part))
    assert advance(sub, want, policy) == tuple(t for t in in_flight if t.node in part)
    assert first.queue[: len(first.admitted)] == first.admitted
    for head in sorted({0, 1, len(first.admitted), len(first.queue) // 2, len(first.queue)}):
        names = weighing(snapshot, want) | set(first.queue[:head])
        assert admissions(snapshot, want, policy, names) == tuple(
            t for t in first.transitions if t.node in first.admitted and t.node in names
        )
        # The same from the counts of the nodes that weigh, planning only the head of the queue.
        head_names = list(first.queue[:head])
        assert counted_admissions(snapshot, want, policy, head_names) == tuple(
            t for t in first.transitions if t.node in first.admitted and t.node in head_names
        )


def weighing(snapshot: Snapshot, want: Desired) -> set[str]:
    return {n.name for n in snapshot.nodes if n.name in want.selected and weighs_on_admission(n)}


def admissions(
    snapshot: Snapshot, want: Desired, policy: Policy, names: set[str], counts: AdmissionCounts | None = None
) -> tuple[Transition, ...]:
    """What the operator starts when slots free: the plan of just `names` (with the slots from `counts`,
    if given), its admissions only."""
    part = plan(
        replace(snapshot, nodes=tuple(n for n in snapshot.nodes if n.name in names)), want, policy, counts
    )
    return tuple(t for t in part.transitions if t.node in part.admitted)


def counted_admissions(
    snapshot: Snapshot, want: Desired, policy: Policy, head: list[str]
) -> tuple[Transition, ...]:
    """Slot filling as the operator does it: slots counted from every node's weight, only the head of the
    queue (less the nodes started or failed) planned."""
    weights = [(n.name, w) for n in snapshot.nodes if (w := weight_of(n)) is not None]
    taken = {name for name, w in weights if w.in_progress or w.failed_on}
    names = {n for n in head if n not in taken}
    return admissions(snapshot, want, policy, names, count_weights(weights, want.selected))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_rollouts_keep_the_invariants_and_converge(
    case: tuple[list[tuple[SimNode, set[str]]], Desired, Policy, int, float, list[int]],
) -> None:
    specs, want, policy, seed, new_pod_rate, crashes = case
    traits = {node.name: t for node, t in specs}
    world = World([node for node, _ in specs], want, seed=seed, new_pod_rate=new_pod_rate)
    pre_cordoned = {name for name, t in traits.items() if "cordoned" in t}
    budget = max(policy.max_unavailable.resolve(len(specs)), unavailable(world))
    rounds = 40 * len(specs) + 100
    quiet = 0
    queue: tuple[str, ...] = ()
    for round_ in range(rounds):
        snapshot = world.snapshot()
        full = plan(snapshot, want, policy)
        quiet = 0 if full.transitions else quiet + 1
        if quiet > 25 and round_ > max(crashes, default=0):  # longer than any step timeout: nothing will move
            break
        if round_ % 7 == 0:
            check_replan(snapshot, want, policy, full)
        # Some rounds take only the quick steps the operator makes between whole plans, some also fill
        # slots from the nodes that weigh on admission and the head of an earlier plan's queue.
        if round_ % 3 == 1:
            result = Plan(advance(snapshot, want, policy))
        elif round_ % 3 == 2:
            head = list(queue[: random.Random(round_).randint(0, len(queue))])
            if round_ % 2:
                filled = counted_admissions(snapshot, want, policy, head)
            else:
                filled = admissions(snapshot, want, policy, weighing(snapshot, want) | set(head))
            result = Plan(advance(snapshot, want, policy) + filled)
        else:
            result, queue = full, full.queue
        crash_after = random.Random(round_).randint(0, len(result.transitions)) if round_ in crashes else None
        world.apply_plan(result, crash_after=crash_after)
        check_moment(world, budget, pre_cordoned)
        world.tick()
        check_moment(world, budget, pre_cordoned)

    final = plan(world.snapshot(), want, policy)
    states = {name: node.labels.get(NODE_STATE_LABEL) for name, node in world.nodes.items()}
    troubled = {name for name, t in traits.items() if t & {"broken", "blocked"}}
    if policy.wait_for_completion.timeout_seconds:
        troubled |= {name for name, t in traits.items() if "slow-blocked-job" in t}
    left_alone = {name for name, t in traits.items() if t & {"not-ready", "skip", "maintenance"}}
    halted = policy.max_failures > 0 and len(troubled) >= policy.max_failures
    # Nodes out of service for good (someone else's cordon, NotReady; with halt, failed nodes we keep
    # cordoned) can use up maxUnavailable by themselves: then only nodes already cordoned can start
    # (documented; the MaxUnavailable hold says so).
    down_for_good = sum(1 for t in traits.values() if t & {"cordoned", "not-ready"})
    if policy.on_failure is OnFailure.HALT:
        down_for_good += len(troubled)
    halted = halted or down_for_good >= policy.max_unavailable.resolve(len(specs))
    if not halted:
        for name in set(world.nodes) - troubled - left_alone:
            assert states[name] == NodeState.UPGRADE_DONE, f"{name} stuck in {states[name]}: {final}"
    for name, node in world.nodes.items():
        if name in left_alone:
            continue
        assert states[name] not in {s.value for s in IN_FLIGHT_STATES}, (
            f"{name} still in flight: {states[name]}"
        )
        held_failed = (
            states[name] == NodeState.UPGRADE_FAILED and INITIAL_UNSCHEDULABLE_ANNOTATION in node.annotations
        )
        if name not in pre_cordoned and not held_failed:
            assert not node.unschedulable, f"{name} left cordoned in {states[name]}"
        if policy.on_failure is OnFailure.ROLLBACK and name in troubled:
            assert states[name] in (
                NodeState.ROLLED_BACK,
                NodeState.UPGRADE_FAILED,
                NodeState.UPGRADE_DONE,
                NodeState.UPGRADE_REQUIRED,
            )
            if states[name] == NodeState.ROLLED_BACK:
                assert any(o.ready for o in node.operands), f"{name} rolled back but serves nothing"


def test_a_30_node_migration_with_max_unavailable_3_completes_and_comes_back() -> None:
    """The round trip in the simulated world: device plugin to DRA, then back, with jobs running."""
    nodes = [settled_node(f"n{i:02d}", DP, NEW[DP]) for i in range(30)]
    for i, node in enumerate(nodes):
        if i % 2:
            node.pods.append(
                SimPod(PodRef("jobs", f"job{i}"), DP, labels={"app": "train"}, finishes_in=i % 5 + 1)
            )
    policy = Policy(max_unavailable=IntOrPercent(3), max_parallel=0)
    world = World(nodes, Desired(mode=DRA, versions=NEW, selected=frozenset()), seed=1, new_pod_rate=0.2)
    for target in (DRA, DP):
        want = Desired(mode=target, versions=NEW, selected=frozenset(n.name for n in nodes))
        world.desired = want
        peak = 0
        for _ in range(200):
            result = plan(world.snapshot(), want, policy)
            world.apply_plan(result)
            check_moment(world, 3, set())
            peak = max(peak, unavailable(world))
            world.tick()
            if result.complete:
                break
        assert result.complete, result.holds
        assert peak == 3
        assert all(n.deploy_value(target) == "true" and not n.unschedulable for n in world.nodes.values())


def test_operands_follow_labels_in_the_world() -> None:
    """Sanity check of the simulator itself: label off -> pod and advertisement gone a tick later."""
    node = settled_node("a", DP, NEW[DP])
    world = World([node], Desired(DP, NEW, frozenset({"a"})))
    node.labels.pop(DEPLOY_LABELS[DP])
    world.tick()
    assert node.operands and node.operands[0].deleting and node.advert
    for _ in range(12):
        world.tick()
    assert not node.operands and not node.advert
    node.labels[DEPLOY_LABELS[DRA]] = "true"
    for _ in range(4):
        world.tick()
    assert [o.ready for o in node.operands] == [True]
    assert node.advert == {DRA: 4}
    assert isinstance(node.operands[0], SimOperand)
