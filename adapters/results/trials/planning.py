"""How small a difference a design can detect: the minimum detectable effect (MDE) before a run
(`arena plan`) and of the design that was run (the comparisons).

    trial_variance(tasks)                 the trial-to-trial variance seen in earlier runs
    plan_mde(tasks, trials, baseline_rate, within_variance=None)
                                          the MDE of a tasks x trials comparison, 80 % power,
                                          for the verdict the product runs on it (simulated)
    design_mde(baseline_trials, candidate_trials, baseline_rate, ...)
                                          the same for a design that was run (trials per task)
    mde_from_standard_error(se)           (z_{1-alpha/2} + z_{power}) x se (the textbook formula)
    simulated_improved(...)               the product's these-tasks verdict, vectorised over
                                          simulated comparisons (what plan_mde simulates)

The MDE is for the "these tasks" estimand (the benchmark's fixed tasks, docs/statistics.md): two
models each run `trials` times on each of `tasks` tasks and compared once by the verdict
`arena compare` and a model update without the adaptive design give (paired.py): the exact
McNemar test when both runs have one trial per task, else the stratified permutation z test.

Why simulate instead of the textbook 2.80 x SE: at the difference that formula names, that
verdict decides "improved" only 55-75 % of the time on WAA-like suites (issue 64): the new
model's trials vary more than the baseline's when its improvement makes tasks uncertain, the
test's null variance grows with a real difference, and with one trial the exact McNemar test is
conservative. So the plan plays the verdict itself on simulated comparisons:

- The baseline's per-task success probabilities are the quantiles of a Beta distribution with
  the baseline's rate as its mean and the trial-to-trial variance v = mean p(1 - p) the plan is
  given (earlier runs' repeated trials, else its upper bound rate (1 - rate): every task a coin
  with the suite's rate). Beta(a, b) with mean r has mean p(1 - p) = r (1 - r) (a + b) / (a + b + 1),
  so a + b = v / (r (1 - r) - v): a small v puts the tasks near 0 and 1, as on WAA.
- The candidate improves by the difference on randomly chosen tasks, each raised by at most 50
  points (and never above 1), as `simulation.shifted` does; each simulated comparison draws its
  own tasks to improve and its own trial outcomes.
- The MDE is the smallest difference the verdict calls "improved" in `power` of the simulated
  comparisons (2,000 by default, one seed, the same draws at every difference tried, so the
  search is stable and the plan is the same every time it is asked).

tests/results/test_plan_power.py checks the printed difference against the product's own verdict
(`compare_trials`) on WAA-like suites with one and three trials.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from adapters.results.trials._scipy import STATS_EXTRA_HINT, StatsExtraMissing, normal_quantile, scipy_stats
from adapters.results.trials.estimates import TaskTrials, unbiased_trial_variance
from adapters.results.trials.flaky import TaskStability

if TYPE_CHECKING:
    import numpy as np

DEFAULT_ALPHA = 0.05
DEFAULT_POWER = 0.8
DEFAULT_SIMULATIONS = 2000
IMPROVEMENT_CAP = 0.5  # the most one task's success probability rises in the planned improvement
_MAX_DRAWS = 1_000_000  # simulations x tasks held at once (8 MB per array; a plan in about 1 s)
_SEARCH_STEPS = 12  # halvings of the difference's range: 0.5 / 2^12, about 0.01 points


def _numpy() -> Any:
    """numpy (it comes with SciPy, the `stats` extra), imported when a plan is simulated."""
    try:
        import numpy
    except ImportError as exc:  # pragma: no cover - the test environment has it
        raise StatsExtraMissing(STATS_EXTRA_HINT) from exc
    return numpy


class TrialVariance(BaseModel):
    """The mean over tasks of the unbiased p(1 - p), from tasks with two sound trials or more."""

    variance: float
    tasks: int  # tasks it is estimated from


def trial_variance(tasks: Sequence[TaskTrials | TaskStability]) -> TrialVariance | None:
    """The trial-to-trial variance from earlier repeated trials, or None when no task has two
    sound trials. Give one run's tasks (`group_trials`), or the same agent's trials across runs
    grouped by task version and settings (`flaky.task_stability`)."""
    counts = [(t.sound_successes, t.sound) if isinstance(t, TaskTrials) else (t.successes, t.sound_trials)
              for t in tasks]
    values = [unbiased_trial_variance(s, n) for s, n in counts if n >= 2]
    if not values:
        return None
    return TrialVariance(variance=sum(values) / len(values), tasks=len(values))


def _probability(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1):
        raise ValueError(f"{name} must be between 0 and 1 (exclusive), got {value!r}")
    return float(value)


def mde_from_standard_error(standard_error: float, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER) -> float:
    """The smallest true difference a two-sided level-`alpha` z test detects with probability
    `power`, for an estimate with this standard error: (z_{1-alpha/2} + z_{power}) x se."""
    alpha, power = _probability("alpha", alpha), _probability("power", power)
    return (normal_quantile(1 - alpha / 2) + normal_quantile(power)) * standard_error


# --- the product's verdict on simulated comparisons ------------------------------------------------


def simulated_improved(baseline_successes: np.ndarray, candidate_successes: np.ndarray,
                       baseline_trials: np.ndarray | int, candidate_trials: np.ndarray | int,
                       alpha: float = DEFAULT_ALPHA) -> np.ndarray:
    """For each simulated comparison (rows: comparisons, columns: tasks, every trial sound),
    whether the these-tasks verdict of `paired.compare_trials` is "improved": the exact McNemar
    test when every task has one trial in each run, else the stratified permutation z test, at
    two-sided level `alpha`, with the candidate's mean ahead. tests/results/test_plan_power.py
    checks it against compare_trials itself."""
    np, stats = _numpy(), scipy_stats()
    base = np.asarray(baseline_successes, dtype=float)
    new = np.asarray(candidate_successes, dtype=float)
    kb = np.broadcast_to(np.asarray(baseline_trials, dtype=float), base.shape[-1:])
    kc = np.broadcast_to(np.asarray(candidate_trials, dtype=float), new.shape[-1:])
    total = (new / kc - base / kb).sum(axis=-1)
    if np.all(kb == 1) and np.all(kc == 1):
        fixed = ((new == 1) & (base == 0)).sum(axis=-1)
        broken = ((base == 1) & (new == 0)).sum(axis=-1)
        discordant = fixed + broken
        p_value = np.where(discordant > 0,
                           np.minimum(1.0, 2 * stats.binom.cdf(np.minimum(fixed, broken), discordant, 0.5)), 1.0)
    else:
        m, s = kb + kc, base + new
        null = (s * (m - s) / ((m - 1) * kb * kc)).sum(axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(null > 0, total / np.sqrt(null), 0.0)
        p_value = np.where(null > 0, np.minimum(1.0, 2 * stats.norm.sf(np.abs(z))), 1.0)
    # compare_trials calls a difference of exactly 0 no difference; sums of fractions carry
    # rounding, hence the tolerance.
    return (p_value < alpha) & (total > 1e-9)


def planned_task_rates(tasks: int, rate: float, variance: float) -> np.ndarray:
    """`tasks` success probabilities with mean `rate` and mean p(1 - p) `variance`: the
    quantiles of the Beta distribution with those moments (module docstring); every task at
    `rate` when `variance` is its upper bound rate (1 - rate) or the rate is 0 or 1."""
    np = _numpy()
    bound = rate * (1 - rate)
    if bound <= 0 or variance >= bound:
        return np.full(tasks, float(rate))
    concentration = variance / (bound - variance)  # a + b
    quantiles = (np.arange(tasks) + 0.5) / tasks
    return np.asarray(scipy_stats().beta.ppf(quantiles, rate * concentration, (1 - rate) * concentration), dtype=float)


class _PowerCurve:
    """The simulated power of the verdict against a planned improvement of any size, with the
    same draws at every size (common random numbers): which tasks improve, in what order, and
    each trial outcome's uniform draw."""

    def __init__(self, p: np.ndarray, baseline_trials: np.ndarray, candidate_trials: np.ndarray,
                 simulations: int, alpha: float, seed: int) -> None:
        np, stats = _numpy(), scipy_stats()
        rng = np.random.default_rng(seed)
        tasks = p.size
        self.p, self.kb, self.kc, self.alpha = p, baseline_trials, candidate_trials, alpha
        self.room = np.minimum(1.0 - p, IMPROVEMENT_CAP)  # how far each task can rise
        self.order = np.argsort(rng.random((simulations, tasks)), axis=1)  # the tasks to improve, first first
        self.unorder = np.argsort(self.order, axis=1)
        room = self.room[self.order]
        self.room_in_order, self.room_before = room, np.cumsum(room, axis=1) - room
        # Binomial counts by inverse CDF from one uniform each: a higher probability never gives
        # fewer successes for the same draw, so the power rises smoothly with the difference.
        self.new_draws = rng.random((simulations, tasks))
        self.base = stats.binom.ppf(rng.random((simulations, tasks)), baseline_trials, p)
        self.new_unchanged = stats.binom.ppf(self.new_draws, candidate_trials, p)
        self.tasks = tasks

    @property
    def largest(self) -> float:
        """The largest mean improvement the model allows (every task raised as far as it may)."""
        return float(self.room.sum()) / self.tasks

    def power(self, difference: float) -> float:
        """The share of simulated comparisons the verdict calls "improved" when the candidate's
        mean is `difference` above the baseline's."""
        np, stats = _numpy(), scipy_stats()
        raised = np.clip(difference * self.tasks - self.room_before, 0.0, self.room_in_order)
        raise_by = np.take_along_axis(raised, self.unorder, axis=1)
        new = self.new_unchanged.copy()
        moved = raise_by > 0
        kc = np.broadcast_to(self.kc, raise_by.shape)
        new[moved] = stats.binom.ppf(self.new_draws[moved], kc[moved], (self.p + raise_by)[moved])
        return float(np.mean(simulated_improved(self.base, new, self.kb, self.kc, self.alpha)))


