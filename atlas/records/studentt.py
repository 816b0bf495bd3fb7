"""Student's t distribution for integer degrees of freedom, exact, in plain Python: the gate
(atlas.records.gating) needs one-sided p-values and quantiles at any level (a Holm step-down over
the draft lengths of one decision asks for 5 %/4, 5 %/3, ...), and numpy has no t distribution.
"""

from __future__ import annotations

import math


def cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with `df` >= 1 degrees of freedom: the closed form for integer df
    (Abramowitz & Stegun 26.7.3 and 26.7.4), a finite sum in cos(theta), theta = atan(t / sqrt(df))."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, not {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)), df - 3 powers
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for j in range(1, (df - 1) // 2):
            term *= c2 * (2 * j) / (2 * j + 1)
            total += term
        inside = 2 / math.pi * (theta + s * math.cos(theta) * total)
    else:  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...), df - 2 powers
        term, total = 1.0, 1.0
        for j in range(1, df // 2):
            term *= c2 * (2 * j - 1) / (2 * j)
            total += term
        inside = s * total
    # `inside` is P(|T| < |t|)
    return 0.5 + math.copysign(inside / 2, t)


def quantile(p: float, df: int) -> float:
    """The t with cdf(t, df) = p, for 0 < p < 1, by bisection to float precision."""
    if not 0 < p < 1:
        raise ValueError(f"a quantile needs 0 < p < 1, not {p}")
    lo, hi = -1.0, 1.0
    while cdf(lo, df) > p:
        lo *= 2
    while cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2
