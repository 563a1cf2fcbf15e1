"""The dnf path of nvidia_driver, rendered table by table from the imitation repository's package data.

No RPM repository is reachable from the test machine, so RHEL is never run: these tests render what the
role's tasks would receive (role_render.py: Ansible's own templating) for every driver version the apt tests
install (nvidia_packages.BRANCHES), as NVIDIA's RPMs carry them (nvidia_packages.RPM_PACKAGES: epoch 3,
release .el<major>), and check the pure version helpers and rpm parsers against the same rows.
"""

from __future__ import annotations

from typing import Any

import nvidia_packages as data
import pytest
from ansible_collections.gpuforge.nodes.plugins.module_utils import (  # type: ignore[import-untyped]
    driver_versions,
)
from ansible_collections.gpuforge.nodes.plugins.module_utils import (
    node_state as ns,
)
from role_render import RoleRender, facts

MAJORS = ("8", "9")
HOSTS = [("RedHat", "9"), ("RedHat", "8"), ("Rocky", "9"), ("Rocky", "8"), ("AlmaLinux", "9")]
VERSIONS = [(branch.branch, upstream) for branch in data.BRANCHES for upstream in branch.versions]


def set_packages(modules: str) -> list[data.RpmPackage]:
    return [package for package in data.RPM_PACKAGES if package.modules in ("", modules)]


def rpm_index_text(upstream: str, major: str, modules: str) -> str:
    """`rpm --query --all` with RPM_INDEX_FORMAT on a host with the driver set and two unrelated packages."""
    lines = [
        f"{p.name}\t{data.rpm_version(p, upstream, major)}\t"
        f"{p.source}-{upstream}-{p.release.format(major=major)}.src.rpm"
        for p in set_packages(modules)
    ]
    lines += ["bash\t(none):5.1.8-9.el9\tbash-5.1.8-9.el9.src.rpm", "gpg-pubkey\t(none):d42d0685-1\t(none)"]
    return "\n".join(lines) + "\n"


def driver(family: str, major: str, **overrides: Any) -> RoleRender:
    state = {"gpu_facts": {"pci": {"nvswitch_count": 4}}, "packages": {}, "package_index": []}
    state.update(overrides.pop("state", {}))
    return RoleRender("nvidia_driver", facts(family, major), __nvidia_driver_state=state, **overrides)


@pytest.mark.parametrize(("branch", "upstream"), VERSIONS)
@pytest.mark.parametrize("major", MAJORS)
def test_installed_versions_lose_the_epoch_not_the_release(branch: str, upstream: str, major: str) -> None:
    packages = set_packages("open")
    text = "".join(f"{p.name}\t{data.rpm_version(p, upstream, major)}\n" for p in packages)
    parsed = ns.parse_rpm_query(text, [p.name for p in packages])
    for package in packages:
        assert parsed[package.name]["version"] == f"{upstream}-{package.release.format(major=major)}"
        assert driver_versions.upstream_version(data.rpm_version(package, upstream, major)) == upstream


@pytest.mark.parametrize(("branch", "upstream"), VERSIONS)
def test_deb_and_rpm_versions_reduce_to_the_same_driver_version(branch: str, upstream: str) -> None:
    for _upstream, deb_version in data.package_versions(next(b for b in data.BRANCHES if b.branch == branch)):
        assert driver_versions.upstream_version(deb_version) == _upstream
    assert driver_versions.upstream_version(f"3:{upstream}-1.el9") == upstream
    assert driver_versions.upstream_version(upstream) == upstream


@pytest.mark.parametrize(("branch", "upstream"), VERSIONS)
@pytest.mark.parametrize("major", MAJORS)
@pytest.mark.parametrize("modules", ["open", "proprietary"])
def test_the_whole_resolved_set_is_locked_with_its_epoch(
    branch: str, upstream: str, major: str, modules: str
) -> None:
    rows = ns.parse_rpm_index(rpm_index_text(upstream, major, modules))
    assert ["installed", "bash", "bash", "0:5.1.8-9.el9"] in rows
    expected = sorted(
        f"{p.name}-{p.epoch}:{upstream}-{p.release.format(major=major)}.*" for p in set_packages(modules)
    )
    # The role's lock task, rendered with the read it gets after the install.
    role = driver("Rocky", major, nvidia_driver_kernel_modules=modules, nvidia_driver_branch=branch)
    specs = role.task_value(
        "install-RedHat.yml",
        "Lock the driver set at its version, epoch included",
        "community.general.dnf_versionlock",
        "name",
        __nvidia_driver_resolved={"package_index": rows},
        nvidia_driver_target_version=f"{upstream}-1.el{major}",
    )
    assert specs == expected
    # Packages the role never names are locked too (dnf resolved them into the set).
    assert any(spec.startswith("nvidia-kmod-common-3:") for spec in specs)
    assert "nvidia-fabric-manager-0:" + upstream + "-1.*" in specs


