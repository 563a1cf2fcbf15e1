"""Table-driven tests of adding Debian's contrib, non-free and non-free-firmware components to apt sources."""

from __future__ import annotations

import pytest
from ansible_collections.gpuforge.nodes.plugins.module_utils import apt_sources  # type: ignore[import-untyped]

NONFREE = ["contrib", "non-free", "non-free-firmware"]
# Debian 12's deb822 layout (the debian:bookworm image, cloud images).
DEBIAN_SOURCES = (
    "Types: deb\n"
    "# http://snapshot.debian.org/archive/debian/20250101T000000Z\n"
    "URIs: http://deb.debian.org/debian\n"
    "Suites: bookworm bookworm-updates\n"
    "Components: main\n"
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    "\n"
    "Types: deb\n"
    "URIs: http://deb.debian.org/debian-security\n"
    "Suites: bookworm-security\n"
    "Components: main\n"
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
)
DEBIAN_SOURCES_NONFREE = DEBIAN_SOURCES.replace(
    "Components: main\n", "Components: main contrib non-free non-free-firmware\n"
)
THIRD_PARTY = "\nTypes: deb\nURIs: https://example.com/apt\nSuites: stable\nComponents: main\n"


@pytest.mark.parametrize(
    ("path", "text", "expected"),
    [
        # Both stanzas gain the components; the comment and Signed-By stay.
        ("/etc/apt/sources.list.d/debian.sources", DEBIAN_SOURCES, DEBIAN_SOURCES_NONFREE),
        # Already complete: unchanged (idempotent).
        ("/etc/apt/sources.list.d/debian.sources", DEBIAN_SOURCES_NONFREE, DEBIAN_SOURCES_NONFREE),
        # Partly there: only the missing ones are added, in order.
        (
            "/etc/apt/sources.list.d/debian.sources",
            "URIs: http://mirror.example/debian\nSuites: bookworm\nComponents: main non-free-firmware\n",
            "URIs: http://mirror.example/debian\nSuites: bookworm\n"
            "Components: main non-free-firmware contrib non-free\n",
        ),
        # Another repository in the same file, and a disabled stanza: left alone.
        (
            "/etc/apt/sources.list.d/debian.sources",
            DEBIAN_SOURCES_NONFREE + THIRD_PARTY,
            DEBIAN_SOURCES_NONFREE + THIRD_PARTY,
        ),
        (
            "/etc/apt/sources.list.d/debian.sources",
            "Enabled: no\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\n",
            "Enabled: no\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\n",
        ),
        # Another release: left alone.
        (
            "/etc/apt/sources.list.d/debian.sources",
            "URIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\n",
            "URIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\n",
        ),
        # The installer's one-line sources.list: deb and deb-src lines, options, comments kept.
        (
            "/etc/apt/sources.list",
            "# main only\n"
            "deb http://deb.debian.org/debian/ bookworm main\n"
            "deb-src http://deb.debian.org/debian/ bookworm main\n"
            "deb [arch=amd64 signed-by=/k.gpg] http://security.debian.org/debian-security"
            " bookworm-security main # security\n"
            "deb http://deb.debian.org/debian/ bookworm-updates main non-free-firmware\n"
            "deb https://example.com/apt stable main\n"
            "#deb http://deb.debian.org/debian/ bookworm-backports main\n",
            "# main only\n"
            "deb http://deb.debian.org/debian/ bookworm main contrib non-free non-free-firmware\n"
            "deb-src http://deb.debian.org/debian/ bookworm main contrib non-free non-free-firmware\n"
            "deb [arch=amd64 signed-by=/k.gpg] http://security.debian.org/debian-security"
            " bookworm-security main contrib non-free non-free-firmware # security\n"
            "deb http://deb.debian.org/debian/ bookworm-updates main non-free-firmware contrib non-free\n"
            "deb https://example.com/apt stable main\n"
            "#deb http://deb.debian.org/debian/ bookworm-backports main\n",
        ),
        # An entry without main is not Debian's archive as the release ships it: left alone.
        (
            "/etc/apt/sources.list",
            "deb http://x/debian bookworm contrib\n",
            "deb http://x/debian bookworm contrib\n",
        ),
    ],
)
def test_with_components(path: str, text: str, expected: str) -> None:
    assert apt_sources.with_components(path, text, "bookworm", NONFREE) == expected


def test_component_edits_only_files_that_change() -> None:
    files = {
        "/etc/apt/sources.list.d/debian.sources": {"exists": True, "content": DEBIAN_SOURCES},
        "/etc/apt/sources.list": {"exists": False, "content": None},
        "/etc/apt/other.list": {"exists": True, "content": "deb http://x/debian bookworm main\n"},
    }
    paths = ["/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"]
    assert apt_sources.component_edits(files, paths, "bookworm", NONFREE) == {
        "/etc/apt/sources.list.d/debian.sources": DEBIAN_SOURCES_NONFREE
    }
    complete = {"/etc/apt/sources.list.d/debian.sources": {"exists": True, "content": DEBIAN_SOURCES_NONFREE}}
    assert apt_sources.component_edits(complete, paths, "bookworm", NONFREE) == {}
