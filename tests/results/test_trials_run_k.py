"""pass@k for the run's K and a headline that groups trials by task (issue 64): after the adaptive
design adds trials to some tasks of a baseline run, its summary and reports give pass@K for the K
the run asked for (stated, with where it comes from), never pass@<the most trials one task got>;
and a run with trials heads its summary and reports with the mean of per-task fractions and the
tasks-like-these interval instead of a Wilson interval over every trial."""

from __future__ import annotations

import html
import re
from pathlib import Path

from adapters.benchmark import BenchmarkResult, OutcomeKind
from adapters.results.metrics import compute_run_metrics
from adapters.results.report_html import write_html_report
from adapters.results.report_text import render_text_report
from adapters.results.stats import wilson_interval
from adapters.results.trials import group_trials, suite_rate
from adapters.store import ResultStore, RunInfo
from flows.summary import format_summary, summary_markdown, summary_rows, trial_statistics, trials_section

S, F = OutcomeKind.SUCCESS, OutcomeKind.AGENT_FAILURE


def _run(store: ResultStore, run_id: str, trials: int, outcomes: dict[str, list[OutcomeKind]]) -> None:
    store.start_run(RunInfo(run_id=run_id, agent="openai", suite="s", task_count=len(outcomes),
                            run_config={"trials": trials}))
    attempt = 0
    for task_id, results in outcomes.items():
        for trial, outcome in enumerate(results, start=1):
            attempt += 1
            store.record_result(run_id, BenchmarkResult(task_id=task_id, domain="notepad", outcome=outcome,
                                                        success=outcome is S, attempt=attempt, trial=trial))


# A baseline run of K = 1 to which the adaptive design added trials of two tasks, 8 of one.
ADAPTED = {"a": [S, F, S, S, F, S, S, F], "b": [F, S], "c": [S], "d": [F], "e": [S]}


def test_after_the_adaptive_design_the_reports_give_pass_at_the_runs_k(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.duckdb") as store:
        _run(store, "base", 1, ADAPTED)
        text = render_text_report(store, "base")
        page = write_html_report(store, "base", tmp_path / "base.html").read_text()
        rows = store.latest_attempts("base")
    assert "pass@8" not in text and "pass^8" not in text and "pass@2" not in text
    assert "pass@1 " in text and "trials: K = 1 per task (the run's configuration)" in text
    assert "some tasks got more trials than K (up to 8" in text
    trials = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    assert "pass@8" not in trials and "trials: K = 1 per task" in trials
    # The summary at the end of the run: K is the run's configuration's, whatever the rows hold.
    summary_text, _ = trials_section(trial_statistics(rows, 1))
    assert "pass@8" not in summary_text and "K = 1 per task" in summary_text


def test_a_run_with_trials_gives_pass_at_k_and_pass_hat_k_for_its_k(tmp_path: Path) -> None:
    runs = {"a": [S, S, F], "b": [F, F, F, S, S], "c": [S, S, S]}  # b got 2 more than K = 3
    with ResultStore(tmp_path / "r.duckdb") as store:
        _run(store, "k3", 3, runs)
        text = render_text_report(store, "k3")
    assert "pass@3 " in text and "pass^3 " in text and "pass@5" not in text
    assert "over 3 task(s)" in text


def test_the_headline_of_a_run_with_trials_groups_trials_by_task(tmp_path: Path) -> None:
    runs = {"a": [S, S, S], "b": [F, F, F], "c": [S, F, S], "d": [S, S, S], "e": [F, F, F], "f": [S, S, F]}
    with ResultStore(tmp_path / "r.duckdb") as store:
        _run(store, "r", 3, runs)
        text = render_text_report(store, "r")
        page = write_html_report(store, "r", tmp_path / "r.html").read_text()
        metrics = compute_run_metrics(store, "r")
        rows = store.latest_attempts("r")
    rate = suite_rate(group_trials(rows))
    low, high = rate.tasks_like_these.interval
    grouped = f"{100 * rate.rate:.1f}% [{100 * low:.1f}%, {100 * high:.1f}%] over 6 task(s) x K=3 trial(s)"
    naive = wilson_interval(11, 18)  # every trial an independent draw: too narrow for tasks like these
    assert naive is not None and high - low > naive[1] - naive[0]
    statistics = trial_statistics(rows, 3)
    for shown in (text, format_summary("r", metrics, "local-simulation", None, statistics),
                  summary_markdown("r", metrics, "local-simulation", None, statistics)):
        headline = next(line for line in shown.splitlines() if "success rate (sound environment" in line.lower())
        assert grouped in headline and "interval for tasks like these" in headline
        assert f"{100 * naive[0]:.1f}%" not in headline  # no per-trial Wilson interval beside it
    # The summary's table artifact: the ALL row (and each domain's) as the headline, not per trial.
    total = summary_rows(metrics, trials=statistics)[-1]
    assert total["domain"] == "ALL" and total["success_rate_sound"] == round(rate.rate, 4)
    assert total["ci95_sound"] == f"[{100 * low:.1f}%, {100 * high:.1f}%]"
    card = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    assert f"6 tasks x K=3 trials · 95% CI [{100 * low:.1f}%, {100 * high:.1f}%] (tasks like these" in card


def test_a_single_trial_run_keeps_its_wilson_headline(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.duckdb") as store:
        _run(store, "one", 1, {"a": [S], "b": [F], "c": [S]})
        text = render_text_report(store, "one")
        rows = store.latest_attempts("one")
    assert trial_statistics(rows, 1) is None and "Repeated trials" not in text
    low, high = wilson_interval(2, 3)
    assert f"success rate (sound environment): 2/3 66.7% [{100 * low:.1f}%, {100 * high:.1f}%]" in text
