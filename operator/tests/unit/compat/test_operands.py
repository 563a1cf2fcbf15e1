"""The operand contract: every release compat.yaml serves has an entry, lookups and rollback rules."""

from __future__ import annotations

import pytest

from gpuforge import compat
from gpuforge.compat.operands import (
    DEVICE_PLUGIN,
    DRA_COMPUTE_DOMAIN_PLUGIN,
    DRA_CONTROLLER,
    DRA_KUBELET_PLUGIN,
    UnsupportedRelease,
    load_operands,
    rollback_problem,
)

CONTRACT = load_operands()
FACTS = compat.load()


def test_every_release_compat_serves_has_a_contract_and_nothing_else() -> None:
    assert CONTRACT.versions(DEVICE_PLUGIN) == tuple(r.version for r in FACTS.device_plugin_releases)
    dra_versions = tuple(r.version for r in FACTS.dra_releases)
    assert CONTRACT.versions(DRA_KUBELET_PLUGIN) == dra_versions
    assert CONTRACT.versions(DRA_CONTROLLER) == dra_versions
    assert CONTRACT.versions(DRA_COMPUTE_DOMAIN_PLUGIN) == dra_versions
    assert set(CONTRACT.compute_domain_sets) == set(dra_versions)


@pytest.mark.parametrize(
    ("component", "version", "required_env", "health_port"),
    [
        (DEVICE_PLUGIN, "v0.17.0", (), None),
        (DEVICE_PLUGIN, "v0.20.0", (), None),
        (DRA_KUBELET_PLUGIN, "v25.3.0", ("IMAGE_NAME", "NODE_NAME"), None),
        (DRA_KUBELET_PLUGIN, "v25.3.2", ("IMAGE_NAME", "NODE_NAME"), None),
        (DRA_KUBELET_PLUGIN, "v25.8.0", ("IMAGE_NAME", "NODE_NAME"), 51516),
        (DRA_KUBELET_PLUGIN, "v25.12.0", ("IMAGE_NAME", "NODE_NAME"), 51516),
        (DRA_KUBELET_PLUGIN, "v0.4.0", ("IMAGE_NAME", "NODE_NAME"), 51516),
        (DRA_CONTROLLER, "v25.3.2", ("POD_NAME", "IMAGE_NAME"), None),
        (DRA_CONTROLLER, "v25.8.0", ("POD_NAME", "IMAGE_NAME", "LOG_VERBOSITY_CD_DAEMON"), None),
        (DRA_CONTROLLER, "v0.4.0", ("POD_NAME", "IMAGE_NAME", "LOG_VERBOSITY_CD_DAEMON"), None),
        (DRA_COMPUTE_DOMAIN_PLUGIN, "v25.3.2", ("NODE_NAME",), None),
        (DRA_COMPUTE_DOMAIN_PLUGIN, "v25.8.0", ("NODE_NAME",), 51515),
        (DRA_COMPUTE_DOMAIN_PLUGIN, "v0.4.0", ("NODE_NAME",), 51515),
    ],
)
def test_required_env_and_health_server(
    component: str, version: str, required_env: tuple[str, ...], health_port: int | None
) -> None:
    release = CONTRACT.release(component, version)
    assert release.required_env == required_env
    assert release.health_port == health_port
    assert (release.startup_probe is not None) == (health_port is not None)


def test_a_patch_release_shares_its_base_contract() -> None:
    assert CONTRACT.release(DRA_KUBELET_PLUGIN, "v0.4.1").version == "v0.4.0"
    assert CONTRACT.release(DEVICE_PLUGIN, "v0.17.2").version == "v0.17.0"


@pytest.mark.parametrize("version", ["v24.1.0", "v0.3.0", "latest"])
def test_a_release_without_contract_is_refused_with_the_reason(version: str) -> None:
    with pytest.raises(UnsupportedRelease, match=r"no contract|not a release"):
        CONTRACT.release(DRA_KUBELET_PLUGIN, version)


def test_device_plugin_config_and_mig_rules() -> None:
    release = CONTRACT.release(DEVICE_PLUGIN, "v0.17.4")
    assert release.min_time_slicing_replicas == 2
    assert release.mig_needs_sys_admin
    assert release.mig_env == {"NVIDIA_MIG_MONITOR_DEVICES": "all"}
    assert release.needs_nvml
    assert "nvidia.com/gpu.shared" in release.advertises
    assert release.error("missing_flag", flag="image-name") == 'Required flag "image-name" not set'


@pytest.mark.parametrize(
    ("current", "target", "refused"),
    [
        ("v0.4.0", "v25.12.0", True),  # v0.4.0's checkpoint carries a BootID v25.x cannot read
        ("v0.4.0", "v25.3.2", True),
        ("v25.12.0", "v0.4.0", False),  # forward
        ("v25.12.0", "v25.8.0", False),  # same checkpoint format
        ("v0.4.0", "v0.4.0", False),
    ],
)
def test_rollbacks_across_checkpoint_formats(current: str, target: str, refused: bool) -> None:
    problem = rollback_problem(CONTRACT, DRA_KUBELET_PLUGIN, current, target)
    assert (problem is not None) == refused
    if refused:
        assert problem is not None and "forward-only" in problem


@pytest.mark.parametrize(
    ("version", "crds", "cliques_rbac"),
    [
        ("v25.3.0", {"computedomains"}, False),
        ("v25.8.0", {"computedomains"}, False),
        ("v25.12.0", {"computedomains", "computedomaincliques"}, True),
        ("v0.4.1", {"computedomains", "computedomaincliques"}, True),
    ],
)
def test_compute_domain_crds_and_rbac_per_release(version: str, crds: set[str], cliques_rbac: bool) -> None:
    """The ComputeDomainClique API and the rules for it arrive together, in v25.12."""
    domains = CONTRACT.compute_domains(version)
    assert {path.rpartition("_")[2].removesuffix(".yaml") for path in domains.crds} == crds
    namespaced = domains.rbac.controller_namespaced + domains.rbac.kubelet_plugin_namespaced
    assert any("computedomaincliques" in rule["resources"] for rule in namespaced) == cliques_rbac
    assert domains.kubelet_plugin_scc == "privileged"


def test_the_v25_3_compute_domain_plugin_wants_the_host_dev() -> None:
    assert CONTRACT.release(DRA_COMPUTE_DOMAIN_PLUGIN, "v25.3.2").host_dev
    assert not CONTRACT.release(DRA_COMPUTE_DOMAIN_PLUGIN, "v25.12.0").host_dev


def test_the_device_plugin_uses_the_privileged_scc_on_openshift() -> None:
    assert CONTRACT.release(DEVICE_PLUGIN, "v0.20.0").openshift_scc == "privileged"
    assert CONTRACT.release(DRA_KUBELET_PLUGIN, "v0.4.0").openshift_scc is None
