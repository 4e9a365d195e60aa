"""Where a report, comparison or export reads results from: an open store, a DuckDB file or a
PostgreSQL URL (the team store).

One way to open a results database for reading, and one check that the runs asked for exist,
shared by metrics, comparison, export and the CLI.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import duckdb

from adapters.store import connections
from adapters.store.postgres import is_server_location, redact
from adapters.store.duckdb_store import ResultStore, StoreError, check_file_intact, open_error


class UnknownRunError(StoreError):
    """A run id asked for is not in the results database; the message names it and the file."""


ResultsSource = ResultStore | str | Path
"""Where results are: an open `ResultStore`, the path of its DuckDB file, or a PostgreSQL URL."""


READ_WAIT_SECONDS = 60.0
"""How long a read waits for another process's write (writes take tens of milliseconds)."""


@contextlib.contextmanager
def results_connection(
    source: ResultsSource, run_ids: Iterable[str] = (), *, with_steps: bool = False, private: bool = False
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only DuckDB connection to the results in `source`, closed on exit.

    A path must be an existing file (a missing or mistyped one is an error, never a new empty
    database). The connection waits its turn while another process (a run) is writing, and
    sees everything committed so far by any process; holding it briefly keeps writers moving.
    For a PostgreSQL store the connection holds every `runs` row and the results of `run_ids`,
    and their steps when `with_steps` (`ResultStore.reading`): pass what the queries read.
    A file's connection is `private` when its settings must reach no other connection of this
    process (`connections.connect`).
    """
    if isinstance(source, ResultStore):
        with source.reading(run_ids, with_steps=with_steps) as conn:
            yield conn
        return
    if not isinstance(source, (str, Path)):
        raise TypeError(f"source must be a ResultStore, a DuckDB file path or a PostgreSQL URL, got {type(source).__name__}")
    if is_server_location(source):
        with ResultStore(str(source), read_only=True) as store, store.reading(run_ids, with_steps=with_steps) as conn:
            yield conn
        return
    path = Path(source).expanduser().resolve()
    if not path.is_file():
        raise StoreError(f"{path}: results database not found")
    with contextlib.ExitStack() as stack:
        try:
            conn = stack.enter_context(
                connections.connect(path, read_only=True, wait_seconds=READ_WAIT_SECONDS, private=private)
            )
        except connections.StoreBusyError as exc:
            raise StoreError(str(exc)) from exc
        except duckdb.Error as exc:
            raise open_error(str(path), exc) from exc
        check_file_intact(conn, path, str(path))
        yield conn


def require_runs(conn: duckdb.DuckDBPyConnection, run_ids: Iterable[str], where: Path | str) -> None:
    """Raise `UnknownRunError` naming every run id of `run_ids` that is not in the runs table."""
    try:
        missing = [
            run_id
            for run_id in dict.fromkeys(run_ids)
            if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone() is None
        ]
    except duckdb.CatalogException as exc:
        raise StoreError(f"{where}: not a results database (no runs table): {exc}") from exc
    if missing:
        names = ", ".join(repr(r) for r in missing)
        raise UnknownRunError(f"{where}: unknown run{'s' if len(missing) > 1 else ''} {names}")


def source_path(source: ResultsSource) -> Path | str:
    """Where `source`'s results are, for messages: the DuckDB file's absolute path or the
    PostgreSQL URL without its password."""
    if isinstance(source, ResultStore):
        return source.location
    if is_server_location(source):
        return redact(str(source))
    return Path(source).expanduser().resolve()


def latest_completed_run(
    source: ResultsSource, *, baseline: str, agent: str, model: str | None, suite_hash: str, provider: str,
    agent_config_hash: str, exclude_run_id: str = "",
) -> str | None:
    """The most recently finished completed run of baseline `baseline` that is still what the
    baseline is: the same agent, model, suite (content hash), provider and agent configuration
    (hash). Other than `exclude_run_id`; None when there is none."""
    with results_connection(source) as conn:
        row = conn.execute(
            """
            SELECT run_id FROM runs
            WHERE status = 'completed' AND baseline = ? AND agent = ? AND model_id IS NOT DISTINCT FROM ?
              AND suite_hash = ? AND provider = ? AND agent_config_hash = ? AND run_id <> ?
            ORDER BY finished_at DESC NULLS LAST LIMIT 1
            """,
            [baseline, agent, model, suite_hash, provider, agent_config_hash, exclude_run_id],
        ).fetchone()
    return row[0] if row else None


def stored_selection(source: ResultsSource, run_id: str) -> list[str] | None:
    """The task ids run `run_id` selected, or None (no such run, a run recorded before
    selections were stored, or a database another process holds for writing: the flow checks
    again when it starts)."""
    try:
        with results_connection(source) as conn:
            row = conn.execute("SELECT selected_task_ids FROM runs WHERE run_id = ?", [run_id]).fetchone()
    except (StoreError, duckdb.Error):
        return None
    return None if row is None or row[0] is None else list(json.loads(row[0]))


def latest_run(source: ResultsSource) -> str | None:
    """The id of the most recently started run, or None when there is none."""
    with results_connection(source) as conn:
        row = conn.execute("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1").fetchone()
    return None if row is None else str(row[0])
