"""Compatibility facts (compat.yaml) and the questions the operator asks of them. No I/O beyond reading
the packaged data file once.

Questions: which resource.k8s.io version to write ("best from the served set"), whether a DRA driver
release can serve a node's kubelet, which releases serve a set of kubelet minors (for upgrades), and the
default image of a release. Kubernetes minors are `(1, 33)` tuples; versions are strings like "v0.4.0".
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

import yaml

Minor = tuple[int, int]

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


class UnknownRelease(LookupError):
    """The operand version is not in compat.yaml and no earlier release of its line is."""


def parse_minor(version: str) -> Minor | None:
    """`v1.33.2` / `1.33` / `v1.34.0-alpha.1+kwok` -> (1, 33); None when unparseable."""
    match = _VERSION_RE.match(version.strip())
    return (int(match[1]), int(match[2])) if match else None


def parse_release(version: str) -> tuple[int, int, int]:
    """`v0.4.0-sim-crash` -> (0, 4, 0): pre-release and build suffixes share their base's facts."""
    match = _VERSION_RE.match(version.strip())
    if match is None:
        raise UnknownRelease(f"not a release version: {version!r}")
    return (int(match[1]), int(match[2]), int(match[3] or 0))


def format_minor(minor: Minor) -> str:
    return f"{minor[0]}.{minor[1]}"


@dataclass(frozen=True)
class ResourceApiFacts:
    exists: frozenset[str]
    on_by_default: frozenset[str]


@dataclass(frozen=True)
class KubeletFacts:
    dra_grpc: frozenset[str]
    claims_api: str
    device_plugin_api: frozenset[str]


@dataclass(frozen=True)
class DraRelease:
    version: str
    image: str
    dra_grpc: frozenset[str]
    min_kubernetes: Minor
    recommended_kubernetes: str
    admission_policy: bool
    controller: bool


@dataclass(frozen=True)
class DevicePluginRelease:
    version: str
    image: str
    api: frozenset[str]
    min_kubernetes: Minor


@dataclass(frozen=True)
class Compat:
    resource_api_preference: tuple[str, ...]
    resource_api: Mapping[Minor, ResourceApiFacts]
    kubelets: Mapping[Minor, KubeletFacts]
    dra_releases: tuple[DraRelease, ...]  # in release order, newest last
    device_plugin_releases: tuple[DevicePluginRelease, ...]

    # --- API versions ------------------------------------------------------------------------------

    def best_resource_api(self, served: Iterable[str]) -> str | None:
        """The resource.k8s.io version to write cluster objects in: the most preferred one served."""
        served_set = set(served)
        return next((v for v in self.resource_api_preference if v in served_set), None)

    # --- kubelets ----------------------------------------------------------------------------------

    def kubelet(self, minor: Minor) -> KubeletFacts | None:
        """Facts for a kubelet minor; newer than the table: the newest row; older: None."""
        if minor in self.kubelets:
            return self.kubelets[minor]
        newest = max(self.kubelets)
        return self.kubelets[newest] if minor > newest else None

    # --- releases ----------------------------------------------------------------------------------

    def dra_release(self, version: str) -> DraRelease:
        return _nearest(self.dra_releases, version, "DRA driver")

    def device_plugin_release(self, version: str) -> DevicePluginRelease:
        return _nearest(self.device_plugin_releases, version, "device plugin")

    def dra_problem(self, version: str, kubelet_minor: Minor | None, served: Iterable[str]) -> str | None:
        """Why DRA driver `version` cannot serve a node whose kubelet is `kubelet_minor`, or None.

        `served`: the resource.k8s.io versions the API server serves (the kubelet reads claims through it).
        """
        release = self.dra_release(version)
        if kubelet_minor is None:
            return "kubelet version unknown"
        facts = self.kubelet(kubelet_minor)
        kubelet = f"kubelet {format_minor(kubelet_minor)}"
        if facts is None:
            return f"{kubelet} predates DRA"
        if kubelet_minor < release.min_kubernetes:
            return f"DRA driver {version} needs Kubernetes {format_minor(release.min_kubernetes)} or newer"
        if not facts.dra_grpc & release.dra_grpc:
            return (
                f"{kubelet} speaks DRA gRPC {_join(facts.dra_grpc)}, "
                f"DRA driver {version} serves {_join(release.dra_grpc)}"
            )
        if facts.claims_api not in set(served):
            api = f"resource.k8s.io/{facts.claims_api}"
            return f"{kubelet} reads claims with {api}, which the API server does not serve"
        return None

    def device_plugin_problem(self, version: str, kubelet_minor: Minor | None) -> str | None:
        release = self.device_plugin_release(version)
        if kubelet_minor is None:
            return None  # the device-plugin API has not changed since 1.10: nothing to check
        facts = self.kubelet(kubelet_minor)
        if facts is not None and not facts.device_plugin_api & release.api:
            return (
                f"kubelet {format_minor(kubelet_minor)} does not speak device-plugin API {_join(release.api)}"
            )
        return None

    def dra_releases_serving(self, kubelet_minors: Iterable[Minor]) -> tuple[str, ...]:
        """DRA driver releases that serve every given kubelet minor (e.g. both sides of a node upgrade)."""
        minors = list(kubelet_minors)
        out = []
        for release in self.dra_releases:
            if all(self._serves(release, minor) for minor in minors):
                out.append(release.version)
        return tuple(out)

    def _serves(self, release: DraRelease, minor: Minor) -> bool:
        facts = self.kubelet(minor)
        return (
            facts is not None and minor >= release.min_kubernetes and bool(facts.dra_grpc & release.dra_grpc)
        )

    @property
    def latest_dra(self) -> DraRelease:
        return self.dra_releases[-1]

    @property
    def latest_device_plugin(self) -> DevicePluginRelease:
        return self.device_plugin_releases[-1]


