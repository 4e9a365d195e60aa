"""SciPy, imported when a repeated-trial statistic is first computed.

SciPy is the `stats` extra, not a core dependency: the main job (`arena run`) and single-trial
reports and comparisons (pure Python, adapters/results/stats.py) never need it, and it adds about
9 s and 215 MB (numpy included) to a fresh install that takes 39 s without it (measured; see
docs/statistics.md). Importing it lazily also keeps its 0.8 s import off every `arena` command.
"""

from __future__ import annotations

from types import ModuleType

from adapters.extras import ExtraMissing

STATS_EXTRA_HINT = "repeated-trial statistics need SciPy: pip install 'waa-arena[stats]'"


class StatsExtraMissing(ExtraMissing):
    """SciPy is not installed; the message names the extra that brings it."""


def scipy_stats() -> ModuleType:
    """`scipy.stats`, or StatsExtraMissing naming the `stats` extra."""
    try:
        import scipy.stats
    except ImportError as exc:  # pragma: no cover - the test environment has SciPy
        raise StatsExtraMissing(STATS_EXTRA_HINT) from exc
    return scipy.stats


def scipy_optimize() -> ModuleType:
    """`scipy.optimize`, or StatsExtraMissing naming the `stats` extra."""
    try:
        import scipy.optimize
    except ImportError as exc:  # pragma: no cover
        raise StatsExtraMissing(STATS_EXTRA_HINT) from exc
    return scipy.optimize


def normal_quantile(probability: float) -> float:
    """The standard normal distribution's quantile (scipy.stats.norm.ppf)."""
    return float(scipy_stats().norm.ppf(probability))


def t_quantile(probability: float, df: float) -> float:
    """Student's t distribution's quantile with `df` degrees of freedom (scipy.stats.t.ppf)."""
    return float(scipy_stats().t.ppf(probability, df))
