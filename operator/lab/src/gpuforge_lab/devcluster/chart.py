"""The Helm chart `charts/gpuforge`, generated from the kustomize base `operator/deploy`.

The base stays the one place the manifests are written; the chart is derived from it, committed, and
checked against it (tests/unit/devcluster/test_chart.py fails when the committed chart is stale;
tests/integration/release/test_chart.py renders both with the real helm and kubectl and compares the
objects). The generator applies the part of kustomize the base uses (namespace, labels without
selectors, one image) and refuses any other kustomization field, so a base that grows past it fails here
with the field's name instead of yielding a chart that differs from `kubectl kustomize`.

Values: `image.repository` / `image.tag` (the tag defaults to `gpuforge.__version__`), `namespace.name` /
`namespace.create`, `resources` of the operator container, and `quotaWebhook.enabled`, which keeps or
drops the objects of `rbac-quota.yaml` (the operator's permissions to deploy the GpuQuota webhook). The
defaults render exactly the objects of the base.

    python -m gpuforge_lab.devcluster.chart           # rewrite charts/gpuforge (make chart)
    python -m gpuforge_lab.devcluster.chart --check   # exit 1 naming the files that differ
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import gpuforge

OPERATOR_DIR = Path(__file__).resolve().parents[4]
BASE_DIR = OPERATOR_DIR / "deploy"
CHART_DIR = OPERATOR_DIR.parent / "charts" / "gpuforge"
CHART_NAME = "gpuforge"

# Files of the base whose objects a value switches on or off.
QUOTA_FILE = "rbac-quota.yaml"
# What the generator knows how to apply; any other kustomization field is refused.
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "namespace", "labels", "resources", "images"}
CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "PriorityClass",
}
NAMESPACED = {
    "ServiceAccount",
    "Deployment",
    "Service",
    "ConfigMap",
    "Secret",
    "Role",
    "RoleBinding",
    "PodDisruptionBudget",
}

# Placeholders put into the objects before they are written out, replaced by Helm expressions after.
_NAMESPACE = "GPUFORGE_CHART_NAMESPACE"
_IMAGE = "GPUFORGE_CHART_IMAGE"
_RESOURCES = "GPUFORGE_CHART_RESOURCES"


class ChartError(ValueError):
    """The base cannot be turned into a chart; the message names the file and field."""


@dataclass(frozen=True)
class Kustomization:
    namespace: str
    labels: dict[str, str]
    resources: tuple[str, ...]
    image_name: str
    image_repository: str
    image_tag: str


def load_kustomization(base: Path) -> Kustomization:
    path = base / "kustomization.yaml"
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ChartError(f"{path}: not a mapping")
    unknown = sorted(set(data) - KUSTOMIZATION_FIELDS)
    if unknown:
        raise ChartError(f"{path}: the chart generator does not apply {', '.join(unknown)}")
    labels: dict[str, str] = {}
    for index, entry in enumerate(data.get("labels") or []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise ChartError(f"{path}: labels[{index}] sets includeSelectors/includeTemplates")
        labels.update({str(k): str(v) for k, v in entry.get("pairs", {}).items()})
    images = data.get("images") or []
    if len(images) != 1:
        raise ChartError(f"{path}: images must name exactly one image (the operator's), has {len(images)}")
    image = images[0]
    for field in ("name", "newName", "newTag"):
        if not image.get(field):
            raise ChartError(f"{path}: images[0].{field} is missing")
    namespace = data.get("namespace")
    if not namespace:
        raise ChartError(f"{path}: namespace is missing")
    return Kustomization(
        namespace=str(namespace),
        labels=labels,
        resources=tuple(str(r) for r in data.get("resources") or []),
        image_name=str(image["name"]),
        image_repository=str(image["newName"]),
        image_tag=str(image["newTag"]),
    )


def _image_name(reference: str) -> str:
    """`repo/name:tag` or `repo/name@sha256:...` without the tag or digest, as kustomize matches it."""
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def _templated(obj: dict[str, Any], kustomization: Kustomization, source: str) -> dict[str, Any]:
    """The object as kustomize would emit it, with placeholders where the chart's values go."""
    kind = obj.get("kind", "")
    name = obj.get("metadata", {}).get("name", "")
    where = f"{source}: {kind} {name}"
    if kind not in CLUSTER_SCOPED and kind not in NAMESPACED:
        raise ChartError(f"{where}: the chart generator does not know whether {kind} is namespaced")
    metadata = obj.setdefault("metadata", {})
    metadata["labels"] = {**metadata.get("labels", {}), **kustomization.labels}
    if kind in NAMESPACED:
        metadata["namespace"] = _NAMESPACE
    if kind == "Namespace":
        if name != kustomization.namespace:
            raise ChartError(f"{where}: the base's Namespace must be its namespace {kustomization.namespace}")
        metadata["name"] = _NAMESPACE
    if kind in ("ClusterRoleBinding", "RoleBinding"):
        for subject in obj.get("subjects", []):
            if subject.get("kind") == "ServiceAccount":
                subject["namespace"] = _NAMESPACE
    if kind == "Deployment":
        pod = obj["spec"]["template"]["spec"]
        containers = pod.get("containers", [])
        if len(containers) != 1 or pod.get("initContainers"):
            raise ChartError(f"{where}: the chart's values fit one container, found {len(containers)}")
        container = containers[0]
        if _image_name(container.get("image", "")) != kustomization.image_name:
            raise ChartError(f"{where}: its image is not {kustomization.image_name}, the kustomization's")
        container["image"] = _IMAGE
        container["resources"] = _RESOURCES
    return obj


