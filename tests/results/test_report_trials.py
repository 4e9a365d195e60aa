"""The HTML report of a run with repeated trials: each task's trials side by side, and the flaky
tasks with their trial outcomes (a deterministic agent's flagged as the environment); a
single-trial run's report has no trials section."""

from __future__ import annotations

import html
import re
from pathlib import Path

from adapters.benchmark import BenchmarkResult, OutcomeKind
from adapters.results.report_html import write_html_report
from adapters.store import ResultStore, RunInfo

S, F, I = OutcomeKind.SUCCESS, OutcomeKind.AGENT_FAILURE, OutcomeKind.INFRASTRUCTURE_ERROR


def _run(store: ResultStore, run_id: str, agent: str, outcomes: dict[str, list[OutcomeKind]]) -> None:
    store.start_run(RunInfo(run_id=run_id, agent=agent, suite="s", task_count=len(outcomes)))
    for task_id, trials in outcomes.items():
        for trial, outcome in enumerate(trials, start=1):
            store.record_result(run_id, BenchmarkResult(task_id=task_id, domain="notepad", outcome=outcome,
                                                        success=outcome is S, attempt=trial, trial=trial))


def _text(page: str, section: str) -> str:
    match = re.search(rf'<section id="{section}">(.*?)</section>', page, re.S)
    return "" if match is None else " ".join(html.unescape(re.sub(r"<[^>]+>", " ", match.group(1))).split())


def test_the_report_shows_trials_side_by_side_and_the_flaky_tasks(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.duckdb") as store:
        _run(store, "trials", "scripted", {"a": [S, F, S], "b": [F, F, F], "c": [S, I]})
        _run(store, "single", "scripted", {"a": [S], "b": [F]})
        page = write_html_report(store, "trials", tmp_path / "trials.html").read_text()
        single = write_html_report(store, "single", tmp_path / "single.html").read_text()
    text = _text(page, "trials")
    assert "3 task(s), up to 3 trials each" in text
    assert "a notepad success agent_failure success 2/3" in text
    assert "c notepad success infrastructure_error - 1/1" in text  # an unsound trial does not count
    assert ("Flaky tasks: 1 a (notepad): 2/3 sound trials succeeded: trial 1 success, trial 2 agent_failure, "
            "trial 3 success (deterministic agent: the environment varied)") in text
    assert '<section id="trials">' not in single
    # Each trial's trajectory has an anchor of its own, and the index links each one.
    ids = re.findall(r'<details class="task [^"]*" id="([^"]+)"', page)
    assert len(ids) == len(set(ids)) == 8 and sorted(re.findall(r'href="#(task-\d+)"', page)) == sorted(ids)


def test_run_metrics_count_each_trials_attempts_once(tmp_path: Path) -> None:
    """The per-domain rows count trials; attempts and what they spent are each trial's own (not
    the task's whole attempt count repeated on every trial)."""
    from adapters.results.metrics import compute_run_metrics

    with ResultStore(tmp_path / "r.duckdb") as store:
        _run(store, "r", "scripted", {"a": [S, F, S]})
        store.record_result("r", BenchmarkResult(task_id="a", domain="notepad", outcome=I, attempt=4, trial=4))
        store.record_result("r", BenchmarkResult(task_id="a", domain="notepad", outcome=S, success=True, attempt=5, trial=4))
        metrics = compute_run_metrics(store, "r")
    assert metrics.overall.tasks == 4 and metrics.overall.attempts == 5 and metrics.overall.retried_tasks == 1
    assert sorted((t.attempt, t.attempts) for t in metrics.tasks) == [(1, 1), (2, 1), (3, 1), (5, 2)]


def test_the_text_report_adds_the_trial_statistics_only_for_runs_with_trials(tmp_path: Path) -> None:
    from adapters.results.report_text import render_text_report
    from adapters.results.trials import group_trials, suite_rate

    with ResultStore(tmp_path / "r.duckdb") as store:
        _run(store, "trials", "noisy-scripted", {"a": [S, F, S], "b": [F, F, S]})
        _run(store, "single", "scripted", {"a": [S], "b": [F]})
        text, single = render_text_report(store, "trials"), render_text_report(store, "single")
        rate = suite_rate(group_trials(store.latest_attempts("trials"))).rate
    assert "Repeated trials (the rows above are one per task and trial" in text
    assert f"success rate over trials (mean of per-task fractions): {100 * rate:.1f}%" in text
    assert "pass@3 " in text and "pass^3 " in text and "Repeated trials" not in single
