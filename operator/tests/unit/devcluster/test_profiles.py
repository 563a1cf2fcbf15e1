from __future__ import annotations

import pytest

from gpuforge_lab.devcluster.profiles import ProfileError, parse_profile


@pytest.mark.parametrize(
    ("name", "served", "internal_components"),
    [
        ("1.32", ("v1beta1",), True),
        ("1.33", ("v1beta2", "v1beta1"), True),
        ("1.34", ("v1",), False),
        ("1.34+betas", ("v1", "v1beta2", "v1beta1"), False),
        ("1.35", ("v1",), False),
        ("1.36", ("v1",), False),
        ("1.36+betas", ("v1", "v1beta2", "v1beta1"), False),
    ],
)
def test_served_versions(name: str, served: tuple[str, ...], internal_components: bool) -> None:
    profile = parse_profile(name)
    assert profile.served_versions == served
    assert profile.needs_older_components == internal_components
    for version in ("v1", "v1beta1", "v1beta2"):
        expected = "true" if version in served else "false"
        assert f"resource.k8s.io/{version}={expected}" in profile.runtime_config()


@pytest.mark.parametrize(
    ("name", "gate", "value"),
    [
        ("1.33", "DRAPrioritizedList", "false"),
        ("1.34", "DRAPrioritizedList", "true"),
        ("1.34", "DRAExtendedResource", "false"),
        ("1.35", "DRAExtendedResource", "false"),
        ("1.32", "DRAResourceClaimDeviceStatus", "false"),
        ("1.33", "DRAResourceClaimDeviceStatus", "true"),
    ],
)
def test_feature_gates_follow_the_release(name: str, gate: str, value: str) -> None:
    assert f"{gate}={value}" in parse_profile(name).feature_gates.split(",")


def test_pinned_release_uses_its_own_defaults() -> None:
    assert parse_profile("1.36").feature_gates == ""


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("1.31", "not supported"),
        ("1.40", "not supported"),
        ("banana", "not of the form"),
        ("1.33+betas", "applies to 1.34+"),
        ("1.34+alpha", "unknown profile suffix"),
    ],
)
def test_bad_profiles_are_refused_clearly(name: str, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        parse_profile(name)
