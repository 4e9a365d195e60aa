"""Two runs with repeated trials, compared task by task.

    compare_trials(baseline_tasks, candidate_tasks)        from `group_trials` of each run
    compare_trial_rows(baseline_rows, candidate_rows)      from per-trial rows
    render_trial_comparison(comparison)                     plain text

Tasks are paired by task id and task fingerprint (a task whose definition changed between the
runs is two tasks, listed apart; rows without a fingerprint pair by id, as in
adapters/results/compare.py). A paired task needs at least one sound trial in each run; the
others are listed apart. For each paired task d_i = (candidate's success fraction) - (baseline's);
the difference is their mean over the T paired tasks, so every task weighs the same however many
trials it got.

these tasks (the default verdict's estimand: "is it better on this benchmark's tasks"):
    Var = sum_i var_i / T^2 with var_i = u_base / n_base + u_new / n_new (u the unbiased
    trial-to-trial variance) when both runs have two sound trials or more of task i, else the
    pooled u of the task's trials of both runs times (1 / n_base + 1 / n_new) (exact when the
    task's two success probabilities are equal, larger otherwise). Interval: Student's t with
    Satterthwaite's degrees of freedom for that sum of estimated variances.
    Test: a stratified permutation z test of "each task's trials are exchangeable between the
    two runs": its variance is each task's exact permutation variance
    S(m - S) / ((m - 1) n_base n_new) (m trials, S successes of both runs), so it is valid with
    any number of trials per task and per run, and with one trial each it is McNemar's test.
    When every paired task has exactly one sound trial in each run, the interval is Newcombe's
    paired interval and the test the exact McNemar test, the same answers as compare.py gives.
tasks like these (the tasks as a sample of a population):
    the paired t interval and one-sample t test on the d_i (scipy.stats.ttest_1samp).

The minimum detectable effect (80 % power, alpha 0.05) of the design that was run comes with
each estimand: for these tasks simulated for the verdict above as `arena plan` does
(planning.design_mde, from each paired task's trials, the baseline's rate and trial-to-trial
variance; `TrialComparison.detectable_difference`, computed when shown), since the textbook
(z_{1-alpha/2} + z_power) x SE promises more power than that verdict has; for tasks like these the
t-test formula.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr

from adapters.results.stats import Interval, mcnemar_exact, paired_difference_interval
from adapters.results.trials._scipy import normal_quantile, scipy_stats, t_quantile
from adapters.results.trials.estimates import (
    DEFAULT_CONFIDENCE,
    ESTIMAND_TEXT,
    Estimand,
    TaskTrials,
    group_trials,
    unbiased_trial_variance,
)
from adapters.results.trials.planning import DEFAULT_POWER, PlannedMDE, TrialVariance, design_mde

Verdict = Literal["improved", "regressed", "no significant difference", "insufficient data", "not tested"]
ADAPTIVE_NOTE = (
    "trials collected by the adaptive design: described, not tested (a fixed-sample test or interval does not hold "
    "on trials chosen by what earlier trials showed; the design's anytime-valid interval is the verdict's basis)"
)


class PairedTask(BaseModel):
    """One task both runs have, with a sound trial in each."""

    task_id: str
    fingerprint: str | None
    domain: str
    baseline_successes: int
    baseline_trials: int  # sound trials
    candidate_successes: int
    candidate_trials: int

    @property
    def difference(self) -> float:
        return self.candidate_successes / self.candidate_trials - self.baseline_successes / self.baseline_trials


class UnpairedTask(BaseModel):
    """A task id both runs have that is not compared, and why."""

    task_id: str
    domain: str
    reason: str


class DifferenceEstimate(BaseModel):
    """The difference's interval, test and MDE for one estimand."""

    estimand: Estimand
    interval: Interval | None
    standard_error: float | None
    interval_method: str
    test_method: str
    statistic: float | None
    p_value: float | None
    mde: float | None  # at `power`, two-sided `alpha`
    mde_note: str = ""


