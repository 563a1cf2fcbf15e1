"""Ubuntu's package names, versions and services as the role renders them (no Ubuntu host runs in the tests).

Ubuntu's archive is not reachable from the test machine, so no molecule scenario runs Ubuntu: these tests
render the role's install arguments and decisions (role_render.py) for every branch of the imitation
repository's table (nvidia_packages.BRANCHES), with the facts Canonical's and NVIDIA's packaging have:
the pinning package's own version, precompiled modules versioned by the kernel, the static
nvidia-persistenced unit running --no-persistence-mode, and Canonical's nvidia-fabricmanager-<branch>.
"""

from __future__ import annotations

from typing import Any

import nvidia_packages as data
import pytest
from role_render import RoleRender, facts

KERNEL = "6.8.0-45-generic"
RELEASES = [("22", "22.04"), ("24", "24.04")]
BRANCHES = [branch.branch for branch in data.BRANCHES]
INSTALL = "Install the kernel headers and the driver packages of the branch"


def driver(release: tuple[str, str], state: dict[str, Any] | None = None, **overrides: Any) -> RoleRender:
    major, version = release
    read: dict[str, Any] = {
        "gpu_facts": {"pci": {"nvswitch_count": 4}},
        "package_index": [],
        "candidates": {},
        "files": {},
        "services": {},
    }
    read.update(state or {})
    role = RoleRender(
        "nvidia_driver",
        facts("Ubuntu", major, version=version, kernel=KERNEL),
        __nvidia_driver_state=read,
        **overrides,
    )
    # What the preflight's decision stores for the later tasks.
    packages = role.var("_nvidia_driver_packages")
    read.setdefault("packages", {})
    for name in [*packages, role.var("_nvidia_driver_headers_package")]:
        read["packages"].setdefault(name, {"installed": False, "version": None, "held": False})
    return RoleRender(
        "nvidia_driver",
        facts("Ubuntu", major, version=version, kernel=KERNEL),
        __nvidia_driver_state=read,
        _nvidia_driver_package_list=packages,
        **overrides,
    )


def install_arguments(role: RoleRender, target: str) -> list[str]:
    assert role.task_runs("install-Debian.yml", INSTALL, nvidia_driver_target_version=target)
    names: list[str] = role.task_value(
        "install-Debian.yml", INSTALL, "ansible.builtin.apt", "name", nvidia_driver_target_version=target
    )
    return names


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("modules", ["open", "proprietary"])
@pytest.mark.parametrize("source", ["cuda", "distro"])
def test_precompiled_modules_are_installed_by_name_with_the_no_dkms_set(
    release: tuple[str, str], branch: str, modules: str, source: str
) -> None:
    role = driver(
        release,
        nvidia_driver_branch=branch,
        nvidia_driver_kernel_modules=modules,
        nvidia_driver_module_build="precompiled",
        nvidia_driver_source=source,
    )
    upstream = next(b for b in data.BRANCHES if b.branch == branch).versions[-1]
    arguments = install_arguments(role, f"{upstream}-0ubuntu1")
    open_suffix = "-open" if modules == "open" else ""
    modules_package = f"linux-modules-nvidia-{branch}-server{open_suffix}-{KERNEL}"
    # Versioned by the kernel (e.g. 6.8.0-45.45): asked for by name.
    assert modules_package in arguments
    assert not [a for a in arguments if a.startswith("linux-modules-nvidia") and "=" in a]
    # nvidia-headless-<b> depends on nvidia-dkms-<b>: the no-dkms set instead, and no DKMS package at all.
    assert [a for a in arguments if a.startswith("nvidia-headless-no-dkms")]
    assert not [a for a in arguments if "dkms" in a and "no-dkms" not in a]
    assert all(a.endswith(f"={upstream}-0ubuntu1") for a in arguments if not a.startswith("linux-"))


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("branch", BRANCHES)
def test_dkms_build_keeps_headless_and_versions_every_package(release: tuple[str, str], branch: str) -> None:
    role = driver(release, nvidia_driver_branch=branch)
    arguments = install_arguments(role, "1.0-1")
    suffix = f"-{branch}" if int(branch) < 590 else ""
    assert f"nvidia-dkms{suffix}-open=1.0-1" in arguments
    assert f"nvidia-headless{suffix}-open=1.0-1" in arguments
    # Every package at the driver's version, but the running kernel's headers.
    assert all("=" in a for a in arguments if a != f"linux-headers-{KERNEL}")


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("branch", [b.branch for b in data.BRANCHES if b.pinning])
def test_the_pinning_package_is_never_asked_for_at_the_driver_version(
    release: tuple[str, str], branch: str
) -> None:
    # The pinning package carries its own version (seen: nvidia-driver-pinning-610=610-2ubuntu1), and an
    # installed one of the same branch shows up in the package index under the driver's source package.
    pinning = f"nvidia-driver-pinning-{branch}"
    index = [["installed", "nvidia-graphics-drivers", pinning, f"{branch}-2ubuntu1"]]
    role = driver(
        release,
        state={"package_index": index, "candidates": {pinning: f"{branch}-2ubuntu1"}},
        nvidia_driver_branch=branch,
    )
    assert role.var("_nvidia_driver_pin_by_package") is True
    assert (
        role.task_runs(
            "install-Debian.yml", "Install the branch's pinning package", _nvidia_driver_lock_by_package=True
        )
        is False
    )
    pinning_task = role.task("install-Debian.yml", "Install the branch's pinning package")
    assert pinning_task["ansible.builtin.apt"]["name"] == "{{ _nvidia_driver_pinning_package }}"
    upstream = next(b for b in data.BRANCHES if b.branch == branch).versions[-1]
    assert not [a for a in install_arguments(role, f"{upstream}-1") if a.startswith("nvidia-driver-pinning")]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("source", ["cuda", "distro"])
