"""`arena store migrate`: copy the runs of a DuckDB results file into the team store.

Run by run, each in one transaction: a run already in the target is left as it is (so a migrate
interrupted half-way, or run twice, copies each run exactly once). Screenshot paths, stored
relative to the DuckDB file's folder, become absolute, so the team store still finds them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from adapters.store.duckdb_store import ResultStore
from adapters.store.errors import StoreError


class MigrationReport(BaseModel):
    """What a migrate did: runs copied (with their result and step counts) and runs skipped."""

    copied: list[str] = []
    skipped: list[str] = []
    results: int = 0
    steps: int = 0


def migrate(source: Path, target: ResultStore) -> MigrationReport:
    """Copy every run of the DuckDB file `source` (with its results and steps) into `target`,
    a PostgreSQL store; runs already there are skipped. `StoreError` naming the file or store."""
    if not target.is_server:
        raise StoreError(f"{target.location}: the target of a migrate is the team store (a postgresql:// URL)")
    report = MigrationReport()
    with ResultStore(source, read_only=True) as origin:
        with origin.reading() as conn:
            run_ids = [r for (r,) in conn.execute("SELECT run_id FROM runs ORDER BY started_at, run_id").fetchall()]
        existing = _existing_runs(target)
        for run_id in run_ids:
            if run_id in existing:
                report.skipped.append(run_id)
                continue
            results, steps = _copy_run(origin, target, run_id)
            report.copied.append(run_id)
            report.results += results
            report.steps += steps
    if report.copied:
        with target.writing() as server:
            server.execute("ANALYZE")  # the planner's statistics, before the first queries
    return report


def _existing_runs(target: ResultStore) -> set[str]:
    with target.reading() as conn:
        return {r for (r,) in conn.execute("SELECT run_id FROM runs").fetchall()}


def _copy_run(origin: ResultStore, target: ResultStore, run_id: str) -> tuple[int, int]:
    """One run's rows from `origin` into `target`, in one transaction; (results, steps) copied."""
    with origin.reading() as conn:
        tables = {
            table: _rows(conn, f"SELECT * FROM {table} WHERE run_id = ?", [run_id])
            for table in ("runs", "task_results", "steps")
        }
    columns, rows = tables["steps"]
    path_at = columns.index("screenshot_path")
    for row in rows:
        if row[path_at] is not None:
            row[path_at] = str(origin.resolve_path(row[path_at]))
    counts = {}
    with _transaction(target) as server:
        for table, (columns, rows) in tables.items():
            counts[table] = server.copy_rows(table, columns, rows)
    return counts["task_results"], counts["steps"]


def _rows(conn: Any, sql: str, params: list[Any]) -> tuple[list[str], list[list[Any]]]:
    cursor = conn.execute(sql, params)
    return [d[0] for d in cursor.description], [list(row) for row in cursor.fetchall()]


@contextlib.contextmanager
def _transaction(target: ResultStore) -> Iterator[Any]:
    with target.writing() as server:
        server.execute("BEGIN TRANSACTION")
        try:
            yield server
            server.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):
                server.execute("ROLLBACK")
            raise
