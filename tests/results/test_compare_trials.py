"""`arena compare` and the model-update comparison when a run has repeated trials: per-task means
compared with the paired trial comparison (adapters/results/trials/paired.py), whose verdict is
the comparison's; single-trial runs keep today's answers (tests/results/test_compare.py)."""

from __future__ import annotations

from pathlib import Path

from adapters.benchmark import BenchmarkResult, OutcomeKind
from adapters.results.compare import compare_runs, compare_stored_runs, comparison_markdown, render_comparison_text
from adapters.results.trials import compare_trial_rows
from adapters.store import ResultStore, RunInfo


def _rows(successes: dict[str, list[bool]]) -> list[dict]:
    return [
        {"task_id": task, "domain": "notepad", "trial": k + 1, "attempt": k + 1,
         "outcome": "success" if ok else "agent_failure", "success": ok}
        for task, outcomes in successes.items() for k, ok in enumerate(outcomes)
    ]


BASE = {f"t{i}": [i % 2 == 0, False, i % 3 == 0] for i in range(12)}
NEW = {f"t{i}": [True, True, i % 4 != 0] for i in range(12)}


def test_runs_with_trials_are_compared_by_per_task_means() -> None:
    comparison = compare_runs(_rows(BASE), _rows(NEW), "base", "new")
    expected = compare_trial_rows(_rows(BASE), _rows(NEW), alpha=0.05, confidence=0.95)
    assert comparison.trials is not None
    assert comparison.trials.difference == expected.difference and comparison.verdict == expected.verdict == "improved"
    assert comparison.p_value == expected.these_tasks.p_value
    # The classic table and flips are the first trial of each run.
    assert comparison.test.paired_tasks == 12 and comparison.overall.baseline_total_sound == 12
    assert {f.task_id for f in comparison.fixed} == {f"t{i}" for i in range(12) if i % 2}
    text = render_comparison_text(comparison)
    assert "Verdict: improved (per-task means over trials, 12 paired tasks" in text
    assert "repeated trials: per-task means" in text and "detectable difference at 80 % power" in text
    assert "## Repeated trials" in comparison_markdown(comparison, "t")


def test_a_run_with_trials_against_a_single_trial_run_pairs_unequal_trials() -> None:
    single = {task: outcomes[:1] for task, outcomes in BASE.items()}
    comparison = compare_runs(_rows(single), _rows(NEW), "base", "new")
    assert comparison.trials is not None and not comparison.trials.single_trial
    assert all(t.baseline_trials == 1 and t.candidate_trials == 3 for t in comparison.trials.paired)


def test_single_trial_runs_have_no_trial_comparison() -> None:
    single = {task: outcomes[:1] for task, outcomes in BASE.items()}
    comparison = compare_runs(_rows(single), _rows({t: o[:1] for t, o in NEW.items()}), "base", "new")
    assert comparison.trials is None and comparison.verdict == comparison.test.verdict
    assert "repeated trials" not in render_comparison_text(comparison)


def test_stored_runs_with_trials_compare_from_the_store(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    with ResultStore(db) as store:
        for run_id, outcomes in (("base", BASE), ("new", NEW)):
            store.start_run(RunInfo(run_id=run_id, agent="noisy-scripted", suite="s", task_count=len(outcomes)))
            for task, trials in outcomes.items():
                attempt = 0
                for k, ok in enumerate(trials, start=1):
                    if k == 2:  # an infrastructure error retried within the trial: its final attempt counts
                        attempt += 1
                        store.record_result(run_id, BenchmarkResult(task_id=task, outcome=OutcomeKind.INFRASTRUCTURE_ERROR,
                                                                    attempt=attempt, trial=k))
                    attempt += 1
                    outcome = OutcomeKind.SUCCESS if ok else OutcomeKind.AGENT_FAILURE
                    store.record_result(run_id, BenchmarkResult(task_id=task, domain="notepad", outcome=outcome, success=ok,
                                                                attempt=attempt, trial=k))
    comparison = compare_stored_runs(db, "base", "new")
    assert comparison.trials is not None and comparison.verdict == "improved"
    assert comparison.trials.difference == compare_runs(_rows(BASE), _rows(NEW), "base", "new").trials.difference
    assert comparison.new_status is not None and comparison.new_status.missing == 0
