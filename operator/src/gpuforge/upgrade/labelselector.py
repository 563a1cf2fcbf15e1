"""Kubernetes label selectors as a small typed value: parse, match. Pure, no I/O.

The upgrade policy names pods with selectors (`waitForCompletion.podSelector`, `drain.podSelector`). Both
spellings users know are accepted: the kubectl string form (`app=train,tier!=web,gpu,!spot,zone in (a,b)`)
and the API object form (`{matchLabels: ..., matchExpressions: ...}`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class SelectorError(ValueError):
    """A selector that cannot be parsed; the message quotes the offending part."""


class Operator(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        match self.operator:
            case Operator.IN:
                return labels.get(self.key) in self.values
            case Operator.NOT_IN:
                return labels.get(self.key) not in self.values
            case Operator.EXISTS:
                return self.key in labels
            case Operator.DOES_NOT_EXIST:
                return self.key not in labels


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """All requirements must hold (AND). The empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        return cls(tuple(_parse_term(term) for term in _split_terms(text)))

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> LabelSelector:
        """`{matchLabels: {k: v}, matchExpressions: [{key, operator, values}]}` as in the Kubernetes API."""
        requirements = [
            Requirement(str(key), Operator.IN, frozenset({str(value)}))
            for key, value in sorted((obj.get("matchLabels") or {}).items())
        ]
        for index, expression in enumerate(obj.get("matchExpressions") or ()):
            try:
                operator = Operator(expression["operator"])
                key = str(expression["key"])
            except (KeyError, ValueError, TypeError) as error:
                raise SelectorError(f"matchExpressions[{index}]: {error}") from None
            values = frozenset(str(value) for value in expression.get("values") or ())
            requirements.append(Requirement(key, operator, values))
        return cls(tuple(requirements))

    @classmethod
    def from_any(cls, value: str | Mapping[str, Any] | None) -> LabelSelector:
        if value is None:
            return cls()
        if isinstance(value, str):
            return cls.parse(value)
        return cls.from_object(value)

    def __str__(self) -> str:
        parts = []
        for requirement in self.requirements:
            values = ",".join(sorted(requirement.values))
            match requirement.operator:
                case Operator.IN if len(requirement.values) == 1:
                    parts.append(f"{requirement.key}={values}")
                case Operator.NOT_IN if len(requirement.values) == 1:
                    parts.append(f"{requirement.key}!={values}")
                case Operator.IN:
                    parts.append(f"{requirement.key} in ({values})")
                case Operator.NOT_IN:
                    parts.append(f"{requirement.key} notin ({values})")
                case Operator.EXISTS:
                    parts.append(requirement.key)
                case Operator.DOES_NOT_EXIST:
                    parts.append(f"!{requirement.key}")
        return ",".join(parts)


_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_TERM = re.compile(rf"^(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)$")
_EQUALITY_TERM = re.compile(rf"^(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>{_VALUE})$")
_EXISTS_TERM = re.compile(rf"^(?P<neg>!?)\s*(?P<key>{_KEY})$")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside `( ... )`."""
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    terms.append("".join(current).strip())
    if terms == [""]:
        return []
    if any(not term for term in terms):
        raise SelectorError(f"empty term in selector {text!r}")
    return terms


def _parse_term(term: str) -> Requirement:
    if match := _SET_TERM.match(term):
        values = frozenset(value.strip() for value in match["values"].split(",") if value.strip())
        if not values or not all(re.fullmatch(_VALUE, value) for value in values):
            raise SelectorError(f"bad value list in {term!r}")
        operator = Operator.IN if match["op"] == "in" else Operator.NOT_IN
        return Requirement(match["key"], operator, values)
    if match := _EQUALITY_TERM.match(term):
        operator = Operator.NOT_IN if match["op"] == "!=" else Operator.IN
        return Requirement(match["key"], operator, frozenset({match["value"]}))
    if match := _EXISTS_TERM.match(term):
        operator = Operator.DOES_NOT_EXIST if match["neg"] else Operator.EXISTS
        return Requirement(match["key"], operator)
    raise SelectorError(f"cannot parse selector term {term!r}")
