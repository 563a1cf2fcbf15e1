"""The generated Helm chart against its kustomize base, rendered by the real programs: the pinned helm
(built from the Go module proxy, gpuforge_lab.devcluster.helm) and the local control plane's kubectl.

With default values `helm template --include-crds` gives the same objects as `kubectl kustomize
operator/deploy`, compared parsed (so layout, key order and quoting do not count); each value reaches the
objects it names, `quotaWebhook.enabled=false` removes exactly the objects of rbac-quota.yaml, and values
the chart's schema refuses fail with the field's name.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge_lab.devcluster.build import build
from gpuforge_lab.devcluster.chart import BASE_DIR, CHART_DIR, QUOTA_FILE
from gpuforge_lab.devcluster.helm import ensure_helm
from gpuforge_lab.devcluster.pools import Pool

# Every test needs the local control plane's binaries (kubectl), the last one a running cluster.
pytestmark = pytest.mark.cluster

Key = tuple[str, str, str, str]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The pinned helm, with its cache, configuration and data in a scratch directory."""
    home = tmp_path_factory.mktemp("helm-home")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("CACHE", "CONFIG", "DATA"):
            patch.setenv(f"HELM_{name}_HOME", str(home / name.lower()))
        yield ensure_helm()


@pytest.fixture(scope="module")
def kubectl() -> Path:
    return build().path("kubectl")


def objects(text: str) -> dict[Key, dict[str, Any]]:
    """Objects by (apiVersion, kind, namespace, name); a name twice is an error, not a silent overwrite."""
    found: dict[Key, dict[str, Any]] = {}
    for obj in yaml.safe_load_all(text):
        if not obj:
            continue
        metadata = obj["metadata"]
        key = (obj["apiVersion"], obj["kind"], metadata.get("namespace", ""), metadata["name"])
        assert key not in found, f"{key} rendered twice"
        found[key] = obj
    return found


def kustomize(kubectl: Path) -> dict[Key, dict[str, Any]]:
    result = subprocess.run([str(kubectl), "kustomize", str(BASE_DIR)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return objects(result.stdout)


def template(helm: Path, *settings: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = [str(helm), "template", "gpuforge", str(CHART_DIR), "--include-crds"]
    for setting in settings:
        command += ["--set", setting]
    result = subprocess.run(command, capture_output=True, text=True)
    assert not check or result.returncode == 0, result.stderr
    return result


def rendered(helm: Path, *settings: str) -> dict[Key, dict[str, Any]]:
    return objects(template(helm, *settings).stdout)


def test_default_values_render_the_kustomize_base(helm: Path, kubectl: Path) -> None:
    base = kustomize(kubectl)
    chart = rendered(helm)
    assert sorted(chart) == sorted(base)
    for key, obj in base.items():
        assert chart[key] == obj, f"{key} differs between the chart and the base"


def test_quota_off_removes_the_quota_webhook_objects(helm: Path, kubectl: Path) -> None:
    base = kustomize(kubectl)
    quota = {
        (o["apiVersion"], o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
        for o in yaml.safe_load_all((BASE_DIR / QUOTA_FILE).read_text())
        if o
    }
    assert {kind for _, kind, _, _ in quota} == {"ClusterRole", "ClusterRoleBinding"}
    chart = rendered(helm, "quotaWebhook.enabled=false")
    assert sorted(chart) == sorted(set(base) - quota)
    assert all(chart[key] == base[key] for key in chart)


def test_values_reach_their_objects(helm: Path) -> None:
    chart = rendered(
        helm,
        "namespace.name=gpu-operators",
        "image.repository=registry.example.com/gpuforge",
        "image.tag=1.2.3",
        "resources.requests.cpu=250m",
        "resources.limits.memory=1Gi",
    )
    namespaces = {key[2] for key in chart if key[1] not in ("Namespace", "CustomResourceDefinition")}
    assert namespaces <= {"gpu-operators", ""}
    deployment = chart[("apps/v1", "Deployment", "gpu-operators", "gpuforge-operator")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/gpuforge:1.2.3"
    assert container["resources"]["requests"]["cpu"] == "250m"
    assert container["resources"]["limits"]["memory"] == "1Gi"
    assert ("v1", "Namespace", "", "gpu-operators") in chart
    for key, obj in chart.items():
        for subject in obj.get("subjects", []):
            assert subject["namespace"] == "gpu-operators", key
    without_namespace = rendered(helm, "namespace.create=false")
    assert not any(kind == "Namespace" for _, kind, _, _ in without_namespace)


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("quotaWebhook.enabled=maybe", "/quotaWebhook/enabled"),
        ("namespace.name=Not_A_Name", "/namespace/name"),
        ("image.tag=", "/image/tag"),
        ("replicas=2", "replicas"),
    ],
)
def test_values_outside_the_schema_are_refused(helm: Path, setting: str, field: str) -> None:
    result = template(helm, setting, check=False)
    assert result.returncode != 0 and field in result.stderr, result.stderr


def test_helm_lint_passes(helm: Path) -> None:
    result = subprocess.run([str(helm), "lint", "--strict", str(CHART_DIR)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- installed with helm on the local control plane ---------------------------------------------------


@pytest.fixture(scope="module")
def cluster(cluster_factory: Callable[..., Any]) -> Any:
    return cluster_factory(profile="1.36", pools=[Pool(name="cpu", count=1, gpu=None)], name="helm-install")


def run_helm(helm: Path, cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(helm), f"--kubeconfig={cluster.kubeconfig}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def exists(cluster: Any, *what: str) -> bool:
    return bool(cluster.kubectl("get", *what, check=False).returncode == 0)


def test_install_upgrade_uninstall(helm: Path, cluster: Any) -> None:
    """What docs/install.md tells a user to run: the release record in its own namespace, the objects
    where namespace.name says; quota off on upgrade removes the quota RBAC; uninstall keeps the CRD."""
    release_namespace = ["--namespace", "gpuforge-helm", "--create-namespace"]
    run_helm(
        helm, cluster, "install", "gpuforge", str(CHART_DIR), *release_namespace, "--wait", "--timeout=120s"
    )
    assert exists(cluster, "crd", "gpustacks.gpuforge.io")
    deployment = json.loads(
        cluster.kubectl("get", "deploy", "-n", "gpuforge-system", "gpuforge-operator", "-o", "json").stdout
    )
    assert deployment["status"].get("availableReplicas") == 1
    namespace = json.loads(cluster.kubectl("get", "namespace", "gpuforge-system", "-o", "json").stdout)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert exists(cluster, "clusterrole", "gpuforge-operator-quota")

    run_helm(
        helm,
        cluster,
        "upgrade",
        "gpuforge",
        str(CHART_DIR),
        *release_namespace[:2],
        "--set",
        "quotaWebhook.enabled=false",
    )
    assert not exists(cluster, "clusterrole", "gpuforge-operator-quota")
    assert not exists(cluster, "clusterrolebinding", "gpuforge-operator-quota")
    assert exists(cluster, "clusterrole", "gpuforge-operator")

    run_helm(helm, cluster, "uninstall", "gpuforge", *release_namespace[:2], "--wait")
    assert not exists(cluster, "deploy", "-n", "gpuforge-system", "gpuforge-operator")
    assert exists(cluster, "crd", "gpustacks.gpuforge.io"), "deleting the CRD would delete every GpuStack"
