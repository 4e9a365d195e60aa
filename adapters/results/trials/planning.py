"""How small a difference a design can detect: the minimum detectable effect (MDE) before a run
(`arena plan`) and of the design that was run (the comparisons).

    trial_variance(tasks)                 the trial-to-trial variance seen in earlier runs
    plan_mde(tasks, trials, baseline_rate, within_variance=None)
                                          the MDE of a tasks x trials comparison, 80 % power
    mde_from_standard_error(se)           (z_{1-alpha/2} + z_{power}) x se

The MDE is for the "these tasks" estimand (the benchmark's fixed tasks, docs/statistics.md): two
models each run `trials` times on each of `tasks` tasks, compared by the mean over tasks of the
per-task difference. Its standard error is sqrt((v_base / k_base + v_new / k_new) / T), where v is
the trial-to-trial variance, the mean over tasks of p_i(1 - p_i). Without earlier repeated trials
v is not known; the stated default is its upper bound at the baseline's rate, rate (1 - rate)
(every task a coin with the suite's success rate: the most trial noise a suite with that rate can
have), so the planned MDE is then conservative.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel

from adapters.results.trials._scipy import normal_quantile
from adapters.results.trials.estimates import TaskTrials, unbiased_trial_variance
from adapters.results.trials.flaky import TaskStability

DEFAULT_ALPHA = 0.05
DEFAULT_POWER = 0.8


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


class PlannedMDE(BaseModel):
    """The MDE of a planned comparison (these tasks), and what it assumed."""

    tasks: int
    baseline_trials: int
    candidate_trials: int
    baseline_rate: float
    within_variance: float
    variance_source: str  # "earlier runs (N tasks with repeated trials)" or the stated default
    alpha: float
    power: float
    standard_error: float
    mde: float

    def render(self) -> str:
        """What `arena plan` prints."""
        return (
            f"detectable difference: {100 * self.mde:.1f} points at {100 * self.power:.0f} % power, alpha "
            f"{self.alpha:g} ({self.tasks} tasks x {self.baseline_trials} baseline / {self.candidate_trials} "
            f"new trials, baseline rate {100 * self.baseline_rate:.1f} %, trial-to-trial variance "
            f"{self.within_variance:.3f} from {self.variance_source}; estimand: these tasks)"
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
) -> PlannedMDE:
    """The smallest difference a design of `tasks` x `trials` (each model; `candidate_trials`
    for the new model when it differs) detects at `power` (module docstring for the variance)."""
    for name, value in (("tasks", tasks), ("trials", trials), ("candidate_trials", candidate_trials or 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if not (isinstance(baseline_rate, (int, float)) and 0 <= baseline_rate <= 1):
        raise ValueError(f"baseline rate must be between 0 and 1, got {baseline_rate!r}")
    new_trials = candidate_trials or trials
    if isinstance(within_variance, TrialVariance):
        variance, source = within_variance.variance, f"earlier runs ({within_variance.tasks} tasks with repeated trials)"
    elif within_variance is not None:
        if not (0 <= within_variance <= 0.25):
            raise ValueError(f"trial-to-trial variance must be between 0 and 0.25, got {within_variance!r}")
        variance, source = float(within_variance), "the caller"
    else:
        variance = baseline_rate * (1 - baseline_rate)
        source = "the default rate x (1 - rate), its upper bound (no earlier repeated trials)"
    if variance == 0:
        # No trial-to-trial variation seen is no evidence of none: plan with the bound instead,
        # or with the largest variance a trial can have when the rate itself is 0 or 1.
        bound = baseline_rate * (1 - baseline_rate)
        if bound > 0:
            variance, source = bound, "the default rate x (1 - rate) (the earlier trials never varied)"
        else:
            variance, source = 0.25, "the maximum 0.25 (no variation and a rate of 0 or 1 give nothing to plan with)"
    se = math.sqrt((variance / trials + variance / new_trials) / tasks)
    return PlannedMDE(
        tasks=tasks, baseline_trials=trials, candidate_trials=new_trials, baseline_rate=float(baseline_rate),
        within_variance=variance, variance_source=source, alpha=alpha, power=power, standard_error=se,
        mde=mde_from_standard_error(se, alpha, power),
    )
