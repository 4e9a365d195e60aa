"""Statistics for comparing success rates: an exact paired test and difference intervals.

Pure Python (``math`` only): scipy is not a base dependency of the project.

    mcnemar_exact(b, c)                              exact McNemar test, two-sided p-value
    paired_difference_interval(a, b, c, d)           Newcombe (1998) method 10, paired data
    unpaired_difference_interval(x1, n1, x2, n2)     Newcombe (1998) method 10, independent
    wilson_interval_effective(p, n_eff)              Wilson with an effective sample size

The intervals are built from Wilson score intervals (`wilson_interval` below, so
every interval in a report comes from the same Wilson code):

- Newcombe RG. Two-sided confidence intervals for the single proportion: comparison of seven
  methods. Stat Med 1998; 17:857-872 (the Wilson interval, method 3).
- Newcombe RG. Interval estimation for the difference between independent proportions:
  comparison of eleven methods. Stat Med 1998; 17:873-890 (method 10, "square and add").
- Newcombe RG. Improved confidence intervals for the difference between binomial proportions
  based on paired data. Stat Med 1998; 17:2635-2650 (method 10: the same, with a correction
  for the correlation between the paired outcomes).

A paired 2x2 table is written here as Newcombe writes it::

                         second: success   second: failure
        first: success         a                 b
        first: failure         c                 d

so the first proportion is (a + b) / n, the second (a + c) / n, and the discordant pairs are
b and c.
"""

from __future__ import annotations

import math


Interval = tuple[float, float]
"""A (lower, upper) confidence interval."""

# The same normal quantile as `wilson_interval`'s default, so a difference interval and the
# Wilson intervals printed beside it are computed at exactly the same level.
Z95 = 1.959964


def wilson_interval(successes: int, total: int, z: float = 1.959964) -> tuple[float, float] | None:
    """Wilson score interval for a binomial proportion (default 95%); None when total is 0."""
    if total <= 0:
        return None
    p = successes / total
    centre, half = _wilson_centre_half(p, total, z)
    # At p = 0 or 1 one bound is exactly 0 or 1; floating point would give 1e-17 off.
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    high = 1.0 if successes >= total else min(1.0, centre + half)
    return low, high


def _wilson_centre_half(p: float, n: float, z: float) -> tuple[float, float]:
    """The Wilson interval's centre and half-width for proportion `p` observed over `n`."""
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return centre, half


def wilson_interval_effective(p: float, effective_n: float, z: float = Z95) -> Interval:
    """Wilson score interval for an estimated proportion `p` whose variance equals that of a
    binomial proportion over `effective_n` trials (n_eff = p(1 - p) / variance).

    This is the design-effect adjusted Wilson interval for clustered data (Korn & Graubard 1998;
    evaluated for clustered surveys by Dean & Pagano 2015): with `effective_n` equal to a whole
    number of independent trials and `p` a count over it, it is `wilson_interval`.
    """
    if not (0.0 <= p <= 1.0):
        raise ValueError(f"p must be between 0 and 1, got {p!r}")
    if not (effective_n > 0 and math.isfinite(effective_n)):
        raise ValueError(f"effective_n must be a positive finite number, got {effective_n!r}")
    centre, half = _wilson_centre_half(p, effective_n, _z(z))
    low = 0.0 if p <= 0 else max(0.0, centre - half)
    high = 1.0 if p >= 1 else min(1.0, centre + half)
    return low, high


def _count(name: str, value: int) -> int:
    """`value` as a non-negative int, or a ValueError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer count, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _z(z: float) -> float:
    if not (isinstance(z, (int, float)) and math.isfinite(z) and z > 0):
        raise ValueError(f"z must be a positive finite number, got {z!r}")
    return float(z)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided p-value of the exact McNemar test for paired binary outcomes.

    `b` and `c` are the discordant pairs (success in the first classification only, and in the
    second only). Under the null hypothesis each discordant pair is equally likely to go
    either way, so b ~ Binomial(b + c, 1/2); the p-value is twice the smaller tail, capped at 1.
    With no discordant pairs there is no evidence either way and the p-value is 1.
    """
    b, c = _count("b", b), _count("c", c)
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1))
    # Integer numerator and denominator: Python's int / int is correctly rounded however large
    # they are, so the p-value stays exact (no float underflow for thousands of pairs).
    return min(1.0, 2 * tail / 2**n)


def paired_difference_interval(a: int, b: int, c: int, d: int, z: float = Z95) -> Interval | None:
    """Confidence interval for p1 - p2 of two paired proportions (Newcombe 1998, method 10).

    `a` pairs succeeded in both classifications, `b` in the first only, `c` in the second only,
    `d` in neither; p1 = (a + b) / n and p2 = (a + c) / n. The default level is 95%. Returns
    None when there are no pairs.
    """
    a, b, c, d = _count("a", a), _count("b", b), _count("c", c), _count("d", d)
    z = _z(z)
    n = a + b + c + d
    if n == 0:
        return None
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson_interval(a + b, n, z)  # type: ignore[misc]  # n > 0, never None
    l2, u2 = wilson_interval(a + c, n, z)  # type: ignore[misc]
    # The correlation of the paired outcomes (phi), with Newcombe's correction: a positive
    # product-moment term is reduced by n/2 (to no lower than 0); 0 when a margin is empty.
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    phi = 0.0
    if margins > 0:
        cross = a * d - b * c
        if cross > n / 2:
            corrected = cross - n / 2
        elif cross >= 0:
            corrected = 0.0
        else:
            corrected = float(cross)
        phi = corrected / math.sqrt(margins)
    diff = p1 - p2
    low_1, high_2 = p1 - l1, u2 - p2
    high_1, low_2 = u1 - p1, p2 - l2
    # max(0, ...) only absorbs rounding: with |phi| <= 1 each radicand is >= (x - y)^2 >= 0.
    lower = diff - math.sqrt(max(0.0, low_1**2 - 2 * phi * low_1 * high_2 + high_2**2))
    upper = diff + math.sqrt(max(0.0, high_1**2 - 2 * phi * high_1 * low_2 + low_2**2))
    return max(-1.0, lower), min(1.0, upper)


def unpaired_difference_interval(
    successes1: int, total1: int, successes2: int, total2: int, z: float = Z95
) -> Interval | None:
    """Confidence interval for p1 - p2 of two independent proportions (Newcombe 1998, method 10).

    p1 = successes1 / total1 and p2 = successes2 / total2. The default level is 95%. Returns
    None when either sample is empty.
    """
    x1, n1 = _count("successes1", successes1), _count("total1", total1)
    x2, n2 = _count("successes2", successes2), _count("total2", total2)
    z = _z(z)
    if x1 > n1:
        raise ValueError(f"successes1 ({x1}) must not exceed total1 ({n1})")
    if x2 > n2:
        raise ValueError(f"successes2 ({x2}) must not exceed total2 ({n2})")
    if n1 == 0 or n2 == 0:
        return None
    p1, p2 = x1 / n1, x2 / n2
    l1, u1 = wilson_interval(x1, n1, z)  # type: ignore[misc]  # totals > 0, never None
    l2, u2 = wilson_interval(x2, n2, z)  # type: ignore[misc]
    diff = p1 - p2
    lower = diff - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    upper = diff + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return max(-1.0, lower), min(1.0, upper)
