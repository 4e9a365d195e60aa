"""The repeated-trial lines of a run's summary: the suite rate as the mean of per-task fractions
with both estimands' intervals, and pass@k / pass^k (estimates.py). Pure; needs SciPy (the
`stats` extra) like the rest of this package."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from adapters.results.trials.estimates import (
    DEFAULT_CONFIDENCE,
    PassAtK,
    SuiteRate,
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
    if metric.value is None:
        return f"{metric.metric.replace('k', str(metric.k))} - (no task has {metric.k} sound trials)"
    fewer = f", {metric.tasks_with_fewer_trials} task(s) with fewer sound trials left out" \
        if metric.tasks_with_fewer_trials else ""
    return (f"{metric.metric.replace('k', str(metric.k))} {_pct(metric.value)} {_interval(metric.interval)} "
            f"over {metric.tasks} task(s){fewer}")


def trial_metrics(rows: Iterable[Mapping[str, Any]], confidence: float = DEFAULT_CONFIDENCE
                  ) -> tuple[SuiteRate, int, list[PassAtK]]:
    """From a run's final attempt per (task, trial) (`latest_task_results` rows): the suite
    rate, the trials per task k (the most any task got), and pass@1, pass@k and pass^k."""
    tasks = group_trials(rows)
    k = max((len(t.trials) for t in tasks), default=1)
    metrics = [pass_at_k(tasks, 1, confidence)]
    if k > 1:
        metrics += [pass_at_k(tasks, k, confidence), pass_hat_k(tasks, k, confidence)]
    return suite_rate(tasks, confidence), k, metrics


def trial_summary_lines(rows: Iterable[Mapping[str, Any]], confidence: float = DEFAULT_CONFIDENCE) -> list[str]:
    """Plain-text lines for a run with repeated trials (see `trial_metrics`)."""
    rate, k, metrics = trial_metrics(list(rows), confidence)
    level = f"{100 * confidence:.0f} %"
    spread = f"{rate.min_trials}" if rate.min_trials == rate.max_trials else f"{rate.min_trials}-{rate.max_trials}"
    lines = [
        f"trials: up to {k} per task; {rate.sound_trials} sound trial(s) over {rate.tasks} task(s) ({spread} per task)"
        + (f"; {len(rate.tasks_without_sound_trial)} task(s) without a sound trial" if rate.tasks_without_sound_trial
           else ""),
        f"success rate over trials (mean of per-task fractions): {_pct(rate.rate)}   {level} intervals: "
        f"these tasks {_interval(rate.these_tasks.interval)}, tasks like these {_interval(rate.tasks_like_these.interval)}",
        "   ".join(_pass_text(m) for m in metrics),
    ]
    return lines


def trial_lines(rows: list[Mapping[str, Any]]) -> list[str] | None:
    """`trial_summary_lines` for a run with repeated trials, None for a single-trial run (whose
    reports stay as they were); without SciPy, one line naming the `stats` extra (the run's
    results stand; only these statistics need it)."""
    from adapters.results.trials._scipy import StatsExtraMissing

    if not has_repeated_trials(rows):
        return None
    try:
        return trial_summary_lines(rows)
    except StatsExtraMissing as exc:
        return [f"statistics not computed: {exc}"]
