"""How the site writes a number: one rule for a figure at a fixed precision, one for a chart's
axis label."""

from __future__ import annotations

from collections.abc import Sequence


def fixed(v: float | None, digits: int = 2) -> str:
    """A figure at `digits` decimals; a missing one is a dash."""
    return "—" if v is None else f"{v:.{digits}f}"


def fixed_list(values: Sequence[float], digits: int = 3) -> str:
    """Figures at `digits` decimals, comma-separated (a widget's data attribute)."""
    return ", ".join(fixed(v, digits) for v in values)


def tick(v: float) -> str:
    """An axis label: a whole number as itself, else at most two decimals below 10 (trailing zeros
    dropped) and one at 10 and above."""
    if float(v).is_integer():
        return str(int(v))
    return f"{v:.2f}".rstrip("0").rstrip(".") if abs(v) < 10 else f"{v:.1f}"
