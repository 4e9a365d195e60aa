"""`arena tasks stability`: per-task stability across stored runs and trials; a deterministic
agent's flaky task is flagged as an environment problem."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from adapters.benchmark import BenchmarkResult, OutcomeKind
from adapters.store import ResultStore, RunInfo
from flows.cli import main


def _record(store: ResultStore, run_id: str, agent: str, started: int, outcomes: dict[str, list[OutcomeKind]]) -> None:
    store.start_run(RunInfo(run_id=run_id, agent=agent, suite="s", task_count=len(outcomes),
                            started_at=dt.datetime(2026, 11, 1, started)))
    attempt = 0
    for task_id, trials in outcomes.items():
        for trial, outcome in enumerate(trials, start=1):
            attempt += 1
            store.record_result(run_id, BenchmarkResult(task_id=task_id, domain="notepad", outcome=outcome,
                                                        success=outcome is OutcomeKind.SUCCESS, attempt=attempt,
                                                        trial=trial))


S, F, I = OutcomeKind.SUCCESS, OutcomeKind.AGENT_FAILURE, OutcomeKind.INFRASTRUCTURE_ERROR


def test_stability_lists_flaky_tasks_and_flags_a_deterministic_agents_as_the_environment(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.duckdb"
    with ResultStore(db) as store:
        _record(store, "night-1", "scripted", 1, {"a": [S], "b": [S], "c": [S]})
        _record(store, "night-2", "scripted", 2, {"a": [S], "b": [F], "c": [I]})  # an infra error is not flaky
        _record(store, "noisy", "noisy-scripted", 3, {"a": [S, F, S], "b": [F, F, F]})
    assert main(["tasks", "stability", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("task stability over 3 run(s): 5 task version(s) x configuration, 2 flaky, 1 of them "
                          "with a deterministic agent: the ENVIRONMENT varied")
    assert "  ENVIRONMENT (deterministic agent): notepad/b [scripted] 1/2 sound trials succeeded over 2 run(s): " \
           "night-1#1 success, night-2#1 agent_failure" in out
    assert "  flaky: notepad/a [noisy-scripted] 2/3 sound trials succeeded over 1 run(s): noisy#1 success, " \
           "noisy#2 agent_failure, noisy#3 success" in out
    assert "  notepad/c [scripted] 100% of 1 sound trial(s) over 2 run(s)" in out
    # Filters: one agent, the most recent run only.
    assert main(["tasks", "stability", "--db", str(db), "--agent", "scripted", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("task stability over 1 run(s): 3 task version(s) x configuration, 0 flaky") and "night-1" not in out
    assert main(["tasks", "stability", "--db", str(db), "--agent", "claude"]) == 0
    assert "no stored results match" in capsys.readouterr().out
    assert main(["tasks", "stability", "--db", str(db), "--runs", "0"]) == 2
    assert "--runs 0: must be at least 1" in capsys.readouterr().err
