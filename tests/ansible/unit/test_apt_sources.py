"""Table-driven tests of the apt source parser behind gpuforge.nodes.apt_sources."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.gpuforge.nodes.plugins.module_utils import apt_sources  # type: ignore[import-untyped]

CUDA = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
TOOLKIT = "https://nvidia.github.io/libnvidia-container/stable/deb/amd64/"
# What cuda-keyring 1.1-1 and NVIDIA's toolkit install guide put on a host.
KEYRING_LIST = (
    "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
    "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /\n"
)
TOOLKIT_LIST = (
    "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "
    "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
    "#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "
    "https://nvidia.github.io/libnvidia-container/experimental/deb/$(ARCH) /\n"
)
OWN_SOURCES = (
    f"X-Repolib-Name: cuda\nTypes: deb\nURIs: {CUDA}\nSuites: /\nSigned-By: /etc/apt/keyrings/cuda.asc\n"
)


@pytest.mark.parametrize(
    ("files", "uris", "expected"),
    [
        # cuda-keyring's list is found; the role's own file is excluded.
        (
            {
                "/etc/apt/sources.list.d/cuda-debian12-x86_64.list": KEYRING_LIST,
                "/etc/apt/sources.list.d/cuda.sources": OWN_SOURCES,
            },
            [CUDA],
            [
                {
                    "path": "/etc/apt/sources.list.d/cuda-debian12-x86_64.list",
                    "uris": [CUDA],
                    "signed_by": ["/usr/share/keyrings/cuda-archive-keyring.gpg"],
                    "other_entries": False,
                }
            ],
        ),
        # $(ARCH) is substituted; the commented experimental line is no entry.
        (
            {"/etc/apt/sources.list.d/nvidia-container-toolkit.list": TOOLKIT_LIST},
            [TOOLKIT.rstrip("/")],
            [
                {
                    "path": "/etc/apt/sources.list.d/nvidia-container-toolkit.list",
                    "uris": [TOOLKIT],
                    "signed_by": ["/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"],
                    "other_entries": False,
                }
            ],
        ),
        # A deb822 file of someone else's, with an inline key and a second repository.
        (
            {
                "/etc/apt/sources.list.d/site.sources": (
                    f"Types: deb\nURIs: {CUDA.rstrip('/')}\nSuites: /\nSigned-By:\n -----BEGIN PGP PUBLIC KEY"
                    " BLOCK-----\n .\n -----END PGP PUBLIC KEY BLOCK-----\n\n"
                    "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\n"
                )
            },
            [CUDA],
            [
                {
                    "path": "/etc/apt/sources.list.d/site.sources",
                    "uris": [CUDA],
                    "signed_by": ["(inline key)"],
                    "other_entries": True,
                }
            ],
        ),
        # Disabled stanzas and other repositories are not reported.
        (
            {
                "/etc/apt/sources.list.d/off.sources": f"Enabled: no\nTypes: deb\nURIs: {CUDA}\nSuites: /\n",
                "/etc/apt/sources.list": "deb http://deb.debian.org/debian bookworm main\n",
            },
            [CUDA],
            [],
        ),
    ],
)
def test_matching_files(files: dict[str, str], uris: list[str], expected: list[dict[str, Any]]) -> None:
    found = apt_sources.matching_files(files, uris, "amd64", exclude=["/etc/apt/sources.list.d/cuda.sources"])
    assert found == expected
