from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuforge.quota.quantity import QuantityError, format_quantity, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", Decimal(2)),
        (2, Decimal(2)),
        ("500m", Decimal("0.5")),
        ("16Gi", Decimal(16 * 2**30)),
        ("1k", Decimal(1000)),
        ("1.5", Decimal("1.5")),
        ("1e3", Decimal(1000)),
        ("100n", Decimal("1e-7")),
        (" 4 ", Decimal(4)),
        ("0", Decimal(0)),
        (".5", Decimal("0.5")),
    ],
)
def test_parse(text: object, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "garbage", ["", "lots", "1.2.3", "5 Gi", "1Q", "--1", None, True, [], "1e99", "9" * 70]
)
def test_garbage_names_the_field(garbage: object) -> None:
    with pytest.raises(QuantityError, match=r"spec\.hard\.requests\.cpu"):
        parse_quantity(garbage, "spec.hard.requests.cpu")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal(16), "16"),
        (Decimal("0.5"), "500m"),
        (Decimal(16 * 2**30), "16Gi"),
        (Decimal("0.0001"), "0.0001"),
    ],
)
def test_format(value: Decimal, text: str) -> None:
    assert format_quantity(value) == text


@given(st.decimals(min_value=-(10**12), max_value=10**12, places=6, allow_nan=False, allow_infinity=False))
def test_format_round_trips(value: Decimal) -> None:
    assert parse_quantity(format_quantity(value)) == value


def test_exact_arithmetic() -> None:
    assert parse_quantity("100m") + parse_quantity("200m") == parse_quantity("300m")