class TrialComparison(BaseModel):
    """Candidate vs baseline over repeated trials; `verdict` is for `estimand`."""

    confidence: float
    alpha: float
    power: float
    estimand: Estimand
    paired: list[PairedTask]
    unpaired: list[UnpairedTask] = Field(default_factory=list)
    only_in_baseline: list[str] = Field(default_factory=list)
    only_in_candidate: list[str] = Field(default_factory=list)
    single_trial: bool  # every paired task has one sound trial in each run
    baseline_rate: float | None  # mean over paired tasks
    candidate_rate: float | None
    difference: float | None  # candidate minus baseline
    these_tasks: DifferenceEstimate
    tasks_like_these: DifferenceEstimate
    # False once `descriptive()`: the trials were collected adaptively, so no fixed-sample test,
    # interval or detectable difference is given for them.
    tested: bool = True
    _detectable: PlannedMDE | None = PrivateAttr(default=None)

    def detectable_difference(self) -> PlannedMDE | None:
        """These tasks: the smallest improvement the verdict of this design (each paired task's
        sound trials in both runs) detects with `power`, simulated as `arena plan` does from the
        baseline's rate and trial-to-trial variance; None without paired tasks or when not tested.
        Computed when first asked (about 0.5 s for 154 tasks), then kept."""
        if not self.tested or not self.paired or self.baseline_rate is None:
            return None
        if self._detectable is None:
            repeated = [unbiased_trial_variance(t.baseline_successes, t.baseline_trials)
                        for t in self.paired if t.baseline_trials >= 2]
            variance = TrialVariance(variance=sum(repeated) / len(repeated), tasks=len(repeated)) if repeated else None
            self._detectable = design_mde([t.baseline_trials for t in self.paired],
                                          [t.candidate_trials for t in self.paired], self.baseline_rate, variance,
                                          alpha=self.alpha, power=self.power)
        return self._detectable

    def descriptive(self) -> TrialComparison:
        """This comparison without its tests, intervals and detectable differences: for trials an
        adaptive design chose (flows/baselines.py), whose verdict is the design's own."""
        blank = {"interval": None, "standard_error": None, "statistic": None, "p_value": None, "mde": None,
                 "interval_method": "not applied", "test_method": "not applied", "mde_note": ADAPTIVE_NOTE}
        return self.model_copy(update={"tested": False,
                                       "these_tasks": self.these_tasks.model_copy(update=blank),
                                       "tasks_like_these": self.tasks_like_these.model_copy(update=blank)})

    def estimate(self, estimand: Estimand | None = None) -> DifferenceEstimate:
        """The estimate for an estimand (default: the verdict's)."""
        return self.these_tasks if (estimand or self.estimand) == "these_tasks" else self.tasks_like_these

    @property
    def verdict(self) -> Verdict:
        """improved / regressed when the verdict estimand's test gives p < alpha; "not tested" for
        a descriptive comparison (`descriptive`)."""
        chosen = self.estimate()
        if not self.tested:
            return "not tested"
        if not self.paired or chosen.p_value is None:
            return "insufficient data"
        if chosen.p_value >= self.alpha or not self.difference:
            return "no significant difference"
        return "improved" if self.difference > 0 else "regressed"


def _pts(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.1f}"


