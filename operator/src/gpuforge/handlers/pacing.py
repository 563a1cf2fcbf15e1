"""How often whole reconcile passes come while nodes are in flight. Pure: no kopf, no I/O."""

from __future__ import annotations

# While nodes are in flight, whole passes come this often at most (quick steps move the nodes in
# between): they refresh the status and the operands, catch timers and anything else.
WHOLE_PASS_EVERY = 5.0
# A whole pass reads and plans every node, so it takes time in proportion to the nodes. The next one waits
# at least this many times as long as the last took: on thousands of nodes whole passes stay a bounded
# share of the operator's time, instead of growing with nodes x the migration's length.
PASS_SPACING = 10.0
# ... but never longer than this: a pass that applied thousands of labels or operands is long for its
# writes, not its reads, and the status (nodes ready, in flight) should not go stale for minutes.
WHOLE_PASS_AT_MOST = 30.0


def in_flight_interval(last_pass_seconds: float) -> float:
    """Seconds from the end of a whole pass to the next while nodes are in flight."""
    return min(WHOLE_PASS_AT_MOST, max(WHOLE_PASS_EVERY, PASS_SPACING * last_pass_seconds))