def _verdict_name(baseline_trials: int, candidate_trials: int) -> str:
    """The test `compare_trials` runs: exact McNemar when every task has one trial in each run."""
    if baseline_trials == candidate_trials == 1:
        return "exact McNemar (one trial per task and run)"
    return "stratified permutation z test"


class PlannedMDE(BaseModel):
    """The MDE of a planned comparison (these tasks), for the verdict the product runs on it."""

    tasks: int
    baseline_trials: float  # per task (a mean when tasks got different numbers)
    candidate_trials: float
    baseline_rate: float
    within_variance: float
    variance_source: str  # "earlier runs (N tasks with repeated trials)" or the stated default
    alpha: float
    power: float
    mde: float | None  # None: even the largest improvement the model allows is detected less often
    largest: float  # the largest mean improvement the model allows
    power_at_largest: float
    verdict: str  # the test the comparison will run
    simulations: int

    def render(self) -> str:
        """What `arena plan` prints."""
        design = (f"{self.tasks} tasks x {self.baseline_trials:g} baseline / {self.candidate_trials:g} new trials, "
                  f"baseline rate {100 * self.baseline_rate:.1f} %, trial-to-trial variance "
                  f"{self.within_variance:.3f} from {self.variance_source}; estimand: these tasks")
        how = (f"for the verdict arena compare and a model update without the adaptive design give ({self.verdict}), "
               f"found on {self.simulations:,} simulated comparisons: per-task rates Beta-distributed with the "
               f"baseline's rate and trial-to-trial variance, the improvement on random tasks, each up by at most "
               f"{100 * IMPROVEMENT_CAP:.0f} points")
        if self.mde is None:
            return (f"detectable difference: none at {100 * self.power:.0f} % power, alpha {self.alpha:g}: even "
                    f"the largest improvement possible ({100 * self.largest:.1f} points) is detected "
                    f"{100 * self.power_at_largest:.0f} % of the time, {how} ({design})")
        return (f"detectable difference: {100 * self.mde:.1f} points at {100 * self.power:.0f} % power, alpha "
                f"{self.alpha:g}, {how} ({design})")


