"""compat.yaml, table by table, through the questions the operator asks."""

from __future__ import annotations

import pytest

from gpuforge import compat
from gpuforge.api import gpustack as m
from gpuforge.compat import Minor, UnknownRelease, parse_minor

C = compat.load()


@pytest.mark.parametrize(
    ("text", "minor"),
    [("v1.33.2", (1, 33)), ("1.34", (1, 34)), ("v1.36.5-kwok.1", (1, 36)), ("garbage", None)],
)
def test_parse_minor(text: str, minor: Minor | None) -> None:
    assert parse_minor(text) == minor


# --- resource.k8s.io versions -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("served", "best"),
    [
        ({"v1", "v1beta1", "v1beta2"}, "v1"),
        ({"v1beta1", "v1beta2"}, "v1beta2"),
        ({"v1beta1"}, "v1beta1"),
        ({"v1alpha3"}, None),  # 1.31: no NVIDIA driver can use it
        (set(), None),
    ],
)
def test_best_resource_api(served: set[str], best: str | None) -> None:
    assert C.best_resource_api(served) == best


@pytest.mark.parametrize(
    ("minor", "on_by_default"),
    [((1, 31), set()), ((1, 32), set()), ((1, 33), set()), ((1, 34), {"v1"}), ((1, 37), {"v1"})],
)
def test_dra_api_on_by_default_only_from_1_34(minor: Minor, on_by_default: set[str]) -> None:
    assert C.resource_api[minor].on_by_default == on_by_default


# --- kubelets ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("minor", "grpc", "claims"),
    [
        ((1, 31), {"v1alpha4"}, "v1alpha3"),
        ((1, 32), {"v1beta1", "v1alpha4"}, "v1beta1"),
        ((1, 33), {"v1beta1"}, "v1beta1"),
        ((1, 34), {"v1", "v1beta1"}, "v1"),
        ((1, 39), {"v1", "v1beta1"}, "v1"),  # newer than the table: newest row
    ],
)
def test_kubelet_facts(minor: Minor, grpc: set[str], claims: str) -> None:
    facts = C.kubelet(minor)
    assert facts is not None
    assert (facts.dra_grpc, facts.claims_api) == (grpc, claims)


def test_kubelet_older_than_table() -> None:
    assert C.kubelet((1, 25)) is None


# --- DRA driver against kubelets --------------------------------------------------------------------
ALL = {"v1", "v1beta1", "v1beta2"}


@pytest.mark.parametrize(
    ("driver", "kubelet", "served", "problem"),
    [
        ("v0.4.0", (1, 34), ALL, None),
        ("v0.4.0", (1, 36), {"v1"}, None),
        ("v0.4.0", (1, 33), ALL, None),
        ("v0.4.0", (1, 32), {"v1beta1"}, None),
        ("v25.3.0", (1, 36), {"v1"}, None),  # v1beta1 gRPC is the kubelet's fallback
        ("v0.4.0", (1, 31), ALL, "needs Kubernetes 1.32"),
        ("v0.4.0", (1, 30), ALL, "predates DRA"),
        ("v0.4.0", (1, 33), {"v1"}, "reads claims with resource.k8s.io/v1beta1"),
        ("v0.4.0", None, ALL, "kubelet version unknown"),
    ],
)
def test_dra_problem(driver: str, kubelet: Minor | None, served: set[str], problem: str | None) -> None:
    found = C.dra_problem(driver, kubelet, served)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_grpc_mismatch_is_explained() -> None:
    """A release serving only v1 would not reach a 1.33 kubelet (synthetic release, same query)."""
    release = C.dra_release("v0.4.0")
    only_v1 = compat.Compat(
        C.resource_api_preference,
        C.resource_api,
        C.kubelets,
        (compat.DraRelease("v9.0.0", release.image, frozenset({"v1"}), (1, 32), "1.34", True, True),),
        C.device_plugin_releases,
    )
    problem = only_v1.dra_problem("v9.0.0", (1, 33), ALL)
    assert problem == "kubelet 1.33 speaks DRA gRPC v1beta1, DRA driver v9.0.0 serves v1"


@pytest.mark.parametrize(
    ("minors", "releases"),
    [
        ([(1, 33), (1, 34)], ("v25.3.0", "v25.3.2", "v25.8.0", "v25.12.0", "v0.4.0")),
        ([(1, 31), (1, 32)], ()),
    ],
)
def test_releases_serving_both_sides_of_an_upgrade(minors: list[Minor], releases: tuple[str, ...]) -> None:
    assert C.dra_releases_serving(minors) == releases


# --- releases ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "known"),
    [
        ("v0.4.0", "v0.4.0"),
        ("v0.4.0-sim-never-ready", "v0.4.0"),  # simulated bad builds share their base's facts
        ("v0.5.1", "v0.4.0"),  # newer patch/minor of a known line inherits the latest facts
        ("v25.12.3", "v25.12.0"),
        ("v25.9.0", "v25.8.0"),
    ],
)
def test_dra_release_lookup(version: str, known: str) -> None:
    assert C.dra_release(version).version == known


@pytest.mark.parametrize("version", ["v0.3.0", "v1.0.0", "v25.1.0"])
def test_unknown_dra_release(version: str) -> None:
    with pytest.raises(UnknownRelease, match=version):
        C.dra_release(version)


@pytest.mark.parametrize("version", [r.version for r in C.device_plugin_releases])
def test_every_device_plugin_release_serves_every_kubelet(version: str) -> None:
    for minor in C.kubelets:
        assert C.device_plugin_problem(version, minor) is None


def test_images_per_repository_move() -> None:
    assert C.dra_release("v25.12.0").image == "nvcr.io/nvidia/k8s-dra-driver-gpu"
    assert C.dra_release("v0.4.0").image == "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu"


def test_crd_defaults_are_the_latest_known_releases() -> None:
    assert C.latest_dra.version == m.DEFAULT_DRA_DRIVER_VERSION
    assert C.latest_device_plugin.version == m.DEFAULT_DEVICE_PLUGIN_VERSION


def test_tables_cover_the_same_minors() -> None:
    assert set(C.resource_api) == set(C.kubelets)
