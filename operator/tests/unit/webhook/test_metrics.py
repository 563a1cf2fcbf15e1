"""The event-loop lag probe: a loop held up by blocking work shows as a late timer."""

from __future__ import annotations

import asyncio
import contextlib
import time

from gpuforge.webhook import metrics


def _late_probes(bound: float) -> float:
    """Probes observed so far that came later than `bound` seconds."""
    total = later = 0.0
    for family in metrics.REGISTRY.collect():
        if family.name != "gpuforge_event_loop_lag_seconds":
            continue
        for bucket in family.samples:
            if bucket.name.endswith("_bucket") and bucket.labels["le"] == "+Inf":
                total = bucket.value
            elif bucket.name.endswith("_bucket") and float(bucket.labels["le"]) == bound:
                later = bucket.value
    return total - later


def test_a_blocked_loop_is_seen_late_by_the_probe() -> None:
    async def scenario() -> None:
        probe = asyncio.create_task(metrics.probe_event_loop_lag(interval=0.005))
        await asyncio.sleep(0.02)  # the probe waits on its timer
        time.sleep(0.15)  # work that never hands the loop back
        await asyncio.sleep(0.02)
        probe.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probe

    before = _late_probes(0.1)
    asyncio.run(scenario())
    assert _late_probes(0.1) == before + 1
