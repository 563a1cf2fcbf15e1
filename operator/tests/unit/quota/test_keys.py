"""Keys of spec.hard: ResourceQuota's countable keys and gpuforge's own; a typo names the key meant."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpuforge.api.gpuquota import GpuQuota
from gpuforge.quota.admission import hard_keys_denied
from gpuforge.quota.keys import hard_key_problems, key_problem


@pytest.mark.parametrize(
    "key",
    [
        "requests.nvidia.com/gpu",
        "requests.nvidia.com/gpu.H100",
        "requests.nvidia.com/gpu.shared",
        "requests.nvidia.com/mig-1g.5gb",
        "requests.cpu",
        "limits.cpu",
        "limits.memory",
        "requests.ephemeral-storage",
        "requests.hugepages-2Mi",
        "cpu",
        "memory",
        "ephemeral-storage",
        "pods",
        "requests.amd.com/gpu",
        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices",
        "count/resourceclaims.resource.k8s.io",
        "cash/requests.nvidia.com/gpu",
        "cash/requests.cpu",
        "requests.cpu.A4",  # per CPU model
        "limits.cpu.a4",
        "cash/limits.cpu.A4",
        "limits.memory.DDR5",  # per memory type
        "requests.memory.HBM-3e",
    ],
)
def test_countable_keys_are_accepted(key: str) -> None:
    assert key_problem(key) == ""


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("nvidia.com/gpu", "did you mean requests.nvidia.com/gpu"),
        ("requests.nvidia.com/gpus", "did you mean requests.nvidia.com/gpu"),
        ("limits.nvidia.com/gpu", "did you mean requests.nvidia.com/gpu"),
        ("cash/nvidia.com/gpu", "did you mean cash/requests.nvidia.com/gpu"),
        ("requests.gpu", "did you mean requests.nvidia.com/gpu"),
        ("request.cpu", "did you mean requests.cpu"),
        ("hugepages-2Mi", "did you mean requests.hugepages-2Mi"),
        ("cpu.A4", "did you mean requests.cpu.A4"),
        ("cash/memory.DDR5", "did you mean cash/requests.memory.DDR5"),
    ],
)
def test_a_misspelt_key_names_the_one_meant(key: str, meant: str) -> None:
    problem = key_problem(key)
    assert problem.startswith(f"{key}: ")
    assert problem.endswith(meant)


@pytest.mark.parametrize(
    "key",
    [
        "count/deployments.apps",
        "cash/cash/requests.cpu",
        "services",
        "x",
        "limits.cpu.A4-",  # a model ends in a letter or digit
        "requests.ephemeral-storage.ssd",  # only GPUs, CPUs and memory are split by model
    ],
)
def test_keys_nothing_is_counted_under_are_refused(key: str) -> None:
    assert key_problem(key) != ""


def test_keys_the_stored_quota_holds_stay_editable() -> None:
    assert hard_key_problems(["nvidia.com/gpu", "requests.cpu"], ["nvidia.com/gpu"]) == []
    assert len(hard_key_problems(["nvidia.com/gpu", "requests.nvidia.com/gpus"])) == 2


def test_a_quota_write_with_a_bad_key_is_invalid() -> None:
    new = GpuQuota(name="team", parent="", hard={"nvidia.com/gpu": Decimal(1)})
    denied = hard_keys_denied(new, None)
    assert denied is not None
    assert (denied.code, denied.reason, denied.key) == (422, "Invalid", "nvidia.com/gpu")
    assert denied.message == (
        'GpuQuota "team": spec.hard.nvidia.com/gpu: not a key gpuforge counts; '
        "did you mean requests.nvidia.com/gpu"
    )
    assert hard_keys_denied(new, new) is None  # already stored: left alone
    good = GpuQuota(name="team", parent="", hard={"requests.nvidia.com/gpu": Decimal(1)})
    assert hard_keys_denied(good, None) is None
