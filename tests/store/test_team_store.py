"""The team store: a real PostgreSQL server on 127.0.0.1 (tests/pg_server.py) that several
controllers write at once and every command reads.

The store's own behaviour on PostgreSQL (round trip, resume rules, threads) is tested by
tests/store/test_store.py, whose `location` fixture runs each test on both engines; this module
covers what only the team store has: bad configuration found before a run, runs from several
processes at once, the commands reading it, `arena store migrate`. Shard workers writing to it:
tests/deployments/test_shards_server.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import psycopg
import pytest
from prefect_home import seeded_run_env

from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkResult, OutcomeKind, StepRecord
from adapters.results.metrics import compute_run_metrics
from adapters.store import SCHEMA_VERSION, ResultStore, RunInfo, SchemaVersionError
from flows.cli import main

ROOT = Path(__file__).resolve().parents[2]
TASK = "notepad-append-line"


def _split(url: str) -> tuple[str, str]:
    """(the URL without its password, the password): the form commands take, and PGPASSWORD."""
    parts = urllib.parse.urlsplit(url)
    bare = parts._replace(netloc=f"{parts.username}@{parts.hostname}:{parts.port}")
    return urllib.parse.urlunsplit(bare), parts.password or ""


@pytest.fixture()
def team(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh team store's URL, without its password; PGPASSWORD holds the password."""
    bare, password = _split(postgres_url)
    monkeypatch.setenv("PGPASSWORD", password)
    return bare


def _rows(url: str, sql: str, params: list[object] | None = None) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- bad configuration: one line, before any run ------------------------------------------------