def render_trial_comparison(comparison: TrialComparison) -> str:
    """The comparison as plain text: the verdict, then each estimand's interval, test and MDE."""
    c = comparison
    chosen = c.estimate()
    trials = "one trial per task and run" if c.single_trial else (
        f"{sum(t.baseline_trials for t in c.paired)} baseline / {sum(t.candidate_trials for t in c.paired)} "
        "candidate sound trials")
    if not c.tested:
        lines = [ADAPTIVE_NOTE,
                 f"paired tasks: {len(c.paired)} ({trials}); not compared: {len(c.unpaired)}; only in the baseline: "
                 f"{len(c.only_in_baseline)}; only in the candidate: {len(c.only_in_candidate)}"]
        if c.difference is not None:
            lines.append(f"success (mean over tasks): baseline {100 * (c.baseline_rate or 0):.1f} %, candidate "
                         f"{100 * (c.candidate_rate or 0):.1f} %, difference {_pts(c.difference)} points")
        return "\n".join(lines) + "\n"
    lines = [
        f"verdict: {c.verdict} ({ESTIMAND_TEXT[c.estimand]}; {chosen.test_method}, p = "
        f"{'n/a' if chosen.p_value is None else f'{chosen.p_value:.3g}'}, alpha {c.alpha:g})",
        f"paired tasks: {len(c.paired)} ({trials}); not compared: {len(c.unpaired)}; only in the baseline: "
        f"{len(c.only_in_baseline)}; only in the candidate: {len(c.only_in_candidate)}",
    ]
    if c.difference is not None:
        lines.append(f"success (mean over tasks): baseline {100 * (c.baseline_rate or 0):.1f} %, candidate "
                     f"{100 * (c.candidate_rate or 0):.1f} %, difference {_pts(c.difference)} points")
    for estimate in (c.these_tasks, c.tasks_like_these):
        interval = "n/a" if estimate.interval is None else f"[{_pts(estimate.interval[0])}, {_pts(estimate.interval[1])}]"
        mde = f"{100 * estimate.mde:.1f} points" if estimate.mde is not None else f"n/a ({estimate.mde_note})"
        if estimate.estimand == "these_tasks":
            planned = c.detectable_difference()
            mde = "n/a" if planned is None else (
                f"{100 * planned.mde:.1f} points (simulated for this verdict, as arena plan does)" if planned.mde
                is not None else f"none up to {100 * planned.largest:.1f} points (simulated for this verdict)")
        lines.append(f"  {ESTIMAND_TEXT[estimate.estimand]}: {100 * c.confidence:.0f} % interval {interval} points "
                     f"({estimate.interval_method}); detectable difference at {100 * c.power:.0f} % power: {mde}")
    return "\n".join(lines) + "\n"


def _pair(baseline: Sequence[TaskTrials], candidate: Sequence[TaskTrials]) -> tuple[
    list[tuple[TaskTrials, TaskTrials]], list[UnpairedTask], list[str], list[str]
]:
    by_id: dict[str, tuple[list[TaskTrials], list[TaskTrials]]] = {}
    for side, tasks in enumerate((baseline, candidate)):
        for task in tasks:
            by_id.setdefault(task.task_id, ([], []))[side].append(task)
    pairs: list[tuple[TaskTrials, TaskTrials]] = []
    unpaired: list[UnpairedTask] = []
    only_base: list[str] = []
    only_new: list[str] = []
    for task_id in sorted(by_id):
        bases, news = by_id[task_id]
        if not news:
            only_base.append(task_id)
            continue
        if not bases:
            only_new.append(task_id)
            continue
        for b in bases:
            match = next((n for n in news if not b.fingerprint or not n.fingerprint or n.fingerprint == b.fingerprint), None)
            if match is None:
                unpaired.append(UnpairedTask(
                    task_id=task_id, domain=b.domain or news[0].domain,
                    reason=f"different task versions (fingerprint {b.fingerprint} -> {news[0].fingerprint})",
                ))
                continue
            news = [n for n in news if n is not match]
            if not b.sound or not match.sound:
                side = "either run" if not b.sound and not match.sound else ("the baseline" if not b.sound else "the candidate")
                unpaired.append(UnpairedTask(task_id=task_id, domain=match.domain or b.domain,
                                             reason=f"no trial with a sound environment in {side}"))
                continue
            pairs.append((b, match))
    return pairs, unpaired, only_base, only_new


def _variance_components(task: PairedTask) -> list[tuple[float, int]]:
    """The task's difference's variance for the these-tasks interval (module docstring), as
    (component, its degrees of freedom) for Satterthwaite's approximation."""
    nb, nc = task.baseline_trials, task.candidate_trials
    if nb >= 2 and nc >= 2:
        return [(unbiased_trial_variance(task.baseline_successes, nb) / nb, nb - 1),
                (unbiased_trial_variance(task.candidate_successes, nc) / nc, nc - 1)]
    return [(pooled_variance(task) * (1 / nb + 1 / nc), nb + nc - 1)]


def _task_variance(task: PairedTask) -> float:
    return sum(c for c, _ in _variance_components(task))


