"""How often whole reconcile passes come while nodes are in flight. Pure: no kopf, no I/O."""

from __future__ import annotations

from collections.abc import Mapping

# While nodes are in flight, whole passes come this often at most (quick steps move the nodes in
# between): they refresh the status and the operands, catch timers and anything else.
WHOLE_PASS_EVERY = 5.0
# A whole pass reads and plans every node, so those phases take time in proportion to the nodes. The next
# pass waits at least this many times as long as the last one's reading and planning took: on thousands of
# nodes whole passes stay a bounded share of the operator's time, instead of growing with nodes x the
# migration's length. Its writes (operands, status, events) are left out: they do not grow with the fleet,
# and the pass that applies a new spec's operands on a busy API server is long for them alone (24 s for
# 1,000 nodes, which as a whole would have left the status two minutes behind a migration going on).
PASS_SPACING = 15.0
# The phases of a pass (`gpuforge.k8s.stack.Outcome.phases`) that read and plan every node.
FLEET_PHASES = ("read", "plan")
# ... but never longer than this, so that the status (nodes ready, in flight) is at most about two
# minutes old. A migration's length grows with its nodes as a pass's does: a lower cap would make the
# number of passes, and so their CPU per node, grow with the fleet (with 5,000 nodes and a 30 s cap, 39
# passes of 4 s took 158 s of wall time against 202 s of the operator's CPU). Up to this cap (8 s of
# reading and planning, about 20,000 nodes) a migration takes about as many passes at any size.
WHOLE_PASS_AT_MOST = 120.0


def in_flight_interval(phases: Mapping[str, float]) -> float:
    """Seconds from the end of a whole pass to the next while nodes are in flight, from the seconds the
    last pass spent in each phase."""
    fleet = sum(phases.get(phase, 0.0) for phase in FLEET_PHASES)
    return min(WHOLE_PASS_AT_MOST, max(WHOLE_PASS_EVERY, PASS_SPACING * fleet))
