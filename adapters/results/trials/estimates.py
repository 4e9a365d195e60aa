"""One run with repeated trials: each task's success fraction, the suite's rate, pass@k and pass^k,
and intervals for two estimands.

    group_trials(rows)              per-attempt rows -> one TaskTrials per task (sound trials counted)
    suite_rate(tasks)               the suite's rate (mean over tasks) with both estimands' intervals
    pass_at_k(tasks, k)             at least one of k trials succeeds (Chen et al. 2021's estimator)
    pass_hat_k(tasks, k)            all k trials succeed (tau-bench's pass^k, Yao et al. 2024)

Rows are shaped like the `latest_task_results` view plus a `trial` number: task_id, trial,
outcome, success (task_fingerprint, domain, score and attempt are used when present). Only trials
whose environment was sound count (adapters/results/rates.py: an infrastructure error or a setup
failure says nothing about the agent); a task with no sound trial is listed, not counted.

The suite's rate is the mean of the per-task success fractions, so every task weighs the same
however many sound trials it got. Two estimands (docs/statistics.md):

- "these tasks" (`these_tasks`): the mean success probability over exactly these tasks. Only the
  trial-to-trial variation counts: Var = sum_i p_i(1 - p_i) / n_i / T^2, estimated per task with
  the unbiased s(n - s) / (n(n - 1)) when it has two sound trials or more; tasks with one sound
  trial get the binomial bound of their group's mean (the mean of p(1 - p) is at most
  p_bar(1 - p_bar)), so with one trial per task this is exactly the Wilson interval of the
  single-trial reports.
- "tasks like these" (`tasks_like_these`): the mean over a population of tasks this suite is a
  sample of. The tasks are the units: Var = the sample variance of the per-task fractions / T.

Both intervals are Wilson score intervals with the effective number of trials
n_eff = rate (1 - rate) / Var (Korn & Graubard 1998; Dean & Pagano 2015 for clustered data),
shrunk by (z / t_df)^2 for the degrees of freedom of the variance estimate (Korn & Graubard's
adjustment; Satterthwaite's df for these tasks, T - 1 for tasks like these).
When the trials show no variation at all (every task always succeeded or always failed) the
variance estimate is 0, which more trials could contradict: n_eff is then the sound trials
(these tasks) or the tasks (tasks like these), as if each were one independent draw.

Intervals over tasks (tasks like these: the rate, pass@k and pass^k) keep their coverage near 0
and 1 with Brown, Cai & DasGupta's (2001) modified Wilson interval: when the effective count of
successes x = rate x n_eff is 1-2 (n_eff <= 50) or 1-3 (larger n_eff), the lower bound is the
exact Poisson one, chi2_{2x}(alpha / 2) / (2 n_eff), where Wilson's is too high (and the same for
failures at the upper bound). A per-task pass^k is mostly 0 on a hard suite: a t interval over
tasks then collapses to [0, 0] or misses the truth most of the time; this one covers it at least
92 % of the time in simulation (tests/results/test_pass_k_coverage.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from adapters.results.attempts import keep_final_attempt
from adapters.results.rates import is_sound
from adapters.results.stats import Interval, wilson_interval_effective
from adapters.results.trials._scipy import normal_quantile, scipy_stats, t_quantile

Estimand = Literal["these_tasks", "tasks_like_these"]
ESTIMANDS: tuple[Estimand, ...] = ("these_tasks", "tasks_like_these")
ESTIMAND_TEXT: dict[str, str] = {
    "these_tasks": "these fixed tasks (trial-to-trial variation only)",
    "tasks_like_these": "tasks like these (the tasks as a sample: between-task variation)",
}
DEFAULT_CONFIDENCE = 0.95
_REQUIRED = ("task_id", "trial", "outcome", "success")


class TrialRowError(ValueError):
    """A result row is malformed; the message names the row and what is wrong."""


class TaskTrials(BaseModel):
    """One task's trials in one run (each trial's final attempt)."""

    task_id: str
    fingerprint: str | None = None
    domain: str = ""
    trials: list[int]  # trial numbers, ascending
    outcomes: list[str]  # each trial's final outcome, in the order of `trials`
    successes: list[bool]  # each trial's success, in the order of `trials`

    @property
    def key(self) -> tuple[str, str | None]:
        """What pairs a task across runs: its id and its definition's fingerprint."""
        return self.task_id, self.fingerprint

    @property
    def sound(self) -> int:
        """Trials whose environment was sound (the ones that count)."""
        return sum(is_sound(o) for o in self.outcomes)

    @property
    def sound_successes(self) -> int:
        return sum(s for s, o in zip(self.successes, self.outcomes) if is_sound(o))

    @property
    def fraction(self) -> float | None:
        """Successes over sound trials; None when no trial was sound."""
        return self.sound_successes / self.sound if self.sound else None


