"""Table-driven tests of the pure parsers behind gpuforge.nodes.node_state (dpkg, apt, rpm, systemctl)."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.gpuforge.nodes.plugins.module_utils import node_state as ns  # type: ignore[import-untyped]

ABSENT = {"installed": False, "version": None, "held": False}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {"nvidia-smi": ABSENT}),
        (
            "nvidia-smi\t580.95.05-1\tii \n",
            {"nvidia-smi": {"installed": True, "version": "580.95.05-1", "held": False}},
        ),
        (
            "nvidia-smi\t580.95.05-1\thi \n",
            {"nvidia-smi": {"installed": True, "version": "580.95.05-1", "held": True}},
        ),
        # Removed with its configuration left: known to dpkg, not installed (but still held).
        (
            "nvidia-smi\t580.95.05-1\thc \n",
            {"nvidia-smi": {"installed": False, "version": None, "held": True}},
        ),
        ("other\t1\tii \n", {"nvidia-smi": ABSENT}),  # packages not asked for are ignored
        ("nvidia-smi\t1:2.0-1\tiU \n", {"nvidia-smi": {"installed": False, "version": None, "held": False}}),
    ],
)
def test_parse_dpkg_query(text: str, expected: dict[str, Any]) -> None:
    assert ns.parse_dpkg_query(text, list(expected)) == expected


@pytest.mark.parametrize(
    ("text", "locks", "expected"),
    [
        ("", "", {"nvidia-driver": ABSENT}),
        (
            "nvidia-driver\t3:580.95.05-1.el9\n",
            "nvidia-driver-3:580.95.05-1.el9.*\n",
            # NVIDIA's epoch 3 is dropped like 0: versions compare with dpkg's and nvidia-smi's.
            {"nvidia-driver": {"installed": True, "version": "580.95.05-1.el9", "held": True}},
        ),
        (
            "nvidia-driver\t(none):580.95.05-1.el9\npackage libcuda is not installed\n",
            "# comment\n",
            {
                "nvidia-driver": {"installed": True, "version": "580.95.05-1.el9", "held": False},
                "libcuda": ABSENT,
            },
        ),
    ],
)
def test_parse_rpm_query(text: str, locks: str, expected: dict[str, Any]) -> None:
    assert ns.parse_rpm_query(text, list(expected), locks) == expected


POLICY = """nvidia-smi:
  Installed: 570.172.08-1
  Candidate: 580.95.05-1
  Version table:
     580.95.05-1 600
        600 http://127.0.0.1/ Packages
linux-headers-6.1.0-1-amd64:
  Installed: (none)
  Candidate: (none)
  Version table:
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (POLICY, {"nvidia-smi": "580.95.05-1", "linux-headers-6.1.0-1-amd64": None}),
        (POLICY, {"unknown-package": None}),
        ("", {"nvidia-smi": None}),
    ],
)
def test_parse_apt_policy(text: str, expected: dict[str, str | None]) -> None:
    assert ns.parse_apt_policy(text, list(expected)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nvidia-smi: /usr/bin/nvidia-smi\n", {"/usr/bin/nvidia-smi": "nvidia-smi"}),
        ("libcuda1:amd64, libcuda1:i386: /usr/lib/x\n", {"/usr/lib/x": "libcuda1"}),
        ("diversion by foo from: /usr/bin/nvidia-smi\n", {"/usr/bin/nvidia-smi": None}),
        ("", {"/usr/bin/nvidia-smi": None}),  # dpkg-query: no path found matching pattern (stderr)
    ],
)
def test_parse_dpkg_search(text: str, expected: dict[str, str | None]) -> None:
    assert ns.parse_dpkg_search(text, list(expected)) == expected


def test_parse_rpm_owners_keeps_order_and_skips_errors() -> None:
    text = "nvidia-driver-cuda\nfile /usr/bin/x is not owned by any package\n"
    assert ns.parse_rpm_owners(text, ["/usr/bin/nvidia-smi", "/usr/bin/x"]) == {
        "/usr/bin/nvidia-smi": "nvidia-driver-cuda",
        "/usr/bin/x": None,
    }


SHOW = """Id=nvidia-persistenced.service
LoadState=loaded
UnitFileState=enabled
ActiveState=active

Id=nvidia-fabricmanager.service
LoadState=not-found
UnitFileState=
ActiveState=inactive
"""


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (
            ["nvidia-persistenced", "nvidia-fabricmanager"],
            {
                "nvidia-persistenced": {"loaded": True, "enabled": "enabled", "active": "active"},
                "nvidia-fabricmanager": {"loaded": False, "enabled": None, "active": "inactive"},
            },
        ),
        (
            ["nvidia-persistenced.service"],
            {"nvidia-persistenced.service": {"loaded": True, "enabled": "enabled", "active": "active"}},
        ),
        (["containerd"], {"containerd": {"loaded": False, "enabled": None, "active": None}}),
    ],
)
def test_parse_systemctl_show(names: list[str], expected: dict[str, Any]) -> None:
    assert ns.parse_systemctl_show(SHOW, names) == expected
