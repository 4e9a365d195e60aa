"""Schema 7: how a run scored server failures during evaluation (runs.scoring, adapters/outcomes.py
R9) and how each action was delivered (steps.delivery), on a DuckDB file and on PostgreSQL; the
scoring shown beside every rate."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkResult, OutcomeKind, StepRecord
from adapters.results.compare import compare_stored_runs, render_comparison_text
from adapters.results.metrics import compute_run_metrics
from adapters.results.report_html import render_html_report
from adapters.results.report_text import render_text_report
from adapters.store import ResultStore, RunInfo, StoreError
from adapters.store.duckdb_store import SCHEMA_VERSION
from flows.summary import format_summary, summary_markdown

DELIVERY = "pyautogui.write through /execute: 40000 characters in 40 piece(s) of at most 1000"


@pytest.fixture(params=["duckdb", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return str(tmp_path / "results.duckdb")


def _run(run_id: str, scoring: str | None) -> RunInfo:
    return RunInfo(run_id=run_id, agent="scripted", suite="s", suite_hash="h", task_count=1, scoring=scoring)


def _typed(task_id: str = "t") -> BenchmarkResult:
    step = StepRecord(index=0, action=BenchmarkAction(type=ActionType.TYPE, text="x" * 40_000), delivery=DELIVERY)
    return BenchmarkResult(task_id=task_id, domain="notepad", outcome=OutcomeKind.SUCCESS, success=True, score=1.0,
                           steps=[step], num_steps=1)


def _as_version_6(location: str) -> None:
    """Turn a fresh store into what schema version 6 wrote: without the columns of versions 7
    (the run's controller and heartbeat), 8 (scoring, delivery), 9 (trials) and 10 (shard tickets)."""
    with ResultStore(location) as store, store.writing() as conn:
        for column in ("scoring", "heartbeat_at", "controller"):
            conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        conn.execute("ALTER TABLE steps DROP COLUMN delivery")
        # and of version 9 (trials): the view reads the column, so it goes first
        conn.execute("DROP VIEW latest_task_results")
        conn.execute("ALTER TABLE task_results DROP COLUMN trial")
        conn.execute("DROP TABLE shard_tickets")
        conn.execute("UPDATE schema_version SET version = 6")


def test_a_version_6_store_is_upgraded_in_place(location: str) -> None:
    _as_version_6(location)
    with ResultStore(location) as store, store.writing() as conn:
        conn.execute("INSERT INTO runs (run_id, agent, suite, status, started_at) "
                     "VALUES ('old', 'scripted', 's', 'completed', TIMESTAMP '2025-01-01 02:00:00')")
    with ResultStore(location) as store:
        assert store.schema_version() == SCHEMA_VERSION == 10
        assert store.get_run("old").scoring is None  # recorded before the option existed
        store.start_run(_run("new", "waa-compat"))
        store.record_result("new", _typed())
        assert store.get_run("new").scoring == "waa-compat"
        (step,) = store.steps("new", "t")
        assert step["delivery"] == DELIVERY


def test_a_run_resumes_only_with_the_scoring_it_started_with(location: str) -> None:
    with ResultStore(location) as store:
        store.start_run(_run("r", "strict"))
        store.start_run(_run("r", "strict"), resume=True)
        with pytest.raises(StoreError, match="scoring: stored 'strict', now 'waa-compat'"):
            store.start_run(_run("r", "waa-compat"), resume=True)
        store.start_run(_run("old", None))  # before schema 8: nothing to compare
        store.start_run(_run("old", "strict"), resume=True)


def test_every_rate_is_shown_with_the_scoring_it_was_measured_with(tmp_path: Path) -> None:
    db = tmp_path / "results.duckdb"
    with ResultStore(db) as store:
        store.start_run(_run("strict-run", "strict"))
        store.start_run(_run("compat-run", "waa-compat"))
        store.start_run(_run("old-run", None))
        for run_id in ("strict-run", "compat-run", "old-run"):
            store.record_result(run_id, _typed())
        strict = "scoring: strict (a server failure during evaluation is an infrastructure error, never scored)"
        compat = "scoring: waa-compat (a server's error answer during evaluation is scored as WAA scores it"
        metrics = compute_run_metrics(store, "strict-run")
        assert strict in format_summary("strict-run", metrics, "local-simulation")
        assert strict in summary_markdown("strict-run", metrics, "local-simulation")
        assert strict in render_text_report(store, "strict-run")
        assert html.escape(compat) in render_html_report(compute_run_metrics(store, "compat-run"), store)
        assert "scoring: not recorded" in render_text_report(store, "old-run")
        comparison = render_comparison_text(compare_stored_runs(store, "strict-run", "compat-run"))
    assert strict in comparison and compat in comparison
    assert "the runs scored server failures during evaluation differently (baseline strict, new waa-compat)" in comparison
