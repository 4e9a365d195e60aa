"""Exporting one run to Parquet, written by DuckDB itself (no pyarrow).

    export_run_parquet(source, run_id, out_dir) -> [runs.parquet, task_results.parquet,
                                                    steps.parquet, latest_task_results.parquet]

The files hold exactly the DuckDB columns (see adapters/store/duckdb_store.py); JSON columns
stay JSON (Parquet strings with the JSON logical type), timestamps stay UTC.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from adapters.results.source import ResultsSource, require_runs, results_connection, source_path
from adapters.training.output import OutputExists
from adapters.whole_files import temporary_beside

# File name -> the query that fills it; `?` is the run id. Ordered so files are deterministic.
EXPORTS: dict[str, str] = {
    "runs.parquet": "SELECT * FROM runs WHERE run_id = ?",
    "task_results.parquet": "SELECT * FROM task_results WHERE run_id = ? ORDER BY task_id, attempt",
    "steps.parquet": "SELECT * FROM steps WHERE run_id = ? ORDER BY task_id, attempt, step_index",
    # The latest_task_results view for one run, filtered before attempts are numbered (as in
    # compare.py) so the work stays proportional to the run.
    "latest_task_results.parquet": (
        "SELECT * FROM task_results WHERE run_id = ? "
        "QUALIFY row_number() OVER (PARTITION BY task_id, trial ORDER BY attempt DESC) = 1 ORDER BY task_id, trial"
    ),
}


class ExportError(RuntimeError):
    """The export cannot be written; the message names the run, file or directory."""


class ExportFilesExist(OutputExists, ExportError):
    """The export's files are there already."""


def sql_string_literal(value: str) -> str:
    """`value` as a SQL string literal: single-quoted, inner quotes doubled.

    DuckDB's standard string literals treat nothing but the quote specially (a backslash is an
    ordinary character), so doubling quotes is a complete escape. COPY's target has to be a
    literal: DuckDB 1.1, the oldest version the project allows, accepts no prepared parameter
    there. NUL cannot be part
    of a file path and is refused.
    """
    if "\x00" in value:
        raise ExportError(f"refusing a path with a NUL character: {value!r}")
    return "'" + value.replace("'", "''") + "'"


def export_run_parquet(
    source: ResultsSource, run_id: str, out_dir: str | Path, *, overwrite: bool = False
) -> list[Path]:
    """Write one run's rows to Parquet files in `out_dir` and return their paths.

    Files: runs.parquet (the run's row), task_results.parquet (every attempt), steps.parquet
    and latest_task_results.parquet (the final attempt of each task and trial; `trial` is a
    column of both result files). `source` is an open
    `ResultStore` or the path of its DuckDB file. `out_dir` is created when missing. Existing
    files are an error (nothing is written) unless `overwrite=True`. Each file is written under
    a temporary name and renamed, so an interrupted export never leaves a truncated file.

    Raises `UnknownRunError` when the run is not in the database, `ExportError` for an unusable
    output directory or existing files.
    """
    if not isinstance(run_id, str) or not run_id:
        raise ExportError(f"run_id must be a non-empty string, got {run_id!r}")
    directory = Path(out_dir).expanduser().resolve()
    targets = [directory / name for name in EXPORTS]
    if directory.exists() and not directory.is_dir():
        raise ExportError(f"{directory}: output directory is a file")
    existing = [t for t in targets if t.exists()]
    if existing and not overwrite:
        raise ExportFilesExist(f"{directory}: {', '.join(t.name for t in existing)} already exist(s)", replaced="them")
    with results_connection(source, [run_id], with_steps=True) as conn:
        # Checked before creating anything, so a typo leaves no empty directory behind.
        require_runs(conn, [run_id], source_path(source))
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ExportError(f"{directory}: cannot create the output directory: {exc}") from exc
        for target, query in zip(targets, EXPORTS.values()):
            _copy(conn, query, run_id, target)
    return targets


def _copy(conn: duckdb.DuckDBPyConnection, query: str, run_id: str, target: Path) -> None:
    """COPY one query's rows (run id bound as a parameter) to `target`, via a temporary file."""
    partial = temporary_beside(target)  # two exports into one folder at once each write their own
    statement = f"COPY ({query}) TO {sql_string_literal(str(partial))} (FORMAT parquet)"
    try:
        conn.execute(statement, [run_id])
        os.replace(partial, target)
    except (duckdb.Error, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise ExportError(f"{target}: cannot write the export of run {run_id!r}: {exc}") from exc