def _int(value: Any, what: str) -> int:
    """`value` as an int (an integral float or numpy integer too), or a TrialRowError."""
    try:
        number = int(value)
        ok = not isinstance(value, (bool, str)) and number == value
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise TrialRowError(f"{what} must be a whole number, got {value!r}")
    return number


def group_trials(rows: Iterable[Mapping[str, Any]], run_id: str = "") -> list[TaskTrials]:
    """Each task's trials, sorted by task id (and fingerprint), from per-trial rows.

    A (task, trial) given more than once keeps the row with the highest `attempt` (every copy
    needs one); rows of one task id with different fingerprints are different tasks.
    """
    label = f" of run {run_id!r}" if run_id else ""
    chosen: dict[tuple[str, str | None, int], Mapping[str, Any]] = {}
    for index, row in enumerate(rows):
        where = f"result row #{index + 1}{label}"
        missing = [key for key in _REQUIRED if key not in row]
        if missing:
            raise TrialRowError(f"{where} lacks {', '.join(missing)}; rows need {', '.join(_REQUIRED)}")
        trial = _int(row["trial"], f"{where}: trial")
        if trial < 0:
            raise TrialRowError(f"{where}: trial must be >= 0, got {trial}")
        fingerprint = row.get("task_fingerprint") or None
        key = (str(row["task_id"]), None if fingerprint is None else str(fingerprint), trial)
        if row.get("attempt") is not None:
            _int(row["attempt"], f"{where}: attempt")
        keep_final_attempt(chosen, key, row, lambda where=where, key=key: TrialRowError(
            f"{where}: task {key[0]!r} trial {key[2]} appears more than once without distinct attempt "
            "numbers; pass each trial's final attempt, or rows with `attempt`"
        ))
    tasks: dict[tuple[str, str | None], TaskTrials] = {}
    for (task_id, fingerprint, trial), row in sorted(chosen.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2])):
        task = tasks.setdefault(
            (task_id, fingerprint),
            TaskTrials(task_id=task_id, fingerprint=fingerprint, domain=str(row.get("domain") or ""),
                       trials=[], outcomes=[], successes=[]),
        )
        task.trials.append(trial)
        task.outcomes.append(str(row["outcome"]))
        task.successes.append(bool(row["success"]))
    return list(tasks.values())


def unbiased_trial_variance(successes: int, trials: int) -> float:
    """An unbiased estimate of p(1 - p) from `successes` of `trials` (>= 2) Bernoulli trials."""
    if trials < 2:
        raise ValueError(f"the trial-to-trial variance needs 2 trials or more, got {trials}")
    return successes * (trials - successes) / (trials * (trials - 1))


class EstimandInterval(BaseModel):
    """A rate's interval for one estimand."""

    estimand: Estimand
    interval: Interval | None  # None when no task has a sound trial
    standard_error: float | None
    effective_trials: float | None  # the Wilson interval's n_eff
    degrees_of_freedom: float | None = None  # of the variance estimate (None: not estimated)
    method: str


class SuiteRate(BaseModel):
    """A suite's success rate over repeated trials: the mean of the per-task fractions."""

    confidence: float
    tasks: int  # tasks with at least one sound trial
    tasks_without_sound_trial: list[str]
    trials: int  # every trial of the counted tasks
    sound_trials: int
    successes: int  # over sound trials
    min_trials: int  # sound trials per counted task
    max_trials: int
    rate: float | None
    these_tasks: EstimandInterval
    tasks_like_these: EstimandInterval

    def interval(self, estimand: Estimand) -> EstimandInterval:
        """The interval for an estimand by name."""
        return self.these_tasks if estimand == "these_tasks" else self.tasks_like_these


def _check_confidence(confidence: float) -> float:
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ValueError(f"confidence must be between 0 and 1 (exclusive), got {confidence!r}")
    return float(confidence)


