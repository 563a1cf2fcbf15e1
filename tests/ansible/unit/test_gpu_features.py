"""Table-driven tests of the pure GPU fact and NFD feature functions behind gpuforge.nodes.gpu_facts."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.gpuforge.nodes.plugins.module_utils import gpu_features as gf  # type: ignore[import-untyped]

H100_CSV = (
    "0, NVIDIA H100 80GB HBM3, GPU-aaa, 81559, 580.95.05, 9.0, Disabled\n"
    "1, NVIDIA H100 80GB HBM3, GPU-bbb, 81559, 580.95.05, 9.0, Enabled\n"
)
T4_CSV = "0, Tesla T4, GPU-ccc, 15360, 570.172.08, 7.5, [N/A]\n"


def pci(vendor: str, pci_class: str, device: str = "0x0001") -> dict[str, str]:
    return {"address": "0000:00:00.0", "vendor": vendor, "class": pci_class, "device": device}


@pytest.mark.parametrize(
    ("devices", "gpus", "nvswitches"),
    [
        ([], 0, 0),
        ([pci("0x8086", "0x030000")], 0, 0),  # an Intel VGA controller is not ours
        ([pci("0x10de", "0x030200"), pci("0x10de", "0x030000")], 2, 0),  # 3D and VGA controllers
        ([pci("0x10de", "0x068000"), pci("0x10de", "0x030200")], 1, 1),  # NVSwitch is a bridge
        ([pci("0x10DE", "0x030200")], 1, 0),  # sysfs case does not matter
        ([pci("0x10de", "0x040300")], 0, 0),  # the GPU's HDMI audio function
    ],
)
def test_pci_summary_counts_gpus_and_nvswitches(
    devices: list[dict[str, str]], gpus: int, nvswitches: int
) -> None:
    summary = gf.pci_summary(devices)
    assert (summary["gpu_count"], summary["nvswitch_count"]) == (gpus, nvswitches)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        (T4_CSV, [("Tesla T4", 15360, "7.5", False, False)]),
        (
            H100_CSV,
            [
                ("NVIDIA H100 80GB HBM3", 81559, "9.0", True, False),
                ("NVIDIA H100 80GB HBM3", 81559, "9.0", True, True),
            ],
        ),
        ("0, X, GPU-x, [N/A], 1.2.3, 8.0, [N/A]\n", [("X", None, "8.0", False, False)]),
    ],
)
def test_parse_query_csv(text: str, expected: list[tuple[Any, ...]]) -> None:
    parsed = [
        (g["name"], g["memory_mib"], g["compute_capability"], g["mig_capable"], g["mig_enabled"])
        for g in gf.parse_query_csv(text)
    ]
    assert parsed == expected


def test_parse_query_csv_rejects_a_short_line() -> None:
    with pytest.raises(ValueError, match="unexpected nvidia-smi query line"):
        gf.parse_query_csv("0, Tesla T4\n")


@pytest.mark.parametrize(
    ("banner", "version"),
    [
        ("| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0     |", "13.0"),
        ("CUDA Version: 12.8", "12.8"),
        ("no banner at all", None),
        (None, None),
    ],
)
def test_parse_cuda_version(banner: str | None, version: str | None) -> None:
    assert gf.parse_cuda_version(banner) == version


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        (None, None),  # not an EFI system
        (b"\x06\x00\x00\x00\x01", True),
        (b"\x06\x00\x00\x00\x00", False),
        (b"\x06\x00", None),  # truncated
    ],
)
def test_secure_boot_state(raw: bytes | None, state: bool | None) -> None:
    assert gf.secure_boot_state(raw) is state


@pytest.mark.parametrize(
    ("capability", "family"),
    [
        ("7.0", "volta"),
        ("7.5", "turing"),
        ("8.0", "ampere"),
        ("8.6", "ampere"),
        ("8.9", "ada-lovelace"),
        ("9.0", "hopper"),
        ("10.0", "blackwell"),
        ("12.0", "blackwell"),
        ("2.1", None),
        ("garbage", None),
        (None, None),
    ],
)
def test_gpu_family(capability: str | None, family: str | None) -> None:
    assert gf.gpu_family(capability) == family


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("Tesla T4", "Tesla-T4"),
        (" (weird) name! ", "weird-name"),
        ("x" * 80, "x" * 63),
    ],
)
def test_label_value(text: str, value: str) -> None:
    assert gf.label_value(text) == value


def test_features_of_an_nvswitch_node() -> None:
    pci_summary = {"gpu_count": 2, "gpu_device_ids": ["0x2330"], "nvswitch_count": 4}
    summary = gf.summarize(gf.parse_query_csv(H100_CSV), pci_summary, "13.0")
    assert gf.features(summary) == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.driver-version.minor": "95",
        "nvidia.com/cuda.driver-version.rev": "05",
        "nvidia.com/cuda.driver-version.full": "580.95.05",
        "nvidia.com/cuda.runtime-version.major": "13",
        "nvidia.com/cuda.runtime-version.minor": "0",
        "nvidia.com/cuda.runtime-version.full": "13.0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/gpu.nvswitch.count": "4",
    }


@pytest.mark.parametrize(
    ("gpus_csv", "pci_gpus", "namespace", "expected_subset", "absent"),
    [
        # No GPU anywhere: no features at all.
        ("", 0, "nvidia.com", {}, ["nvidia.com/gpu.present"]),
        # GPUs on PCI but no driver yet: presence and count only.
        (
            "",
            2,
            "nvidia.com",
            {"nvidia.com/gpu.count": "2"},
            ["nvidia.com/gpu.product", "nvidia.com/mig.capable"],
        ),
        (
            T4_CSV,
            1,
            "example.org/",
            {"example.org/mig.capable": "false", "example.org/gpu.family": "turing"},
            [],
        ),
    ],
)
def test_features_table(
    gpus_csv: str, pci_gpus: int, namespace: str, expected_subset: dict[str, str], absent: list[str]
) -> None:
    pci_summary = {"gpu_count": pci_gpus, "gpu_device_ids": [], "nvswitch_count": 0}
    result = gf.features(gf.summarize(gf.parse_query_csv(gpus_csv), pci_summary, None), namespace)
    assert expected_subset.items() <= result.items()
    assert not set(absent) & set(result)
    assert "nvidia.com/gpu.nvswitch.count" not in result