@pytest.mark.parametrize(("branch", "upstream"), VERSIONS)
@pytest.mark.parametrize(("family", "major"), HOSTS)
@pytest.mark.parametrize("modules", ["open", "proprietary"])
def test_dnf_gets_the_exact_version_of_each_named_package(
    branch: str, upstream: str, family: str, major: str, modules: str
) -> None:
    role = driver(family, major, nvidia_driver_kernel_modules=modules, nvidia_driver_branch=branch)
    specs = role.task_value(
        "install-RedHat.yml",
        "Install the driver packages at that version",
        "ansible.builtin.dnf",
        "name",
        nvidia_driver_target_version=f"{upstream}-1.el{major}",
    )
    names = {p.name for p in set_packages(modules)}
    assert specs, "no package asked for"
    for spec in specs:
        name, _, version = spec.rpartition("-")
        assert version == upstream and name in names, spec
    assert (
        f"{'kmod-nvidia-open-dkms' if modules == 'open' else 'kmod-nvidia-latest-dkms'}-{upstream}" in specs
    )
    assert (
        role.var("_nvidia_driver_module_stream")
        == f"nvidia-driver:{branch}-{'open' if modules == 'open' else 'dkms'}"
    )


@pytest.mark.parametrize(
    ("stdout_lines", "target"),
    [
        (["3:580.95.05-1.el9"], "580.95.05-1.el9"),
        (["0:580.95.05-1.el8"], "580.95.05-1.el8"),
        ([], "(none)"),
        (["Error: no matching packages"], "(none)"),
    ],
)
def test_the_target_is_the_resolved_version_without_epoch(stdout_lines: list[str], target: str) -> None:
    role = driver("Rocky", "9")
    rendered = role.task_value(
        "install-RedHat.yml",
        "Record the target version",
        "ansible.builtin.set_fact",
        "nvidia_driver_target_version",
        __nvidia_driver_repoquery={"stdout_lines": stdout_lines},
    )
    assert rendered == target


@pytest.mark.parametrize(
    ("family", "major", "epel", "crb", "rhsm"),
    [
        (
            "RedHat",
            "9",
            "https://dl.fedoraproject.org/pub/epel/epel-release-latest-9.noarch.rpm",
            "codeready-builder-for-rhel-9-x86_64-rpms",
            True,
        ),
        (
            "RedHat",
            "8",
            "https://dl.fedoraproject.org/pub/epel/epel-release-latest-8.noarch.rpm",
            "codeready-builder-for-rhel-8-x86_64-rpms",
            True,
        ),
        ("Rocky", "9", "epel-release", "crb", False),
        ("Rocky", "8", "epel-release", "powertools", False),
        ("AlmaLinux", "9", "epel-release", "crb", False),
    ],
)
def test_epel_crb_and_dkms_come_first(family: str, major: str, epel: str, crb: str, rhsm: bool) -> None:
    role = driver(family, major)
    assert role.var("_nvidia_driver_epel_package") == epel
    assert role.var("_nvidia_driver_crb_repo") == crb
    assert "dkms" in role.var("_nvidia_driver_prerequisites")
    assert (
        role.task_runs("install-RedHat.yml", "Enable CodeReady Builder, which EPEL's packages need (RHEL)")
        == rhsm
    )
    assert (
        role.task_runs("install-RedHat.yml", "Enable CRB (PowerTools on 8), which EPEL's packages need")
        != rhsm
    )
    assert (
        role.task_runs("install-RedHat.yml", "Add EPEL's signing key (RHEL installs EPEL from its URL)")
        == rhsm
    )
    # A mirror configured by other means: the role adds no repository.
    unmanaged = driver(family, major, nvidia_driver_repo_manage=False)
    assert not unmanaged.task_runs("install-RedHat.yml", "Add EPEL, which carries dkms")


