"""Table-driven tests of the decisions behind gpuforge.nodes.nvidia_ctk_config (containerd imports, CDI)."""

from __future__ import annotations

import pytest
from ansible_collections.gpuforge.nodes.plugins.module_utils import nvidia_ctk  # type: ignore[import-untyped]

PATTERN = "/etc/containerd/conf.d/*.toml"
IMPORT = f'imports = ["{PATTERN}"]\n'


def test_drop_in_pattern() -> None:
    assert nvidia_ctk.drop_in_pattern("/etc/containerd/conf.d/99-nvidia.toml") == PATTERN


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        # No main configuration: a minimal one that only imports the drop-ins.
        (None, "version = 2\n" + IMPORT),
        # Debian's file without imports: one line at the top, the rest untouched.
        (
            'version = 2\n[plugins."io.containerd.grpc.v1.cri".cni]\n  bin_dir = "/usr/lib/cni"\n',
            IMPORT + 'version = 2\n[plugins."io.containerd.grpc.v1.cri".cni]\n  bin_dir = "/usr/lib/cni"\n',
        ),
        ("", IMPORT),
        # Already imported (by us, or by nvidia-ctk >= 1.18 itself): nothing to change.
        ("version = 2\n" + IMPORT, None),
        (f'version = 2\nimports = ["/etc/other/*.toml", "{PATTERN}"]\n', None),
        # `imports` inside a value or a comment is not an imports list.
        ('# imports = ["/x"]\nversion = 2\n', IMPORT + '# imports = ["/x"]\nversion = 2\n'),
    ],
)
def test_containerd_main_text(current: str | None, expected: str | None) -> None:
    assert nvidia_ctk.containerd_main_text(current, PATTERN) == expected


def test_containerd_main_text_refuses_foreign_imports() -> None:
    with pytest.raises(nvidia_ctk.ForeignImports):
        nvidia_ctk.containerd_main_text('version = 2\nimports = ["/etc/site/*.toml"]\n', PATTERN)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("nvidia.com/gpu=0\nnvidia.com/gpu=all\n", ["nvidia.com/gpu=0", "nvidia.com/gpu=all"]),
        (
            'time="2026-01-01T00:00:00Z" level=info msg="Found 3 CDI devices"\n'
            "nvidia.com/gpu=0\nnvidia.com/gpu=1\nnvidia.com/gpu=all\nnvidia.com/mig=0:1\n",
            ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all"],
        ),
    ],
)
def test_cdi_device_names(text: str, expected: list[str]) -> None:
    assert nvidia_ctk.cdi_device_names(text) == expected
