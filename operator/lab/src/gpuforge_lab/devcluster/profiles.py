"""API profiles: make one Kubernetes build serve the `resource.k8s.io` versions of an older release.

A profile names a Kubernetes minor (optionally `+betas`) and yields the API server's `--runtime-config`
and the DRA feature gates that release had by default (facts: shared/reference/dra-compat.md §1, and the
versioned gate table of the pinned release). Gates the pinned release has locked to their GA default cannot
be turned back off; they are listed in `locked_differences` so `gpuforge dev cluster status` can say so.

The pinned controller-manager and scheduler (1.36) read ResourceSlices and ResourceClaims through
`resource.k8s.io/v1` only. For the beta-only profiles (1.32, 1.33) they are replaced by the 1.33 ones (built
alongside, see versions.toml), which use v1beta1 as a real 1.33 control plane does; the 1.36 API server serves
exactly the profile's versions. Its own readiness check `informer-sync` then never passes (an informer of its
own watches v1 ResourceSlices), so health is checked without that one check. Pure data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

RESOURCE_GROUP = "resource.k8s.io"
ALL_DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")

# DRA gates, each with the first release it was on by default in (None: off by default in every release
# before the pinned one). Only gates the pinned 1.36 build knows.
# Locked in 1.36 (cannot be set): DynamicResourceAllocation (true), DRAAdminAccess (true).
_DEFAULT_ON_SINCE: dict[str, int | None] = {
    "DRAPrioritizedList": 34,
    "DRAResourceClaimDeviceStatus": 33,
    "DRADeviceTaints": None,
    "DRAPartitionableDevices": None,
    "DRAConsumableCapacity": None,
    "DRAExtendedResource": None,
    "DRADeviceBindingConditions": None,
    "DRASchedulerFilterTimeout": 34,
    "DRAResourceClaimGranularStatusAuthorization": None,
    "ResourceHealthStatus": None,
    "ResourceHealthStatusMessage": None,
}
_PINNED_MINOR = 36
# DRA gates per release, as (gate, default in that release); the pinned release keeps its own defaults.
_GATES_BY_MINOR: dict[int, dict[str, bool]] = {
    minor: {gate: since is not None and minor >= since for gate, since in _DEFAULT_ON_SINCE.items()}
    for minor in range(32, _PINNED_MINOR)
} | {_PINNED_MINOR: {}}
# Gates that differ from the real release but cannot be changed in the pinned build (locked to GA).
_LOCKED: dict[int, tuple[str, ...]] = {
    32: (
        "DynamicResourceAllocation=true (beta, off by default in 1.32)",
        "DRAAdminAccess=true (alpha in 1.32)",
    ),
    33: (
        "DynamicResourceAllocation=true (beta, off by default in 1.33)",
        "DRAAdminAccess=true (alpha in 1.33)",
    ),
    34: (),
    35: (),
    36: (),
}


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class ApiProfile:
    name: str
    minor: int
    betas: bool

    @property
    def served_versions(self) -> tuple[str, ...]:
        """resource.k8s.io versions the public API server serves, newest first."""
        if self.minor == 32:
            return ("v1beta1",)
        if self.minor == 33:
            return ("v1beta2", "v1beta1")
        return ("v1", "v1beta2", "v1beta1") if self.betas else ("v1",)

    @property
    def needs_older_components(self) -> bool:
        """Whether controller-manager and scheduler must come from the older (v1beta1-speaking) release."""
        return "v1" not in self.served_versions

    @property
    def component_feature_gates(self) -> str:
        """Gates for controller-manager and scheduler (the 1.33 binaries' own for the beta profiles)."""
        if not self.needs_older_components:
            return self.feature_gates
        gates = {
            "DynamicResourceAllocation": True
        }  # beta, off by default in 1.32/1.33: clusters using DRA set it
        if self.minor == 32:
            gates["DRAResourceClaimDeviceStatus"] = False
        return ",".join(f"{name}={'true' if value else 'false'}" for name, value in sorted(gates.items()))

    def runtime_config(self) -> str:
        served = set(self.served_versions)
        return ",".join(
            f"{RESOURCE_GROUP}/{version}={'true' if version in served else 'false'}"
            for version in ALL_DRA_VERSIONS
        )

    @property
    def feature_gates(self) -> str:
        gates = _GATES_BY_MINOR[self.minor]
        return ",".join(f"{name}={'true' if value else 'false'}" for name, value in sorted(gates.items()))

    @property
    def locked_differences(self) -> tuple[str, ...]:
        return _LOCKED[self.minor]

    @property
    def default_kubelet_version(self) -> str:
        return f"v1.{self.minor}.0"


SUPPORTED_MINORS = tuple(sorted(_GATES_BY_MINOR))
DEFAULT_PROFILE = "1.36"


def parse_profile(name: str) -> ApiProfile:
    """'1.33' -> v1beta2+v1beta1; '1.34' -> v1 only; '1.34+betas' -> v1 and both betas."""
    base, _, suffix = name.partition("+")
    if suffix not in ("", "betas"):
        raise ProfileError(f"unknown profile suffix {suffix!r} in {name!r}: only '+betas' exists")
    try:
        major, minor_text = base.split(".")
        minor = int(minor_text)
    except ValueError:
        raise ProfileError(f"API profile {name!r} is not of the form 1.NN[+betas]") from None
    if major != "1" or minor not in _GATES_BY_MINOR:
        supported = ", ".join(f"1.{m}" for m in SUPPORTED_MINORS)
        raise ProfileError(f"API profile {name!r} is not supported; choose one of {supported} (+betas)")
    if suffix and minor < 34:
        raise ProfileError(f"profile {base} serves only beta versions already; '+betas' applies to 1.34+")
    return ApiProfile(name=name, minor=minor, betas=bool(suffix))
