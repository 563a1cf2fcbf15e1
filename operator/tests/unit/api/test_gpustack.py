"""Parsing GpuStack bodies into the typed model."""

from __future__ import annotations

from typing import Any

import pytest

from gpuforge.api import gpustack as m
from gpuforge.api.convert import ModelError, from_dict, to_dict
from gpuforge.constants import NFD_PCI_NVIDIA_LABELS, NFD_TEGRA_LABEL


def test_default_selector_matches_every_nfd_label_variant() -> None:
    terms = m.GpuStackSpec().node_selector.node_selector_terms
    assert [t.match_expressions[0].key for t in terms] == [*NFD_PCI_NVIDIA_LABELS, NFD_TEGRA_LABEL[0]]
    # Tegra (Jetson, IGX) GPUs are on no PCI bus: selected by CPU vendor, as NVIDIA's charts do
    assert terms[-1].match_expressions[0].values == ("NVIDIA",)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"mode": "magic"}, "spec.mode"),
        ({"devicePlugin": {"migStrategy": "all"}}, "spec.devicePlugin.migStrategy"),
        ({"dra": {"unknown": 1}}, "spec.dra.unknown"),
        ({"upgradePolicy": {"maxParallel": "3"}}, "spec.upgradePolicy.maxParallel"),
        ({"tolerations": [{"operator": "Maybe"}]}, "spec.tolerations[0].operator"),
    ],
)
def test_bad_spec_names_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ModelError, match=field.replace("[", r"\[").replace("]", r"\]")):
        from_dict(m.GpuStackSpec, spec, "spec")


@pytest.mark.parametrize("value", [3, "30%"])
def test_max_unavailable_is_int_or_string(value: int | str) -> None:
    spec = from_dict(m.GpuStackSpec, {"upgradePolicy": {"maxUnavailable": value}})
    assert spec.upgrade_policy.max_unavailable == value


def test_round_trip() -> None:
    body = {
        "mode": "dra",
        "dra": {"version": "v25.12.0", "deviceClasses": ["gpu.nvidia.com", "mig.nvidia.com"]},
        "devicePlugin": {"config": {"sharing": {"timeSlicing": {"replicas": 4}}}},
        "resources": {"requests": {"cpu": "10m", "memory": 64}},
    }
    spec = from_dict(m.GpuStackSpec, body)
    assert spec.mode is m.Mode.DRA
    assert spec.operand_version == "v25.12.0"
    assert spec.device_plugin.config.sharing.time_slicing == m.TimeSlicing(replicas=4)
    assert from_dict(m.GpuStackSpec, to_dict(spec)) == spec


def test_from_body_reads_identity() -> None:
    stack = m.GpuStack.from_body(
        {"metadata": {"name": "a", "generation": 3, "uid": "u", "creationTimestamp": "2026-01-01T00:00:00Z"}}
    )
    assert (stack.name, stack.generation, stack.uid) == ("a", 3, "u")
    assert stack.spec == m.GpuStackSpec()
