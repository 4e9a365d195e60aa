"""The repeated-trial lines of a run's summary and reports: the headline rate as the mean of
per-task fractions with an interval that groups trials by task, both estimands' intervals, and
pass@k / pass^k for the run's K (estimates.py). Pure; needs SciPy (the `stats` extra) like the
rest of this package.

The run's K is the number of trials it asked for of every task (its configuration's `trials`),
never the most trials any one task got: the adaptive model-update design adds trials to some
tasks of a run, and a pass@8 over the one task it gave 8 trials says nothing about the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from adapters.results.trials.estimates import (
    DEFAULT_CONFIDENCE,
    PassAtK,
    SuiteRate,
    TaskTrials,
    group_trials,
    pass_at_k,
    pass_hat_k,
    suite_rate,
)


def has_repeated_trials(rows: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any row is a trial after the first (the run repeated tasks)."""
    return any(int(row.get("trial") or 1) > 1 for row in rows)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _interval(interval: tuple[float, float] | None) -> str:
    return "[-]" if interval is None else f"[{100 * interval[0]:.1f}%, {100 * interval[1]:.1f}%]"


def _pass_text(metric: PassAtK) -> str:
    label = metric.metric.replace("k", str(metric.k))
    if metric.value is None:
        return f"{label} - (no task has {metric.k} sound trials)"
    fewer = f", {metric.tasks_with_fewer_trials} task(s) with fewer sound trials left out" \
        if metric.tasks_with_fewer_trials else ""
    return f"{label} {_pct(metric.value)} {_interval(metric.interval)} over {metric.tasks} task(s){fewer}"


def run_trials(tasks: list[TaskTrials], configured: int | None) -> tuple[int, str]:
    """The run's K and where it comes from: `configured` (the run's configuration's `trials`)
    when known, else the fewest trials any task with a result got (each task was asked for at
    least that many)."""
    if configured is not None:
        if isinstance(configured, bool) or not isinstance(configured, int) or configured < 1:
            raise ValueError(f"the run's trials must be a whole number >= 1, got {configured!r}")
        return configured, "the run's configuration"
    return min((len(t.trials) for t in tasks), default=1), "the fewest any task got (no configuration given)"


class TrialStatistics(BaseModel):
    """A run's repeated-trial statistics: its K, the suite rate, pass@1, pass@K and pass^K."""

    k: int  # the trials the run asked for of every task
    k_source: str
    most_trials: int  # the most trials any task got (more than k: added to some tasks only)
    confidence: float
    rate: SuiteRate
    domains: dict[str, SuiteRate]  # the same per domain (tasks grouped by their domain)
    metrics: list[PassAtK]

    def headline(self) -> str:
        """The run's headline rate for a run with trials: the mean of per-task fractions with the
        tasks-like-these interval (trials grouped by task; a Wilson interval over every trial
        treats them as independent and covers about 79 % of the time)."""
        interval = self.rate.tasks_like_these.interval
        return (f"success rate (sound environment): {_pct(self.rate.rate)} {_interval(interval)} "
                f"over {self.rate.tasks} task(s) x K={self.k} trial(s) (mean of each task's success over its sound "
                f"trials; {100 * self.confidence:.0f} % interval for tasks like these, trials grouped by task)")

    def lines(self) -> list[str]:
        """Plain-text lines: the run's K and the trials counted, both estimands' intervals, pass@1,
        pass@K and pass^K."""
        rate = self.rate
        level = f"{100 * self.confidence:.0f} %"
        spread = f"{rate.min_trials}" if rate.min_trials == rate.max_trials else f"{rate.min_trials}-{rate.max_trials}"
        first = (f"trials: K = {self.k} per task ({self.k_source}); {rate.sound_trials} sound trial(s) over "
                 f"{rate.tasks} task(s) ({spread} per task)")
        if self.most_trials > self.k:
            first += (f"; some tasks got more trials than K (up to {self.most_trials}: trials added to chosen tasks, "
                      "e.g. by the adaptive model-update design): pass@k is for the run's K")
        if rate.tasks_without_sound_trial:
            first += f"; {len(rate.tasks_without_sound_trial)} task(s) without a sound trial"
        return [
            first,
            f"success rate over trials (mean of per-task fractions): {_pct(rate.rate)}   {level} intervals: "
            f"these tasks {_interval(rate.these_tasks.interval)}, tasks like these "
            f"{_interval(rate.tasks_like_these.interval)}",
            "   ".join(_pass_text(m) for m in self.metrics)
            + f"   ({level} intervals for tasks like these, Wilson with the tasks' spread, Poisson bounds near 0 and 1)",
        ]


def trial_statistics(rows: Iterable[Mapping[str, Any]], k: int | None = None,
                     confidence: float = DEFAULT_CONFIDENCE) -> TrialStatistics | None:
    """From a run's final attempt per (task, trial) (`latest_task_results` rows) and the run's K
    (its configuration's `trials`; None: inferred, see `run_trials`): the statistics, or None
    for a single-trial run (K = 1 and no task repeated), whose reports stay as they were."""
    rows = list(rows)
    if (k is None or k == 1) and not has_repeated_trials(rows):
        return None
    tasks = group_trials(rows)
    k, source = run_trials(tasks, k)
    metrics = [pass_at_k(tasks, 1, confidence)]
    if k > 1:
        metrics += [pass_at_k(tasks, k, confidence), pass_hat_k(tasks, k, confidence)]
    by_domain: dict[str, list[TaskTrials]] = {}
    for task in tasks:
        by_domain.setdefault(task.domain, []).append(task)
    return TrialStatistics(k=k, k_source=source, most_trials=max((len(t.trials) for t in tasks), default=0),
                           confidence=confidence, rate=suite_rate(tasks, confidence), metrics=metrics,
                           domains={d: suite_rate(members, confidence) for d, members in by_domain.items()})


def trial_section(rows: list[Mapping[str, Any]], k: int | None = None) -> TrialStatistics | str | None:
    """`trial_statistics` for a run with trials, None for a single-trial run; without SciPy, one
    line naming the `stats` extra (the run's results stand; only these statistics need it)."""
    from adapters.results.trials._scipy import StatsExtraMissing

    try:
        return trial_statistics(rows, k)
    except StatsExtraMissing as exc:
        return f"statistics not computed: {exc}"


def trial_lines(rows: list[Mapping[str, Any]], k: int | None = None) -> list[str] | None:
    """The lines of `trial_section` (one line without SciPy), None for a single-trial run."""
    section = trial_section(rows, k)
    if section is None or isinstance(section, str):
        return None if section is None else [section]
    return section.lines()
