"""The CRD file, its schema and the typed model must agree: same fields, same defaults."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.api import gpustack as m
from gpuforge.api.convert import camel, from_dict, to_dict
from gpuforge.api.crd import build_crd, crd_yaml

CRD_FILE = Path(__file__).parents[3] / "deploy" / "crds" / "gpustacks.gpuforge.io.yaml"


def _schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def test_crd_file_is_generated_from_the_model() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), (
        "run: python -m gpuforge.api.crd > deploy/crds/gpustacks.gpuforge.io.yaml"
    )


def _dataclass_of(tp: Any) -> type | None:
    """The dataclass a field holds directly, in an Optional, or as tuple items."""
    for candidate in (tp, *typing.get_args(tp)):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
        for inner in typing.get_args(candidate):
            if isinstance(inner, type) and dataclasses.is_dataclass(inner):
                return inner
    return None


def _pairs(cls: type, schema: dict[str, Any], path: str) -> list[tuple[str, type, dict[str, Any]]]:
    out = [(path, cls, schema)]
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        child = _dataclass_of(hints[field.name])
        if child is None:
            continue
        sub = schema["properties"][camel(field.name)]
        if sub.get("type") == "array":
            sub = sub["items"]
        out += _pairs(child, sub, f"{path}.{camel(field.name)}")
    return out


PAIRS = _pairs(m.GpuStackSpec, _schema()["properties"]["spec"], "spec") + _pairs(
    m.GpuStackStatus, _schema()["properties"]["status"], "status"
)


@pytest.mark.parametrize(("path", "cls", "schema"), PAIRS, ids=[p[0] for p in PAIRS])
def test_schema_and_dataclass_list_the_same_fields(path: str, cls: type, schema: dict[str, Any]) -> None:
    model_fields = {camel(f.name) for f in dataclasses.fields(cls)}
    assert model_fields == set(schema["properties"]), path


@pytest.mark.parametrize(("path", "cls", "schema"), PAIRS, ids=[p[0] for p in PAIRS])
def test_schema_defaults_equal_dataclass_defaults(path: str, cls: type, schema: dict[str, Any]) -> None:
    """A scalar default in the schema is the dataclass default; a field without one has none either."""
    for field in dataclasses.fields(cls):
        prop = schema["properties"][camel(field.name)]
        if field.default is not dataclasses.MISSING:
            default = to_dict(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = to_dict(field.default_factory())
        else:
            default = None
        if "default" in prop:
            if prop.get("type") == "object" and prop["default"] == {}:
                continue  # nested defaults come from the children, checked on their own
            assert prop["default"] == default, f"{path}.{camel(field.name)}"
        elif path.startswith("spec") and prop.get("type") != "object":
            assert default in (None, (), []), (
                f"{path}.{camel(field.name)} has a model default but none in the schema"
            )


def test_an_empty_spec_defaults_like_the_schema() -> None:
    """Defaulting {} through the schema gives the dataclass defaults."""

    def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
        if schema.get("type") == "object" and isinstance(value, dict):
            for key, sub in schema.get("properties", {}).items():
                if key not in value and "default" in sub:
                    value[key] = sub["default"]
                if key in value:
                    value[key] = apply_defaults(sub, value[key])
        if schema.get("type") == "array" and isinstance(value, list):
            return [apply_defaults(schema["items"], v) for v in value]
        return value

    defaulted = apply_defaults(_schema()["properties"]["spec"], {})
    assert from_dict(m.GpuStackSpec, defaulted) == m.GpuStackSpec()


def test_crd_file_parses_as_one_document() -> None:
    docs = list(yaml.safe_load_all(CRD_FILE.read_text()))
    assert len(docs) == 1
    assert docs[0]["spec"]["scope"] == "Cluster"
    assert docs[0]["spec"]["versions"][0]["subresources"] == {"status": {}}