def test_fabric_manager_name(release: tuple[str, str], branch: str, source: str) -> None:
    role = driver(release, nvidia_driver_branch=branch, nvidia_driver_source=source)
    expected = (
        f"nvidia-fabricmanager-{branch}"
        if source == "distro" or int(branch) < 580
        else "nvidia-fabricmanager"
    )
    assert role.var("_nvidia_driver_fabricmanager_package") == expected
    # An NVSwitch system (4 in the read) gets it with the driver.
    assert expected in role.var("_nvidia_driver_packages")


OVERRIDE = "/etc/systemd/system/nvidia-persistenced.service.d/gpuforge-persistence-mode.conf"
RECORD = {"exists": True, "type": "file", "mode": "0644", "uid": 0, "gid": 0}


def persistenced_state(unit_state: str, override: bool) -> dict[str, Any]:
    role = driver(RELEASES[1])
    content = role.var("_nvidia_driver_persistenced_override_content")
    return {
        "services": {
            "nvidia-persistenced": {"loaded": True, "enabled": unit_state, "active": "active"},
            "nvidia-fabricmanager": {"loaded": True, "enabled": "enabled", "active": "active"},
        },
        "files": {
            OVERRIDE: RECORD | {"content": content} if override else {"exists": False},
            "/etc/modprobe.d/gpuforge-blacklist-nouveau.conf": {"exists": False},
        },
    }


def test_the_override_turns_persistence_mode_on() -> None:
    content = driver(RELEASES[1]).var("_nvidia_driver_persistenced_override_content")
    assert "ExecStart=\n" in content
    assert "--persistence-mode" in content
    assert "--no-persistence-mode" not in content


@pytest.mark.parametrize(
    ("unit_state", "override", "writes", "enables"),
    [
        # Canonical's packages as installed: static unit, no override -> the override is written.
        ("static", False, True, True),
        # Converged: nothing to do (static counts as enabled).
        ("static", True, False, False),
        # A unit someone disabled is enabled again.
        ("disabled", True, False, True),
    ],
)
def test_static_persistenced_is_accepted_and_overridden(
    unit_state: str, override: bool, writes: bool, enables: bool
) -> None:
    role = driver(
        RELEASES[1],
        state=persistenced_state(unit_state, override),
        nvidia_driver_reboot_required=False,
        _nvidia_driver_service_list=["nvidia-persistenced", "nvidia-fabricmanager"],
    )
    assert role.var("_nvidia_driver_persistenced_override_in_place") is (not writes)
    assert role.task_runs("configure.yml", "Run nvidia-persistenced in persistence mode") is writes
    written = {"changed": writes, "skipped": not writes}
    assert role.task_runs(
        "configure.yml",
        "Enable nvidia-persistenced (started now unless the driver waits for a reboot)",
        __nvidia_driver_persistenced_override=written,
    ) is (writes or enables)
    problems = role.task_value(
        "verify.yml",
        "Check the packages, holds, services and what nvidia-smi sees",
        "vars",
        "__nvidia_driver_problems",
        __nvidia_driver_wrong_version=False,
        __nvidia_driver_unheld=[],
        __nvidia_driver_smi_wrong=False,
        __nvidia_driver_services_now=list(persistenced_state(unit_state, override)["services"].values()),
    )
    assert [p for p in problems if "not enabled" in p] == ([] if unit_state == "static" else [problems[0]])


def test_debian_still_requires_an_enabled_unit() -> None:
    role = RoleRender(
        "nvidia_driver",
        facts("Debian", "12"),
        __nvidia_driver_state={"gpu_facts": {"pci": {"nvswitch_count": 0}}, "files": {}},
    )
    assert role.var("_nvidia_driver_persistenced_override_in_place") is True
    assert role.render("{{ _nvidia_driver_enabled_states | default(['enabled']) }}") == ["enabled"]
