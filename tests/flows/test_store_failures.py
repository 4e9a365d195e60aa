"""No finished result is lost, and every end is honest, when the results store fails or a run id
is reused: real `arena run` processes against a real PostgreSQL server that is stopped and
started again, a real file system that fills up (a size-limited tmpfs), a DuckDB file cut short,
two controllers with one run id, and a controller killed with SIGKILL."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from machine_pace import scaled
from small_disk import fill, mounted_small_disk

ROOT = Path(__file__).resolve().parents[2]
# The runs that are broken and resumed select the notepad tasks (6 of the bundled 16): enough
# for results to finish while the store is away and for tasks to be left after it, at a third
# of the bundled suite's time.
NOTEPAD = ("--domain", "notepad")
NOTEPAD_TASKS = 6


# The session's Prefect server, which every `arena run` of this module uses: what these tests
# break is the results store, not Prefect, and a local server per run would cost its start-up.
_prefect_api: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _shared_prefect_server(prefect_server: None) -> None:
    from prefect.settings import PREFECT_API_URL

    _prefect_api["url"] = str(PREFECT_API_URL.value())


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "ARENA_STORE_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=_prefect_api["url"], **extra)
    return env


def _start(tmp_path: Path, run_id: str, *args: str, env: dict[str, str] | None = None,
           artifacts: Path | None = None, err_log: Path | None = None) -> subprocess.Popen[str]:
    """`arena run` in the background; its stderr into `err_log` when given (to be watched while
    it runs), else a pipe that `_finish` reads."""
    artifacts = artifacts or tmp_path / "art"
    with contextlib.ExitStack() as files:
        stderr = files.enter_context(err_log.open("w")) if err_log is not None else subprocess.PIPE
        return subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "run", "--run-id", run_id, "--artifacts", str(artifacts), *args],
            cwd=ROOT, env=env or _env(tmp_path), stdout=subprocess.PIPE, stderr=stderr, text=True,
        )


def _recorded(progress: Path) -> int:
    try:
        return int(json.loads(progress.read_text()).get("attempts_recorded", 0))
    except (OSError, ValueError):
        return 0


def _wait(what: str, check: Any, timeout: float, proc: subprocess.Popen[str] | None = None) -> Any:
    deadline = time.monotonic() + scaled(timeout)  # written for a quiet machine (tests/machine_pace.py)
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}:\n{out[-2000:]}\n{(err or '')[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _finish(proc: subprocess.Popen[str], timeout: float = 300) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def _final_results(db: Path, run_id: str) -> dict[str, str]:
    with duckdb.connect(str(db), read_only=True) as con:
        return dict(con.execute("SELECT task_id, outcome FROM latest_task_results WHERE run_id = ?", [run_id]).fetchall())


# --- one controller per run id ----------------------------------------------------------------


def test_a_second_controller_for_a_running_run_id_is_refused_before_any_vm(tmp_path: Path) -> None:
    db = tmp_path / "arena.duckdb"
    # The notepad tasks only (6): long enough for the second controller to meet the first.
    first = _start(tmp_path, "twice", "--quirks", "--pool-size", "1", "--domain", "notepad", "--db", str(db))
    try:
        _wait("a recorded attempt", lambda: _recorded(tmp_path / "art" / "twice" / "progress.json") >= 1, 180, first)
        started = time.monotonic()
        second = _start(tmp_path, "twice", "--quirks", "--pool-size", "1", "--domain", "notepad", "--db", str(db))
        out, err = _finish(second, 120)
        assert second.returncode == 2, (out, err)
        assert err.count("\n") == 1 and "run 'twice' is running elsewhere (PID" in err, err
        assert "Flow run:" not in err and time.monotonic() - started < 60  # refused before Prefect or a VM
    finally:
        out, err = _finish(first)
    assert first.returncode == 0, err[-3000:]
    with duckdb.connect(str(db), read_only=True) as con:
        attempts = con.execute("SELECT task_id, count(*) FROM task_results WHERE run_id = 'twice' GROUP BY 1").fetchall()
    assert len(attempts) == 6 and all(n == 1 for _, n in attempts)  # one controller ran each task once


def test_a_killed_controllers_run_is_shown_abandoned_and_resumes_at_once(tmp_path: Path) -> None:
    db = tmp_path / "arena.duckdb"
    proc = _start(tmp_path, "killed", "--quirks", "--pool-size", "2", *NOTEPAD, "--db", str(db))
    try:
        _wait("a recorded attempt", lambda: _recorded(tmp_path / "art" / "killed" / "progress.json") >= 1, 180, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    report = subprocess.run([sys.executable, "-m", "flows.cli", "report", "killed", "--db", str(db),
                             "--html", str(tmp_path / "r.html")], cwd=ROOT, env=_env(tmp_path),
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "abandoned" in report.stdout and "running" not in report.stdout.split("status", 1)[1].split("\n", 1)[0]
    assert "abandoned" in (tmp_path / "r.html").read_text()
    resumed = _start(tmp_path, "killed", "--quirks", "--pool-size", "2", *NOTEPAD, "--db", str(db))
    out, err = _finish(resumed)
    assert resumed.returncode == 0, err[-3000:]
    assert len(_final_results(db, "killed")) == NOTEPAD_TASKS


# --- the team store stops -------------------------------------------------------------------


@pytest.fixture()
def pg(tmp_path: Path) -> Iterator[Any]:
    from pg_server import postgres_bindir, postgres_server

    if postgres_bindir() is None:
        pytest.skip("PostgreSQL is not installed (the postgresql package provides initdb and pg_ctl)")
    pytest.importorskip("psycopg", reason="psycopg is not installed (the team extra)")
    with postgres_server() as server:
        yield server


def _bare(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}@{parts.hostname}:{parts.port}")), parts.password or ""


def _team_results(url: str, run_id: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return dict(conn.execute("SELECT task_id, outcome FROM latest_task_results WHERE run_id = %s", [run_id]).fetchall())


def test_a_postgresql_outage_mid_run_loses_no_result_and_the_run_completes(tmp_path: Path, pg: Any) -> None:
    store, password = _bare(pg.url)
    env = _env(tmp_path, PGPASSWORD=password)
    err_log = tmp_path / "outage.err"
    proc = _start(tmp_path, "outage", "--quirks", "--pool-size", "2", *NOTEPAD, "--db", store, env=env, err_log=err_log)
    try:
        _wait("two recorded attempts", lambda: _recorded(tmp_path / "art" / "outage" / "progress.json") >= 2, 180, proc)
        pg.stop()
        # Results finish meanwhile and wait in the spool; once a pool's worth (2) waits, no new
        # task starts and the run says it waits for the store.
        spool = tmp_path / "art" / "outage" / "spool"
        spooled = _wait("a pool's worth of results in the spool", lambda: len(list(spool.glob("*.json"))) >= 2 and
                        list(spool.glob("*.json")), 120, proc)
        _wait("the run's notice that it waits for the store", lambda: "wait for the store" in err_log.read_text(), 60, proc)
        pg.start()
        _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err_log.read_text()
    assert proc.returncode == 0, err[-4000:]
    assert spooled, "results finished during the outage were spooled"
    results = _team_results(pg.url, "outage")
    assert len(results) == NOTEPAD_TASKS and set(results.values()) == {"success"}
    assert not list((tmp_path / "art" / "outage" / "spool").glob("*.json"))  # all written, spool empty


def test_a_store_down_at_the_end_exits_6_with_one_line_and_resume_writes_the_spool(tmp_path: Path, pg: Any) -> None:
    store, password = _bare(pg.url)
    env = _env(tmp_path, PGPASSWORD=password, ARENA_STORE_FLUSH_SECONDS="5", ARENA_STORE_OUTAGE_WAIT_SECONDS="5")
    proc = _start(tmp_path, "gone", "--quirks", "--pool-size", "2", *NOTEPAD, "--db", store, env=env)
    try:
        _wait("an attempt", lambda: _recorded(tmp_path / "art" / "gone" / "progress.json") >= 1, 180, proc)
        pg.stop()
        out, err = _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 6, (out[-2000:], err[-4000:])
    last = [line for line in err.splitlines() if line.startswith("arena:")]
    assert len(last) == 1 and "the results store failed" in last[0] and "--run-id gone" in last[0], err[-3000:]
    assert "Traceback" not in err
    spooled = sorted(p.name for p in (tmp_path / "art" / "gone" / "spool").glob("*.json"))
    assert spooled, "the results finished after the store went down wait in the spool"
    pg.start()
    resumed = _start(tmp_path, "gone", "--quirks", "--pool-size", "2", *NOTEPAD, "--db", store, env=_env(tmp_path, PGPASSWORD=password))
    out, err = _finish(resumed)
    assert resumed.returncode == 0, err[-4000:]
    assert "an earlier controller left in its spool" in err
    results = _team_results(pg.url, "gone")
    assert len(results) == NOTEPAD_TASKS and set(results.values()) == {"success"}
    assert not list((tmp_path / "art" / "gone" / "spool").glob("*.json"))


def test_connections_dropped_after_the_last_result_leave_a_completed_run_exiting_0(tmp_path: Path, pg: Any) -> None:
    """Every result stored, then the store's connections dropped (backends terminated, as a
    proxy or a server restart does) while the run reads its end: it ended with exit 6, two
    tracebacks and a resume from an empty spool. Its closing reads now connect again."""
    import psycopg

    store, password = _bare(pg.url)
    env = _env(tmp_path, PGPASSWORD=password)
    proc = _start(tmp_path, "dropped", "--pool-size", "2", *NOTEPAD, "--db", store, env=env)
    dropped = 0
    try:
        _wait("every result recorded",
              lambda: _recorded(tmp_path / "art" / "dropped" / "progress.json") >= NOTEPAD_TASKS, 180, proc)
        with psycopg.connect(pg.url, autocommit=True) as admin:
            while proc.poll() is None:  # every connection the run's end opens is dropped once
                dropped += len(admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'").fetchall())
                time.sleep(0.3)
        out, err = _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert dropped >= 1, "no connection of the run's end was dropped"
    assert proc.returncode == 0, (out[-2000:], err[-4000:])
    assert "Traceback" not in err and "spool" not in err, err[-3000:]
    assert "completed" in out
    results = _team_results(pg.url, "dropped")
    assert len(results) == NOTEPAD_TASKS and set(results.values()) == {"success"}
    with psycopg.connect(pg.url, autocommit=True) as conn:
        assert conn.execute("SELECT status FROM runs WHERE run_id = 'dropped'").fetchone() == ("completed",)


# --- the disk fills up -------------------------------------------------------------------------


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 96 MB file system of its own (tmpfs), as a results disk that can fill up."""
    yield from mounted_small_disk(tmp_path)


