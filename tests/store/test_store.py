"""Tests of the result store, each on a fresh DuckDB file in tmp_path; those that take the
`location` fixture run on a fresh PostgreSQL database too (the team store)."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkResult, OutcomeKind, StepRecord
from adapters.store.duckdb_store import SCHEMA_VERSION
from adapters.store import (
    ResultStore,
    RunInfo,
    SchemaVersionError,
    StoreError,
    is_secret_key,
    scrub_secrets,
)
from adapters.results.metrics import DomainMetrics, compute_run_metrics
from adapters.results.stats import wilson_interval


def _overall(store: ResultStore, run_id: str = "run-1") -> DomainMetrics:
    """The run's headline numbers, as every report computes them (adapters/results)."""
    return compute_run_metrics(store, run_id).overall

RUN = "run-1"


@pytest.fixture()
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "results.duckdb"


@pytest.fixture(params=["duckdb", "postgres"])
def location(request: pytest.FixtureRequest, db_path: Path) -> str:
    """Where a test's store is: a DuckDB file, or a PostgreSQL database (the same behaviour)."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return str(db_path)


@pytest.fixture()
def store(location: str) -> Iterator[ResultStore]:
    with ResultStore(location) as s:
        s.start_run(_run())
        yield s


def _run(run_id: str = RUN, **overrides) -> RunInfo:
    fields = dict(
        run_id=run_id,
        agent="scripted",
        suite="waa/test_all",
        suite_hash="abc123",
        model_id="model-x",
        agent_config={"temperature": 0.0},
        task_count=10,
        pool_size=2,
        provider="local",
        reset_level="snapshot",
        code_revision="deadbeef",
        prefect_flow_run_id="flow-run-1",
        environment="local-simulation",
    )
    fields.update(overrides)
    return RunInfo(**fields)


def _result(
    task_id: str,
    outcome: OutcomeKind = OutcomeKind.SUCCESS,
    *,
    domain: str = "notepad",
    score: float | None = None,
    infeasible: bool = False,
    attempt: int = 1,
    steps: int = 0,
    timings: dict[str, float] | None = None,
) -> BenchmarkResult:
    success = outcome is OutcomeKind.SUCCESS
    records = [
        StepRecord(
            index=i,
            action=BenchmarkAction(type=ActionType.CLICK, x=10 * i, y=20),
            screenshot_path=f"/shots/{task_id}/{i}.png",
            window_title="Notepad",
            agent_seconds=0.5,
            env_seconds=0.25,
        )
        for i in range(steps)
    ]
    return BenchmarkResult(
        task_id=task_id,
        domain=domain,
        outcome=outcome,
        success=success,
        score=(1.0 if success else 0.0) if score is None else score,
        infeasible=infeasible,
        steps=records,
        num_steps=steps,
        error=None if success else f"{outcome.value} happened",
        reason="because",
        total_time_seconds=12.5,
        timings=timings or {},
        attempt=attempt,
        vm_id="vm-0",
    )


# --- round trip ----------------------------------------------------------------------------------


def test_round_trip(location: str) -> None:
    with ResultStore(location) as store:
        assert store.schema_version() == SCHEMA_VERSION
        store.start_run(_run())
        result = _result(
            "t1",
            steps=3,
            timings={"reset_seconds": 1.0, "setup": 2.0, "episode_seconds": 3.0, "agent": 0.5, "extra": 9.0},
        )
        result.steps[1] = StepRecord(
            index=1, action=BenchmarkAction(type=ActionType.TYPE, text="héllo ✓"), error="typed badly"
        )
        store.record_result(RUN, result)

    # Reopen: everything persisted.
    with ResultStore(location) as store:
        (row,) = store.results(RUN)
        assert row["task_id"] == "t1" and row["domain"] == "notepad" and row["attempt"] == 1
        assert row["outcome"] == "success" and row["success"] is True and row["score"] == 1.0
        assert row["num_steps"] == 3 and row["vm_id"] == "vm-0" and row["total_time_seconds"] == 12.5
        assert (row["reset_seconds"], row["setup_seconds"], row["episode_seconds"]) == (1.0, 2.0, 3.0)
        assert row["agent_seconds"] == 0.5
        assert row["evaluate_seconds"] is None and row["env_seconds"] is None
        assert row["timings"]["extra"] == 9.0
        assert isinstance(row["recorded_at"], dt.datetime)

        steps = store.steps(RUN, "t1")
        assert [s["step_index"] for s in steps] == [0, 1, 2]
        assert steps[0]["action_type"] == "click" and steps[0]["action"]["x"] == 0
        assert steps[1]["action"]["text"] == "héllo ✓" and steps[1]["error"] == "typed badly"
        assert BenchmarkAction.model_validate(steps[2]["action"]).x == 20
        assert steps[2]["screenshot_path"] == "/shots/t1/2.png"

        run = store.get_run(RUN)
        assert run is not None
        assert run.status == "running" and run.finished_at is None
        assert run.environment == "local-simulation" and run.pool_size == 2
        assert run.agent_config == {"temperature": 0.0}
        store.finish_run(RUN, "completed")
        finished = store.get_run(RUN)
        assert finished is not None and finished.status == "completed"
        assert finished.finished_at is not None and finished.finished_at >= finished.started_at
        assert store.get_run("other") is None


def test_tables_are_queryable_with_plain_sql(db_path: Path) -> None:
    with ResultStore(db_path) as store:
        store.start_run(_run())
        store.record_result(RUN, _result("t1", steps=2))
    conn = duckdb.connect(str(db_path), read_only=True)
    try:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        assert conn.execute("SELECT count(*) FROM steps").fetchone() == (2,)
        assert conn.execute("SELECT agent_config->>'temperature' FROM runs").fetchone() == ("0.0",)
        assert conn.execute("SELECT task_id FROM latest_task_results").fetchall() == [("t1",)]
    finally:
        conn.close()


def test_a_read_only_store_held_open_reads_through_one_connection(db_path: Path) -> None:
    """A report's reads share one connection (`held_open`): a temporary table made by one read
    is seen by the next one inside the block, and by none after it; a writing store is
    unaffected (each operation still opens and closes the file)."""
    with ResultStore(db_path) as store:
        store.start_run(_run())
        store.record_result(RUN, _result("t1", steps=2))
        with store.held_open():
            store.record_result(RUN, _result("t2"))  # a writer is not held: writes go on
    with ResultStore(db_path, read_only=True) as store:
        with store.held_open(), store.held_open():  # nested: one connection still
            with store.reading() as conn:
                conn.execute("CREATE TEMP TABLE marker AS SELECT 42 AS answer")
            assert compute_run_metrics(store, RUN).overall.tasks == 2
            with store.reading() as conn:
                assert conn.execute("SELECT answer FROM marker").fetchone() == (42,)
        with store.reading() as conn, pytest.raises(duckdb.CatalogException):
            conn.execute("SELECT answer FROM marker")


def test_unknown_run_is_refused(store: ResultStore) -> None:
    with pytest.raises(StoreError, match="unknown run 'ghost'; call start_run first"):
        store.record_result("ghost", _result("t1"))
    with pytest.raises(StoreError, match="unknown run 'ghost'"):
        store.finish_run("ghost", "completed")
    with pytest.raises(StoreError, match="unknown run 'ghost'"):
        compute_run_metrics(store, "ghost")


def test_duplicate_run_and_resume(store: ResultStore) -> None:
    store.finish_run(RUN, "crashed")
    with pytest.raises(StoreError, match="run 'run-1' already exists"):
        store.start_run(_run())
    with pytest.raises(StoreError, match="suite_hash: stored 'abc123', now 'other'"):
        store.start_run(_run(suite_hash="other"), resume=True)
    with pytest.raises(StoreError, match="agent_config_hash: stored"):
        store.start_run(_run(agent_config={"temperature": 0.7}), resume=True)
    store.start_run(_run(prefect_flow_run_id="flow-run-2"), resume=True)
    run = store.get_run(RUN)
    assert run is not None
    assert run.status == "running" and run.finished_at is None
    assert run.prefect_flow_run_id == "flow-run-2"


def test_closed_store(location: str) -> None:
    store = ResultStore(location)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="the store is closed"):
        store.results(RUN)


# --- concurrency ---------------------------------------------------------------------------------


def test_concurrent_record_result_from_8_threads(store: ResultStore) -> None:
    per_thread = 25
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                outcome = OutcomeKind.SUCCESS if i % 2 else OutcomeKind.AGENT_FAILURE
                store.record_result(RUN, _result(f"w{n}-t{i}", outcome, domain=f"d{n}", steps=3))
                if i % 5 == 0:
                    _overall(store)  # reads interleaved with writes
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    # Else the counts below would read a store still being written (a loaded machine's slow threads).
    assert not [t for t in threads if t.is_alive()], "writer threads still running after 300 s"
    assert not errors, errors
    rows = store.results(RUN)
    assert len(rows) == 8 * per_thread
    assert len({r["task_id"] for r in rows}) == 8 * per_thread
    metrics = compute_run_metrics(store, RUN)
    assert metrics.overall.tasks == 200 and metrics.overall.success.successes == 8 * 12
    assert len(metrics.per_domain) == 8
    with store.reading([RUN], with_steps=True) as conn:
        count = conn.execute("SELECT count(*) FROM steps").fetchone()
    assert count == (8 * per_thread * 3,)


# --- summary -------------------------------------------------------------------------------------


def test_summary_numbers(store: ResultStore) -> None:
    results = [
        _result("n1", domain="notepad"),
        _result("n2", OutcomeKind.AGENT_FAILURE, domain="notepad", score=0.25),
        _result("n3", OutcomeKind.INFRASTRUCTURE_ERROR, domain="notepad"),
        _result("c1", domain="chrome"),
        _result("c2", OutcomeKind.TIMEOUT, domain="chrome"),
        _result("c3", OutcomeKind.SETUP_FAILURE, domain="chrome"),
        _result("c4", OutcomeKind.EVALUATION_ERROR, domain="chrome"),
        _result("v1", domain="vlc", infeasible=True),
        _result("v2", OutcomeKind.AGENT_FAILURE, domain="vlc", infeasible=True),
        _result("v3", OutcomeKind.INFRASTRUCTURE_ERROR, domain="vlc", infeasible=True),
    ]
    for r in results:
        store.record_result(RUN, r)
    metrics = compute_run_metrics(store, RUN)
    s = metrics.overall
    assert (s.tasks, s.success.successes, s.infrastructure_errors, s.setup_failures) == (10, 3, 2, 1)
    assert s.success.rate == pytest.approx(0.3)
    # The headline rate leaves out infrastructure errors and setup failures (10 - 2 - 1 tasks).
    assert s.success_sound.rate == pytest.approx(3 / 7)
    assert s.avg_score == pytest.approx(3.25 / 10)
    assert (s.feasible.total, s.feasible.successes) == (7, 2)
    assert s.feasible.rate == pytest.approx(2 / 7)
    assert (s.infeasible.total, s.infeasible.successes) == (3, 1)
    assert s.infeasible.rate == pytest.approx(1 / 3)
    assert s.outcomes == {
        "success": 3, "agent_failure": 2, "setup_failure": 1, "evaluation_error": 1,
        "infrastructure_error": 2, "timeout": 1,
    }
    by_domain = {d.domain: d for d in metrics.per_domain}
    assert [d.domain for d in metrics.per_domain] == ["chrome", "notepad", "vlc"]
    assert (by_domain["notepad"].tasks, by_domain["notepad"].success.successes) == (3, 1)
    assert by_domain["notepad"].success.rate == pytest.approx(1 / 3)
    assert by_domain["notepad"].success_sound.rate == pytest.approx(1 / 2)
    assert by_domain["notepad"].avg_score == pytest.approx(1.25 / 3)
    assert by_domain["chrome"].success.rate == pytest.approx(0.25)
    assert by_domain["chrome"].success_sound.rate == pytest.approx(1 / 3)  # its setup failure is out
    assert by_domain["vlc"].avg_score == pytest.approx(1 / 3)
    low, high = s.success.ci95
    assert low < 0.3 < high
    assert (low, high) == pytest.approx((0.1078, 0.6032), abs=1e-3)


def test_summary_of_empty_run_has_no_rates(store: ResultStore) -> None:
    metrics = compute_run_metrics(store, RUN)
    s = metrics.overall
    assert s.tasks == 0 and s.success.rate is None and s.success.ci95 is None
    assert s.success_sound.rate is None and s.feasible.rate is None
    assert metrics.per_domain == [] and set(s.outcomes.values()) == {0}


def test_summary_counts_only_the_last_attempt(store: ResultStore) -> None:
    store.record_result(RUN, _result("t1", OutcomeKind.INFRASTRUCTURE_ERROR, attempt=1))
    store.record_result(RUN, _result("t1", OutcomeKind.INFRASTRUCTURE_ERROR, attempt=2))
    store.record_result(RUN, _result("t1", OutcomeKind.SUCCESS, attempt=3))
    store.record_result(RUN, _result("t2", OutcomeKind.INFRASTRUCTURE_ERROR, attempt=1))
    store.record_result(RUN, _result("t2", OutcomeKind.AGENT_FAILURE, attempt=2))
    assert len(store.results(RUN)) == 5
    latest = store.latest_attempts(RUN)
    assert [(r["task_id"], r["attempt"], r["outcome"]) for r in latest] == [
        ("t1", 3, "success"),
        ("t2", 2, "agent_failure"),
    ]
    s = _overall(store)
    assert (s.tasks, s.success.successes, s.infrastructure_errors) == (2, 1, 0)
    assert s.outcomes["infrastructure_error"] == 0
    assert store.next_attempt(RUN, "t1") == 4 and store.next_attempt(RUN, "new") == 1


def test_runs_are_separate(store: ResultStore) -> None:
    store.start_run(_run("run-2"))
    store.record_result(RUN, _result("t1"))
    store.record_result("run-2", _result("t1", OutcomeKind.AGENT_FAILURE))
    assert _overall(store).success.successes == 1
    assert _overall(store, "run-2").success.successes == 0
    assert store.finished_task_ids("run-2") == {"t1"}


# --- resume --------------------------------------------------------------------------------------


def test_finished_task_ids_for_resume(store: ResultStore) -> None:
    for outcome in OutcomeKind:
        store.record_result(RUN, _result(f"t-{outcome.value}", outcome))
    # Retried after infra trouble, finally an agent failure: finished.
    store.record_result(RUN, _result("retried", OutcomeKind.INFRASTRUCTURE_ERROR, attempt=1))
    store.record_result(RUN, _result("retried", OutcomeKind.AGENT_FAILURE, attempt=2))
    # Last attempt is an infrastructure error: not finished, so resume runs it again.
    store.record_result(RUN, _result("flaky", OutcomeKind.TIMEOUT, attempt=1))
    store.record_result(RUN, _result("flaky", OutcomeKind.INFRASTRUCTURE_ERROR, attempt=2))
    assert store.finished_task_ids(RUN) == {
        "t-success", "t-agent_failure", "t-setup_failure", "t-evaluation_error", "t-timeout",
        "retried",
    }
    assert store.finished_task_ids("no-such-run") == set()


# --- re-recording --------------------------------------------------------------------------------


def test_re_record_replaces_result_and_steps(store: ResultStore) -> None:
    store.record_result(RUN, _result("t1", OutcomeKind.AGENT_FAILURE, steps=5))
    store.record_result(RUN, _result("t1", OutcomeKind.SUCCESS, steps=2))
    (row,) = store.results(RUN)
    assert row["outcome"] == "success" and row["num_steps"] == 2
    assert [s["step_index"] for s in store.steps(RUN, "t1", attempt=1)] == [0, 1]
    assert _overall(store).success.successes == 1


def test_failed_write_leaves_no_partial_result(store: ResultStore) -> None:
    store.record_result(RUN, _result("t1", steps=2))
    bad = _result("t1", OutcomeKind.AGENT_FAILURE, steps=2)
    bad.steps[1] = bad.steps[1].model_copy(update={"index": 0})
    with pytest.raises(StoreError, match="duplicate step indexes"):
        store.record_result(RUN, bad)
    (row,) = store.results(RUN)
    assert row["outcome"] == "success"
    assert len(store.steps(RUN, "t1")) == 2


# --- secrets -------------------------------------------------------------------------------------


def test_secrets_are_scrubbed_from_agent_config(db_path: Path) -> None:
    config = {
        "model": "claude",
        "API_KEY": "sk-1",
        "max_tokens": 1024,
        "Temperature": 0.2,
        "client": {
            "base_url": "http://127.0.0.1:9000/v1",
            "apiKey": "sk-2",
            "headers": {"Authorization": "Bearer x", "X-Api-Key": "k", "Accept": "json"},
            "nested": [{"hf_token": "t", "password": "p", "keep": 1}, "plain"],
        },
        "client_secret": "s",
        "db_password": "p",
        "access_token": "a",
        "token_budget": 5000,
    }
    with ResultStore(db_path) as store:
        store.start_run(_run(agent_config=config))
        stored = store.get_run(RUN)
        assert stored is not None
        assert stored.agent_config == {
            "model": "claude",
            "max_tokens": 1024,
            "Temperature": 0.2,
            "client": {
                "base_url": "http://127.0.0.1:9000/v1",
                "headers": {"Accept": "json"},
                "nested": [{"keep": 1}, "plain"],
            },
            "token_budget": 5000,
        }
    raw = db_path.read_bytes()
    for secret in (b"sk-1", b"sk-2", b"Bearer x"):
        assert secret not in raw
    # The caller's dict is not modified.
    assert config["API_KEY"] == "sk-1"


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("api_key", True), ("OPENAI_API_KEY", True), ("apikey", True), ("x-api-key", True),
        ("token", True), ("authToken", True), ("Secret", True), ("PASSWORD", True),
        ("aws_secret_access_key", True), ("credentials", True),
        ("max_tokens", False), ("tokenizer", False), ("model", False), ("keyboard_layout", False),
    ],
)
def test_is_secret_key(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_scrub_secrets_leaves_non_dicts() -> None:
    assert scrub_secrets([1, {"token": "x"}]) == [1, {}]
    assert scrub_secrets("token") == "token"


# --- schema version ------------------------------------------------------------------------------


def test_newer_schema_version_is_refused(db_path: Path) -> None:
    ResultStore(db_path).close()
    conn = duckdb.connect(str(db_path))
    conn.execute("UPDATE schema_version SET version = ?", [SCHEMA_VERSION + 1])
    conn.close()
    with pytest.raises(SchemaVersionError) as info:
        ResultStore(db_path)
    message = str(info.value)
    assert str(db_path) in message
    assert f"schema version {SCHEMA_VERSION + 1} is newer than this code supports (version {SCHEMA_VERSION})" in message
    # The refused file was not modified and is not left locked.
    conn = duckdb.connect(str(db_path))
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION + 1,)]
    conn.close()


def test_reopen_keeps_one_version_row(db_path: Path) -> None:
    for _ in range(3):
        ResultStore(db_path).close()
    conn = duckdb.connect(str(db_path))
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    conn.close()


def test_not_a_duckdb_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.duckdb"
    path.write_text("this is not a database, just text long enough to look like a header" * 100)
    with pytest.raises(StoreError, match="cannot open as a DuckDB database"):
        ResultStore(path)


def test_wilson_interval() -> None:
    assert wilson_interval(0, 0) is None
    low, high = wilson_interval(10, 10)
    assert high == 1.0 and 0.69 < low < 0.73


def test_version_1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    """A file written by schema version 1 (no usage columns) opens, keeps its rows, gains columns."""
    import duckdb

    from adapters.benchmark import ModelUsage

    path = tmp_path / "v1.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        con.execute("INSERT INTO schema_version VALUES (1)")
        con.execute(
            "CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, started_at TIMESTAMP, finished_at TIMESTAMP, "
            "status VARCHAR, agent VARCHAR, agent_config JSON, model_id VARCHAR, suite VARCHAR, suite_hash VARCHAR, "
            "task_count INTEGER, pool_size INTEGER, provider VARCHAR, reset_level VARCHAR, code_revision VARCHAR, "
            "prefect_flow_run_id VARCHAR, environment VARCHAR)"
        )
        con.execute(
            "CREATE TABLE task_results (run_id VARCHAR NOT NULL, task_id VARCHAR NOT NULL, domain VARCHAR, "
            "attempt INTEGER NOT NULL, outcome VARCHAR NOT NULL, success BOOLEAN NOT NULL, score DOUBLE, "
            "infeasible BOOLEAN, num_steps INTEGER, error VARCHAR, reason VARCHAR, total_time_seconds DOUBLE, "
            "reset_seconds DOUBLE, setup_seconds DOUBLE, episode_seconds DOUBLE, evaluate_seconds DOUBLE, "
            "agent_seconds DOUBLE, env_seconds DOUBLE, vm_id VARCHAR, recorded_at TIMESTAMP, timings JSON, "
            "PRIMARY KEY (run_id, task_id, attempt))"
        )
        con.execute(
            "CREATE TABLE steps (run_id VARCHAR NOT NULL, task_id VARCHAR NOT NULL, attempt INTEGER NOT NULL, "
            "step_index INTEGER NOT NULL, action_type VARCHAR, action JSON, screenshot_path VARCHAR, "
            "window_title VARCHAR, agent_seconds DOUBLE, env_seconds DOUBLE, error VARCHAR, "
            "PRIMARY KEY (run_id, task_id, attempt, step_index))"
        )
        con.execute(
            "INSERT INTO runs (run_id, agent, suite, started_at, status) "
            "VALUES ('old', 'scripted', 's', TIMESTAMP '2025-01-01 02:00:00', 'failed')"
        )
        con.execute(
            "INSERT INTO task_results (run_id, task_id, attempt, outcome, success) VALUES ('old', 't', 1, 'success', true)"
        )
    with ResultStore(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        assert len(store.results("old")) == 1
        result = BenchmarkResult(
            task_id="u", outcome=OutcomeKind.AGENT_FAILURE, usage=ModelUsage(calls=2, input_tokens=10, output_tokens=5, cost_usd=0.5)
        )
        store.record_result("old", result)
        rows = {r["task_id"]: r for r in store.results("old")}
        assert rows["u"]["input_tokens"] == 10 and rows["u"]["cost_usd"] == 0.5 and rows["t"]["cost_usd"] is None
        # Version 3's columns arrive too: a step written after the upgrade keeps its reasoning.
        step = StepRecord(index=0, action=BenchmarkAction(type=ActionType.CLICK, x=5, y=6, reasoning="why"))
        store.record_result("old", result.model_copy(update={"task_id": "w", "steps": [step], "num_steps": 1}))
        (row,) = store.steps("old", "w")
        assert (row["reasoning"], row["click_x"], row["click_y"]) == ("why", 5.0, 6.0)
        assert store.get_run("old").agent_config_hash is None


def test_provenance_columns_and_config_hash(db_path: Path) -> None:
    """The agent configuration hash identifies equal configurations; secrets never reach it."""
    with ResultStore(db_path) as store:
        store.start_run(_run("a", agent_config={"temperature": 0.0, "api_key": "sk-1"}, model_checkpoint="s3://c/1",
                             vm_image="ami-123", run_config={"pool_size": 2, "password": "hunter2"}))
        store.start_run(_run("b", agent_config={"api_key": "sk-2", "temperature": 0.0}))
        store.start_run(_run("c", agent_config={"temperature": 0.5}))
        a, b, c = (store.get_run(r) for r in "abc")
    assert a.agent_config_hash == b.agent_config_hash != c.agent_config_hash
    assert len(a.agent_config_hash) == 64
    assert (a.model_checkpoint, a.vm_image, a.run_config) == ("s3://c/1", "ami-123", {"pool_size": 2})
    assert "hunter2" not in db_path.read_bytes().decode("latin-1")


def test_screenshot_paths_are_stored_relative_to_the_database(tmp_path: Path) -> None:
    """Screenshots under the database's folder are stored relative to it (the folder can move)."""
    db = tmp_path / "results" / "arena.duckdb"
    inside = tmp_path / "results" / "artifacts" / "t" / "step_000.png"
    outside = tmp_path / "elsewhere" / "step_001.png"
    steps = [
        StepRecord(index=0, action=BenchmarkAction(type=ActionType.CLICK, target_bbox=(10, 20, 30, 40)),
                   screenshot_path=str(inside)),
        StepRecord(index=1, action=BenchmarkAction(type=ActionType.TYPE, text="x"), screenshot_path=str(outside)),
        StepRecord(index=2, action=BenchmarkAction(type=ActionType.CLICK, x=0.5, y=0.5, normalized=True)),
    ]
    with ResultStore(db) as store:
        store.start_run(_run())
        store.record_result(RUN, _result("t").model_copy(update={"steps": steps, "num_steps": 3}))
        rows = store.steps(RUN, "t")
        assert rows[0]["screenshot_path"] == "artifacts/t/step_000.png"
        assert store.resolve_path(rows[0]["screenshot_path"]) == inside
        assert rows[1]["screenshot_path"] == str(outside)
        assert store.resolve_path(rows[1]["screenshot_path"]) == outside
        assert rows[2]["screenshot_path"] is None
        # A box's centre; a normalised point cannot be placed without the screen size; typing has none.
        assert [(r["click_x"], r["click_y"]) for r in rows] == [(20.0, 30.0), (None, None), (None, None)]


