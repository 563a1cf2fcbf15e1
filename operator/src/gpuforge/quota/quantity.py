"""Kubernetes resource quantities ("500m", "16Gi", "2", "1e3") as exact Decimals, and back. No I/O.

Arithmetic on quota usage must be exact: a float would let 0.1 + 0.2 CPUs pass a 0.3 CPU quota or not
depending on rounding. Parsing follows the API machinery's grammar (signed number, then a binary suffix
Ki..Ei, a decimal suffix n, u, m, "", k, M, G, T, P, E, or an exponent e/E<int>).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)
# Quantities beyond this are rejected: nobody has an exabyte of GPUs, and it bounds Decimal work.
_MAX_MAGNITUDE = Decimal("1e21")


class QuantityError(ValueError):
    """A quantity that cannot be parsed; the message names the field it came from."""

    def __init__(self, field: str, value: object, reason: str = "not a Kubernetes quantity") -> None:
        super().__init__(f"{field}: {value!r} is {reason} (examples: 2, 500m, 16Gi)")
        self.field = field
        self.value = value


def parse_quantity(value: object, field: str = "quantity") -> Decimal:
    """Parse a quantity given as a string or a JSON number; raise QuantityError naming `field`."""
    if isinstance(value, bool):
        raise QuantityError(field, value)
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(field, value)
        text = repr(value)
    elif isinstance(value, str):
        text = value.strip()
    else:
        raise QuantityError(field, value)
    if len(text) > 64:
        raise QuantityError(field, value, "too long to be a quantity")
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(field, value)
    try:
        number = Decimal(match["number"])
        suffix = match["suffix"] or ""
        if suffix in _BINARY:
            result = number * _BINARY[suffix]
        elif suffix in _DECIMAL:
            result = number * _DECIMAL[suffix]
        else:
            exponent = int(suffix[1:])
            if abs(exponent) > 30:
                raise QuantityError(field, value, "out of range")
            result = number.scaleb(exponent)
    except InvalidOperation as error:
        raise QuantityError(field, value) from error
    if abs(result) > _MAX_MAGNITUDE:
        raise QuantityError(field, value, "out of range")
    return result


def format_quantity(value: Decimal) -> str:
    """Canonical short text: integers plain ("16"), fractions in milli units ("500m") when exact,
    otherwise a plain decimal. Large multiples of 1024 keep binary suffixes ("16Gi")."""
    if value == value.to_integral_value():
        integer = int(value)
        if integer != 0 and abs(integer) >= 2**20:
            for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi"):
                unit = _BINARY[suffix]
                if integer % unit == 0:
                    return f"{integer // unit}{suffix}"
        return str(integer)
    milli = value * 1000
    if milli == milli.to_integral_value():
        return f"{int(milli)}m"
    return format(value.normalize(), "f")


def parse_resource_list(values: Mapping[str, object] | None, field: str) -> dict[str, Decimal]:
    """Parse a map of resource name to quantity; errors name `field.<key>`."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise QuantityError(field, values, "not a map of quantities")
    return {str(key): parse_quantity(raw, f"{field}.{key}") for key, raw in values.items()}


def format_resource_list(values: Mapping[str, Decimal]) -> dict[str, str]:
    return {key: format_quantity(values[key]) for key in sorted(values)}
