"""The NFD feature file must sort before GPU Feature Discovery's, so that GFD's live values win.

NFD's local source (source/local/local.go, getFeaturesFromFiles) reads features.d with os.ReadDir, which
returns entries sorted by file name (byte order), skips hidden files, and lets a later file's value replace
an earlier one's. The last file to name a feature therefore decides its value.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROLE = Path(__file__).resolve().parents[3] / "roles/nfd_labels"
GFD_FILE = "gfd"


def nfd_merge(files: dict[str, dict[str, str]]) -> dict[str, str]:
    """The features NFD publishes from these files, read the way local.go reads them."""
    merged: dict[str, str] = {}
    for name in sorted(files, key=lambda text: text.encode()):
        if name.startswith("."):
            continue
        merged.update(files[name])
    return merged


def test_default_file_sorts_before_gfd_so_gfd_wins() -> None:
    default = yaml.safe_load((ROLE / "defaults/main.yml").read_text())["nfd_labels_features_file"]
    assert not default.startswith(".")
    ours = {"nvidia.com/gpu.product": "NVIDIA-A100-80GB-PCIe", "nvidia.com/gpu.count": "2"}
    gfd = {"nvidia.com/gpu.product": "NVIDIA-A100-80GB-PCIe-SHARED", "nvidia.com/mig.strategy": "none"}
    merged = nfd_merge({default: ours, GFD_FILE: gfd})
    assert merged["nvidia.com/gpu.product"] == "NVIDIA-A100-80GB-PCIe-SHARED"
    assert merged["nvidia.com/gpu.count"] == "2"  # what GFD does not say still comes from the role


def test_old_file_name_would_override_gfd() -> None:
    merged = nfd_merge(
        {"gpuforge-gpu": {"nvidia.com/gpu.product": "A"}, GFD_FILE: {"nvidia.com/gpu.product": "B"}}
    )
    assert merged["nvidia.com/gpu.product"] == "A"