def test_bad_team_store_configuration_is_one_line_before_the_run(
    team: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    password = os.environ["PGPASSWORD"]
    run = ["run", "--task", TASK, "--pool-size", "1"]

    def fails(db: str) -> str:
        started = time.monotonic()
        assert main([*run, "--db", db]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert time.monotonic() - started < 15
        return err

    unreachable = f"postgresql://arena@127.0.0.1:{_closed_port()}/arena"
    assert "cannot connect to the results store" in fails(unreachable) and unreachable in fails(unreachable)

    monkeypatch.setenv("PGPASSWORD", "wrong-password")
    err = fails(team)
    assert "password authentication failed" in err and "wrong-password" not in err
    monkeypatch.setenv("PGPASSWORD", password)

    # A password in the URL would be shown in the Prefect UI and stored with the run.
    with pytest.raises(SystemExit) as exit_info:
        main([*run, "--db", team.replace("arena@", "arena:secret@")])
    assert exit_info.value.code == 2
    assert "carries a password" in capsys.readouterr().err

    # A store written by a newer version: refused, and left exactly as it was.
    ResultStore(team).close()
    _rows(_with_password(team), "UPDATE schema_version SET version = %s", [SCHEMA_VERSION + 1])
    err = fails(team)
    assert f"schema version {SCHEMA_VERSION + 1} is newer than this code supports" in err
    assert _rows(_with_password(team), "SELECT version FROM schema_version") == [(SCHEMA_VERSION + 1,)]
    assert _rows(_with_password(team), "SELECT count(*) FROM runs") == [(0,)]
    with pytest.raises(SchemaVersionError):
        ResultStore(team, read_only=True)
    assert not (tmp_path / "results").exists()  # nothing of a run was started


def _with_password(bare: str) -> str:
    parts = urllib.parse.urlsplit(bare)
    netloc = f"{parts.username}:{urllib.parse.quote(os.environ['PGPASSWORD'])}@{parts.hostname}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


# --- runs from several processes at once, and every command reading -----------------------------


def test_two_controllers_at_once_land_in_one_team_store_and_every_command_reads_it(
    team: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two `arena run` processes (two controllers; on two hosts they would differ only in host
    name) write the team store at once; report, compare, sql and export read it."""
    env = seeded_run_env(tmp_path / "prefect")
    env.update(ARENA_LOCAL_SERVER_IDLE_SECONDS="3", ARENA_STORE_URL=team, PYTHONPATH=str(ROOT))
    hosts = [tmp_path / f"host-{i}" for i in range(2)]  # each controller its own working directory
    for host in hosts:
        host.mkdir()
    controllers = [
        subprocess.Popen([sys.executable, "-m", "flows.cli", "run", "--run-id", f"team-{i}", "--pool-size", "2"],
                         cwd=host, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, host in enumerate(hosts)
    ]
    outputs = [c.communicate(timeout=600) for c in controllers]
    for controller, (out, err) in zip(controllers, outputs):
        assert controller.returncode == 0, err[-3000:]
        assert f"Results: {team}" in out  # the store's URL, never its password
        assert os.environ["PGPASSWORD"] not in out + err
    password_url = _with_password(team)
    assert _rows(password_url, "SELECT run_id, status, task_count FROM runs ORDER BY run_id") == [
        ("team-0", "completed", 16), ("team-1", "completed", 16)
    ]
    # Exactly one final result per task and run, and each attempt once.
    assert _rows(password_url, "SELECT run_id, count(*), count(DISTINCT task_id) FROM latest_task_results "
                               "GROUP BY run_id ORDER BY run_id") == [("team-0", 16, 16), ("team-1", 16, 16)]
    assert _rows(password_url, "SELECT count(*) FROM task_results") == [(32,)]
    # Nothing went to a local DuckDB file.
    assert not list(tmp_path.rglob("*.duckdb"))

    os.environ["ARENA_STORE_URL"] = team
    try:
        assert main(["report", "latest"]) == 0
        report = capsys.readouterr().out
        assert "WAA run report team-" in report and "16/16" in report.replace(" ", "")
        assert main(["compare", "team-0", "team-1"]) == 0
        assert "team-0" in capsys.readouterr().out
        assert main(["sql", "SELECT run_id, avg(success::int) AS rate FROM latest_task_results GROUP BY 1 ORDER BY 1"]) == 0
        table = capsys.readouterr().out
        assert "team-0" in table and "team-1" in table and "(2 rows)" in table
        assert main(["sql", "DELETE FROM runs"]) == 2
        assert "runs queries only" in capsys.readouterr().err
        assert main(["export", "team-1", "--parquet", str(tmp_path / "export")]) == 0
        assert len(list((tmp_path / "export").glob("*.parquet"))) == 4
    finally:
        del os.environ["ARENA_STORE_URL"]
    assert _rows(password_url, "SELECT count(*) FROM runs") == [(2,)]


# --- arena store migrate ------------------------------------------------------------------------


def _result(task_id: str, outcome: OutcomeKind, screenshot: Path) -> BenchmarkResult:
    steps = [StepRecord(index=i, action=BenchmarkAction(type=ActionType.CLICK, x=i, y=i), screenshot_path=str(screenshot))
             for i in range(3)]
    return BenchmarkResult(task_id=task_id, domain="notepad", outcome=outcome, success=outcome == OutcomeKind.SUCCESS,
                           score=1.0 if outcome == OutcomeKind.SUCCESS else 0.0, num_steps=3, steps=steps,
                           total_time_seconds=2.0, vm_id="vm-0")


def test_store_migrate_copies_each_run_once_with_its_screenshots(
    team: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "results" / "arena.duckdb"
    shot = tmp_path / "results" / "artifacts" / "r1" / "step.png"
    shot.parent.mkdir(parents=True)
    shot.write_bytes(b"png")
    with ResultStore(db) as local:
        for run_id in ("r1", "r2"):
            local.start_run(RunInfo(run_id=run_id, agent="scripted", suite="bundled", task_count=2))
            local.record_result(run_id, _result("t1", OutcomeKind.SUCCESS, shot))
            local.record_result(run_id, _result("t2", OutcomeKind.AGENT_FAILURE, shot))
            local.finish_run(run_id, "completed")
        expected = compute_run_metrics(local, "r1")

    assert main(["store", "migrate", str(db), "--to", team]) == 0
    assert "2 run(s) copied (4 results, 12 steps), 0 already there" in capsys.readouterr().out
    assert main(["store", "migrate", str(db), "--to", team]) == 0
    assert "0 run(s) copied (0 results, 0 steps), 2 already there" in capsys.readouterr().out

    with ResultStore(team, read_only=True) as store:
        migrated = compute_run_metrics(store, "r1")
        steps = store.steps("r1", "t1")
    assert migrated.overall == expected.overall and migrated.tasks == expected.tasks
    assert [Path(s["screenshot_path"]) for s in steps] == [shot] * 3  # absolute: found from any folder

    assert main(["store", "migrate", str(tmp_path / "missing.duckdb"), "--to", team]) == 2
    assert "no such DuckDB file" in capsys.readouterr().err


# --- a nightly and a triggered run at once --------------------------------------------------------


@pytest.mark.parametrize("engine", ["duckdb", "postgres"])
def test_a_nightly_and_a_triggered_model_update_overlap_and_both_land(
    engine: str, prefect_server: None, tmp_path: Path, request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The nightly baselines and a model update triggered meanwhile (a serve process allowing
    several runs at once) write one store at the same time; every run lands."""
    import threading

    from flows.baselines import evaluate_model_update, nightly_baselines
    from tests.agents.fake_model_servers import FakeModelServer, openai_completion

    location = str(tmp_path / "arena.duckdb") if engine == "duckdb" else request.getfixturevalue("team")
    where = f'db_path = "{location}"' if engine == "duckdb" else f'store_url = "{location}"'
    common = f'suite = "bundled"\n{where}\nartifacts_dir = "{tmp_path / "a"}"\n'
    model = FakeModelServer("openai", default=openai_completion("DONE()")).start()
    request.addfinalizer(model.stop)
    model.models = ["base", "ckpt-007"]  # an update is refused for a checkpoint the endpoint does not serve
    monkeypatch.setenv("FAKE_MODEL_KEY", "not-a-secret")
    file = tmp_path / "baselines.toml"
    # The nightly runs both baselines one after the other, first the whole bundled suite on one
    # VM with a pause after each action (long enough for the update to start meanwhile, even on
    # a loaded machine); the update evaluates a checkpoint against the small one, whose agent
    # calls a model (a fake endpoint that answers DONE).
    file.write_text(
        f'version = 1\n[[baselines]]\nname = "scripted-all"\nagent = "scripted"\npool_size = 1\nsettle = 0.2\n{common}'
        f'[[baselines]]\nname = "model-one"\nagent = "openai"\ndomains = ["notepad"]\npool_size = 2\n{common}'
        f'[baselines.agent_options]\nmodel = "base"\nbase_url = "{model.url}"\napi_key_env = "FAKE_MODEL_KEY"\n'
        f'[baselines.model_updates]\nmodels = ["ckpt-*"]\n'
    )
    monkeypatch.setenv("ARENA_BASELINES_FILE", str(file))
    errors: list[BaseException] = []

    def run(call: object) -> None:
        try:
            call()  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    def run_rows() -> list[tuple]:
        with ResultStore(location, read_only=True) as store, store.reading() as conn:
            return conn.execute(
                "SELECT coalesce(baseline, '-'), coalesce(model_id, '-'), status, started_at, finished_at "
                "FROM runs ORDER BY started_at"
            ).fetchall()

    nightly = threading.Thread(target=run, args=(nightly_baselines,))
    update = threading.Thread(target=run, args=(lambda: evaluate_model_update("ckpt-007", baseline="model-one"),))
    nightly.start()
    deadline = time.monotonic() + 120
    while not _has_runs(location):
        assert time.monotonic() < deadline and nightly.is_alive(), errors
        time.sleep(0.2)
    update.start()  # the checkpoint is announced while the nightly's first run is going
    for thread in (nightly, update):
        thread.join(600)
    assert not errors, errors
    runs = run_rows()
    assert all(status == "completed" for _, _, status, _, _ in runs), runs
    assert [m for _, m, _, _, _ in runs].count("ckpt-007") == 1
    assert {b for b, _, _, _, _ in runs} >= {"scripted-all", "model-one"}
    # Runs of the two flows were under way at the same time (the nightly's own runs are one
    # after the other, so an overlap is one with the update's).
    overlapping = [
        (a[:2], b[:2]) for i, a in enumerate(runs) for b in runs[i + 1:] if b[3] < a[4]
    ]
    assert overlapping, runs


def _has_runs(location: str) -> bool:
    try:
        with ResultStore(location, read_only=True) as store, store.reading() as conn:
            return bool(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
    except Exception:  # noqa: BLE001 - not created yet
        return False


def test_a_run_with_trials_lands_in_the_team_store_per_task_and_trial(
    prefect_server: None, team: str, tmp_path: Path
) -> None:
    """`trials = 2` against PostgreSQL: a row per (task, trial), the view per (task, trial), and a
    comparison of two such runs read back from the team store uses the trial comparison."""
    from adapters.agents import AgentOptions
    from adapters.results.compare import compare_stored_runs
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    for run_id, p in (("team-trials-a", 0.2), ("team-trials-b", 0.8)):
        outcome = run_suite(SuiteRunConfig(
            agent="noisy-scripted", agent_options=AgentOptions(success_probability=p, seed=3), task_ids=[TASK],
            trials=2, pool_size=2, store_url=team, artifacts_dir=tmp_path / "a", run_id=run_id))
        assert outcome.status == "completed" and outcome.completeness.trials_final == 2
    assert _rows(team, "SELECT run_id, trial FROM latest_task_results ORDER BY run_id, trial") == [
        ("team-trials-a", 1), ("team-trials-a", 2), ("team-trials-b", 1), ("team-trials-b", 2)]
    with ResultStore(team, read_only=True) as store:
        comparison = compare_stored_runs(store, "team-trials-a", "team-trials-b")
    assert comparison.trials is not None and comparison.trials.paired[0].candidate_trials == 2
