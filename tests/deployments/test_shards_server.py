"""Shard mode against a REAL Prefect server and REAL workers: one suite run spread over two
worker "hosts", each shard on its own local-simulation pool, every attempt back in the
controller's DuckDB file.

The server is `prefect server start` in a subprocess (its own PREFECT_HOME, filesystem lease
storage), the shard deployment is registered from prefect.yaml with `prefect deploy`, and two
`prefect worker start --pool waa-shards --limit 1` processes stand in for two hosts: each has its
own PREFECT_HOME, working directory and shard-DuckDB directory, and shares with the controller
only what docs/deployments.md says hosts must share (the artifacts directory and the results
storage, here temporary directories). Both use this checkout as ARENA_PROJECT_DIR. They are
processes on one machine, not network namespaces: a shard is "remote" in that it runs in another
worker's process tree with its own home and files, and nothing in the shard or controller code
depends on more than that (host names are only reported). The controller flow runs in this test
process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pytest

from lossy_prefect_proxy import losing_first_creation
from server_helpers import PREFECT_BIN, PROJECT, PrefectServer, clean_env, stop_all, tail, wait_for
from pg_server import PASSWORD as PG_PASSWORD

POOL = "waa-shards"
WORKERS = ("host-a", "host-b")

# The operator's shard secret, the same on the controllers and the workers (flows/shard_signing.py).
SHARD_SECRET = "test-shard-secret-not-a-real-one"


@pytest.fixture(autouse=True)
def _shard_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Controllers run in this process too: they sign with the same secret as the workers."""
    monkeypatch.setenv("ARENA_SHARD_SECRET", SHARD_SECRET)


# Bundled tasks whose scripted plans are short, so each shard's pool is busy for a few seconds.
TASKS = [
    "notepad-append-line",
    "notepad-draft-documents",
    "explorer-rename-file",
    "explorer-create-projects-folder",
    "settings-notifications-off",
    "settings-storage-sense-on",
]


def _rows(db: Path, sql: str, params: list[Any] | None = None) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, params or []).fetchall()


# --- the controller's plain functions (no server) ---------------------------------------------


def test_split_into_shards_balances_expected_time_longest_first() -> None:
    from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
    from flows.shard import split_into_shards

    catalog = WAATaskCatalog(bundled_suite_dir())
    tasks = [catalog.load(t) for t in TASKS]
    # No history: equal counts, never an empty shard.
    assert [len(g) for g in split_into_shards(tasks, {}, 4)] == [2, 2, 1, 1]
    assert [len(g) for g in split_into_shards(tasks[:3], {}, 10)] == [1, 1, 1]
    # With history: the never-timed task first (counted as the mean, 4.8 s), then longest first
    # to the least-loaded shard.
    expected = dict(zip(TASKS[:5], [10.0, 9.0, 2.0, 2.0, 1.0]))
    groups = split_into_shards(tasks, expected, 2)
    ids = [[t.task_id for t in g] for g in groups]
    assert ids == [[TASKS[5], TASKS[1], TASKS[4]], [TASKS[0], TASKS[2], TASKS[3]]]
    with pytest.raises(ValueError, match="at least 1"):
        split_into_shards(tasks, {}, 0)


