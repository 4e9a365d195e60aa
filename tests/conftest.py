"""Shared fixtures: a throwaway Prefect home and, for flow tests, one Prefect test server."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import machine_pace
import pytest

from adapters import import_gc

# Collecting imports every test module, and through them most of Prefect and the project, in each
# of the five workers: with Python's collector paused meanwhile (adapters/import_gc.py) that takes
# about 3.3 s of CPU per worker instead of 5.3 s (measured). Resumed once collection ends
# (`pytest_collection_finish`), or at once in xdist's controller, which collects nothing.
import_gc.pause()

# The machine's pace, measured once in the session's first process and shared with its workers
# (tests/machine_pace.py): the tests' time limits stretch with it.
machine_pace.measured_pace()

# Before Prefect is imported anywhere: the test session's own Prefect home, and none of the user's
# Prefect or store settings. A session that kept the user's PREFECT_HOME stopped that home's local
# server when it ended, under the user's own `arena run`; one that kept PREFECT_API_URL would run
# its flows on the user's server, and ARENA_STORE_URL would send its results to the team's store.
# xdist's workers inherit their controller's environment, so they share the home it made.
_SESSION_HOME = "ARENA_TEST_SESSION_PREFECT_HOME"
if not os.environ.get(_SESSION_HOME) or os.environ.get(_SESSION_HOME) != os.environ.get("PREFECT_HOME"):
    for _name in [n for n in os.environ if n.startswith("PREFECT_") or n == "ARENA_STORE_URL"]:
        del os.environ[_name]
    os.environ["PREFECT_HOME"] = os.environ[_SESSION_HOME] = tempfile.mkdtemp(prefix="arena-test-prefect-")
    # Gone with the process that made it; it was left behind in /tmp before.
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
# No test falls back on Prefect's temporary server: Prefect starts one (a server process, and
# its event worker then sends there for the rest of the test process) in a test that uses its
# API where none is configured. A test that uses the API asks for `prefect_server` (or runs on a
# server of its own); one that does not fails with "No Prefect API URL provided" whenever no
# earlier test in its process has started that server, as in `pytest -m "not servers"`.
os.environ["PREFECT_SERVER_EPHEMERAL_ENABLED"] = "false"
# A local Prefect server that `arena run` starts stops 5 s after its last run, not 5 minutes.
os.environ.setdefault("ARENA_LOCAL_SERVER_IDLE_SECONDS", "5")
# The tests' file and web servers on 127.0.0.1 stand in for the public web that task downloads,
# cloud_file and page_info reach, so the operator's fetch allow-list names loopback here
# (adapters/waa/host_fetch.py); the tests of the policy itself clear it.
os.environ["ARENA_FETCH_ALLOW"] = "127.0.0.1"


# The tests' Prefect APIs are plain http on 127.0.0.1, as the local server `arena run` starts is;
# their clients load the same one-certificate CA file as that server's (flows/plain_http_ca.pem)
# instead of the system's or certifi's bundle (measured: 31 ms of CPU per client against 0.8 ms).
# No test talks to Prefect over TLS; the xdist workers and the processes the tests start inherit
# the setting.
if "PREFECT_API_SSL_CERT_FILE" not in os.environ:
    from flows.local_server import PLAIN_HTTP_CA_FILE

    os.environ["PREFECT_API_SSL_CERT_FILE"] = str(PLAIN_HTTP_CA_FILE)

SHARED_TASKS = Path(__file__).resolve().parents[2] / "shared" / "waa-tasks"

# Real-process scenarios (whole `arena run`s killed, cut off, run side by side; servers stopped and
# started; real QEMU): most of the suite's time. They carry the `scenario` mark, so a quick
# development pass can leave them out: pytest -m "not scenario" (README, "Developing"). Each with
# the seconds its tests took together in a whole-suite run here (2 cores, 4 workers), which only
# orders the suite (tests/longest_first.py): a stale figure costs time, never a test.
SCENARIO_MODULES = {
    "tests/flows/test_store_failures.py": 310, "tests/deployments/test_shards_server.py": 265,
    "tests/deployments/test_operations_server.py": 255, "tests/flows/test_local_server_lifetime.py": 155,
    "tests/store/test_team_store.py": 125, "tests/flows/test_cli.py": 125,
    "tests/deployments/test_prefect_states_server.py": 120, "tests/deployments/test_deployments_server.py": 115,
    "tests/flows/test_truthful_runs.py": 95, "tests/flows/test_concurrent_runs.py": 85,
    "tests/vms/test_kvm.py": 80, "tests/flows/test_faults.py": 80, "tests/vms/test_kvm_runs.py": 70,
    "tests/vms/test_kvm_isolation.py": 25, "tests/vms/test_desktop_guest.py": 160,
    "tests/vms/test_kvm_saved_state.py": 45,
    "tests/waa/test_setup_coverage.py": 55, "tests/results/test_demos_from_run.py": 15,
    "tests/deployments/test_prefect_auth_server.py": 15,
}
# Other modules with a test of 20 s or more (whole in-process runs), measured likewise: ordered
# with the scenarios so that none of them is left to run alone at the end.
LONG_MODULES = {
    **SCENARIO_MODULES,
    "tests/waa/test_evaluate_endpoint.py": 50, "tests/flows/test_trials_run.py": 50,
    "tests/flows/test_flow_e2e.py": 45, "tests/results/test_report.py": 45,
    "tests/results/test_trials_statistics.py": 45, "tests/vms/test_cloud_pipeline.py": 40,
    "tests/flows/test_adaptive_model_update.py": 25, "tests/agents/test_agents_pipeline.py": 20,
}


# Tests that use a Prefect test server or a WAA simulation (these fixtures) carry the `servers`
# mark: the quickest development pass leaves them out too, pytest -m "not scenario and not servers".
# (readme_queries_db asks for prefect_server only when it is needed, so it is named here too.)
SERVER_FIXTURES = {"prefect_server", "sim", "waa_sim", "readme_queries_db"}


def _module(item: pytest.Item) -> str:
    """The test's module as a path from the project's root (tests/...)."""
    return item.path.resolve().relative_to(Path(__file__).resolve().parents[1]).as_posix()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of the scenario modules (see SCENARIO_MODULES) and the tests that use a
    server fixture (SERVER_FIXTURES)."""
    for item in items:
        if _module(item) in SCENARIO_MODULES:
            item.add_marker(pytest.mark.scenario)
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.servers)