def test_a_full_disk_mid_run_loses_no_result_and_leaves_no_empty_screenshot(tmp_path: Path, small_disk: Path) -> None:
    db, artifacts = small_disk / "arena.duckdb", small_disk / "art"
    err_log = tmp_path / "full.err"  # not on the small disk: it must take the run's output meanwhile
    proc = _start(tmp_path, "full", "--quirks", "--pool-size", "2", *NOTEPAD, "--db", str(db), artifacts=artifacts,
                  err_log=err_log)
    try:
        _wait("two recorded attempts", lambda: _recorded(artifacts / "full" / "progress.json") >= 2, 180, proc)
        filler = fill(small_disk)
        # Results finish meanwhile; neither the store nor the spool can take them, and once a
        # pool's worth (2) waits, the run says so and starts no new task.
        _wait("the run's notice that it waits for the store", lambda: "wait for the store" in err_log.read_text(), 120, proc)
        filler.unlink()
        _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err_log.read_text()
    assert proc.returncode == 0, err[-4000:]
    results = _final_results(db, "full")
    assert len(results) == NOTEPAD_TASKS, results
    empty = [p for p in artifacts.rglob("*.png") if p.stat().st_size == 0] + list(artifacts.rglob("*.part"))
    assert empty == []


# --- a damaged results file ---------------------------------------------------------------------


def test_a_damaged_duckdb_file_is_refused_in_one_line_and_never_written(tmp_path: Path) -> None:
    db = tmp_path / "arena.duckdb"
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", "--run-id", "good", "--domain", "notepad",
                           "--db", str(db), "--artifacts", str(tmp_path / "art")], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    damaged = tmp_path / "damaged.duckdb"
    shutil.copy(db, damaged)
    with damaged.open("r+b") as handle:
        handle.truncate(damaged.stat().st_size // 2)
    before = damaged.read_bytes()
    for args in (["run", "--domain", "notepad"], ["report", "latest"], ["sql", "SELECT 1"], ["doctor"]):
        result = subprocess.run([sys.executable, "-m", "flows.cli", *args, "--db", str(damaged)], cwd=ROOT,
                                env=_env(tmp_path), capture_output=True, text=True, timeout=120)
        assert result.returncode in (1, 2), (args, result.stdout, result.stderr)
        assert "damaged" in result.stdout + result.stderr, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, (args, result.stderr)
    assert damaged.read_bytes() == before