def test_shard_config_splits_servers_budget_and_keeps_paths_portable() -> None:
    from adapters.vms.base import ResetLevel
    from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
    from flows.budget import RunBudget
    from flows.run_config import SuiteRunConfig
    from flows.shard import shard_budget_limits, shard_config

    urls = [f"http://10.0.0.{i}:5000" for i in range(3)]
    config = SuiteRunConfig(
        provider="existing", waa_urls=urls, reset_level=ResetLevel.SETUP, shards=2, domains=["notepad"],
        max_wall_seconds=100, max_cost_usd=1.0, max_tokens=1001, run_id="r1",
    )
    budget = RunBudget(config, prior_cost_usd=0.2, prior_tokens=1)
    limits = shard_budget_limits(config, budget, 2)
    assert 99 < limits["max_wall_seconds"] <= 100  # wall time: all that is left, for every shard
    assert limits["max_cost_usd"] == pytest.approx(0.4) and limits["max_tokens"] == 500  # equal shares
    tasks = WAATaskCatalog(bundled_suite_dir()).tasks(ids=TASKS[:2])
    first = shard_config(config, "r1", 1, 2, tasks, limits)
    second = shard_config(config, "r1", 2, 2, tasks, limits)
    assert first.waa_urls == [urls[0], urls[2]] and second.waa_urls == [urls[1]]
    assert sorted(first.task_ids) == sorted(TASKS[:2]) and first.domains is None and first.shards == 0
    assert first.max_cost_usd == pytest.approx(0.4) and first.run_id == "r1"
    # The bundled suite travels as a path in the checkout, resolved in each host's own checkout.
    assert not first.suite_dir.is_absolute() and (PROJECT / first.suite_dir).resolve() == bundled_suite_dir().resolve()
    with pytest.raises(ValueError, match="one WAA server per shard"):
        SuiteRunConfig(provider="existing", waa_urls=urls[:1], reset_level=ResetLevel.SETUP, shards=2)
    with pytest.raises(ValueError, match="'flow/deployment'"):
        SuiteRunConfig(shards=2, shard_deployment="evaluate-shard")


# --- real server, real workers -------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A Prefect server, the shard deployment from prefect.yaml on a process pool, two workers."""
    tmp = tmp_path_factory.mktemp("shards")
    server = PrefectServer(tmp / "server-home", tmp / "server.log")
    api_url = server.api_url
    base_env = clean_env()
    shared = tmp / "shared"  # stands in for the filesystem every host mounts at the same path
    logs = {"server": server.log, **{w: tmp / f"{w}.log" for w in WORKERS}}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        server.start()

        # The documented setup: a process pool for shards, then the deployment from prefect.yaml.
        cli_env = {**base_env, "PREFECT_HOME": str(tmp / "cli-home"), "PREFECT_API_URL": api_url,
                   "PREFECT_LOGGING_LEVEL": "WARNING"}
        for args in (["work-pool", "create", POOL, "--type", "process"], ["deploy", "--name", "shard"]):
            done = subprocess.run(
                [str(PREFECT_BIN), "--no-prompt", *args], cwd=PROJECT, env=cli_env,
                capture_output=True, text=True, timeout=120,
            )
            assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"

        for name in WORKERS:
            host = tmp / name
            (host / "tmp").mkdir(parents=True)
            with logs[name].open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        [str(PREFECT_BIN), "worker", "start", "--pool", POOL, "--limit", "1", "--name", name],
                        cwd=host,
                        env={
                            **base_env,
                            "PREFECT_HOME": str(host / "prefect-home"),
                            "PREFECT_API_URL": api_url,
                            "PREFECT_WORKER_QUERY_SECONDS": "1",
                            "PREFECT_LOGGING_LEVEL": "INFO",
                            # The flow runs' logs land in this worker's log file (the process
                            # worker streams their output); not also sending them to the API
                            # keeps the server's SQLite writes down. Under load it has held its
                            # write lock for a minute ("database is locked"; docs: use Postgres).
                            "PREFECT_LOGGING_TO_API_ENABLED": "false",
                            # This host's temporary folder: a shard the crash test SIGKILLs
                            # leaves its simulated disks and evaluation cache there.
                            "TMPDIR": str(host / "tmp"),
                            # The pull step's working directory: this host's checkout.
                            "ARENA_PROJECT_DIR": str(PROJECT),
                            # Flow results (the shards' attempts) where the controller reads them.
                            "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(shared / "prefect-results"),
                            # This host's own shard DuckDB files (never shared).
                            "ARENA_SHARD_DB_DIR": str(host / "shard-db"),
                            # The team store's password (libpq's variable), for runs that use it.
                            "PGPASSWORD": PG_PASSWORD,
                            "ARENA_SHARD_SECRET": SHARD_SECRET,
                        },
                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                    )
                )
        info = {"api_url": api_url, "tmp": tmp, "shared": shared, "logs": logs}

        def both_workers_online() -> bool:
            with _client(info) as client:
                return {w.name for w in client.read_workers_for_work_pool(POOL)} >= set(WORKERS)

        try:
            wait_for("both workers to poll the pool", both_workers_online, 60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_logs(info)}") from None
        yield info
    finally:
        stop_all(procs, timeout=15)
        server.stop()


