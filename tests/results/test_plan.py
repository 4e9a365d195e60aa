"""`arena plan`: wall time and cost before a run, from what earlier runs recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.benchmark import BenchmarkResult, ModelUsage, OutcomeKind
from adapters.results.plan import DEFAULT_TASK_SECONDS, longest_first_makespan, make_plan
from adapters.store.duckdb_store import ResultStore, RunInfo
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from flows.cli import EXIT_OVER_BUDGET, main


def test_longest_first_makespan() -> None:
    assert longest_first_makespan([5, 4, 3, 3, 3], 2) == 10  # 5+3+... : {5,3} vs {4,3,3}
    assert longest_first_makespan([7, 1, 1], 5) == 7
    assert longest_first_makespan([], 3) == 0


def test_plan_counts_untimed_tasks_as_the_median_and_prices_vms_and_model() -> None:
    plan = make_plan(["a", "b", "c", "d"], {"a": 600, "b": 300, "c": 900}, {"a": 0.5, "b": 0.25}, 2, 2.0)
    assert plan.timed_tasks == 3 and plan.assumed_task_seconds == 600 and plan.priced_tasks == 2
    assert plan.work_seconds == 2400 and plan.wall_seconds == 1200  # {900, 300} and {600, 600}
    assert plan.vm_hours == pytest.approx(2 * 1200 / 3600)
    assert plan.cost_usd == pytest.approx(plan.vm_hours * 2.0 + 0.75)
    assert "the other 1 counted as 10.0 min each" in plan.render()


def test_nothing_known_uses_the_default_and_bad_pools_are_refused() -> None:
    assert make_plan(["a"], {}, {}, 1).wall_seconds == DEFAULT_TASK_SECONDS
    with pytest.raises(ValueError, match="pool size"):
        make_plan(["a"], {}, {}, 0)


def test_arena_plan_reads_the_store_and_refuses_above_max_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "arena.duckdb"
    tasks = WAATaskCatalog(bundled_suite_dir()).tasks(domains=["notepad"])
    with ResultStore(db) as store:
        store.start_run(RunInfo(run_id="earlier", agent="claude", suite="bundled"))
        for i, task in enumerate(tasks):
            store.record_result("earlier", BenchmarkResult(
                task_id=task.task_id, domain=task.domain, outcome=OutcomeKind.SUCCESS, success=True, score=1.0,
                total_time_seconds=300.0 + 60 * i, usage=ModelUsage(calls=3, cost_usd=0.10)))
    args = ["plan", "--db", str(db), "--domain", "notepad", "--agent", "claude", "--pool-size", "2",
            "--vm-hour-price", "1.0"]
    assert main(args) == 0
    out = capsys.readouterr().out
    n = len(tasks)
    assert f"plan: {n} task(s) on 2 VM(s)" in out and f"recorded durations for {n}/{n} task(s)" in out
    assert f"model: ${0.10 * n:.2f}" in out
    assert main([*args, "--max-cost", "0.05"]) == EXIT_OVER_BUDGET
    assert "refused: the estimated cost" in capsys.readouterr().err


def test_arena_plan_without_a_store_yet_guesses_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--db", str(tmp_path / "none.duckdb"), "--pool-size", "4"]) == 0
    assert "recorded durations for 0/" in capsys.readouterr().out
    assert not (tmp_path / "none.duckdb").exists()  # planning writes nothing


def test_arena_plan_with_trials_scales_the_work_and_prints_the_detectable_difference(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--trials K: every trial is an episode; the detectable difference at 80 % power is the
    planning library's for these tasks, the agent's rate and trial-to-trial variance from the store."""
    from adapters.results.trials import group_trials, plan_mde, suite_rate, trial_variance

    db = tmp_path / "arena.duckdb"
    tasks = WAATaskCatalog(bundled_suite_dir()).tasks(domains=["notepad"])
    outcomes = {t.task_id: [i % 2 == 0, i % 3 == 0, True] for i, t in enumerate(tasks)}
    rows = []
    with ResultStore(db) as store:
        store.start_run(RunInfo(run_id="earlier", agent="noisy-scripted", suite="bundled"))
        for task in tasks:
            for trial, ok in enumerate(outcomes[task.task_id], start=1):
                outcome = OutcomeKind.SUCCESS if ok else OutcomeKind.AGENT_FAILURE
                store.record_result("earlier", BenchmarkResult(
                    task_id=task.task_id, domain=task.domain, outcome=outcome, success=ok, attempt=trial, trial=trial,
                    total_time_seconds=120.0))
                rows.append({"task_id": task.task_id, "trial": trial, "outcome": outcome.value, "success": ok})
    args = ["plan", "--db", str(db), "--domain", "notepad", "--agent", "noisy-scripted", "--pool-size", "2"]
    assert main([*args, "--trials", "4"]) == 0
    out = capsys.readouterr().out
    n = len(tasks)
    assert f"plan: {n} task(s) x 4 trials = {4 * n} episodes on 2 VM(s)" in out
    assert f"work {4 * n * 2.0:.1f} min" in out
    grouped = group_trials(rows)
    expected = plan_mde(n, 4, suite_rate(grouped).rate, trial_variance(grouped))
    assert f"detectable difference: {100 * expected.mde:.1f} points at 80 % power" in out
    assert "from earlier runs (" in out and "baseline rate from earlier runs of the agent (1)" in out
    assert main([*args, "--trials", "4", "--baseline-rate", "0.3"]) == 0
    assert "baseline rate 30.0 %" in capsys.readouterr().out
    assert main([*args, "--trials", "0"]) == 2
    assert "--trials 0: must be at least 1" in capsys.readouterr().err
