"""helm, built from the Go module proxy the way the control plane is, into the same cache.

The pin is the wrapper module `gomod/helm/go.mod` (`require helm.sh/helm/v3 <version>`, with its go.sum),
the only place the version is written. The binary lands in `<cache>/tools/helm-<version>_<digest>/bin/helm`,
keyed by that version and a digest of the wrapper module; like the control plane, a missing manifest or a
binary that no longer matches it means a partial or broken build, which is rebuilt. The tests that render
the chart (tests/integration/release/test_chart.py) and `make helm` use it.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from rich.console import Console

from .build import (
    GOMOD_DIR,
    RECIPE_REVISION,
    BuildError,
    BuildKind,
    GoTarget,
    Versions,
    build_kind,
)

HELM_GOMOD = GOMOD_DIR / "helm"
HELM_PACKAGE = "helm.sh/helm/v3/cmd/helm"


def _required(module: str) -> str:
    """The version of `module` that the wrapper module's go.mod requires."""
    text = (HELM_GOMOD / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", text, re.MULTILINE)
    if match is None:
        raise BuildError(f"{HELM_GOMOD / 'go.mod'} requires no {module}")
    return match.group(1)


def helm_version() -> str:
    return _required("helm.sh/helm/v3")


def helm_key(versions: Versions | None = None) -> str:
    digest = hashlib.sha256(RECIPE_REVISION.encode())
    for path in sorted(HELM_GOMOD.iterdir()):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return f"helm-{helm_version()}_{digest.hexdigest()[:12]}"


def _ldflags() -> str:
    """What helm's own Makefile stamps: its version, and the Kubernetes version its client-go speaks
    (client-go v0.X.Y is Kubernetes 1.X), the default of `.Capabilities.KubeVersion` in `helm template`."""
    minor = _required("k8s.io/client-go").lstrip("v").split(".")[1]
    stamps = {
        "helm.sh/helm/v3/internal/version.version": helm_version(),
        "helm.sh/helm/v3/internal/version.gitTreeState": "clean",
        "helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor": "1",
        "helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor": minor,
        "helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor": "1",
        "helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor": minor,
    }
    return "-s -w " + " ".join(f"-X {name}={value}" for name, value in stamps.items())


def _targets(versions: Versions) -> list[GoTarget]:
    return [
        GoTarget("helm", (HELM_PACKAGE,), ("helm",), _ldflags(), module="helm", env=(("CGO_ENABLED", "0"),))
    ]


def _announce(versions: Versions, go: Path, target_dir: Path) -> str:
    return f"Building helm {helm_version()} with {go} into {target_dir} (a minute or two on 2 cores)"


HELM = BuildKind("tools", ("helm",), helm_key, _targets, _announce, "helm")


def _reports_pinned_version(helm: Path) -> bool:
    try:
        result = subprocess.run(
            [str(helm), "version", "--template", "{{.Version}}"], capture_output=True, text=True, timeout=60
        )
    except OSError:
        return False
    return result.returncode == 0 and result.stdout.strip() == helm_version()


def ensure_helm(console: Console | None = None) -> Path:
    """The pinned helm from the cache, built first when missing, partial, or unable to run."""
    helm = build_kind(HELM, console).path("helm")
    if not _reports_pinned_version(helm):
        helm = build_kind(HELM, console, force=True).path("helm")
        if not _reports_pinned_version(helm):
            raise BuildError(f"{helm} was rebuilt but does not report version {helm_version()}")
    return helm
