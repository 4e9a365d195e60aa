"""The roles docs/team-store.md tells a DBA to create, on a real PostgreSQL server: its SQL runs
as written (with psql), a run writes the store as the writer, `arena sql` and reports read it
as the reader, neither can end the other's connections, and `arena doctor` warns about a store
role with more powers than a store needs (a superuser, pg_signal_backend, pg_read_server_files)."""

from __future__ import annotations

import os
import re
import subprocess
import urllib.parse
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as sql_text

from flows.cli import main
from flows.doctor import check_store_role

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "team-store.md"
TASK = "notepad-append-line"


def documented_roles_sql() -> str:
    """The `<!-- sql: roles -->` block of docs/team-store.md."""
    found = re.search(r"<!-- sql: roles -->\s*\n```sql\n(.*?)```", DOC.read_text(), re.S)
    assert found, f"{DOC} lost its roles SQL"
    return found.group(1)


def _url(server: str, role: str | None = None, database: str | None = None) -> str:
    """The session server's URL for `role` (password from PGPASSWORD) and `database`."""
    parts = urllib.parse.urlsplit(server)
    netloc = f"{role or parts.username}@{parts.hostname}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, path=f"/{database or parts.path[1:]}"))


@pytest.fixture()
def roles(postgres_server: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The documented roles and database, made by running the doc's SQL with psql as the
    superuser (names made unique: roles belong to the whole server); their URLs without a
    password (every role's password is the test server's, in PGPASSWORD)."""
    from pg_server import postgres_bindir

    password = urllib.parse.urlsplit(postgres_server).password or ""
    monkeypatch.setenv("PGPASSWORD", password)
    suffix = uuid.uuid4().hex[:8]
    names = {"writer": f"arena_writer_{suffix}", "reader": f"arena_reader_{suffix}", "database": f"roles_{suffix}"}
    sql = documented_roles_sql()
    sql = re.sub(r"\barena_writer\b", names["writer"], sql)
    sql = re.sub(r"\barena_reader\b", names["reader"], sql)
    sql = re.sub(r"\barena\b", names["database"], sql)
    parts = urllib.parse.urlsplit(postgres_server)
    done = subprocess.run(
        [str(postgres_bindir() / "psql"), "-v", "ON_ERROR_STOP=1", "-h", parts.hostname or "", "-p", str(parts.port),
         "-U", parts.username or "", "-d", "postgres", "-f", "-"],
        input=sql, capture_output=True, text=True, timeout=60, env={**os.environ, "PGPASSWORD": password},
    )
    assert done.returncode == 0, done.stderr
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        for role in (names["writer"], names["reader"]):  # what \password does, by hand
            admin.execute(sql_text.SQL("ALTER ROLE {} PASSWORD {}").format(sql_text.Identifier(role),
                                                                          sql_text.Literal(password)))
    return {"writer": _url(postgres_server, names["writer"], names["database"]),
            "reader": _url(postgres_server, names["reader"], names["database"]),
            "superuser": _url(postgres_server, None, names["database"]),
            "reader_role": names["reader"]}


def test_the_documented_roles_run_a_run_and_read_it(
    roles: dict[str, str], prefect_server: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from adapters.store import ResultStore
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    outcome = run_suite(SuiteRunConfig(task_ids=[TASK], pool_size=1, store_url=roles["writer"],
                                       artifacts_dir=tmp_path / "a", run_id="as-writer"))
    assert outcome.status == "completed" and outcome.results and outcome.results[0].success

    assert main(["sql", "SELECT run_id, status FROM runs", "--db", roles["reader"]]) == 0
    assert "as-writer  completed" in capsys.readouterr().out
    assert main(["sql", "SELECT task_id, outcome FROM latest_task_results", "--db", roles["reader"], "--csv"]) == 0
    assert f"{TASK},success" in capsys.readouterr().out
    assert main(["report", "as-writer", "--db", roles["reader"]]) == 0
    assert "as-writer" in capsys.readouterr().out
    with ResultStore(roles["reader"], read_only=True) as store:
        assert not store.can_write()

    # The role boundary itself, outside `arena sql`'s checks: the reader can neither write nor
    # end the writer's connections.
    password = urllib.parse.quote(os.environ["PGPASSWORD"])
    with psycopg.connect(roles["writer"].replace("@", f":{password}@", 1), autocommit=True) as writer, \
            psycopg.connect(roles["reader"].replace("@", f":{password}@", 1), autocommit=True) as reader:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            reader.execute("UPDATE runs SET status = 'tampered'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            reader.execute("SELECT pg_terminate_backend(%s)", [writer.info.backend_pid])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            reader.execute("CREATE FUNCTION public.lower(integer) RETURNS int LANGUAGE sql AS 'SELECT 1'")
        assert writer.execute("SELECT status FROM runs").fetchall() == [("completed",)]


def test_doctor_warns_about_a_role_with_more_powers_than_a_store_needs(
    roles: dict[str, str], postgres_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from adapters.store import ResultStore

    ResultStore(roles["writer"]).close()  # the first run's tables, made by the writer
    assert check_store_role(roles["writer"]) == [] and check_store_role(roles["reader"]) == []
    assert check_store_role(Path("results/arena.duckdb")) == []

    superuser = check_store_role(roles["superuser"])
    assert len(superuser) == 1 and superuser[0].warning and superuser[0].ok
    assert "is a superuser" in superuser[0].detail and 'docs/team-store.md, "Roles"' in superuser[0].fix
    assert superuser[0].line().startswith("WARN  team store role:")

    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(f"GRANT pg_signal_backend, pg_read_server_files TO {roles['reader_role']}")
    warnings = [check.detail for check in check_store_role(roles["reader"])]
    assert len(warnings) == 2
    assert "member of pg_signal_backend: it can cancel or end other roles' connections" in warnings[0]
    assert "member of pg_read_server_files: it can read any file the database server can" in warnings[1]

    # Through the command: one line each, and the store's own check still passes or fails on its own.
    assert main(["doctor", "--db", roles["reader"]]) == 1  # the reader may not add results: a FAIL
    out = capsys.readouterr().out
    assert out.count("WARN  team store role:") == 2 and "may not add results" in out


def test_doctor_says_nothing_about_roles_when_the_server_does_not_answer() -> None:
    assert check_store_role("postgresql://arena@127.0.0.1:9/arena") == []