def _objects(base: Path, resource: str) -> Iterator[dict[str, Any]]:
    path = base / resource
    if not path.is_file():
        raise ChartError(f"{base / 'kustomization.yaml'}: resource {resource} is not a file")
    for document in yaml.safe_load_all(path.read_text()):
        if document is None:
            continue
        if not isinstance(document, dict) or "kind" not in document:
            raise ChartError(f"{path}: a document is not a Kubernetes object")
        yield document


def _dump(objects: list[dict[str, Any]]) -> str:
    text = "---\n".join(yaml.safe_dump(obj, sort_keys=False, width=1000) for obj in objects)
    text = re.sub(
        rf"^(\s*(?:- )?\w+): {_NAMESPACE}$", r"\1: {{ .Values.namespace.name | quote }}", text, flags=re.M
    )
    text = re.sub(
        rf"^(\s*(?:- )?)image: {_IMAGE}$",
        r'\1image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"',
        text,
        flags=re.M,
    )

    def resources(match: re.Match[str]) -> str:
        indent = len(match.group(1).replace("- ", "  "))
        return f"{match.group(1)}resources: {{{{- toYaml .Values.resources | nindent {indent + 2} }}}}"

    text = re.sub(rf"^(\s*(?:- )?)resources: {_RESOURCES}$", resources, text, flags=re.M)
    leftover = re.search(r"GPUFORGE_CHART_\w+", text)
    if leftover:
        raise ChartError(f"placeholder {leftover.group(0)} landed where the chart cannot template it")
    return text


def _header(source: str) -> str:
    return (
        f"# Generated from operator/deploy/{source} by `make chart` (gpuforge_lab.devcluster.chart):\n"
        "# edit the kustomize base, not this file.\n"
    )


def _values(kustomization: Kustomization, resources: dict[str, Any], version: str) -> str:
    def block(data: dict[str, Any]) -> str:
        return yaml.safe_dump(data, sort_keys=False)

    return (
        "# Values of the gpuforge chart, generated from operator/deploy by `make chart`. Defaults render\n"
        "# the same objects as `kubectl kustomize operator/deploy`. See docs/install.md.\n"
        "\n"
        f"# The operator's image (`make image` builds localhost/gpuforge-operator:{version}; push it and\n"
        "# point repository at your registry). The tag defaults to this release, gpuforge.__version__.\n"
        + block({"image": {"repository": kustomization.image_repository, "tag": version}})
        + "\n"
        "# The namespace the operator runs in, with Pod Security `restricted`. create: false when you\n"
        "# create it yourself (then give it the same pod-security.kubernetes.io labels).\n"
        + block({"namespace": {"name": kustomization.namespace, "create": True}})
        + "\n"
        "# Requests and limits of the operator container.\n" + block({"resources": resources}) + "\n"
        "# The operator's permissions to deploy the GpuQuota webhook for a GpuStack with spec.quota.enabled\n"
        "# (ClusterRole and ClusterRoleBinding gpuforge-operator-quota). false on a cluster that never\n"
        "# enables quota: those objects are left out, and the API server refuses the operator's requests\n"
        "# to deploy the webhook for a GpuStack that enables it.\n"
        + block({"quotaWebhook": {"enabled": True}})
    )


def _schema() -> str:
    string = {"type": "string", "minLength": 1}
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "additionalProperties": False,
        "required": ["image", "namespace", "resources", "quotaWebhook"],
        "properties": {
            "image": {
                "type": "object",
                "additionalProperties": False,
                "required": ["repository", "tag"],
                "properties": {"repository": string, "tag": string},
            },
            "namespace": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "create"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"},
                    "create": {"type": "boolean"},
                },
            },
            "resources": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "requests": {"type": "object", "additionalProperties": {"type": ["string", "number"]}},
                    "limits": {"type": "object", "additionalProperties": {"type": ["string", "number"]}},
                },
            },
            "quotaWebhook": {
                "type": "object",
                "additionalProperties": False,
                "required": ["enabled"],
                "properties": {"enabled": {"type": "boolean"}},
            },
        },
    }
    return json.dumps(schema, indent=2) + "\n"


