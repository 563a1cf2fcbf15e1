"""Whole passes while nodes are in flight: every 5 s, spaced out in proportion to their own length."""

from __future__ import annotations

import pytest

from gpuforge.handlers.pacing import (
    PASS_SPACING,
    WHOLE_PASS_AT_MOST,
    WHOLE_PASS_EVERY,
    in_flight_interval,
)


@pytest.mark.parametrize(
    ("last_pass", "interval"),
    [
        (0.0, WHOLE_PASS_EVERY),
        (0.3, WHOLE_PASS_EVERY),  # a 1,000-node pass: as before
        (WHOLE_PASS_EVERY / PASS_SPACING, WHOLE_PASS_EVERY),
        (2.0, 2.0 * PASS_SPACING),  # a 5,000-node pass on a loaded machine
        (4.0, 4.0 * PASS_SPACING),  # ... on a machine half as fast: not capped at 30 s any more
        (26.0, WHOLE_PASS_AT_MOST),  # 40,000 nodes, or a pass that labelled 2,000 nodes
    ],
)
def test_in_flight_interval(last_pass: float, interval: float) -> None:
    assert in_flight_interval(last_pass) == pytest.approx(interval)


def test_whole_passes_stay_a_bounded_share_of_the_time() -> None:
    for last_pass in (0.1, 1.0, WHOLE_PASS_AT_MOST / PASS_SPACING):
        assert last_pass / (last_pass + in_flight_interval(last_pass)) <= 1 / (1 + PASS_SPACING)
