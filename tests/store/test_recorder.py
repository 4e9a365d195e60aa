"""The background recorder: lanes hand results over and go on; every result lands or is named."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from adapters.benchmark import BenchmarkAction, ActionType, BenchmarkResult, OutcomeKind, StepRecord
from adapters.store.duckdb_store import ResultStore, RunInfo
from adapters.store.recorder import ResultRecorder


def _result(task_id: str, attempt: int = 1, steps: int = 3) -> BenchmarkResult:
    return BenchmarkResult(
        task_id=task_id, domain="notepad", outcome=OutcomeKind.SUCCESS, success=True, score=1.0, attempt=attempt,
        steps=[StepRecord(index=i, action=BenchmarkAction(type=ActionType.KEY, key="a")) for i in range(steps)],
    )


def test_results_from_many_threads_all_land_once(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.duckdb") as store:
        store.start_run(RunInfo(run_id="run", agent="scripted", suite="s"))
        recorder = ResultRecorder(store, "run")
        threads = [threading.Thread(target=lambda k=k: [recorder.record(_result(f"t{k}-{i}")) for i in range(10)])
                   for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert recorder.close(30) and recorder.failed == [] and recorder.pending == 0
        rows = store.results("run")
        assert len(rows) == 80 and len({r["task_id"] for r in rows}) == 80
        assert len(store.steps("run", "t3-7")) == 3


def test_a_result_the_store_refuses_is_retried_then_named_and_the_others_land(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.duckdb") as store:
        store.start_run(RunInfo(run_id="run", agent="scripted", suite="s"))
        stored: list[str] = []
        recorder = ResultRecorder(store, "run", retries=2, retry_seconds=0.01,
                                  on_stored=lambda r: stored.append(r.task_id))
        bad = _result("dup")
        bad.steps.append(StepRecord(index=0, action=BenchmarkAction(type=ActionType.KEY, key="b")))
        recorder.record(_result("ok-1"))
        recorder.record(bad)
        recorder.record(_result("ok-2"))
        assert recorder.close(30)
        assert [u.result.task_id for u in recorder.failed] == ["dup"]
        assert "duplicate step indexes" in recorder.failed[0].describe()
        assert sorted(r["task_id"] for r in store.results("run")) == ["ok-1", "ok-2"]
        assert sorted(stored) == ["ok-1", "ok-2"]  # progress hears of stored results only


def test_results_of_an_unknown_run_are_reported_not_lost_silently(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.duckdb") as store:
        recorder = ResultRecorder(store, "never-started", retries=1, retry_seconds=0.01)
        recorder.record(_result("t1"))
        assert recorder.close(30)
        assert len(recorder.failed) == 1 and "never-started" in recorder.failed[0].error


def test_nothing_is_taken_after_close(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.duckdb") as store:
        recorder = ResultRecorder(store, "run")
        assert recorder.close(5)
        with pytest.raises(RuntimeError, match="closed"):
            recorder.record(_result("late"))
