"""`arena sql` on the team store has no side effects (issue 63), on a real PostgreSQL server
(tests/pg_server.py; its `arena` role is a superuser, the worst case):

- each attack found from outside is refused in one line naming the function or relation, and
  the other connection (a run's) stays connected, the schema lock stays free, no file is read;
- the documented queries (docs/results.md, in PostgreSQL's spelling as docs/team-store.md says)
  still run and answer as on a DuckDB file;
- a long query ends at the statement timeout, a query waiting for a lock at the lock timeout,
  each with one line;
- the run's own schema lock waits with a limit and names who holds it.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import logging
import os
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkResult, OutcomeKind, StepRecord
from adapters.store import ResultStore, RunInfo
from adapters.store.errors import StoreError
from adapters.store.pg_query_guard import ALLOWED_FUNCTIONS, STORE_RELATIONS, QueryRefused, check_query
from adapters.store.postgres import _SCHEMA_LOCK_KEY, connect, connection_label, set_connection_label
from flows.cli import main

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DOC = ROOT / "docs" / "results.md"


@pytest.fixture()
def team(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh team store's URL without its password (PGPASSWORD holds it), tables created."""
    parts = urllib.parse.urlsplit(postgres_url)
    monkeypatch.setenv("PGPASSWORD", parts.password or "")
    bare = urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}@{parts.hostname}:{parts.port}"))
    ResultStore(bare).close()
    return bare


def _admin(url: str) -> psycopg.Connection:
    """A connection of the test's own (the superuser), outside `arena`."""
    return psycopg.connect(url, autocommit=True, application_name="test admin")


@contextlib.contextmanager
def _run_connection(url: str) -> Iterator[psycopg.Connection]:
    """Another connection to the store, as a running run holds one."""
    with psycopg.connect(url, autocommit=True, application_name="arena run (victim)") as conn:
        yield conn


def _still_connected(conn: psycopg.Connection, pid: int) -> bool:
    try:
        return conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
    except psycopg.Error:
        return False


def _refused(capsys: pytest.CaptureFixture[str], db: str, query: str) -> str:
    """`arena sql QUERY` on `db` fails with one line; that line."""
    code = main(["sql", query, "--db", db])
    captured = capsys.readouterr()
    assert code == 2, (query, captured.out)
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("arena: error:"), captured.err
    return lines[0]


# --- the attacks of issue 63 ----------------------------------------------------------------------


def _with_password(bare: str) -> str:
    """The URL with PGPASSWORD in it, for the test's own connections."""
    return bare.replace("@", f":{urllib.parse.quote(os.environ['PGPASSWORD'])}@", 1)


def _backends(url: str, application: str) -> list[int]:
    """The server pids of the connections named `application`."""
    with _admin(_with_password(url)) as admin:
        return [row[0] for row in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [application]).fetchall()]