def test_expected_seconds_prefers_the_same_agent_and_skips_infrastructure_errors(location: str) -> None:
    with ResultStore(location) as store:
        store.start_run(_run("a"))
        store.start_run(_run("b", agent="random"))
        timed = lambda task, seconds, outcome=OutcomeKind.SUCCESS: _result(task, outcome).model_copy(  # noqa: E731
            update={"total_time_seconds": seconds}
        )
        store.record_result("a", timed("t1", 10.0))
        store.record_result("b", timed("t1", 50.0))
        store.record_result("b", timed("t2", 30.0))
        store.record_result("a", timed("t3", 99.0, OutcomeKind.INFRASTRUCTURE_ERROR))
        assert store.expected_seconds(["t1", "t2", "t3", "t4"], agent="scripted") == {"t1": 10.0, "t2": 30.0}
        assert store.expected_seconds(["t1"], agent="other") == {"t1": 30.0}
        assert store.expected_seconds([], agent="scripted") == {}


def test_a_resume_records_its_own_configuration(location: str) -> None:
    """`arena run --run-id R --trials 5` on a run of 1 trial: the stored configuration says 5, so
    reports compute pass@k for the K the run now asks for."""
    with ResultStore(location) as store:
        store.start_run(_run(run_config={"trials": 1, "pool_size": 2}))
        store.start_run(_run(run_config={"trials": 5, "pool_size": 2}), resume=True)
        assert store.get_run(RUN).run_config == {"trials": 5, "pool_size": 2}
        store.start_run(_run(), resume=True)  # a resume that says nothing keeps what is stored
        assert store.get_run(RUN).run_config["trials"] == 5