def state_with(upstream: str, major: str, loaded: str, marker: bool = False) -> dict[str, Any]:
    cuda = next(p for p in data.RPM_PACKAGES if p.name == "nvidia-driver-cuda")
    return {
        "files": {"/run/gpuforge/nvidia-driver.reboot-required": {"exists": marker}},
        "gpu_facts": {"loaded_module_version": loaded, "nvidia_smi": {"path": "/usr/bin/nvidia-smi"}},
        "owners": {"nvidia-smi": "nvidia-driver-cuda"},
        "packages": {
            "nvidia-driver-cuda": {"installed": True, "version": data.rpm_version(cuda, upstream, major)}
        },
    }


@pytest.mark.parametrize(("branch", "upstream"), VERSIONS)
@pytest.mark.parametrize("major", MAJORS)
def test_reboot_is_decided_from_the_installed_version(branch: str, upstream: str, major: str) -> None:
    older = next(v for _b, v in VERSIONS if v != upstream)
    for loaded, marker, expected in [(upstream, False, False), (older, False, True), (upstream, True, True)]:
        role = driver(
            "Rocky", major, nvidia_driver_branch=branch, state=state_with(upstream, major, loaded, marker)
        )
        # After the install phase, and in the preflight's decision from its read alone.
        required = role.task_value(
            "reboot_facts.yml",
            "Set nvidia_driver_reboot_required",
            "ansible.builtin.set_fact",
            "nvidia_driver_reboot_required",
            nvidia_driver_managed=True,
            # The branch, as the dnf path's target once was: never what the loaded module is compared with.
            nvidia_driver_target_version=branch,
        )
        assert required is expected, (loaded, marker)
        decided = role.task_value(
            "preflight.yml",
            "Decide whether this role manages the driver, and what is left to do",
            "ansible.builtin.set_fact",
            "nvidia_driver_reboot_required",
        )
        assert decided is expected, (loaded, marker)
        assert driver_versions.reboot_needed(
            loaded, data.rpm_version(data.RPM_PACKAGES[0], upstream, major)
        ) is (loaded != upstream)


@pytest.mark.parametrize(("branch", "upstream"), VERSIONS)
def test_unlock_removes_the_installed_sets_entries_only_for_a_change(branch: str, upstream: str) -> None:
    others = [v for _b, v in VERSIONS if v != upstream]
    rows = ns.parse_rpm_index(rpm_index_text(upstream, "9", "open"))
    for target, runs in [(f"{upstream}-1.el9", False), (f"{others[0]}-1.el9", True)]:
        role = driver("Rocky", "9", state=state_with(upstream, "9", upstream) | {"package_index": rows})
        name = "Unlock the installed driver set for the change"
        assert role.task_runs("install-RedHat.yml", name, nvidia_driver_target_version=target) is runs
        specs = role.task_value(
            "install-RedHat.yml",
            name,
            "community.general.dnf_versionlock",
            "name",
            nvidia_driver_target_version=target,
        )
        assert specs == driver_versions.rpm_lock_specs(rows, upstream)
        assert all(f":{upstream}-" in spec for spec in specs)


@pytest.mark.parametrize(("branch", "upstream"), VERSIONS)
def test_verify_compares_driver_versions_across_epochs_and_releases(branch: str, upstream: str) -> None:
    packages = set_packages("open")
    names = [p.name for p in packages]
    for stale, wrong in [(None, False), ("nvidia-driver-libs", True)]:
        older = next(v for _b, v in VERSIONS if v != upstream)
        text = "".join(
            f"{p.name}\t{data.rpm_version(p, older if p.name == stale else upstream, '9')}\n"
            for p in packages
        )
        role = driver("Rocky", "9")
        assert (
            role.task_value(
                "verify.yml",
                "Check the packages, holds, services and what nvidia-smi sees",
                "vars",
                "__nvidia_driver_wrong_version",
                __nvidia_driver_installed=[v["version"] for v in ns.parse_rpm_query(text, names).values()],
                nvidia_driver_target_version=f"{upstream}-1.el9",
            )
            is wrong
        )
