"""Kubernetes resource quantities (``500m``, ``2``, ``64Mi``, ``1e3``) as exact fractions."""

from __future__ import annotations

import math
import re
from fractions import Fraction

_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:[eE](?P<exponent>[+-]?[0-9]+))?"
    r"(?P<suffix>m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
)
_FACTORS: dict[str | None, Fraction] = {
    None: Fraction(1), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}  # fmt: skip


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity as Kubernetes writes it; ValueError when it is not one."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not a quantity: {text!r} (like 500m, 2, 64Mi or 1G)")
    value = Fraction(match["number"]) * _FACTORS[match["suffix"]]
    if match["exponent"]:
        value *= Fraction(10) ** int(match["exponent"])
    return value


def in_units(value: Fraction, divisor: str = "1") -> int:
    """``value`` in units of ``divisor``, rounded up, as the downward API reports resources."""
    return math.ceil(value / parse_quantity(divisor))
