"""`arena sql` cannot change the store or write files, on a DuckDB file and on the team store
(a real PostgreSQL server): whatever the query, the rows stay and no file appears."""

from __future__ import annotations

import datetime as dt
import urllib.parse
from pathlib import Path

import pytest

from adapters.store import ResultStore, RunInfo
from adapters.store.postgres import leading_keyword
from flows.cli import main

PLANTED = Path("/tmp/arena-sql-planted.csv")


@pytest.fixture(params=["duckdb", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A store holding one completed run, as `--db` names it."""
    if request.param == "duckdb":
        location = str(tmp_path / "arena.duckdb")
    else:
        parts = urllib.parse.urlsplit(request.getfixturevalue("postgres_url"))
        monkeypatch.setenv("PGPASSWORD", parts.password or "")
        location = urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}@{parts.hostname}:{parts.port}"))
    with ResultStore(location) as result_store:
        result_store.start_run(RunInfo(run_id="r1", started_at=dt.datetime(2026, 11, 25), status="completed",
                                       agent="scripted", suite="bundled", suite_hash="h", task_count=1, pool_size=1,
                                       provider="local", reset_level="snapshot", environment="local-simulation"))
    return location


def _status(location: str) -> str:
    with ResultStore(location, read_only=True) as result_store:
        run = result_store.get_run("r1")
    assert run is not None
    return run.status


WRITES = [
    "UPDATE runs SET status = 'tampered'",
    "BEGIN READ WRITE; UPDATE runs SET status = 'tampered'; COMMIT",
    "SELECT 1; UPDATE runs SET status = 'tampered'",
    "WITH changed AS (UPDATE runs SET status = 'tampered' RETURNING 1) SELECT * FROM changed",
    "/* a comment */ -- and another\n DELETE FROM runs",
    "EXPLAIN ANALYZE UPDATE runs SET status = 'tampered'",
    f"COPY (SELECT * FROM runs) TO '{PLANTED}'",
    f"COPY runs TO '{PLANTED}'",
    "CREATE TABLE planted (x INTEGER)",
    "SET default_transaction_read_only = off",
]


@pytest.mark.parametrize("query", WRITES)
def test_a_query_cannot_change_the_store_or_write_files(store: str, query: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    PLANTED.unlink(missing_ok=True)
    code = main(["sql", query, "--db", store])
    captured = capsys.readouterr()
    assert code == 2, captured.out
    assert captured.err.startswith("arena: error:") and len(captured.err.strip().splitlines()) == 1
    assert _status(store) == "completed" and not PLANTED.exists()


def test_duckdb_reads_no_other_files(tmp_path: Path, store: str, capsys: pytest.CaptureFixture[str]) -> None:
    if "://" in store:
        pytest.skip("file functions are DuckDB's")
    for query in ("SELECT * FROM read_csv('/etc/passwd')", f"ATTACH '{tmp_path / 'other.duckdb'}'",
                  "SET enable_external_access = true"):
        assert main(["sql", query, "--db", store]) == 2
        assert "root:" not in capsys.readouterr().out
    assert not (tmp_path / "other.duckdb").exists()


def test_queries_still_work(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", "SELECT run_id, status FROM runs", "--db", store]) == 0
    assert "r1" in capsys.readouterr().out
    assert main(["sql", "-- which runs\nWITH r AS (SELECT * FROM runs) SELECT count(*) AS n FROM r", "--db", store]) == 0
    assert "1" in capsys.readouterr().out


@pytest.mark.parametrize("sql, keyword", [
    ("select 1", "select"), ("  /* x /* nested */ y */ -- c\n  UPDATE t", "update"), ("(SELECT 1)", "select"),
    ("", ""), ("-- only a comment", ""), ("WITH x AS (SELECT 1) SELECT * FROM x", "with"),
])
def test_leading_keyword_skips_comments(sql: str, keyword: str) -> None:
    assert leading_keyword(sql) == keyword