def _logs(cluster: dict[str, Any]) -> str:
    return "\n".join(f"--- {name} log:\n{tail(path)}" for name, path in cluster["logs"].items())


@contextmanager
def _client(cluster: dict[str, Any]) -> Iterator[Any]:
    """A sync Prefect client on the test server, whatever this process's own settings say."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: cluster["api_url"]}):
        with get_client(sync_client=True) as client:
            yield client


def _config(cluster: dict[str, Any], run_id: str, task_ids: list[str]) -> Any:
    from flows.run_config import SuiteRunConfig

    return SuiteRunConfig(
        task_ids=task_ids,
        agent="scripted",
        provider="local",
        pool_size=2,
        shards=2,
        # Generous: on a loaded 2-vCPU box the SQLite-backed test server has stalled a worker's
        # submission for 60 s (see the worker environment above).
        shard_start_timeout_seconds=300,
        db_path=cluster["tmp"] / "controller" / "arena.duckdb",
        artifacts_dir=cluster["shared"] / "artifacts",
        run_id=run_id,
    )


def _run_controller(cluster: dict[str, Any], config: Any) -> Any:
    from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED, temporary_settings

    from bench.prefect_server import api_for_this_block
    from flows.evaluate_suite import run_suite

    # Logs stay in this process: the test reads none of them from the server.
    with api_for_this_block(cluster["api_url"]), temporary_settings({PREFECT_LOGGING_TO_API_ENABLED: False}):
        return run_suite(config)


def _shard_runs(cluster: dict[str, Any], run_id: str) -> list[Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    with _client(cluster) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"run:{run_id}"])))


def _final_results(db: Path, run_id: str) -> dict[str, list[tuple[int, str]]]:
    """(attempt, outcome) of every stored attempt, by task."""
    out: dict[str, list[tuple[int, str]]] = {}
    for task_id, attempt, outcome in _rows(
        db, "SELECT task_id, attempt, outcome FROM task_results WHERE run_id = ? ORDER BY task_id, attempt", [run_id]
    ):
        out.setdefault(task_id, []).append((attempt, outcome))
    return out


def _replayed(cluster: dict[str, Any], original: Any, *, same_key: bool) -> Any:
    """What an API reader can do with a finished shard: a new flow run of the shard deployment
    with exactly its parameters, signature and ticket included; with `same_key`, also with its
    idempotency key, after deleting the original (Prefect keeps that key unique). The new
    run's final state."""
    with _client(cluster) as client:
        deployment = client.read_deployment_by_name("evaluate-shard/shard")
        if same_key:
            client.delete_flow_run(original.id)
        replay = client.create_flow_run_from_deployment(
            deployment.id, parameters=original.parameters, idempotency_key=original.idempotency_key if same_key else None)
        assert replay.id != original.id
        return wait_for("the replayed shard run to end", lambda: (st := client.read_flow_run(replay.id).state)
                        is not None and st.is_final() and st, 180)


