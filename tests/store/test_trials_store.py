"""Schema 9: the trial number of each attempt (task_results.trial), migrated in place from a
version-8 store on DuckDB and PostgreSQL; the views per (task, trial), a single-trial run's
views giving the rows they gave before."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from adapters.benchmark import BenchmarkResult, OutcomeKind
from adapters.store import ResultStore, RunInfo
from adapters.store.duckdb_store import _DDL, SCHEMA_VERSION

# What version 8 wrote: today's DDL without the trial column, its view per (run, task).
V8_DDL = [s.replace("        trial INTEGER NOT NULL DEFAULT 1,\n", "").replace("run_id, task_id, trial ORDER", "run_id, task_id ORDER")
          for s in _DDL]
V8_POSTGRES_VIEW = """
    CREATE VIEW latest_task_results AS
    SELECT * FROM task_results t
    WHERE NOT EXISTS (
        SELECT 1 FROM task_results later
        WHERE later.run_id = t.run_id AND later.task_id = t.task_id AND later.attempt > t.attempt
    )
"""


@pytest.fixture(params=["duckdb", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return str(tmp_path / "results.duckdb")


def _v8_rows(conn) -> None:
    conn.execute("INSERT INTO runs (run_id, agent, suite, status) VALUES ('old', 'scripted', 's', 'completed')")
    for task_id, attempt, outcome in (("a", 1, "infrastructure_error"), ("a", 2, "success"), ("b", 1, "agent_failure")):
        conn.execute("INSERT INTO task_results (run_id, task_id, attempt, outcome, success) VALUES ('old', ?, ?, ?, ?)",
                     [task_id, attempt, outcome, outcome == "success"])


def _as_version_8(location: str) -> None:
    """A store exactly as version 8 left it, holding a run with a retried task."""
    if location.startswith("postgresql://"):
        with ResultStore(location) as store, store.writing() as conn:
            conn.execute("DROP VIEW latest_task_results")
            conn.execute("ALTER TABLE task_results DROP COLUMN trial")
            conn.execute("DROP TABLE shard_tickets")  # version 10's
            conn.execute(V8_POSTGRES_VIEW)
            conn.execute("UPDATE schema_version SET version = 8")
            _v8_rows(conn)
        return
    with duckdb.connect(location) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (8)")
        for statement in V8_DDL:
            conn.execute(statement)
        _v8_rows(conn)


def test_a_version_8_store_is_upgraded_in_place_old_rows_become_trial_1(location: str) -> None:
    _as_version_8(location)
    with ResultStore(location) as store:
        assert store.schema_version() == SCHEMA_VERSION == 10
        assert [(r["task_id"], r["attempt"], r["trial"]) for r in store.results("old")] == [("a", 1, 1), ("a", 2, 1), ("b", 1, 1)]
        # The view gives the rows it gave before: the final attempt of each task.
        assert [(r["task_id"], r["attempt"], r["outcome"]) for r in store.latest_attempts("old")] == [
            ("a", 2, "success"), ("b", 1, "agent_failure")]
        assert store.finished_task_ids("old") == {"a", "b"}
        assert store.finished_trials("old") == {("a", 1), ("b", 1)}
        # New results with trials land beside them, the view per (task, trial).
        store.start_run(RunInfo(run_id="new", agent="noisy-scripted", suite="s", task_count=1))
        for attempt, trial, outcome in ((1, 1, OutcomeKind.SUCCESS), (2, 2, OutcomeKind.INFRASTRUCTURE_ERROR),
                                        (3, 3, OutcomeKind.AGENT_FAILURE), (4, 2, OutcomeKind.AGENT_FAILURE)):
            store.record_result("new", BenchmarkResult(task_id="t", outcome=outcome, success=outcome is OutcomeKind.SUCCESS,
                                                       attempt=attempt, trial=trial))
        assert [(r["trial"], r["attempt"], r["outcome"]) for r in store.latest_attempts("new")] == [
            (1, 1, "success"), (2, 4, "agent_failure"), (3, 3, "agent_failure")]
        assert store.finished_trials("new") == {("t", 1), ("t", 2), ("t", 3)}
        assert store.next_attempts("new") == {"t": 5}
    with ResultStore(location, read_only=True) as store, store.reading(["new"]) as conn:
        # Readers' copies (a PostgreSQL store's in-memory snapshot) have the column and view too.
        assert conn.execute("SELECT trial, attempt FROM latest_task_results WHERE run_id = 'new' ORDER BY trial").fetchall() == [
            (1, 1), (2, 4), (3, 3)]


def test_an_unfinished_trial_is_not_finished(location: str) -> None:
    with ResultStore(location) as store:
        store.start_run(RunInfo(run_id="r", agent="scripted", suite="s", task_count=1))
        store.record_result("r", BenchmarkResult(task_id="t", outcome=OutcomeKind.SUCCESS, success=True, attempt=1, trial=1))
        store.record_result("r", BenchmarkResult(task_id="t", outcome=OutcomeKind.INFRASTRUCTURE_ERROR, attempt=2, trial=2))
        assert store.finished_trials("r") == {("t", 1)}