def _chart_yaml(version: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v2",
            "name": CHART_NAME,
            "description": "The gpuforge operator, generated from its kustomize base operator/deploy",
            "type": "application",
            "version": version,
            "appVersion": version,
            "home": "https://github.com/gpuforge/gpuforge",
        },
        sort_keys=False,
    )


NOTES = """\
The gpuforge operator runs in namespace {{ .Values.namespace.name }}:
  kubectl -n {{ .Values.namespace.name }} rollout status deploy/gpuforge-operator
Then say what the GPU nodes should run (examples/gpustack-device-plugin.yaml) and watch it:
  kubectl get gpustacks -w
{{- if not .Values.quotaWebhook.enabled }}
quotaWebhook.enabled is false: a GpuStack with spec.quota.enabled cannot be deployed by this operator.
{{- end }}
"""


def render_chart(base: Path = BASE_DIR, version: str = gpuforge.__version__) -> dict[str, str]:
    """Every file of the chart (path relative to the chart's directory -> content)."""
    kustomization = load_kustomization(base)
    if kustomization.image_tag != version:
        raise ChartError(
            f"{base / 'kustomization.yaml'}: images[0].newTag is {kustomization.image_tag} but "
            f"gpuforge.__version__ is {version}; the chart's default tag is the release's version"
        )
    if QUOTA_FILE not in kustomization.resources:
        raise ChartError(
            f"{base / 'kustomization.yaml'}: {QUOTA_FILE}, switched by quotaWebhook.enabled, is gone"
        )
    files: dict[str, str] = {"Chart.yaml": _chart_yaml(version), "values.schema.json": _schema()}
    resources: dict[str, Any] | None = None
    for resource in kustomization.resources:
        raw = list(_objects(base, resource))
        for obj in raw:
            if obj["kind"] == "Deployment":
                if resources is not None:
                    raise ChartError(f"{resource}: the chart's values fit one Deployment")
                containers = obj["spec"]["template"]["spec"].get("containers") or [{}]
                resources = copy.deepcopy(containers[0].get("resources", {}))
        objects = [_templated(obj, kustomization, resource) for obj in raw]
        name = Path(resource).name
        crds = [obj for obj in objects if obj["kind"] == "CustomResourceDefinition"]
        if crds:
            if len(crds) != len(objects):
                raise ChartError(f"{resource}: a CRD file holds other objects too")
            # Helm installs crds/ before the templates and never deletes them (deleting a CRD deletes
            # every GpuStack); `helm template --include-crds` renders them for GitOps tools.
            files[f"crds/{name}"] = _header(resource) + _dump(crds)
            continue
        body = _dump(objects)
        if name == QUOTA_FILE:
            body = "{{- if .Values.quotaWebhook.enabled }}\n" + body + "{{- end }}\n"
        elif [obj["kind"] for obj in objects] == ["Namespace"]:
            body = "{{- if .Values.namespace.create }}\n" + body + "{{- end }}\n"
        elif any(obj["kind"] == "Namespace" for obj in objects):
            raise ChartError(f"{resource}: the Namespace must be alone in its file (namespace.create)")
        files[f"templates/{name}"] = _header(resource) + body
    if resources is None:
        raise ChartError(f"{base}: no Deployment, so no operator to install")
    files["values.yaml"] = _values(kustomization, resources, version)
    files["templates/NOTES.txt"] = NOTES
    return files


def stale_files(chart_dir: Path = CHART_DIR, base: Path = BASE_DIR) -> list[str]:
    """Files of the committed chart that differ from what the base generates, are missing, or are extra."""
    expected = render_chart(base)
    present = {str(p.relative_to(chart_dir)) for p in chart_dir.rglob("*") if p.is_file()}
    differing = [
        path
        for path, text in expected.items()
        if path not in present or (chart_dir / path).read_text() != text
    ]
    return sorted(set(differing) | (present - set(expected)))


def write_chart(chart_dir: Path = CHART_DIR, base: Path = BASE_DIR) -> list[str]:
    """Write the chart, removing files the base no longer generates; returns the files that changed."""
    files = render_chart(base)
    changed = stale_files(chart_dir, base) if chart_dir.is_dir() else sorted(files)
    for relative in changed:
        target = chart_dir / relative
        if relative in files:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(files[relative])
        else:
            target.unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only report files that differ (exit 1)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_files()
            for path in stale:
                print(f"stale: {CHART_DIR / path} (run `make chart`)", file=sys.stderr)
            return 1 if stale else 0
        for path in write_chart():
            print(f"wrote {CHART_DIR / path}")
    except ChartError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