def test_two_shards_on_two_workers_complete_the_run(cluster: dict[str, Any]) -> None:
    from prefect.client.schemas.objects import StateType

    run_id = "shards-ok"
    config = _config(cluster, run_id, TASKS)
    try:
        outcome = _run_controller(cluster, config)
    except Exception as exc:
        raise AssertionError(f"controller failed: {exc!r}\n{_logs(cluster)}") from exc
    assert outcome.status == "completed", f"{outcome.table}\n{_logs(cluster)}"
    assert outcome.shard_errors == []
    assert sorted(r.task_id for r in outcome.results) == sorted(TASKS)
    assert all(r.success for r in outcome.results), [(r.task_id, r.outcome.value, r.error) for r in outcome.results]

    # Every task has exactly one attempt, final, in the controller's file; the run is completed.
    db = config.db_path
    assert _final_results(db, run_id) == {t: [(1, "success")] for t in TASKS}
    assert _rows(db, "SELECT status, task_count FROM runs WHERE run_id = ?", [run_id]) == [("completed", len(TASKS))]
    # Steps came back with the attempts, and their screenshots are in the shared artifacts dir.
    shots = [Path(p) for (p,) in _rows(db, "SELECT screenshot_path FROM steps WHERE run_id = ?", [run_id])]
    assert shots and all(p.is_absolute() and p.exists() for p in shots), shots[:3]
    assert all(str(cluster["shared"] / "artifacts" / run_id) in str(p) for p in shots)

    # Two shard flow runs, both completed, each picked up by a different worker ("host").
    runs = _shard_runs(cluster, run_id)
    assert len(runs) == 2 and all(r.state.type == StateType.COMPLETED for r in runs), [(r.name, r.state) for r in runs]
    outcomes = [r.state.result() for r in runs]
    workers = {o["worker"]["worker_name"] for o in outcomes}
    if len(workers) == 1:
        # Any worker of the pool takes any shard. In whole runs of the suite under load, one
        # worker's polls have stalled on the test's SQLite server for longer than the other
        # worker's whole first shard, which then took the second as well (seen twice). Its
        # `--limit 1` must still hold: one shard after the other.
        first, second = sorted(runs, key=lambda r: r.start_time)
        assert first.end_time <= second.start_time, [(r.name, r.start_time, r.end_time) for r in runs]
    else:
        assert workers == set(WORKERS), outcomes
        assert len({o["worker"]["prefect_home"] for o in outcomes}) == 2
        assert len({o["worker"]["pid"] for o in outcomes}) == 2
    # Balanced: 3 tasks each, together exactly the run's tasks.
    assert sorted(len(o["task_ids"]) for o in outcomes) == [3, 3]
    assert sorted(t for o in outcomes for t in o["task_ids"]) == sorted(TASKS)
    # Each shard wrote its own DuckDB file on its own "host", holding exactly its tasks.
    for o in outcomes:
        assert o["in_team_store"] is False
        local = Path(o["store"])
        assert local.parent == cluster["tmp"] / o["worker"]["worker_name"] / "shard-db" and local.exists()
        assert sorted(t for (t,) in _rows(local, "SELECT task_id FROM task_results")) == sorted(o["task_ids"])
    # The controller's progress side file saw every final result.
    progress = (cluster["shared"] / "artifacts" / run_id / "progress.json").read_text()
    assert '"final": 6' in progress and '"status": "completed"' in progress

    # A copy of a finished shard's parameters (signature included) in a new flow run is refused
    # before anything runs: that run is not the one its ticket was issued for.
    replay = _replayed(cluster, runs[0], same_key=False)
    assert replay.type == StateType.FAILED and "not the one its controller created" in (replay.message or ""), replay
    assert _final_results(db, run_id) == {t: [(1, "success")] for t in TASKS}


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and everything under it: a worker host dying mid-shard."""
    root = psutil.Process(pid)
    victims = [*root.children(recursive=True), root]
    for p in victims:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(victims, timeout=10)


def test_a_crashed_shard_leaves_the_run_incomplete_and_resume_finishes_it(cluster: dict[str, Any]) -> None:
    from prefect.client.schemas.objects import StateType

    run_id = "shards-crash"
    tasks = TASKS[:4]
    config = _config(cluster, run_id, tasks)
    box: dict[str, Any] = {}

    def controller() -> None:
        try:
            box["outcome"] = _run_controller(cluster, config)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            box["error"] = exc

    thread = threading.Thread(target=controller, name="controller")
    thread.start()

    # As soon as one shard's process runs, kill its whole process tree.
    def running_shard() -> Any:
        runs = [r for r in _shard_runs(cluster, run_id) if r.state and r.state.type == StateType.RUNNING]
        return next((r for r in runs if r.infrastructure_pid), None)

    try:
        victim = wait_for("a running shard", running_shard, 180, interval=0.25)
    except AssertionError as exc:
        thread.join(300)
        raise AssertionError(f"{exc}\n{box}\n{_logs(cluster)}") from None
    _kill_tree(int(str(victim.infrastructure_pid).rsplit(":", 1)[-1]))
    thread.join(300)
    assert not thread.is_alive(), "controller still waiting 300 s after the shard was killed"
    assert "error" not in box, f"controller raised {box.get('error')!r}\n{_logs(cluster)}"
    outcome = box["outcome"]

    # The worker reported the killed shard Crashed; the other one completed.
    states = {r.id: r.state.type for r in _shard_runs(cluster, run_id)}
    assert states[victim.id] == StateType.CRASHED, states
    assert sorted(states.values(), key=str) == sorted([StateType.COMPLETED, StateType.CRASHED], key=str)

    # Not silently partial: incomplete, the killed shard's tasks are missing, and the error
    # names its flow run.
    killed_tasks = victim.parameters["config"]["task_ids"]
    # The split balances the durations recorded so far, so the killed shard held 1 to 3 of the 4.
    assert 1 <= len(killed_tasks) < len(tasks)
    assert outcome.status == "incomplete"
    assert outcome.completeness.missing == len(killed_tasks)
    assert outcome.completeness.not_started == len(killed_tasks)
    (error,) = outcome.shard_errors
    assert victim.name in error and str(victim.id) in error and "Crashed" in error
    assert "missing" in outcome.table and victim.name in outcome.table
    db = config.db_path
    assert _rows(db, "SELECT status FROM runs WHERE run_id = ?", [run_id]) == [("incomplete",)]
    stored = _final_results(db, run_id)
    assert sorted(stored) == sorted(set(tasks) - set(killed_tasks))
    assert all(v == [(1, "success")] for v in stored.values())

    # Before resuming, one missing task gets an earlier infrastructure-error attempt in the
    # controller's file (as a VM lost in an earlier invocation would leave): its shard must
    # continue at attempt 2, which only the controller's file knows about.
    from adapters.benchmark import BenchmarkResult, OutcomeKind
    from adapters.store.duckdb_store import ResultStore
    from adapters.store.lease import Controller

    retried = killed_tasks[0]
    with ResultStore(db) as store:  # that invocation: a controller of the run (only one may write it)
        store.start_run(store.get_run(run_id), resume=True, controller=Controller.this_process())
        store.record_result(
            run_id,
            BenchmarkResult(task_id=retried, outcome=OutcomeKind.INFRASTRUCTURE_ERROR, error="VM lost", attempt=1),
        )
        store.finish_run(run_id, "incomplete")

    # Resume (same run id): only the missing tasks run, again as shards; then every task has
    # exactly one final result, and no attempt was overwritten.
    try:
        again = _run_controller(cluster, config)
    except Exception as exc:
        raise AssertionError(f"resume failed: {exc!r}\n{_logs(cluster)}") from exc
    assert again.status == "completed", f"{again.table}\n{_logs(cluster)}"
    assert again.shard_errors == []
    assert sorted(r.task_id for r in again.results) == sorted(killed_tasks)
    expected = {t: [(1, "success")] for t in tasks}
    expected[retried] = [(1, "infrastructure_error"), (2, "success")]
    assert _final_results(db, run_id) == expected
    assert _rows(db, "SELECT status FROM runs WHERE run_id = ?", [run_id]) == [("completed",)]
    shots = _rows(
        db, "SELECT DISTINCT attempt, screenshot_path FROM steps WHERE run_id = ? AND task_id = ?", [run_id, retried]
    )
    assert shots and all(a == 2 and f"{retried}/attempt-2/" in p for a, p in shots), shots


def test_a_shard_whose_creation_the_client_sends_twice_is_one_flow_run(cluster: dict[str, Any]) -> None:
    """Prefect's client sends a request again when its answer does not arrive. A loaded server
    answered a shard's creation after the client's 60 s timeout, and the retry made a second flow
    run of that shard, which a worker ran too (seen as a third shard run in the crashed-shard
    test). The creation's idempotency key makes the server hand back the run it already made."""
    from prefect.client.schemas.actions import WorkPoolUpdate

    from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
    from bench.prefect_server import api_for_this_block
    from flows.budget import RunBudget
    from flows.shard import issue_tickets, shard_budget_limits, split_into_shards, start_shards

    run_id = "shards-resent"
    config = _config(cluster, run_id, TASKS[:2])
    catalog = WAATaskCatalog(bundled_suite_dir())
    groups = split_into_shards(catalog.tasks(ids=TASKS[:2]), {}, 2)
    limits = shard_budget_limits(config, RunBudget(config), len(groups))
    with _client(cluster) as client:  # the workers leave the shards alone: only their creation matters
        client.update_work_pool(POOL, WorkPoolUpdate(is_paused=True))
    try:
        with losing_first_creation(cluster["api_url"]) as proxy, api_for_this_block(proxy.api_url):
            created = list(start_shards(config, run_id, groups, catalog.content_hash(), {}, {t: 1 for t in TASKS[:2]},
                                        limits, issue_tickets(config, len(groups))))
        runs = _shard_runs(cluster, run_id)
        # At least one creation was sent again (more when the server answered a busy 503 too).
        assert len(proxy.creations) >= 3, proxy.creations
        assert sorted(r.name for r in runs) == [f"{run_id}-shard-1-of-2", f"{run_id}-shard-2-of-2"]
        assert sorted(str(r.id) for r in runs) == sorted(str(c.flow_run_id) for c in created)
    finally:
        with _client(cluster) as client:
            for run in _shard_runs(cluster, run_id):
                client.delete_flow_run(run.id)
            client.update_work_pool(POOL, WorkPoolUpdate(is_paused=False))


