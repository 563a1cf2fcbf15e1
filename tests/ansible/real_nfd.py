#!/usr/bin/env python3
"""NFD's own nfd-worker, built from the Go module proxy, reading a features.d directory as a node would.

    $GPUFORGE_CACHE/ansible/nfd-worker/<version>/nfd-worker          the binary
    $GPUFORGE_CACHE/ansible/nfd-worker/<version>/nfd-worker.sha256   its checksum, written after a build

`real_nfd.py labels DIR` runs `nfd-worker -oneshot -no-publish` (local source only) in a lab host image with
DIR mounted at NFD's fixed features.d path and prints, as JSON, the labels it would publish. The worker
insists on a kubeconfig even when it publishes nothing; it gets one naming an unreachable server.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import lab
import real_ctk
from gpuforge_lab.devcluster.build import go_environment

MODULE = "sigs.k8s.io/node-feature-discovery"
VERSION = "0.17.3"
FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
users: [{name: none, user: {token: none}}]
"""


def _sound(binary: Path, checksum: Path, version: str) -> bool:
    if not (binary.is_file() and checksum.is_file()):
        return False
    if checksum.read_text().split()[0] != real_ctk._sha256(binary):
        return False
    result = subprocess.run([str(binary), "-version"], capture_output=True, text=True, check=False)
    return version in result.stdout + result.stderr


def _download(env: dict[str, str], module: str) -> Path:
    result = subprocess.run(
        [str(real_ctk.GO), "mod", "download", "-json", module],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),
    )
    return Path(json.loads(result.stdout)["Dir"])


def _build(target: Path, version: str) -> None:
    # `go install module@version` stops at the module's replace directive for ./api/nfd (a nested module
    # left out of the zip): build in a copy of the module with that nested module put back.
    env = go_environment()
    env["CGO_ENABLED"] = "0"
    source = _download(env, f"{MODULE}@v{version}")
    api = _download(env, f"{MODULE}/api/nfd@v{version}")
    with tempfile.TemporaryDirectory(dir=real_ctk.cache_root(), prefix="nfd-") as tmp:
        work = Path(tmp) / "src"
        shutil.copytree(source, work)
        shutil.rmtree(work / "api/nfd", ignore_errors=True)
        shutil.copytree(api, work / "api/nfd")
        subprocess.run(["chmod", "-R", "u+w", str(work)], check=True)
        ldflags = f"-X {MODULE}/pkg/version.version=v{version}"
        subprocess.run(
            [str(real_ctk.GO), "build", "-o", str(target), f"-ldflags={ldflags}", "./cmd/nfd-worker"],
            env=env,
            check=True,
            cwd=work,
        )


def ensure(version: str = VERSION) -> Path | None:
    """The cached binary, built when missing or broken; None when Go or the build is not available."""
    directory = real_ctk.cache_root() / "nfd-worker" / version
    binary = directory / "nfd-worker"
    checksum = directory / "nfd-worker.sha256"
    if _sound(binary, checksum, version):
        return binary
    if not real_ctk.GO.is_file():
        print(f"real_nfd: {real_ctk.GO} not found", file=sys.stderr)
        return None
    print(f"real_nfd: building nfd-worker v{version} from the Go module proxy", file=sys.stderr)
    directory.mkdir(parents=True, exist_ok=True)
    checksum.unlink(missing_ok=True)
    try:
        _build(binary, version)
    except (subprocess.CalledProcessError, OSError, KeyError, ValueError) as exc:
        print(f"real_nfd: build failed ({exc})", file=sys.stderr)
        return None
    checksum.write_text(f"{real_ctk._sha256(binary)}  nfd-worker\n")
    return binary if _sound(binary, checksum, version) else None


def parse_labels(log: str) -> dict[str, str]:
    """The labels block nfd-worker logs at -v=3 after discovery (klog's multi-line YAML value)."""
    match = re.search(r'"feature discovery completed" labels=<\n(.*?)\n\s*>', log, re.DOTALL)
    if not match:
        raise ValueError("nfd-worker logged no labels")
    labels = {}
    for line in match.group(1).splitlines():
        key, _, value = line.strip().partition(": ")
        labels[key] = value.strip('"')
    return labels


def labels(features: Path, image: str | None = None) -> dict[str, str]:
    """What nfd-worker would publish from the files in `features`, run in the lab's host image."""
    binary = ensure()
    if binary is None:
        raise SystemExit("real_nfd: no nfd-worker")
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG)
        result = subprocess.run(
            [
                "podman",
                "run",
                "--rm",
                *lab.PODMAN_RUN_COMPAT,
                "--network",
                "none",
                "--env",
                "NODE_NAME=nfd-check",
                "--volume",
                f"{binary}:/nfd-worker:ro",
                "--volume",
                f"{kubeconfig}:/kubeconfig:ro",
                "--volume",
                f"{features.resolve()}:{FEATURES_DIR}:ro",
                image or lab.build_image(),
                "/nfd-worker",
                "-kubeconfig=/kubeconfig",
                "-oneshot",
                "-no-publish",
                "-feature-sources=local",
                "-label-sources=local",
                "-v=3",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    return parse_labels(result.stderr)


if __name__ == "__main__":
    if sys.argv[1:2] == ["labels"] and len(sys.argv) == 3:
        print(json.dumps(labels(Path(sys.argv[2])), sort_keys=True))
    else:
        print(ensure())