class _LongestFirst:
    """Orders the collected tests for xdist's workers (tests/longest_first.py), after `-m` and
    `-k` have deselected theirs: the slices xdist cuts are of the tests that run."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        from longest_first import longest_first

        workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
        items[:] = longest_first(items, _module, workers, LONG_MODULES)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Each test's time limit (pytest-timeout's, read in its own wrapper of this hook, which runs
    inside this one) stretched by the machine's pace now (tests/machine_pace.py): a limit that
    ends a hanging test, written for a quiet machine, must not end a slow one on a busy machine."""
    from machine_pace import pace

    marker = item.get_closest_marker("timeout")
    written = float(marker.args[0]) if marker is not None and marker.args else float(
        item.config.getini("timeout") or 300)
    factor = pace()
    if factor > 1.0:
        item.add_marker(pytest.mark.timeout(written * factor), append=False)  # before the one written
    yield


def pytest_configure(config: pytest.Config) -> None:
    """Register the suite's ordering for xdist (`_LongestFirst`); in xdist's controller, resume
    the collector paused for collection."""
    config.pluginmanager.register(_LongestFirst(), "arena-longest-first")
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        import_gc.resume()


def pytest_collection_finish(session: pytest.Session) -> None:
    """The tests' modules are imported: resume the collector (frozen out of its passes)."""
    import_gc.resume()


@pytest.fixture(scope="session", autouse=True)
def _stop_local_server() -> Iterator[None]:
    """The session's own local Prefect server (if an in-process `arena run` started one) ends
    with the session; it is on the session's own home, never the user's."""
    yield
    from flows.local_server import stop_server

    stop_server(Path(os.environ["PREFECT_HOME"]))


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local WAA simulation server for the tests of one module (stopped after them)."""
    from adapters.waa.localenv.launcher import start_local_env

    handle = start_local_env(tmp_path_factory.mktemp("sim"))
    yield handle
    handle.stop()


# The API URL of this test process's Prefect server while it runs (`prefect_server`).
_session_api: list[str] = []


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One Prefect server for every flow test: the local server's app, as `arena run` starts it,
    on an already-migrated home (tests/prefect_home.py: about 5 s of start-up saved).

    The xdist workers share one (`_shared_server`): a server costs about 3 CPU-s to start and
    1.2-1.7 CPU-s a minute while idle, so five of them, each idle most of a 10-15 minute suite,
    cost about 100 CPU-s more than one. A test process of its own (`-n 0`) has one of its own."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        context = _shared_server(tmp_path_factory.getbasetemp().parent / "shared-prefect")
    else:
        context = _server_of_its_own(tmp_path_factory.mktemp("prefect-server"))
    with context as api_url:
        _session_api.append(api_url)
        try:
            yield
        finally:
            _session_api.clear()


@contextlib.contextmanager
def _shared_server(home: Path) -> Iterator[str]:
    """The test run's one Prefect server on `home` (a folder all xdist workers of the run see),
    held by this worker until the block ends; yields its API URL, made this process's API.

    It is the shared local server `arena run` uses (flows/local_server.py `ensure_server`): the
    first worker starts it, the others find it, each holds it for as long as it runs, and it
    stops once none has for ARENA_LOCAL_SERVER_IDLE_SECONDS (5 s here), however the workers end.
    The runs of different workers meet on it, so each test names its runs uniquely (a run's
    concurrency limit is named after its run id), and a test that changes what all runs use, or
    counts on being alone, asks for `own_prefect_server`."""
    import fcntl
    from unittest import mock

    from prefect.context import _temporary_global_settings_context, get_settings_context
    from prefect_home import DATABASE, SEEDED_SERVER_SETTINGS, seeded_home

    from bench.prefect_server import api_for_this_block
    from flows.local_server import ensure_server

    with open(f"{home}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / DATABASE).exists():
            seeded_home(home)
    # The server's own settings: its supervisor passes this process's environment down to it.
    server_env = {"PREFECT_HOME": str(home), "PREFECT_UI_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING",
                  **SEEDED_SERVER_SETTINGS}
    with mock.patch.dict(os.environ, server_env):
        server = ensure_server(home)
    try:
        with api_for_this_block(server.api_url), _temporary_global_settings_context(get_settings_context()):
            yield server.api_url
    finally:
        server.release()


def _server_of_its_own(folder: Path) -> contextlib.AbstractContextManager[str]:
    """The local server's app on a migrated home in `folder`, made this process's API for the
    block (bench/prefect_server.py `server_for_this_process`); yields its URL."""
    from prefect_home import SEEDED_SERVER_SETTINGS, seeded_home

    from bench.prefect_server import server_for_this_process

    return server_for_this_process(seeded_home(folder / "home"), folder / "server.log", SEEDED_SERVER_SETTINGS)


@pytest.fixture()
def own_prefect_server(tmp_path: Path) -> Iterator[str]:
    """A Prefect server of the test's own (the local server's app on a migrated home), made the
    process's API for the test; yields its URL. For a test that changes what every run on its
    server uses, or counts on being the server's only user."""
    with _server_of_its_own(tmp_path / "own-prefect") as api_url:
        yield api_url