def _variance(baseline_rate: float, within_variance: TrialVariance | float | None) -> tuple[float, str]:
    """The trial-to-trial variance a plan uses and where it comes from (module docstring)."""
    bound = baseline_rate * (1 - baseline_rate)
    if isinstance(within_variance, TrialVariance):
        variance, source = within_variance.variance, f"earlier runs ({within_variance.tasks} tasks with repeated trials)"
    elif within_variance is not None:
        if not (0 <= within_variance <= 0.25):
            raise ValueError(f"trial-to-trial variance must be between 0 and 0.25, got {within_variance!r}")
        variance, source = float(within_variance), "the caller"
    else:
        variance, source = bound, "the default rate x (1 - rate), its upper bound (no earlier repeated trials)"
    if variance == 0 and bound > 0:
        # No trial-to-trial variation seen is no evidence of none: plan with the bound instead.
        variance, source = bound, "the default rate x (1 - rate) (the earlier trials never varied)"
    # More trial noise than a coin with the suite's rate cannot be (Jensen): the bound caps it.
    return min(variance, bound), source


def _simulated_mde(baseline_trials: Sequence[int], candidate_trials: Sequence[int], baseline_rate: float,
                   within_variance: TrialVariance | float | None, alpha: float, power: float, simulations: int,
                   seed: int) -> PlannedMDE:
    """The MDE of a design with these trials per task (one entry per task, each model)."""
    if not (isinstance(baseline_rate, (int, float)) and not isinstance(baseline_rate, bool)
            and 0 <= baseline_rate <= 1):
        raise ValueError(f"baseline rate must be between 0 and 1, got {baseline_rate!r}")
    alpha, power = _probability("alpha", alpha), _probability("power", power)
    np = _numpy()
    tasks = len(baseline_trials)
    variance, source = _variance(float(baseline_rate), within_variance)
    simulations = max(1, min(simulations, _MAX_DRAWS // tasks))
    kb, kc = np.asarray(baseline_trials, dtype=float), np.asarray(candidate_trials, dtype=float)
    curve = _PowerCurve(planned_task_rates(tasks, float(baseline_rate), variance), kb, kc, simulations, alpha, seed)
    low, high = 0.0, curve.largest
    at_largest = curve.power(high) if high > 0 else 0.0
    mde: float | None = None
    if at_largest >= power:
        for _ in range(_SEARCH_STEPS):
            middle = (low + high) / 2
            low, high = (low, middle) if curve.power(middle) >= power else (middle, high)
        mde = high
    single = bool(np.all(kb == 1) and np.all(kc == 1))
    return PlannedMDE(
        tasks=tasks, baseline_trials=float(kb.mean()), candidate_trials=float(kc.mean()),
        baseline_rate=float(baseline_rate), within_variance=variance, variance_source=source, alpha=alpha,
        power=power, mde=mde, largest=curve.largest, power_at_largest=at_largest,
        verdict=_verdict_name(1 if single else 2, 1 if single else 2), simulations=simulations,
    )


def plan_mde(
    tasks: int,
    trials: int,
    baseline_rate: float,
    within_variance: TrialVariance | float | None = None,
    *,
    candidate_trials: int | None = None,
    alpha: float = DEFAULT_ALPHA,
    power: float = DEFAULT_POWER,
    simulations: int = DEFAULT_SIMULATIONS,
    seed: int = 0,
) -> PlannedMDE:
    """The smallest improvement a design of `tasks` x `trials` (each model; `candidate_trials`
    for the new model when it differs) gets the verdict "improved" with probability `power`,
    found by simulating that verdict (module docstring)."""
    for name, value in (("tasks", tasks), ("trials", trials), ("candidate_trials", candidate_trials or 1),
                        ("simulations", simulations)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    new_trials = candidate_trials or trials
    return _simulated_mde([trials] * tasks, [new_trials] * tasks, baseline_rate, within_variance, alpha, power,
                          simulations, seed)


def design_mde(baseline_trials: Sequence[int], candidate_trials: Sequence[int], baseline_rate: float,
               within_variance: TrialVariance | float | None = None, *, alpha: float = DEFAULT_ALPHA,
               power: float = DEFAULT_POWER) -> PlannedMDE:
    """The MDE of a design that was run (paired.py): each paired task's sound trials in the
    baseline's run and the candidate's, simulated as `plan_mde` does."""
    if not baseline_trials or len(baseline_trials) != len(candidate_trials):
        raise ValueError("give each paired task's trials in both runs (two lists of the same length, not empty)")
    if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in (*baseline_trials, *candidate_trials)):
        raise ValueError("each task's trials must be a whole number >= 1")
    return _simulated_mde(list(baseline_trials), list(candidate_trials), baseline_rate, within_variance, alpha, power,
                          DEFAULT_SIMULATIONS, 0)
