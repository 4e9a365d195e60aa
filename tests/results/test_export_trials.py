"""Exports of a run with repeated trials carry the trial: Parquet (every attempt, and the final
attempt of each task and trial) and the training exports' episodes."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from adapters.benchmark import BenchmarkResult, OutcomeKind
from adapters.results.export import export_run_parquet
from adapters.store import ResultStore, RunInfo
from adapters.training.export import export_training
from adapters.training.selection import EpisodeFilter


def test_parquet_and_training_exports_carry_the_trial(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    with ResultStore(db) as store:
        store.start_run(RunInfo(run_id="r", agent="noisy-scripted", suite="bundled", task_count=1))
        for attempt, trial, outcome in ((1, 1, OutcomeKind.SUCCESS), (2, 2, OutcomeKind.INFRASTRUCTURE_ERROR),
                                        (3, 2, OutcomeKind.AGENT_FAILURE), (4, 3, OutcomeKind.SUCCESS)):
            store.record_result("r", BenchmarkResult(task_id="notepad-append-line", domain="notepad", outcome=outcome,
                                                     success=outcome is OutcomeKind.SUCCESS, attempt=attempt, trial=trial))
    out = tmp_path / "parquet"
    export_run_parquet(db, "r", out)
    with duckdb.connect() as con:
        latest = con.execute(f"SELECT trial, attempt, outcome FROM '{out / 'latest_task_results.parquet'}'").fetchall()
        every = con.execute(f"SELECT trial, attempt FROM '{out / 'task_results.parquet'}'").fetchall()
    assert latest == [(1, 1, "success"), (2, 3, "agent_failure"), (3, 4, "success")]
    assert every == [(1, 1), (2, 2), (2, 3), (3, 4)]
    summary = export_training(db, EpisodeFilter(run_ids=["r"]), "trajectories", tmp_path / "traj")
    assert summary.episodes == 3
    lines = [json.loads(line) for f in sorted((tmp_path / "traj").rglob("*.jsonl")) for line in f.read_text().splitlines()]
    assert sorted((e["trial"], e["attempt"]) for e in lines) == [(1, 1), (2, 3), (3, 4)]
