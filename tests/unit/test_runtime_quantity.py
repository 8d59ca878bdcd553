from __future__ import annotations

from fractions import Fraction

import pytest

from kustos.runtime.quantity import in_units, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Fraction(2)), ("500m", Fraction(1, 2)), ("0.5", Fraction(1, 2)),
        ("64Mi", Fraction(64 * 2**20)), ("1G", Fraction(10**9)), ("1e3", Fraction(1000)),
        ("1.5Gi", Fraction(3 * 2**29)), (".5", Fraction(1, 2)),
    ],
)  # fmt: skip
def test_quantities_are_exact(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "64 MB", "1.2.3", "Mi", "5x"])
def test_what_is_not_a_quantity_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)


def test_units_round_up_as_the_downward_api_does() -> None:
    assert in_units(parse_quantity("250m"), "1") == 1
    assert in_units(parse_quantity("250m"), "1m") == 250
    assert in_units(parse_quantity("100Mi"), "1Mi") == 100
    assert in_units(parse_quantity("100Mi"), "1Gi") == 1