def test_a_shard_its_controller_did_not_sign_is_refused(cluster: dict[str, Any]) -> None:
    """Anyone who reaches the Prefect API can create a run of the shard deployment; without the
    controller's signature (or with parameters changed after signing) it fails before anything
    starts: no VM, no store, nothing written."""
    from prefect.client.schemas.objects import StateType

    from adapters.waa.catalog import WAATaskCatalog
    from flows.shard import issue_tickets, shard_config, shard_parameters
    from flows.shard_signing import sign_shard

    run_id = "shards-forged"
    config = _config(cluster, run_id, TASKS[:1])
    tasks = WAATaskCatalog(config.suite_dir).tasks(ids=[TASKS[0]])
    (ticket,) = issue_tickets(config, 1)
    parameters = shard_parameters(shard_config(config, run_id, 1, 1, tasks, {}), 1, 1, None, {TASKS[0]: 1}, {},
                                  ticket.ticket, ticket.expires_at.isoformat() + "+00:00")
    signature = sign_shard(parameters)
    hostile = {**parameters, "config": {**parameters["config"], "db_path": "/tmp/shard-forged.duckdb"}}
    with _client(cluster) as client:
        deployment = client.read_deployment_by_name("evaluate-shard/shard")
        runs = [client.create_flow_run_from_deployment(deployment.id, parameters=p)
                for p in ({**parameters, "signature": "0" * 64}, {**hostile, "signature": signature}, parameters)]
        for run in runs:
            state = wait_for("the forged shard run to end", lambda: (st := client.read_flow_run(run.id).state)
                             is not None and st.is_final() and st, 120)
            assert state.type == StateType.FAILED, state
            assert "not signed by a controller" in (state.message or ""), state.message
    assert not Path("/tmp/shard-forged.duckdb").exists()
    assert not (cluster["shared"] / "artifacts" / run_id).exists()