def satterthwaite_df(components: Iterable[tuple[float, int]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of independent variance estimates
    (Satterthwaite 1946): (sum c)^2 / sum(c^2 / df); infinite when the sum is 0."""
    pairs = [(c, df) for c, df in components if c > 0]
    if not pairs:
        return math.inf
    return sum(c for c, _ in pairs) ** 2 / sum(c * c / df for c, df in pairs)


def pooled_variance(task: PairedTask) -> float:
    """The unbiased p(1 - p) of the task's trials of both runs taken together."""
    return unbiased_trial_variance(task.baseline_successes + task.candidate_successes,
                                   task.baseline_trials + task.candidate_trials)


def _permutation_variance(task: PairedTask) -> float:
    """Var of the task's difference when its trials' run labels are shuffled (the test's null)."""
    m = task.baseline_trials + task.candidate_trials
    s = task.baseline_successes + task.candidate_successes
    return s * (m - s) / ((m - 1) * task.baseline_trials * task.candidate_trials)


def _these_tasks(tasks: list[PairedTask], difference: float, confidence: float, single_trial: bool
                 ) -> DifferenceEstimate:
    z = normal_quantile(1 - (1 - confidence) / 2)
    size = len(tasks)
    variance = sum(_task_variance(t) for t in tasks) / size**2
    se = math.sqrt(variance)
    # Simulated for this verdict when shown (module docstring): the textbook formula overstates its power.
    mde: float | None = None
    note = "simulated when shown: TrialComparison.detectable_difference()"
    if single_trial:
        fixed = sum(1 for t in tasks if t.candidate_successes and not t.baseline_successes)
        broken = sum(1 for t in tasks if t.baseline_successes and not t.candidate_successes)
        both = sum(1 for t in tasks if t.baseline_successes and t.candidate_successes)
        # Newcombe's first proportion is the candidate's: the difference is candidate - baseline.
        interval = paired_difference_interval(both, fixed, broken, size - both - fixed - broken, z)
        return DifferenceEstimate(
            estimand="these_tasks", interval=interval, standard_error=se,
            interval_method="Newcombe's paired interval (one trial per task and run)",
            test_method="exact McNemar (one trial per task and run)",
            statistic=float(fixed - broken), p_value=mcnemar_exact(broken, fixed), mde=mde, mde_note=note,
        )
    # The interval's quantile: Student's t with Satterthwaite's degrees of freedom, since the
    # variance is estimated from few trials per task (a normal quantile covers ~94 % at 60
    # tasks x 3 trials in simulation).
    df = satterthwaite_df(c for t in tasks for c in _variance_components(t))
    quantile = z if math.isinf(df) else t_quantile(1 - (1 - confidence) / 2, df)
    null_variance = sum(_permutation_variance(t) for t in tasks)
    total = sum(t.difference for t in tasks)
    if null_variance > 0:
        statistic = total / math.sqrt(null_variance)
        p_value = float(min(1.0, 2 * scipy_stats().norm.sf(abs(statistic))))
    else:  # no task's trials varied at all: every label shuffle gives the same difference, 0
        statistic, p_value = 0.0, 1.0
    return DifferenceEstimate(
        estimand="these_tasks",
        interval=(max(-1.0, difference - quantile * se), min(1.0, difference + quantile * se)),
        standard_error=se,
        interval_method=f"t with Satterthwaite's {df:.0f} degrees of freedom, within-task (trial-to-trial) variance",
        test_method="stratified permutation z test (trials exchangeable between runs within each task)",
        statistic=statistic, p_value=p_value, mde=mde, mde_note=note,
    )


def _tasks_like_these(tasks: list[PairedTask], difference: float, confidence: float, alpha: float,
                      power: float) -> DifferenceEstimate:
    size = len(tasks)
    base = {"estimand": "tasks_like_these", "interval_method": "paired t over tasks",
            "test_method": "one-sample t test on the per-task differences (scipy.stats.ttest_1samp)"}
    if size < 2:
        return DifferenceEstimate(**base, interval=None, standard_error=None, statistic=None, p_value=None, mde=None,
                                  mde_note="needs two paired tasks or more")
    diffs = [t.difference for t in tasks]
    sd = math.sqrt(sum((d - difference) ** 2 for d in diffs) / (size - 1))
    se = sd / math.sqrt(size)
    if se == 0:
        # Every task moved by the same amount: no spread to test against.
        p_value, statistic = (1.0, 0.0) if difference == 0 else (0.0, math.copysign(math.inf, difference))
        return DifferenceEstimate(**base, interval=(difference, difference), standard_error=0.0, statistic=statistic,
                                  p_value=p_value, mde=None, mde_note="every task's difference is the same")
    result = scipy_stats().ttest_1samp(diffs, 0.0)
    half = t_quantile(1 - (1 - confidence) / 2, size - 1) * se
    mde = (t_quantile(1 - alpha / 2, size - 1) + t_quantile(power, size - 1)) * se
    return DifferenceEstimate(**base, interval=(max(-1.0, difference - half), min(1.0, difference + half)),
                              standard_error=se, statistic=float(result.statistic), p_value=float(result.pvalue),
                              mde=mde)


def compare_trials(
    baseline: Sequence[TaskTrials],
    candidate: Sequence[TaskTrials],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    alpha: float | None = None,
    power: float = DEFAULT_POWER,
    estimand: Estimand = "these_tasks",
) -> TrialComparison:
    """Compare two runs' repeated trials task by task (module docstring); the verdict is for
    `estimand` at level `alpha` (default 1 - confidence)."""
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ValueError(f"confidence must be between 0 and 1 (exclusive), got {confidence!r}")
    alpha = 1 - confidence if alpha is None else alpha
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ValueError(f"alpha must be between 0 and 1 (exclusive), got {alpha!r}")
    if estimand not in ("these_tasks", "tasks_like_these"):
        raise ValueError(f"estimand must be 'these_tasks' or 'tasks_like_these', got {estimand!r}")
    pairs, unpaired, only_base, only_new = _pair(baseline, candidate)
    tasks = [
        PairedTask(task_id=b.task_id, fingerprint=b.fingerprint or c.fingerprint, domain=c.domain or b.domain,
                   baseline_successes=b.sound_successes, baseline_trials=b.sound,
                   candidate_successes=c.sound_successes, candidate_trials=c.sound)
        for b, c in pairs
    ]
    single = bool(tasks) and all(t.baseline_trials == 1 and t.candidate_trials == 1 for t in tasks)
    common: dict[str, Any] = {
        "confidence": confidence, "alpha": alpha, "power": power, "estimand": estimand, "paired": tasks,
        "unpaired": unpaired, "only_in_baseline": only_base, "only_in_candidate": only_new, "single_trial": single,
    }
    if not tasks:
        empty = {"interval": None, "standard_error": None, "interval_method": "no paired task",
                 "test_method": "no paired task", "statistic": None, "p_value": None, "mde": None}
        return TrialComparison(**common, baseline_rate=None, candidate_rate=None, difference=None,
                               these_tasks=DifferenceEstimate(estimand="these_tasks", **empty),
                               tasks_like_these=DifferenceEstimate(estimand="tasks_like_these", **empty))
    size = len(tasks)
    base_rate = sum(t.baseline_successes / t.baseline_trials for t in tasks) / size
    new_rate = sum(t.candidate_successes / t.candidate_trials for t in tasks) / size
    difference = sum(t.difference for t in tasks) / size
    return TrialComparison(
        **common, baseline_rate=base_rate, candidate_rate=new_rate, difference=difference,
        these_tasks=_these_tasks(tasks, difference, confidence, single),
        tasks_like_these=_tasks_like_these(tasks, difference, confidence, alpha, power),
    )


def compare_trial_rows(
    baseline_rows: Iterable[Mapping[str, Any]],
    candidate_rows: Iterable[Mapping[str, Any]],
    **options: Any,
) -> TrialComparison:
    """`compare_trials` from per-trial rows of each run (see estimates.group_trials)."""
    return compare_trials(group_trials(baseline_rows, "baseline"), group_trials(candidate_rows, "candidate"), **options)
