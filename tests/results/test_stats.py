"""The statistics behind run comparisons, against published values and an independent library.

Published values (all 95%, four decimals as printed in the papers):
- Wilson intervals: Newcombe, Stat Med 1998; 17:857-872, Table II, method 3.
- Independent difference: Newcombe, Stat Med 1998; 17:873-890, Table II, method 10.
- Paired difference: Newcombe, Stat Med 1998; 17:2635-2650, example (a) (36, 12, 2, 0), method
  10; and the Cavo et al. (2012) table in Fagerland, Lydersen & Laake, Stat Med 2014;
  33:2850-2875 (59, 6, 16, 80), Newcombe square-and-add interval.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest

from adapters.results.stats import mcnemar_exact, paired_difference_interval, unpaired_difference_interval
from adapters.results.stats import wilson_interval


def binomtest(k: int, n: int, p: float = 0.5) -> Any:
    """SciPy's exact binomial test, imported at the first call rather than at collection
    (tests/installed.py says why)."""
    from scipy.stats import binomtest as scipy_binomtest

    return scipy_binomtest(k, n, p)


def _rounded(interval: tuple[float, float] | None) -> tuple[float, float]:
    assert interval is not None
    return round(interval[0], 4), round(interval[1], 4)


@pytest.mark.parametrize(
    ("successes", "total", "expected"),
    [
        (81, 263, (0.2553, 0.3662)),
        (15, 148, (0.0624, 0.1605)),
        (0, 20, (0.0, 0.1611)),
        (1, 29, (0.0061, 0.1718)),
    ],
)
def test_wilson_interval_matches_newcombe_single_proportion_table(
    successes: int, total: int, expected: tuple[float, float]
) -> None:
    assert _rounded(wilson_interval(successes, total)) == expected


@pytest.mark.parametrize(
    ("x1", "n1", "x2", "n2", "expected"),
    [
        (56, 70, 48, 80, (0.0524, 0.3339)),
        (9, 10, 3, 10, (0.1705, 0.8090)),
        (6, 7, 2, 7, (0.0582, 0.8062)),
        (5, 56, 0, 29, (-0.0381, 0.1926)),
        (0, 10, 0, 20, (-0.1611, 0.2775)),
        (0, 10, 0, 10, (-0.2775, 0.2775)),
        (10, 10, 0, 20, (0.6791, 1.0)),
        (10, 10, 0, 10, (0.6075, 1.0)),
    ],
)
def test_unpaired_difference_matches_newcombe_independent_table(
    x1: int, n1: int, x2: int, n2: int, expected: tuple[float, float]
) -> None:
    assert _rounded(unpaired_difference_interval(x1, n1, x2, n2)) == expected


def test_unpaired_difference_is_antisymmetric_and_needs_both_samples() -> None:
    forward = unpaired_difference_interval(56, 70, 48, 80)
    backward = unpaired_difference_interval(48, 80, 56, 70)
    assert forward is not None and backward is not None
    assert forward[0] == pytest.approx(-backward[1]) and forward[1] == pytest.approx(-backward[0])
    assert unpaired_difference_interval(3, 5, 0, 0) is None
    assert unpaired_difference_interval(0, 0, 3, 5) is None


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        # Newcombe's own worked example: difference 0.2, method 10 interval.
        ((36, 12, 2, 0), (0.0569, 0.3404)),
        # Fagerland et al.'s Cavo et al. table: difference -0.0621.
        ((59, 6, 16, 80), (-0.1186, -0.0046)),
    ],
)
def test_paired_difference_matches_published_examples(
    table: tuple[int, int, int, int], expected: tuple[float, float]
) -> None:
    assert _rounded(paired_difference_interval(*table)) == expected


def _paired_method_10_reference(a: int, b: int, c: int, d: int) -> tuple[float, float]:
    """Newcombe's method 10 written from the paper's formulas, with scipy's Wilson interval
    (`binomtest(...).proportion_ci(method="wilson")`) instead of ours: an independent check."""
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    ci1 = binomtest(a + b, n).proportion_ci(confidence_level=0.95, method="wilson")
    ci2 = binomtest(a + c, n).proportion_ci(confidence_level=0.95, method="wilson")
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    corrected = cross - n / 2 if cross > n / 2 else (0.0 if cross >= 0 else cross)
    phi = corrected / math.sqrt(margins) if margins else 0.0
    d1, e2 = p1 - ci1.low, ci2.high - p2
    e1, d2 = ci1.high - p1, p2 - ci2.low
    lower = p1 - p2 - math.sqrt(max(0.0, d1 * d1 - 2 * phi * d1 * e2 + e2 * e2))
    upper = p1 - p2 + math.sqrt(max(0.0, e1 * e1 - 2 * phi * e1 * d2 + d2 * d2))
    return max(-1.0, lower), min(1.0, upper)


@pytest.mark.parametrize("table", [t for t in itertools.product((0, 2, 7), repeat=4) if sum(t) > 0])
def test_paired_difference_agrees_with_an_independent_computation(table: tuple[int, int, int, int]) -> None:
    ours = paired_difference_interval(*table)
    assert ours is not None
    reference = _paired_method_10_reference(*table)
    assert ours == pytest.approx(reference, abs=1e-6)
    a, b, c, d = table
    n = sum(table)
    # The interval contains the point estimate and stays within [-1, 1].
    assert -1.0 <= ours[0] <= (b - c) / n <= ours[1] <= 1.0


def test_paired_difference_edge_cases() -> None:
    assert paired_difference_interval(0, 0, 0, 0) is None
    # No discordant pairs: the estimate is 0 and the interval still has width.
    low, high = paired_difference_interval(10, 0, 0, 10)  # type: ignore[misc]
    assert low < 0 < high
    # Every pair favours the first classification: the interval excludes 0 and reaches no further than 1.
    low, high = paired_difference_interval(0, 20, 0, 0)  # type: ignore[misc]
    assert 0 < low < high == 1.0
    # Swapping the two classifications mirrors the interval.
    forward = paired_difference_interval(36, 12, 2, 0)
    mirrored = paired_difference_interval(36, 2, 12, 0)
    assert forward is not None and mirrored is not None
    assert forward[0] == pytest.approx(-mirrored[1]) and forward[1] == pytest.approx(-mirrored[0])


def test_mcnemar_exact_hand_computed() -> None:
    # b=0, c=5: 2 * (1/2)^5.
    assert mcnemar_exact(0, 5) == 0.0625
    assert mcnemar_exact(5, 0) == 0.0625
    # b=1, c=9: 2 * (1 + 10) / 2^10.
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    # No discordant pairs: no evidence, p = 1 by definition; equal counts: p = 1 too.
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(4, 4) == 1.0


@pytest.mark.parametrize(("b", "c"), [(0, 1), (2, 3), (1, 12), (7, 20), (30, 31), (45, 10), (0, 16), (300, 250)])
def test_mcnemar_exact_matches_scipy_binomtest(b: int, c: int) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(binomtest(b, b + c, 0.5).pvalue, rel=1e-9)


def test_mcnemar_exact_does_not_underflow_for_many_pairs() -> None:
    p = mcnemar_exact(1000, 1300)
    assert 0 < p < 1e-9
    assert p == pytest.approx(binomtest(1000, 2300, 0.5).pvalue, rel=1e-6)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: mcnemar_exact(-1, 3), "b must be >= 0"),
        (lambda: mcnemar_exact(1, 2.5), "c must be an integer count"),  # type: ignore[arg-type]
        (lambda: paired_difference_interval(1, 2, 3, -4), "d must be >= 0"),
        (lambda: paired_difference_interval(1, 2, 3, 4, z=0), "z must be a positive"),
        (lambda: unpaired_difference_interval(5, 4, 1, 2), "successes1 (5) must not exceed total1 (4)"),
        (lambda: unpaired_difference_interval(1, 4, True, 2), "successes2 must be an integer count"),  # type: ignore[arg-type]
    ],
)
def test_bad_input_names_the_argument(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)