def test_a_missing_shard_deployment_fails_the_run_naming_it(cluster: dict[str, Any]) -> None:
    """A misconfiguration fails loudly before any shard starts: the run is "failed", not partial."""
    run_id = "shards-no-deployment"
    config = _config(cluster, run_id, TASKS[:2]).model_copy(update={"shard_deployment": "evaluate-shard/nope"})
    with pytest.raises(ValueError, match="'evaluate-shard/nope' does not exist on the Prefect server"):
        _run_controller(cluster, config)
    assert _rows(config.db_path, "SELECT status FROM runs WHERE run_id = ?", [run_id]) == [("failed",)]
    assert _shard_runs(cluster, run_id) == []


def test_two_controllers_with_shards_write_one_team_store(
    cluster: dict[str, Any], postgres_url: str, tmp_path: Path
) -> None:
    """The team store: two `arena run --shards 2` controllers at once, their four shards on the
    two workers, all writing one PostgreSQL store; every task has exactly one final result per
    run, written by the shard itself (no shard file on any host, nothing copied back)."""
    import psycopg

    bare = postgres_url.replace(f":{PG_PASSWORD}@", "@")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and not k.startswith("ARENA_")}
    env.update(PREFECT_API_URL=cluster["api_url"], ARENA_STORE_URL=bare, PGPASSWORD=PG_PASSWORD,
               PYTHONPATH=str(PROJECT), PREFECT_LOGGING_TO_API_ENABLED="false", ARENA_SHARD_SECRET=SHARD_SECRET)
    run_ids = ["team-shards-a", "team-shards-b"]
    controllers = []
    for run_id in run_ids:
        home = tmp_path / run_id
        home.mkdir()
        args = ["run", "--run-id", run_id, "--shards", "2", "--pool-size", "1",
                "--artifacts", str(cluster["shared"] / "artifacts"), *[a for t in TASKS[:4] for a in ("--task", t)]]
        controllers.append(subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *args], cwd=home, env={**env, "PREFECT_HOME": str(home / "prefect")},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    outputs = [c.communicate(timeout=600) for c in controllers]
    for controller, (out, err) in zip(controllers, outputs):
        assert controller.returncode == 0, f"{out[-2000:]}\n{err[-3000:]}\n{_logs(cluster)}"

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        runs = conn.execute("SELECT run_id, status, task_count FROM runs ORDER BY run_id").fetchall()
        finals = conn.execute(
            "SELECT run_id, task_id, count(*), max(attempt), bool_and(success) FROM task_results "
            "GROUP BY run_id, task_id ORDER BY run_id, task_id"
        ).fetchall()
    assert runs == [(r, "completed", 4) for r in run_ids]
    assert finals == [(r, t, 1, 1, True) for r in run_ids for t in sorted(TASKS[:4])]
    # Each run's two shards ran on the workers and wrote the store themselves.
    for run_id in run_ids:
        outcomes = [r.state.result() for r in _shard_runs(cluster, run_id)]
        assert len(outcomes) == 2 and all(o["in_team_store"] and o["store"] == bare for o in outcomes), outcomes
    assert not [p for p in cluster["tmp"].rglob("team-shards-*.duckdb")]

    # Replays of a finished shard: a copy of its parameters in a new flow run is refused; so is
    # one with its idempotency key too (its original deleted first): its ticket is spent, on
    # that host and in the team store. Nothing new reaches the store.
    from prefect.client.schemas.objects import StateType

    original = _shard_runs(cluster, run_ids[0])[0]
    copied = _replayed(cluster, original, same_key=False)
    assert copied.type == StateType.FAILED and "not the one its controller created" in (copied.message or ""), copied
    keyed = _replayed(cluster, original, same_key=True)
    assert keyed.type == StateType.FAILED and "spent" in (keyed.message or ""), keyed
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        after = conn.execute(
            "SELECT run_id, task_id, count(*), max(attempt), bool_and(success) FROM task_results "
            "GROUP BY run_id, task_id ORDER BY run_id, task_id"
        ).fetchall()
        status = conn.execute("SELECT status FROM runs WHERE run_id = %s", [run_ids[0]]).fetchone()
    assert after == finals and status == ("completed",)