def these_tasks_variance(counts: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """Var of the mean of per-task fractions over fixed tasks, from (successes, sound trials)
    per task (each with trials >= 1), and its Satterthwaite degrees of freedom (infinite for
    the single-trial bound, which is not estimated): see the module docstring."""
    components: list[tuple[float, float]] = []
    singles: list[int] = []
    for successes, trials in counts:
        if trials >= 2:
            components.append((unbiased_trial_variance(successes, trials) / trials, trials - 1))
        else:
            singles.append(successes)
    if singles:
        # The mean of p(1 - p) over these tasks is at most p_bar(1 - p_bar) (Jensen).
        p_bar = sum(singles) / len(singles)
        components.append((len(singles) * p_bar * (1 - p_bar), math.inf))
    total = sum(c for c, _ in components)
    estimated = sum(c * c / df for c, df in components if c > 0)
    df = total**2 / estimated if estimated > 0 else math.inf
    return total / len(counts) ** 2, df


def _wilson_estimand(estimand: Estimand, rate: float, variance: float, df: float, fallback_n: float,
                     confidence: float, method: str, extremes: bool = False) -> EstimandInterval:
    """Wilson with n_eff (module docstring); `extremes`: with the modified bounds near 0 and 1."""
    z = normal_quantile(1 - (1 - confidence) / 2)
    if variance > 0 and 0 < rate < 1:
        n_eff = rate * (1 - rate) / variance
        if math.isfinite(df):
            # The variance is estimated with df degrees of freedom: shrink n_eff by (z / t_df)^2,
            # Korn & Graubard's degrees-of-freedom adjustment.
            n_eff *= (z / t_quantile(1 - (1 - confidence) / 2, df)) ** 2
    else:
        n_eff = fallback_n
    interval = wilson_interval_effective(rate, n_eff, z)
    if extremes:
        interval = _poisson_bounds(interval, rate, n_eff, confidence)
    return EstimandInterval(
        estimand=estimand,
        interval=interval,
        standard_error=math.sqrt(variance),
        effective_trials=n_eff,
        degrees_of_freedom=None if math.isinf(df) else df,
        method=method + (" (Brown-Cai-DasGupta's Poisson bound near 0 and 1)" if extremes else ""),
    )


def _poisson_bounds(interval: Interval, rate: float, n_eff: float, confidence: float) -> Interval:
    """Brown, Cai & DasGupta's (2001, Statist. Sci. 16(2) 101-133) modified Wilson interval: with
    an effective count of 1-2 successes (n_eff <= 50; 1-3 above) Wilson's lower bound is too high,
    and the exact Poisson bound replaces it; the same for failures at the upper bound."""
    low, high = interval
    largest = 2 if n_eff <= 50 else 3
    chi2 = scipy_stats().chi2
    successes, failures = rate * n_eff, (1 - rate) * n_eff
    if 0 < successes <= largest:
        low = min(low, float(chi2.ppf((1 - confidence) / 2, 2 * successes)) / (2 * n_eff))
    if 0 < failures <= largest:
        high = max(high, 1 - float(chi2.ppf((1 - confidence) / 2, 2 * failures)) / (2 * n_eff))
    return low, high


def tasks_like_these(values: Sequence[float], confidence: float = DEFAULT_CONFIDENCE,
                     method: str = "Wilson with n_eff from the between-task variance") -> EstimandInterval:
    """The interval of the mean of per-task values in [0, 1] (success fractions, pass@k or pass^k
    estimates) for tasks like these: the tasks a sample, the sample variance of the values over
    T - 1 degrees of freedom, Wilson with that n_eff and the Poisson bounds near 0 and 1 (module
    docstring); one task each when the values never differ. No interval for fewer than 2 tasks."""
    size = len(values)
    if size < 2:
        return EstimandInterval(estimand="tasks_like_these", interval=None, standard_error=None,
                                effective_trials=None, method="needs two tasks or more")
    mean = sum(values) / size
    variance = sum((v - mean) ** 2 for v in values) / (size * (size - 1))
    return _wilson_estimand("tasks_like_these", min(1.0, max(0.0, mean)), variance, size - 1, size, confidence,
                            method, extremes=True)


def suite_rate(tasks: Sequence[TaskTrials], confidence: float = DEFAULT_CONFIDENCE) -> SuiteRate:
    """The suite's rate as the mean over tasks of their success fractions, with intervals for
    both estimands (module docstring). With one sound trial per task both intervals are the
    Wilson interval of successes over tasks (the tasks-like-these one over T - 1 tasks' worth)."""
    confidence = _check_confidence(confidence)
    counted = [t for t in tasks if t.sound]
    counts = [(t.sound_successes, t.sound) for t in counted]
    base: dict[str, Any] = {
        "confidence": confidence,
        "tasks": len(counted),
        "tasks_without_sound_trial": sorted(t.task_id for t in tasks if not t.sound),
        "trials": sum(len(t.trials) for t in counted),
        "sound_trials": sum(n for _, n in counts),
        "successes": sum(s for s, _ in counts),
        "min_trials": min((n for _, n in counts), default=0),
        "max_trials": max((n for _, n in counts), default=0),
    }
    if not counted:
        empty = {"interval": None, "standard_error": None, "effective_trials": None, "method": "no sound trial"}
        return SuiteRate(**base, rate=None,
                         these_tasks=EstimandInterval(estimand="these_tasks", **empty),
                         tasks_like_these=EstimandInterval(estimand="tasks_like_these", **empty))
    fractions = [s / n for s, n in counts]
    size = len(fractions)
    rate = sum(fractions) / size
    variance, df = these_tasks_variance(counts)
    fixed = _wilson_estimand(
        "these_tasks", rate, variance, df, base["sound_trials"], confidence,
        "Wilson with n_eff from the within-task (trial-to-trial) variance",
    )
    if size > 1:
        population = tasks_like_these(fractions, confidence,
                                      "Wilson with n_eff from the between-task variance of the per-task fractions")
    else:  # one task: nothing to estimate the spread of tasks from; one draw's worth
        population = _wilson_estimand("tasks_like_these", rate, 0.0, math.inf, 1, confidence,
                                      "Wilson over one task (no between-task variance to estimate)")
    return SuiteRate(**base, rate=rate, these_tasks=fixed, tasks_like_these=population)


class PassAtK(BaseModel):
    """pass@k or pass^k over the tasks with at least k sound trials."""

    metric: Literal["pass@k", "pass^k"]
    k: int
    tasks: int  # tasks with >= k sound trials (the others are not counted)
    tasks_with_fewer_trials: int
    value: float | None  # mean over those tasks
    # Tasks like these: Wilson with n_eff from the spread of the per-task estimates and the
    # Poisson bounds near 0 and 1 (`tasks_like_these`; None with fewer than 2 tasks).
    interval: Interval | None
    estimator: str
    interval_method: str = ""


def _pass_metric(tasks: Sequence[TaskTrials], k: int, confidence: float, metric: Literal["pass@k", "pass^k"]) -> PassAtK:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a whole number >= 1, got {k!r}")
    confidence = _check_confidence(confidence)
    counted = [t for t in tasks if t.sound >= k]
    values = []
    for t in counted:
        n, c = t.sound, t.sound_successes
        if metric == "pass@k":
            values.append(1.0 - math.comb(n - c, k) / math.comb(n, k))
        else:
            values.append(math.comb(c, k) / math.comb(n, k))
    estimator = (
        "unbiased pass@k: 1 - C(n - c, k) / C(n, k) per task (Chen et al. 2021)" if metric == "pass@k"
        else "unbiased pass^k: C(c, k) / C(n, k) per task (Yao et al. 2024, tau-bench)"
    )
    value = sum(values) / len(values) if values else None
    spread = tasks_like_these(values, confidence, "tasks like these: Wilson with n_eff from the per-task estimates")
    return PassAtK(metric=metric, k=k, tasks=len(counted), tasks_with_fewer_trials=sum(1 for t in tasks if t.sound < k),
                   value=value, interval=spread.interval, estimator=estimator, interval_method=spread.method)


def pass_at_k(tasks: Sequence[TaskTrials], k: int, confidence: float = DEFAULT_CONFIDENCE) -> PassAtK:
    """pass@k: the probability that at least one of k trials succeeds, averaged over tasks.

    Per task the unbiased estimator from its n >= k sound trials with c successes,
    1 - C(n - c, k) / C(n, k) (Chen et al. 2021, "Evaluating Large Language Models Trained on
    Code"); tasks with fewer than k sound trials are not counted (and counted as such).
    """
    return _pass_metric(tasks, k, confidence, "pass@k")


def pass_hat_k(tasks: Sequence[TaskTrials], k: int, confidence: float = DEFAULT_CONFIDENCE) -> PassAtK:
    """pass^k: the probability that all k trials succeed (the reliability a deployment needs).

    Per task the unbiased estimator of p^k from n >= k sound trials with c successes,
    C(c, k) / C(n, k) (Yao et al. 2024, "tau-bench"); tasks with fewer than k sound trials are
    not counted.
    """
    return _pass_metric(tasks, k, confidence, "pass^k")