@pytest.fixture(autouse=True)
def _prefect_events_go_to_the_session_server() -> Iterator[None]:
    """Fails the test that leaves Prefect's event worker sending anywhere but this process's
    Prefect server (`prefect_server`), and ends that worker.

    The worker keeps the server it first sent to, for the whole process (bench/prefect_server.py
    `end_background_work`). A test that runs flows in-process on another server (a proxy, a
    module's own server) without `api_for_this_block` left it there: the next test of the process
    that read its task runs from its own server, whichever that was in the order, found none.
    Checked here, the failure names the test that did it."""
    yield
    import sys

    if "prefect.events.worker" not in sys.modules:  # no Prefect run in this process yet
        return
    from urllib.parse import urlsplit

    from prefect.events.worker import EventsWorker

    expected = {urlsplit(url).netloc for url in _session_api}
    elsewhere = sorted(
        url for url in (_events_destination(worker) for worker in list(EventsWorker._instances.values())
                        if isinstance(worker, EventsWorker) and not worker._stopped)
        if url is not None and urlsplit(url).netloc not in expected
    )
    if elsewhere:
        from bench.prefect_server import end_background_work

        end_background_work()
        pytest.fail(f"the test left Prefect's event worker sending to {', '.join(elsewhere)}, not to this process's "
                    "Prefect server: run flows on another server inside bench.prefect_server.api_for_this_block",
                    pytrace=False)


def _events_destination(worker: Any) -> str | None:
    """Where a running Prefect event worker sends (its client's websocket URL), None while it starts."""
    from prefect.events.clients import PrefectEventsClient

    client = getattr(worker, "_client", None)
    if not isinstance(client, PrefectEventsClient):  # starting, or a client that sends nowhere
        return None
    url = getattr(client, "_events_socket_url", None)
    if not isinstance(url, str):
        raise RuntimeError(f"Prefect's event client {type(client).__name__} no longer names its websocket URL "
                           "(_events_socket_url): update tests/conftest.py's check to this Prefect version")
    return url


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A real PostgreSQL server on 127.0.0.1 for the session (its `arena` database's URL), or a
    clean skip when PostgreSQL or psycopg is not installed."""
    from pg_server import postgres_bindir, running_postgres

    if postgres_bindir() is None:
        pytest.skip("PostgreSQL is not installed (the postgresql package provides initdb and pg_ctl)")
    pytest.importorskip("psycopg", reason="psycopg is not installed (the team extra)")
    with running_postgres() as url:
        yield url


@pytest.fixture()
def postgres_url(postgres_server: str) -> str:
    """The URL of a new, empty database on the session's PostgreSQL server."""
    import uuid

    import psycopg

    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_server.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def waa_tasks_dir() -> Path:
    """The 154 real WAA tasks beside the project, or a clean skip when they are absent."""
    if not (SHARED_TASKS / "test_all.json").exists():
        pytest.skip(f"real WAA tasks not found at {SHARED_TASKS}")
    return SHARED_TASKS
