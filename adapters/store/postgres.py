"""The team store's engine: the same tables and views in a PostgreSQL database, via psycopg.

Several controllers and shard hosts write one PostgreSQL database at once (PostgreSQL takes
care of concurrent writers; each result is one transaction). The store's SQL is written once,
in DuckDB's dialect with `?` parameters; `PgConnection` passes it to PostgreSQL with `%s`
parameters, and `ddl` translates the few types that are spelled differently.

Reports, comparisons and exports run DuckDB SQL (window functions with QUALIFY, COPY to
Parquet). For a PostgreSQL store they read from an in-memory DuckDB database holding the `runs`
table and the results (and, when they need them, the steps) of the runs they ask for
(`snapshot`): one run is a few hundred results and a few thousand steps, copied in tens of
milliseconds.

psycopg is an optional dependency (the `team` extra); a PostgreSQL location without it is a
clear error.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import duckdb

from adapters.secrets import redact_url
from adapters.store.errors import StoreError, StoreUnavailable
from adapters.store_location import is_server_location  # noqa: F401 - part of this module's interface

# Held while a store creates or upgrades the schema, so two controllers starting at once do not
# race on CREATE TABLE (PostgreSQL raises a unique violation on its catalog when they do).
_SCHEMA_LOCK_KEY = 0x5741_4121

# The last attempt of each task: as an anti-join on the primary key it took 73 ms over 100,000
# results where DISTINCT ON took 128 ms (bench/results_queries.py data, PostgreSQL 15).
VIEW_DDL = """
    CREATE OR REPLACE VIEW latest_task_results AS
    SELECT * FROM task_results t
    WHERE NOT EXISTS (
        SELECT 1 FROM task_results later
        WHERE later.run_id = t.run_id AND later.task_id = t.task_id AND later.trial = t.trial
          AND later.attempt > t.attempt
    )
"""


def redact(url: str) -> str:
    """`url` with its password (in the user part or the query) replaced by ***, for messages."""
    return redact_url(url)


def ddl(statement: str) -> str:
    """A DuckDB DDL statement of the store in PostgreSQL's spelling."""
    return re.sub(r"\bDOUBLE\b", "DOUBLE PRECISION", statement)


def _placeholders(sql: str) -> str:
    # The store's SQL has no literal '?' or '%'; a '%' is doubled anyway so it cannot be taken
    # for a parameter.
    return sql.replace("%", "%%").replace("?", "%s")


class PgConnection:
    """A psycopg connection that accepts the store's `?`-parameter SQL (autocommit; explicit
    BEGIN/COMMIT where the store groups statements)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        """Run one statement; returns the cursor (fetchone, fetchall, description)."""
        return self._conn.execute(_placeholders(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement for each row of parameters."""
        with self._conn.cursor() as cursor:
            cursor.executemany(_placeholders(sql), list(rows))

    @property
    def broken(self) -> bool:
        """The server connection is lost; a new one is needed."""
        return bool(self._conn.closed or self._conn.broken)

    def close(self) -> None:
        """Close the server connection."""
        self._conn.close()

    def copy_rows(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
        """Bulk-load rows with COPY (many times faster than INSERTs); the number of rows."""
        count = 0
        with self._conn.cursor() as cursor:
            with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
                    count += 1
        return count

    def lock_schema(self) -> None:
        """Take the schema lock for the current transaction."""
        self._conn.execute("SELECT pg_advisory_xact_lock(%s)", [_SCHEMA_LOCK_KEY])

    def table_exists(self, name: str) -> bool:
        """Whether the table exists in the connection's schema."""
        row = self._conn.execute("SELECT to_regclass(%s) IS NOT NULL", [name]).fetchone()
        return bool(row[0])


def connect(url: str, *, connect_timeout: float = 10.0) -> PgConnection:
    """A connection to the PostgreSQL database at `url`; `StoreError` (password hidden) when
    psycopg is missing or the server cannot be reached or refuses the login."""
    try:
        import psycopg
    except ImportError as exc:
        raise StoreError(
            f"{redact(url)}: a PostgreSQL results store needs psycopg; install the team extra "
            "(pip install 'waa-arena[team]')"
        ) from exc
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(connect_timeout)))
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise StoreUnavailable(f"{redact(url)}: cannot connect to the results store: {reason}") from exc
    return PgConnection(conn)


# What `arena sql` runs on the team store: queries, never commands (COPY, SET, BEGIN, DO ...).
READ_STATEMENTS = frozenset({"select", "with", "values", "table", "explain", "show"})


