"""The Helm chart generated from the kustomize base: the committed chart is what the base generates now,
and a base the generator cannot translate faithfully is refused, naming the file and field."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

import gpuforge
from gpuforge_lab.devcluster import chart


def test_committed_chart_is_generated_from_the_base() -> None:
    assert chart.stale_files() == [], "charts/gpuforge is stale: run `make chart` and commit it"


def test_defaults_are_the_release_and_the_base() -> None:
    files = chart.render_chart()
    values = yaml.safe_load(files["values.yaml"])
    kustomization = chart.load_kustomization(chart.BASE_DIR)
    assert values["image"] == {"repository": kustomization.image_repository, "tag": gpuforge.__version__}
    assert values["namespace"] == {"name": kustomization.namespace, "create": True}
    assert values["quotaWebhook"] == {"enabled": True}
    chart_yaml = yaml.safe_load(files["Chart.yaml"])
    assert chart_yaml["version"] == chart_yaml["appVersion"] == gpuforge.__version__
    assert set(files) >= {"crds/gpustacks.gpuforge.io.yaml", "templates/rbac-quota.yaml"}


def test_quota_objects_are_switched_by_their_value() -> None:
    text = chart.render_chart()["templates/rbac-quota.yaml"]
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body[0] == "{{- if .Values.quotaWebhook.enabled }}" and body[-1] == "{{- end }}"


def test_write_removes_what_the_base_no_longer_generates(tmp_path: Path) -> None:
    out = tmp_path / "chart"
    (out / "templates").mkdir(parents=True)
    (out / "templates" / "gone.yaml").write_text("kind: Gone\n")
    changed = chart.write_chart(out)
    assert "templates/gone.yaml" in changed and not (out / "templates" / "gone.yaml").exists()
    assert chart.stale_files(out) == []
    assert chart.write_chart(out) == []


def edit_kustomization(change: Callable[[dict[str, object]], None]) -> Callable[[Path], None]:
    def edit(base: Path) -> None:
        path = base / "kustomization.yaml"
        data = yaml.safe_load(path.read_text())
        change(data)
        path.write_text(yaml.safe_dump(data))

    return edit


def replace_in(name: str, old: str, new: str) -> Callable[[Path], None]:
    def edit(base: Path) -> None:
        path = base / name
        path.write_text(path.read_text().replace(old, new))

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (edit_kustomization(lambda k: k.update(patches=[{"path": "x.yaml"}])), "does not apply patches"),
        (edit_kustomization(lambda k: k["images"][0].update(newTag="9.9.9")), r"newTag is 9\.9\.9"),
        (edit_kustomization(lambda k: k["images"].append({"name": "b"})), "exactly one image"),
        (edit_kustomization(lambda k: k["resources"].remove("rbac-quota.yaml")), "rbac-quota.yaml"),
        (edit_kustomization(lambda k: k["labels"][0].update(includeSelectors=True)), r"labels\[0\]"),
        (replace_in("serviceaccount.yaml", "kind: ServiceAccount", "kind: Widget"), "Widget is namespaced"),
        (replace_in("deployment.yaml", "image: gpuforge-operator", "image: other"), "image is not"),
    ],
)
def test_a_base_past_the_generator_is_refused(
    tmp_path: Path, edit: Callable[[Path], None], message: str
) -> None:
    base = tmp_path / "deploy"
    shutil.copytree(chart.BASE_DIR, base)
    edit(base)
    with pytest.raises(chart.ChartError, match=message):
        chart.render_chart(base)
