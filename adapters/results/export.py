"""Exporting one run to Parquet, written by DuckDB itself (no pyarrow).

    export_run_parquet(source, run_id, out_dir) -> [runs.parquet, task_results.parquet,
                                                    steps.parquet, latest_task_results.parquet]

The files hold exactly the DuckDB columns (see adapters/store/duckdb_store.py); JSON columns
stay JSON (Parquet strings with the JSON logical type), timestamps stay UTC. Each file carries
Parquet key-value metadata naming this product and the export (`PARQUET_MARKER`), so
`overwrite` replaces only files an earlier export wrote: a file of that name that is not one
(no marker, and not an earlier export's DuckDB-written file with a run_id column) is refused.
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


# Written into every exported file's key-value metadata; `overwrite` checks it.
PARQUET_MARKER = {"producer": "waa-arena", "kind": "run-parquet"}


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
    files are an error (nothing is written) unless `overwrite=True`, and even then unless each is
    a file an earlier export wrote (`_not_an_export`). Each file is written under
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
        for target in existing:
            problem = _not_an_export(conn, target)
            if problem is not None:
                raise ExportError(f"{directory}: {target.name} was not written by an export of this product "
                                  f"({problem}); overwriting replaces only those, so give another directory")
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ExportError(f"{directory}: cannot create the output directory: {exc}") from exc
        for target, query in zip(targets, EXPORTS.values()):
            _copy(conn, query, run_id, target)
    return targets


def _not_an_export(conn: duckdb.DuckDBPyConnection, target: Path) -> str | None:
    """Why the existing `target` is not a file an export of this product wrote, or None.

    Its Parquet metadata is read by DuckDB, which takes the name as a glob pattern: rows are
    kept only for the exact file, so a name with glob characters that matches others is not
    judged by them (no rows: refused). Files of exports from before the marker are DuckDB's own
    Parquet with a run_id column."""
    if not target.is_file():
        return "not a file"
    name = str(target)
    try:
        marker = dict(conn.execute(
            "SELECT decode(key), decode(value) FROM parquet_kv_metadata(?) WHERE file_name = ?", [name, name]
        ).fetchall())
        if marker.items() >= PARQUET_MARKER.items():
            return None
        made_by = conn.execute("SELECT created_by FROM parquet_file_metadata(?) WHERE file_name = ?",
                               [name, name]).fetchone()
        columns = {row[0] for row in conn.execute(
            "SELECT name FROM parquet_schema(?) WHERE file_name = ?", [name, name]).fetchall()}
    except (duckdb.Error, UnicodeDecodeError) as exc:
        return f"its Parquet metadata cannot be read: {str(exc).splitlines()[0][:160]}"
    if made_by is None or not str(made_by[0] or "").startswith("DuckDB") or "run_id" not in columns:
        return f"no {PARQUET_MARKER['producer']} marker in its metadata"
    return None


def _copy(conn: duckdb.DuckDBPyConnection, query: str, run_id: str, target: Path) -> None:
    """COPY one query's rows (run id bound as a parameter) to `target`, via a temporary file."""
    partial = temporary_beside(target)  # two exports into one folder at once each write their own
    marker = ", ".join(f"{key}: {sql_string_literal(value)}" for key, value in PARQUET_MARKER.items())
    statement = f"COPY ({query}) TO {sql_string_literal(str(partial))} (FORMAT parquet, KV_METADATA {{{marker}}})"
    try:
        conn.execute(statement, [run_id])
        os.replace(partial, target)
    except (duckdb.Error, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise ExportError(f"{target}: cannot write the export of run {run_id!r}: {exc}") from exc
