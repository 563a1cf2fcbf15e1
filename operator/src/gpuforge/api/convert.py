"""Conversion between Kubernetes-style camelCase dicts and the typed dataclass models. No I/O.

The CRD schema defaults every field, so a body read from the API server is complete; the dataclass
defaults mirror the schema defaults (a unit test checks they agree) so that partial dicts, as written
in tests and examples, convert to the same model.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class ModelError(ValueError):
    """A dict does not fit the model; the message names the field path."""


def camel(name: str) -> str:
    """`max_parallel` -> `maxParallel`. A trailing underscore (reserved words) is dropped."""
    head, *rest = name.rstrip("_").split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls: type[T], data: Mapping[str, Any] | None, path: str = "") -> T:
    """Build dataclass `cls` from a camelCase mapping; unknown keys are an error naming the field."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ModelError(f"{path or '<root>'}: expected an object, got {type(data).__name__}")
    assert dataclasses.is_dataclass(cls)
    hints = _hints(cls)
    fields = {camel(f.name): f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ModelError(f"{_join(path, unknown[0])}: unknown field")
    kwargs: dict[str, Any] = {}
    for key, field in fields.items():
        if key in data:
            kwargs[field.name] = _convert(hints[field.name], data[key], _join(path, key))
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Inverse of `from_dict`: dataclasses to camelCase dicts, enums to their values. None is omitted."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name)
            if value is not None:
                out[camel(field.name)] = to_dict(value)
        return out
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    return obj


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:
            return _convert(members[0], value, path)
        # int | str (Kubernetes int-or-string): keep whichever the value is.
        for member in members:
            if isinstance(member, type) and isinstance(value, member) and not isinstance(value, bool):
                return value
        raise ModelError(f"{path}: expected one of {[getattr(m, '__name__', m) for m in members]}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ModelError(f"{path}: expected a list")
        return tuple(_convert(args[0], item, f"{path}[{i}]") for i, item in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ModelError(f"{path}: expected an object")
        return {str(k): _convert(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in tp)
            raise ModelError(f"{path}: unsupported value {value!r} (allowed: {allowed})") from None
    if tp is bool:
        if not isinstance(value, bool):
            raise ModelError(f"{path}: expected a boolean")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelError(f"{path}: expected an integer")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ModelError(f"{path}: expected a string")
        return value
    raise ModelError(f"{path}: cannot convert to {tp!r}")
