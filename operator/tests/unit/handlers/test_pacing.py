"""Whole passes while nodes are in flight: every 5 s, spaced out in proportion to the time they took to
read and plan the nodes."""

from __future__ import annotations

import pytest

from gpuforge.handlers.pacing import (
    FLEET_PHASES,
    PASS_SPACING,
    WHOLE_PASS_AT_MOST,
    WHOLE_PASS_EVERY,
    in_flight_interval,
)


def passed(read: float, plan: float, operands: float = 0.0) -> dict[str, float]:
    return {"read": read, "plan": plan, "nodes": 0.01, "operands": operands, "status": 0.05}


@pytest.mark.parametrize(
    ("phases", "interval"),
    [
        ({}, WHOLE_PASS_EVERY),
        (passed(0.2, 0.1), WHOLE_PASS_EVERY),  # 1,000 nodes
        (passed(WHOLE_PASS_EVERY / PASS_SPACING, 0.0), WHOLE_PASS_EVERY),
        (passed(1.0, 0.6), 1.6 * PASS_SPACING),  # 5,000 nodes on a loaded machine
        (passed(0.2, 0.1, operands=20.0), WHOLE_PASS_EVERY),  # a new spec's operands, on a busy server
        (passed(6.0, 3.0), WHOLE_PASS_AT_MOST),  # tens of thousands of nodes
    ],
)
def test_in_flight_interval(phases: dict[str, float], interval: float) -> None:
    assert in_flight_interval(phases) == pytest.approx(interval)


def test_whole_passes_stay_a_bounded_share_of_the_time() -> None:
    for fleet in (0.1, 1.0, WHOLE_PASS_AT_MOST / PASS_SPACING):
        phases = {phase: fleet / len(FLEET_PHASES) for phase in FLEET_PHASES}
        assert fleet / (fleet + in_flight_interval(phases)) <= 1 / (1 + PASS_SPACING) + 1e-9