def test_ending_another_connection_is_refused_and_the_run_keeps_its_connection(
    team: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store of a run under way keeps its one server connection (the same backend) through
    every attempt to end it."""
    set_connection_label("arena run victim-run")
    try:
        store = ResultStore(team)
    finally:
        set_connection_label(None)
    with store:
        store.start_run(RunInfo(run_id="victim-run", agent="scripted", suite="bundled", task_count=1))
        [pid] = _backends(team, "arena run victim-run")
        attacks = {
            f"SELECT pg_terminate_backend({pid})": "pg_terminate_backend",
            f"SELECT pg_cancel_backend({pid}) FROM runs": "pg_cancel_backend",
            f"SELECT * FROM runs, LATERAL (SELECT pg_terminate_backend({pid})) x": "pg_terminate_backend",
            f"WITH x AS (SELECT pg_catalog.pg_terminate_backend({pid})) SELECT * FROM x": "pg_terminate_backend",
            f"EXPLAIN ANALYZE SELECT pg_terminate_backend({pid})": "pg_terminate_backend",
            f"SELECT run_id FROM runs ORDER BY pg_terminate_backend({pid})": "pg_terminate_backend",
            # Functions that run a query given as text, carrying the forbidden call past any
            # check of the query's own text.
            f"SELECT query_to_xml('select pg_terminate_backend({pid})', true, true, '')": "query_to_xml",
            f"SELECT * FROM ts_stat('select to_tsvector(pg_terminate_backend({pid})::text)')": "ts_stat",
            f"SELECT xpath('/x', query_to_xml('select pg_terminate_backend({pid})', true, true, ''))": "xpath",
        }
        for query, function in attacks.items():
            line = _refused(capsys, team, query)
            assert f"function {function}()" in line, line
            if function in ("pg_terminate_backend", "pg_cancel_backend"):
                assert "it signals other connections to the store" in line
            if function in ("query_to_xml", "ts_stat"):
                assert "it runs a query given as a string" in line
        store.finish_run("victim-run", "completed")
        assert _backends(team, "arena run victim-run") == [pid]  # the same connection, never replaced
        assert store.get_run("victim-run").status == "completed"


def test_the_schema_lock_cannot_be_taken_or_held_by_a_query(team: str, capsys: pytest.CaptureFixture[str]) -> None:
    for query in (f"SELECT pg_advisory_lock({_SCHEMA_LOCK_KEY}), pg_sleep(2)",
                  f"SELECT pg_try_advisory_xact_lock({_SCHEMA_LOCK_KEY})",
                  f"SELECT pg_catalog.pg_advisory_lock_shared({_SCHEMA_LOCK_KEY})",
                  "SELECT pg_sleep(2)", "SELECT pg_sleep_for('2 seconds')"):
        line = _refused(capsys, team, query)
        assert "takes a lock" in line or "sleeps" in line, line
    with _admin(_with_password(team)) as other:
        assert other.execute("SELECT pg_try_advisory_lock(%s)", [_SCHEMA_LOCK_KEY]).fetchone()[0]  # it is free
        other.execute("SELECT pg_advisory_unlock(%s)", [_SCHEMA_LOCK_KEY])


def test_server_files_stay_unread_even_for_a_superuser(team: str, capsys: pytest.CaptureFixture[str]) -> None:
    with _admin(_with_password(team)) as admin:
        assert admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]
    for query in ("SELECT pg_read_file('/etc/passwd')", "SELECT pg_catalog.pg_read_binary_file('/etc/passwd')",
                  "SELECT * FROM pg_ls_dir('/etc')", "SELECT pg_stat_file('/etc/passwd')",
                  "SELECT convert_from(pg_read_binary_file('/etc/passwd'), 'UTF8')",
                  "SELECT lo_import('/etc/passwd')"):
        line = _refused(capsys, team, query)
        assert "root:" not in line and re.search(r"function (pg_\w+|lo_import)\(\)", line), line
        assert "reads files on the database server" in line, line


def test_functions_operators_and_relations_outside_the_store_are_refused(
    team: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A function of another schema, and one of the store's schema that an unqualified built-in
    name (or an operator) would resolve to: each would end the run's connection; each is refused
    before it is called."""
    with _run_connection(_with_password(team)) as run, _admin(_with_password(team)) as admin:
        pid = run.info.backend_pid
        kill = f"SELECT pg_terminate_backend({pid})::int"
        admin.execute("CREATE SCHEMA evil")
        admin.execute(f"CREATE FUNCTION evil.kill() RETURNS int LANGUAGE sql AS '{kill}'")
        admin.execute(f"CREATE FUNCTION public.lower(integer) RETURNS int LANGUAGE sql AS '{kill}'")
        admin.execute(f"CREATE FUNCTION public.kill_op(integer, integer) RETURNS int LANGUAGE sql AS '{kill}'")
        admin.execute("CREATE OPERATOR public.=== (LEFTARG = integer, RIGHTARG = integer, FUNCTION = public.kill_op)")
        admin.execute(f"CREATE FUNCTION public.evil(runs) RETURNS int LANGUAGE sql AS '{kill}'")
        admin.execute("CREATE TABLE evil.secrets (x text)")
        expected = {
            "SELECT evil.kill()": "function evil.kill: only built-ins run",
            "SELECT lower(1)": "function public.lower exists beside the built-in",
            "SELECT 1 === 2": "operator public.=== exists beside the built-in",
            # r.evil is evil(r) (functional notation) when runs has no such column.
            "SELECT r.evil FROM runs r": "function public.evil exists",
            "SELECT (r).evil FROM runs r": "function public.evil exists",
            "SELECT 1 OPERATOR(public.===) 2": "operator public.===: only built-ins run",
            "SELECT * FROM evil.secrets": "relation evil.secrets",
            "SELECT * FROM pg_authid": "relation pg_authid",
            "SELECT query FROM pg_stat_activity": "relation pg_stat_activity",
            # A CTE's name is in scope only where PostgreSQL says: out of it, it is the catalog.
            "WITH a AS (SELECT * FROM pg_authid), pg_authid AS (SELECT 1) SELECT * FROM a": "relation pg_authid",
            "SELECT * FROM (WITH pg_authid AS (SELECT 1) SELECT 1) x, pg_authid": "relation pg_authid",
            "SELECT 'runs'::regclass": "type regclass",
            "SELECT * FROM runs FOR UPDATE": "FOR UPDATE/SHARE",
            "SELECT * FROM runs FOR SHARE": "FOR UPDATE/SHARE",
            "SELECT * INTO copied FROM runs": "SELECT INTO",
        }
        for query, words in expected.items():
            line = _refused(capsys, team, query)
            assert words in line, (query, line)
        # The built-in, named as such, still runs: the check is about what a name resolves to.
        assert main(["sql", "SELECT pg_catalog.lower('ABC') AS l", "--db", team]) == 0
        assert "abc" in capsys.readouterr().out
        assert _still_connected(run, pid)


def test_string_literals_are_read_by_the_server_as_the_check_read_them(
    team: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database set to standard_conforming_strings = off reads 'a\\'' differently from the
    parser the check uses: what the check took for text would be code there. The query runs
    with the setting on, so the text stays text."""
    database = urllib.parse.urlsplit(team).path[1:]
    with _admin(_with_password(team)) as admin:
        admin.execute(f"ALTER DATABASE {database} SET standard_conforming_strings = off")
    with _run_connection(_with_password(team)) as run:
        pid = run.info.backend_pid
        assert main(["sql", f"SELECT 'a\\'', pg_terminate_backend({pid}) --'", "--db", team]) == 0
        assert "pg_terminate_backend" in capsys.readouterr().out  # returned as the text it is
        assert _still_connected(run, pid)


@pytest.mark.parametrize("query, words", [
    ("SHOW data_directory", "SHOW is not one"),
    ("SELECT 1; SELECT 2", "exactly one statement"),
    ("WITH d AS (DELETE FROM runs RETURNING *) SELECT * FROM d", "DELETE"),
    ("EXPLAIN (ANALYZE) DELETE FROM runs", "DELETE is not one"),
    ("SELECT xmlparse(document '<a/>')", "XmlExpr"),
    ("SELECT set_config('statement_timeout', '0', true)", "server settings"),
    ("SELECT current_setting('data_directory')", "server settings"),
    ("SELECT nextval('x')", "sequences"),
    ("SELECT * FROM runs TABLESAMPLE system_time(1000)", "TABLESAMPLE system_time"),
    ("SELECT FROM WHERE", "does not parse"),
    pytest.param("SELECT " + "+".join(["1"] * 20000), "nested too deeply to check", id="deeply-nested"),
])
def test_other_statements_and_functions_are_refused_by_name(
    team: str, query: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert words in _refused(capsys, team, query)


# --- what still works ----------------------------------------------------------------------------


def _documented_queries() -> list[tuple[str, str]]:
    """(name, sql) of docs/results.md's "Querying results" queries and its first example."""
    text = RESULTS_DOC.read_text()
    marked = re.findall(r"<!-- query: ([\w-]+) -->\s*\n```sql\n(.*?)```", text, re.S)
    first = re.search(r"```sql\n-- \.venv/bin/arena sql.*?\n(.*?)```", text, re.S)
    assert marked and first, "docs/results.md lost its queries"
    return [("latest-by-domain", first.group(1)), *marked]


def _matching(text: str, start: int) -> int:
    """The index just after the parenthesis that closes the one at `start`."""
    depth = 0
    for index in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return index + 1
    raise ValueError("unbalanced parentheses")


def _top_level_comma(text: str) -> int:
    depth = 0
    for index in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[index], 0)
        if text[index] == "," and depth == 0:
            return index
    raise ValueError("no comma")


def to_postgres(sql: str) -> str:
    """A DuckDB query of docs/results.md in PostgreSQL's spelling, by the three rules
    docs/team-store.md gives: GROUP BY ALL, count_if, round of a DOUBLE."""
    def round_numeric(inner: str) -> str:
        comma = _top_level_comma(inner)
        return f"round(({inner[:comma]})::numeric{inner[comma:]})"

    for function, rewrite in (("count_if(", lambda inner: f"count(*) FILTER (WHERE {inner})"),
                              ("round(", round_numeric)):
        position = 0
        while (found := sql.find(function, position)) >= 0:
            end = _matching(sql, found + len(function) - 1)
            replaced = rewrite(sql[found + len(function): end - 1])
            sql = sql[:found] + replaced + sql[end:]
            position = found + len(replaced)
    while (found := sql.find("GROUP BY ALL")) >= 0:
        # the positions of the leading select items without a call, in that GROUP BY's own SELECT
        select = re.search(r"SELECT(.*?)\bFROM\b", sql[sql[:found].rfind("SELECT"):found], re.S).group(1)
        plain = 0
        for item in select.split(","):
            if "(" in item:
                break
            plain += 1
        positions = ", ".join(str(k + 1) for k in range(plain))
        sql = sql[:found] + f"GROUP BY {positions}" + sql[found + len("GROUP BY ALL"):]
    return sql.strip().rstrip(";")


def _fill(location: Path | str) -> None:
    """Two small runs under the ids the documented queries name, the same in any store."""
    for run_id, agent, solved, day in (("nightly-scripted", "scripted", {"a", "b", "c"}, 1),
                                       ("nightly-random", "random", {"a"}, 2)):
        with ResultStore(location) as store:
            store.start_run(RunInfo(run_id=run_id, agent=agent, suite="bundled", task_count=3,
                                    started_at=dt.datetime(2026, 12, day)))
            for task, domain in (("a", "notepad"), ("b", "notepad"), ("c", "settings"),
                                 ("notepad-append-line", "notepad")):
                ok = task in solved or (agent == "scripted" and task == "notepad-append-line")
                steps = [StepRecord(index=i, action=BenchmarkAction(type=ActionType.CLICK, x=i, y=i),
                                    screenshot_path=f"shots/{task}-{i}.png", agent_seconds=0.5, env_seconds=0.25)
                         for i in range(2)]
                store.record_result(run_id, BenchmarkResult(
                    task_id=task, domain=domain, outcome=OutcomeKind.SUCCESS if ok else OutcomeKind.AGENT_FAILURE,
                    success=ok, score=1.0 if ok else 0.25, num_steps=2, steps=steps, total_time_seconds=3.0,
                    cost_usd=0.01))
            store.finish_run(run_id, "completed")


def test_the_documented_queries_still_run_and_answer_as_on_a_duckdb_file(
    team: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "arena.duckdb"
    _fill(db)
    _fill(team)
    for name, sql in _documented_queries():
        assert main(["sql", sql, "--db", str(db), "--csv"]) == 0, name
        on_file = list(csv.reader(capsys.readouterr().out.splitlines()))
        code = main(["sql", to_postgres(sql), "--db", team, "--csv"])
        captured = capsys.readouterr()
        assert code == 0, (name, captured.err)
        on_server = list(csv.reader(captured.out.splitlines()))
        assert len(on_server) == len(on_file) > 1, (name, on_file, on_server)  # the header, and rows
        assert [row[0] for row in on_server] == [row[0] for row in on_file], name
    # docs/team-store.md's own and the usual analytic forms.
    for sql in ("SELECT run_id, avg(success::int) AS rate FROM latest_task_results GROUP BY 1 ORDER BY 1",
                "SELECT domain, percentile_cont(0.5) WITHIN GROUP (ORDER BY total_time_seconds) FROM task_results "
                "GROUP BY domain",
                "SELECT run_id, task_id, row_number() OVER (PARTITION BY run_id ORDER BY recorded_at) "
                "FROM task_results",
                "SELECT date_trunc('day', started_at), count(*) FILTER (WHERE status = 'completed') "
                "FROM runs GROUP BY 1",
                "SELECT s.action->>'type' AS kind, count(*) FROM steps s GROUP BY 1",
                "TABLE schema_version", "VALUES (1, 'a')",
                "EXPLAIN SELECT * FROM latest_task_results WHERE run_id = 'nightly-random'"):
        assert main(["sql", sql, "--db", team]) == 0, (sql, capsys.readouterr().err)
        assert "row" in capsys.readouterr().out


def test_the_rewrite_rules_of_the_doc() -> None:
    assert to_postgres("SELECT a, b, count_if(x AND (y)), round(avg(s), 3) FROM t GROUP BY ALL;") == (
        "SELECT a, b, count(*) FILTER (WHERE x AND (y)), round((avg(s))::numeric, 3) FROM t GROUP BY 1, 2")


def test_every_allowed_function_is_a_built_in_of_the_server(team: str) -> None:
    """The allow-list names functions of pg_catalog (a name that is not one would be whatever
    someone creates under it); a few are of servers newer than this one."""
    newer = {"any_value", "regexp_count", "regexp_instr", "regexp_like", "regexp_substr", "random_normal"}
    with _admin(_with_password(team)) as admin:
        built_in = {row[0] for row in admin.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'pg_catalog'::regnamespace").fetchall()}
        version = admin.info.server_version
    missing = ALLOWED_FUNCTIONS - built_in - {"extract", "overlaps"}  # grammar: extract is date_part before 14
    if version >= 160000:
        assert not missing, sorted(missing)
    else:
        assert missing <= newer, sorted(missing - newer)


def test_the_store_relations_are_exactly_what_a_new_store_creates(team: str) -> None:
    with _admin(_with_password(team)) as admin:
        created = {row[0] for row in admin.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall()}
    assert created == STORE_RELATIONS


# --- timeouts ---------------------------------------------------------------------------------------


def test_a_long_query_ends_at_the_statement_timeout_with_one_line(
    team: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ARENA_SQL_TIMEOUT_SECONDS", "1")
    line = _refused(capsys, team, "SELECT count(*) FROM generate_series(1, 100000000000)")
    assert "statement timeout of 1 s" in line and "ARENA_SQL_TIMEOUT_SECONDS" in line
    monkeypatch.setenv("ARENA_SQL_TIMEOUT_SECONDS", "soon")
    assert "ARENA_SQL_TIMEOUT_SECONDS must be a number of seconds, got 'soon'" in _refused(capsys, team, "TABLE runs")


def test_a_query_waiting_for_a_lock_ends_at_the_lock_timeout(
    team: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ARENA_SQL_TIMEOUT_SECONDS", "4")
    with psycopg.connect(_with_password(team)) as locker:  # a schema change under way
        locker.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        line = _refused(capsys, team, "SELECT count(*) FROM runs")
        locker.rollback()
    assert "waiting 2 s for a lock another connection holds" in line


def test_the_query_runs_read_only_under_its_limits_on_a_connection_of_its_own(
    team: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the session looks like to the query (read with current_setting, which the check
    itself refuses, so it is set aside here)."""
    import adapters.store.postgres as postgres
    from adapters.store.pg_query_guard import CheckedQuery

    monkeypatch.setattr(postgres, "check_query", lambda sql, relations: CheckedQuery())
    names = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout",
             "standard_conforming_strings", "transaction_read_only", "application_name")
    answer = postgres.read_only_query(
        team, "SELECT " + ", ".join(f"current_setting('{name}')" for name in names),
        postgres.QueryLimits(statement=7, lock=3, idle=5))
    assert answer is not None
    settings = dict(zip(names, answer[1][0]))
    assert settings | {"application_name": ""} == {
        "statement_timeout": "7s", "lock_timeout": "3s", "idle_in_transaction_session_timeout": "5s",
        "standard_conforming_strings": "on", "transaction_read_only": "on", "application_name": ""}
    assert settings["application_name"].startswith("arena sql (pid ")


# --- the run's own schema lock ------------------------------------------------------------------


@contextlib.contextmanager
def _holding_the_schema_lock(url: str) -> Iterator[int]:
    """Another connection that holds the schema lock, as a person's psql could; its pid."""
    with psycopg.connect(url, autocommit=True, application_name="psql (someone)") as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [_SCHEMA_LOCK_KEY])
        yield holder.info.backend_pid


def test_the_schema_lock_wait_names_the_holder_and_ends(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with _holding_the_schema_lock(postgres_url) as pid:
        conn = connect(postgres_url)
        try:
            conn.execute("BEGIN")
            with caplog.at_level(logging.WARNING, logger="adapters.store.postgres"), \
                    pytest.raises(StoreError) as refused:
                conn.lock_schema(wait_seconds=1.5, notice_seconds=0.5, poll_seconds=0.1)
            conn.execute("ROLLBACK")
        finally:
            conn.close()
    message = str(refused.value)
    assert f"held by server pid {pid} (role arena, application 'psql (someone)', from 127.0.0.1, idle since " in message
    assert f"SELECT pg_terminate_backend({pid})" in message and "arena-test-password" not in message
    notices = [r.getMessage() for r in caplog.records if "waiting for the schema lock" in r.getMessage()]
    assert len(notices) == 1 and f"server pid {pid}" in notices[0]
    # Once it is free, the lock is taken at once.
    conn = connect(postgres_url)
    try:
        conn.execute("BEGIN")
        conn.lock_schema(wait_seconds=1)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def test_a_run_refuses_in_one_line_while_someone_holds_the_schema_lock(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A new store's tables are created under the schema lock: `arena run` gives up after
    ARENA_SCHEMA_LOCK_WAIT_SECONDS with who holds it, before any VM, instead of waiting silently."""
    parts = urllib.parse.urlsplit(postgres_url)
    monkeypatch.setenv("PGPASSWORD", parts.password or "")
    monkeypatch.setenv("ARENA_SCHEMA_LOCK_WAIT_SECONDS", "1")
    monkeypatch.chdir(tmp_path)
    bare = urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}@{parts.hostname}:{parts.port}"))
    with _holding_the_schema_lock(postgres_url) as pid:
        assert main(["run", "--task", "notepad-append-line", "--pool-size", "1", "--db", bare]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"the schema lock is held by server pid {pid}" in err and "psql (someone)" in err
    assert not (tmp_path / "results").exists()


def test_connections_are_named_for_whoever_looks(team: str) -> None:
    assert connection_label("arena sql").startswith("arena sql (pid ")
    with ResultStore(team) as store, _admin(_with_password(team)) as admin:
        store.schema_version()  # its connection is open
        names = [row[0] for row in admin.execute(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()").fetchall()]
        assert any(name.startswith("arena ") and "(pid " in name for name in names), names
    set_connection_label("arena run nightly-7")
    try:
        with ResultStore(team) as store, _admin(_with_password(team)) as admin:
            store.schema_version()
            names = [row[0] for row in admin.execute("SELECT application_name FROM pg_stat_activity").fetchall()]
        assert "arena run nightly-7" in names
    finally:
        set_connection_label(None)


def test_check_query_reports_what_it_found() -> None:
    used = check_query("SELECT lower(r.agent) || 'x', 1::integer FROM runs r ORDER BY 1 USING <")
    assert {"lower", "agent", "r"} <= used.functions and {"||", "<"} <= used.operators and "int4" not in used.types
    with pytest.raises(QueryRefused, match="relation other"):
        check_query("SELECT * FROM other")
