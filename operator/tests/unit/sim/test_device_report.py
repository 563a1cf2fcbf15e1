"""The agent's model of kubelet's device manager when a device plugin stops and comes back."""

from __future__ import annotations

import pytest

from gpuforge_lab.sim.agent import DeviceReport, device_report

GRACE = 300.0
GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("registered", "previously", "stopped", "now", "expected"),
    [
        pytest.param({GPU: 2}, {}, {}, 0.0, DeviceReport({GPU: 2}, {GPU: 2}, {}), id="plugin registers"),
        pytest.param(
            {}, {GPU: 2}, {}, 10.0, DeviceReport({GPU: 2}, {GPU: 0}, {GPU: (2, 10.0)}), id="plugin stops"
        ),
        pytest.param(
            {},
            {},
            {GPU: (2, 10.0)},
            309.0,
            DeviceReport({GPU: 2}, {GPU: 0}, {GPU: (2, 10.0)}),
            id="within the grace period",
        ),
        pytest.param(
            {}, {}, {GPU: (2, 10.0)}, 310.0, DeviceReport({GPU: 0}, {GPU: 0}, {}), id="grace period over"
        ),
        pytest.param(
            {GPU: 2}, {}, {GPU: (2, 10.0)}, 20.0, DeviceReport({GPU: 2}, {GPU: 2}, {}), id="plugin back"
        ),
        pytest.param(
            {"nvidia.com/gpu.shared": 8},
            {GPU: 2},
            {},
            5.0,
            DeviceReport(
                {"nvidia.com/gpu.shared": 8, GPU: 2}, {"nvidia.com/gpu.shared": 8, GPU: 0}, {GPU: (2, 5.0)}
            ),
            id="a renamed resource replaces the old one, which lingers",
        ),
    ],
)
def test_device_report(
    registered: dict[str, int],
    previously: dict[str, int],
    stopped: dict[str, tuple[int, float]],
    now: float,
    expected: DeviceReport,
) -> None:
    assert device_report(registered, previously, stopped, now, GRACE) == expected
