"""The CRDs of the workload projects the GPU quota admits whole (gpuforge.api.workloadkinds), to serve
them on the local control plane: tests create JobSets, LeaderWorkerSets, RayClusters, RayJobs,
PyTorchJobs and Rollouts against the projects' real schemas (no controller of theirs runs).

Each CRD is its project's released file at a pinned version, checked against the file's SHA-256. Those
the Go module proxy serves are read from the module's zip (`go mod download`, cached in the shared Go
module cache under the gpuforge cache, by version); JobSet and LeaderWorkerSet, which it does not serve
here, are vendored beside this file (see SOURCES.md). Descriptions are dropped before they are
installed: they are most of each file, documentation only, and every API server watch and list carries
them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuforge_lab.devcluster.build import go_environment

HERE = Path(__file__).resolve().parent


class CrdSourceError(RuntimeError):
    """A CRD could not be had, or is not the pinned file."""


@dataclass(frozen=True)
class ModuleFile:
    """A file of a Go module, as the module proxy serves it at `version`."""

    module: str
    version: str
    path: str
    sha256: str


@dataclass(frozen=True)
class VendoredFile:
    """A CRD vendored beside this module (descriptions dropped); `sha256` is the original file's."""

    name: str
    source: str
    sha256: str


CrdSource = ModuleFile | VendoredFile

SOURCES: tuple[CrdSource, ...] = (
    VendoredFile(
        "jobset.x-k8s.io_jobsets.json",
        "kubernetes-sigs/jobset v0.12.0 config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
        "d022b87624512cf0b6741b31b24a2bea9945b5a838b50713af29332c878bb6fe",
    ),
    VendoredFile(
        "leaderworkerset.x-k8s.io_leaderworkersets.json",
        "kubernetes-sigs/lws v0.10.0 config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
        "c5dcad8ed943e495490241f00b9a1b45d51203b6d484020db3636d5bf553568e",
    ),
    ModuleFile(
        "github.com/ray-project/kuberay/ray-operator",
        "v1.5.0",
        "config/crd/bases/ray.io_rayclusters.yaml",
        "d0094482c5855c504a56670a5a1a012c3b7fe0149e63445e863790e7a9a9a9fb",
    ),
    ModuleFile(
        "github.com/ray-project/kuberay/ray-operator",
        "v1.5.0",
        "config/crd/bases/ray.io_rayjobs.yaml",
        "a2d8246e4573896ed68d5f439f4de716e220ef15df3832652d8ee68cc86e6190",
    ),
    ModuleFile(
        "github.com/kubeflow/training-operator",
        "v1.8.1",
        "manifests/base/crds/kubeflow.org_pytorchjobs.yaml",
        "2e38887fa7c47f01c4a13548feeb179d1e26b98f2eb3eb755b8ac64ac9084036",
    ),
    ModuleFile(
        "github.com/argoproj/argo-rollouts",
        "v1.8.5",
        "manifests/crds/rollout-crd.yaml",
        "1f1c5d67088ccf355d1e0681d58bbcaf46a9dd1bf7215769dcd3e6a62053d8aa",
    ),
)


def without_descriptions(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: without_descriptions(item) for key, item in value.items() if key != "description"}
    if isinstance(value, list):
        return [without_descriptions(item) for item in value]
    return value


def _go() -> str:
    go = os.environ.get("GPUFORGE_GO") or shutil.which("go")
    if not go:
        raise CrdSourceError("no Go toolchain on PATH (or GPUFORGE_GO) to download the CRDs' modules with")
    return go


def module_dir(module: str, version: str) -> Path:
    """The module's files, from the Go module cache (downloaded through the module proxy once)."""
    result = subprocess.run(
        [_go(), "mod", "download", "-json", f"{module}@{version}"],
        env=go_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    try:
        answer = json.loads(result.stdout)
    except json.JSONDecodeError:
        answer = {}
    if result.returncode != 0 or not answer.get("Dir"):
        detail = answer.get("Error") or result.stderr.strip()[-2000:]
        raise CrdSourceError(f"downloading {module}@{version} failed: {detail}")
    return Path(answer["Dir"])


def _checked(data: bytes, source: CrdSource, what: str) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    if digest != source.sha256:
        raise CrdSourceError(f"{what}: SHA-256 {digest}, pinned {source.sha256}")
    return data


def crd_documents(source: CrdSource) -> list[dict[str, Any]]:
    """The CRD objects of one source, descriptions dropped."""
    if isinstance(source, VendoredFile):
        documents = json.loads((HERE / source.name).read_text())
        return list(documents) if isinstance(documents, list) else [documents]
    path = module_dir(source.module, source.version) / source.path
    data = _checked(path.read_bytes(), source, f"{source.module}@{source.version}/{source.path}")
    return [without_descriptions(doc) for doc in yaml.safe_load_all(data) if doc]


def workload_crds() -> Iterator[dict[str, Any]]:
    """Every CRD of SOURCES, in order."""
    for source in SOURCES:
        yield from crd_documents(source)


def vendor(source: VendoredFile, original: bytes) -> Path:
    """Write a vendored CRD from its original file (after checking it is the pinned one)."""
    _checked(original, source, source.source)
    documents = [without_descriptions(doc) for doc in yaml.safe_load_all(original) if doc]
    target = HERE / source.name
    target.write_text(json.dumps(documents, separators=(",", ":"), sort_keys=False) + "\n")
    return target