def read_only_query(url: str, sql: str) -> tuple[list[str], list[tuple[Any, ...]]] | None:
    """Run one query (PostgreSQL's dialect) that cannot change anything: column names and rows,
    or None for a statement without rows. ValueError naming the problem when the query is not
    one read-only statement, or with the server's first line when it fails.

    Three locks, each enough for most attempts: the statement must start with a query keyword
    (`READ_STATEMENTS`: no COPY, SET, BEGIN or DO); it is sent as one prepared statement, so a
    second statement after a ';' cannot ride along; and it runs inside a READ ONLY transaction
    that is rolled back, so a data-modifying CTE or EXPLAIN ANALYZE of an UPDATE is refused by
    the server itself."""
    import psycopg

    keyword = leading_keyword(sql)
    if keyword not in READ_STATEMENTS:
        raise ValueError(f"arena sql runs queries only ({', '.join(sorted(READ_STATEMENTS))}); "
                         f"{(keyword or 'an empty statement').upper()} is not one")
    conn = connect(url)
    raw = conn._conn
    try:
        raw.execute("BEGIN TRANSACTION READ ONLY")
        try:
            cursor = raw.execute(sql, prepare=True)  # prepared: exactly one statement
        except psycopg.Error as exc:
            raise ValueError(f"query failed: {str(exc).strip().splitlines()[0]}") from exc
        if cursor.description is None:
            return None
        return [column.name for column in cursor.description], cursor.fetchall()
    finally:
        with contextlib.suppress(Exception):
            raw.execute("ROLLBACK")
        conn.close()


def leading_keyword(sql: str) -> str:
    """The first word of `sql` after whitespace, -- and /* */ comments (nested, as PostgreSQL
    reads them), lowercased; "" when there is none."""
    position, depth = 0, 0
    while position < len(sql):
        if depth:
            if sql.startswith("*/", position):
                depth, position = depth - 1, position + 2
            elif sql.startswith("/*", position):
                depth, position = depth + 1, position + 2
            else:
                position += 1
        elif sql[position].isspace() or sql[position] == "(":
            position += 1
        elif sql.startswith("--", position):
            end = sql.find("\n", position)
            position = len(sql) if end < 0 else end + 1
        elif sql.startswith("/*", position):
            depth, position = 1, position + 2
        else:
            match = re.match(r"[A-Za-z_]+", sql[position:])
            return match.group(0).lower() if match else sql[position]
    return ""


def is_engine_error(exc: BaseException) -> bool:
    """True for psycopg's errors (a failed statement, a lost server)."""
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(exc, psycopg.Error)


def snapshot(
    conn: PgConnection, ddl_statements: Sequence[str], run_ids: Iterable[str], *, with_steps: bool
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB database with the store's tables and views (`ddl_statements`, DuckDB
    spelling), holding every `runs` row and the task results of `run_ids`, and their steps when
    `with_steps` (most of the copying: about 20 steps per result)."""
    wanted = list(dict.fromkeys(run_ids))
    local = duckdb.connect(":memory:")
    for statement in ddl_statements:
        local.execute(statement)
    _copy_rows(conn, local, "runs", "SELECT * FROM runs", [])
    if wanted:
        where = "WHERE run_id = ANY(?)"
        _copy_rows(conn, local, "task_results", f"SELECT * FROM task_results {where}", [wanted])
        if with_steps:
            _copy_rows(conn, local, "steps", f"SELECT * FROM steps {where}", [wanted])
    return local


def _copy_rows(source: PgConnection, target: duckdb.DuckDBPyConnection, table: str, sql: str, params: list[Any]) -> None:
    """Copy the rows of one query on PostgreSQL into the same-named DuckDB table.

    Column by column, as typed lists unnested in one INSERT: DuckDB's executemany takes about
    1.4 s for a run's 3,000 steps, this about 15 ms.
    """
    cursor = source.execute(sql, params)
    names = [column.name for column in cursor.description]
    rows = cursor.fetchall()
    if not rows:
        return
    types = dict(
        target.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ?", [table]
        ).fetchall()
    )
    columns = [list(values) for values in zip(*rows)]
    selects = []
    for index, name in enumerate(names):
        kind = types[name]
        if kind == "JSON":
            columns[index] = [_json_text(value) for value in columns[index]]
            kind = "VARCHAR"
        selects.append(f"unnest(?::{kind}[])")
    target.execute(f"INSERT INTO {table} ({', '.join(names)}) SELECT {', '.join(selects)}", columns)


def _json_text(value: Any) -> Any:
    # psycopg decodes JSON columns to Python values; DuckDB's JSON columns take the text.
    return None if value is None else json.dumps(value)