R = TypeVar("R", DraRelease, DevicePluginRelease)


def _join(values: Iterable[str]) -> str:
    return "/".join(sorted(values))


def _nearest(releases: tuple[R, ...], version: str, what: str) -> R:
    """The release itself, or the newest earlier release of the same major line (a newer patch or
    pre-release inherits its facts)."""
    wanted = parse_release(version)
    same_line = [r for r in releases if parse_release(r.version)[0] == wanted[0]]
    earlier = [r for r in same_line if parse_release(r.version) <= wanted]
    if not earlier:
        known = ", ".join(r.version for r in releases)
        raise UnknownRelease(f"{what} {version} is not a known release (known: {known})")
    return max(earlier, key=lambda r: parse_release(r.version))


def _minor(text: str) -> Minor:
    minor = parse_minor(text)
    if minor is None:
        raise ValueError(f"compat.yaml: not a Kubernetes minor: {text!r}")
    return minor


def from_data(data: Mapping[str, Any]) -> Compat:
    return Compat(
        resource_api_preference=tuple(data["resourceApi"]["preference"]),
        resource_api={
            _minor(k): ResourceApiFacts(frozenset(v["exists"]), frozenset(v["onByDefault"]))
            for k, v in data["resourceApi"]["minors"].items()
        },
        kubelets={
            _minor(k): KubeletFacts(frozenset(v["draGrpc"]), v["claimsApi"], frozenset(v["devicePluginApi"]))
            for k, v in data["kubelets"].items()
        },
        dra_releases=tuple(
            DraRelease(
                version=r["version"],
                image=r["image"],
                dra_grpc=frozenset(r["draGrpc"]),
                min_kubernetes=_minor(r["minKubernetes"]),
                recommended_kubernetes=r["recommendedKubernetes"],
                admission_policy=bool(r["admissionPolicy"]),
                controller=bool(r["controller"]),
            )
            for r in data["draDriver"]
        ),
        device_plugin_releases=tuple(
            DevicePluginRelease(r["version"], r["image"], frozenset(r["api"]), _minor(r["minKubernetes"]))
            for r in data["devicePlugin"]
        ),
    )


@functools.cache
def load() -> Compat:
    """The packaged compat.yaml (read once per process)."""
    text = resources.files(__package__).joinpath("compat.yaml").read_text()
    return from_data(yaml.safe_load(text))
