"""The shared local Prefect server never outlives its use: not when its home folder is deleted
(a PREFECT_HOME in a temporary directory), not when the folder now belongs to another server,
not when its supervisor is killed. `arena doctor` lists what runs and stops it.

Real processes throughout: `ensure_server` in user processes, real `arena run`s, real SIGKILLs
and a real `rm -rf` of the home. The idle limit is set long (30 s) where a test shows that a
server without a home does not wait for it. The servers of the `ensure_server` tests keep their
database outside the home, one per test worker, so that only the first one pays for the schema
migrations (~10 s); the `arena run` test keeps the default, a database inside the home.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests
from ports import server_port
from prefect_home import DATABASE, SEEDED_SERVER_SETTINGS, seeded_home
from processes import ended_within

from flows.cli import main
from flows.doctor import local_server_lines
from flows.local_server import (LocalServerError, ProcessRef, RunningServer, ensure_server,
                                find_running_servers, state_dir, stop_server)
from tests.flows.test_concurrent_runs import ROOT, USER, _env

LONG_IDLE = "30"


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The database URL the servers of this module's `ensure_server` tests share (migrated)."""
    return f"sqlite+aiosqlite:///{seeded_home(tmp_path_factory.mktemp('prefect-db')) / DATABASE}"


def _user(home: Path, database: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    """A process using the shared server of `home` until its stdin gets a line; and the record
    of the server it uses."""
    env = {**_env(home, LONG_IDLE), "PREFECT_SERVER_DATABASE_CONNECTION_URL": database, **SEEDED_SERVER_SETTINGS}
    user = subprocess.Popen([sys.executable, "-c", USER, str(home)], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert user.stdout is not None
    line = user.stdout.readline()
    assert line, user.communicate(timeout=30)[1][-3000:]
    record = json.loads((state_dir(home) / "server.json").read_text())
    assert line.split()[0] == record["api_url"]
    return user, record


def _release(user: subprocess.Popen[str]) -> None:
    if user.poll() is None and user.stdin is not None:
        user.stdin.write("\n")
        user.stdin.flush()
    user.wait(timeout=30)


def _pids(record: dict[str, object]) -> list[int]:
    return [int(str(record["supervisor_pid"])), int(str(record["server_pid"]))]


def _all_gone(pids: list[int], timeout: float) -> float | None:
    """Seconds until every pid has ended, or None if one still runs after `timeout`."""
    started = time.monotonic()
    for pid in pids:
        if not ended_within(pid, max(0.0, timeout - (time.monotonic() - started))):
            return None
    return time.monotonic() - started


def _listed(port: object) -> RunningServer | None:
    return next((s for s in find_running_servers() if s.port == port), None)


def _kill_left(*records: dict[str, object]) -> None:
    """Clean-up after a failed assertion: end what a test started (by its own pids)."""
    for record in records:
        for pid in _pids(record):
            try:
                process = psutil.Process(pid)
                if "flows.local_server" in " ".join(process.cmdline()) or "uvicorn" in process.cmdline():
                    process.kill()
            except psutil.Error:
                pass


def test_a_server_whose_home_is_deleted_stops_once_no_run_uses_it(tmp_path: Path, database: str) -> None:
    """While a run uses it, the server stays (and `arena doctor` shows its home as deleted);
    once its last user dies (SIGKILL), it stops at once: nobody can find it any more."""
    home = tmp_path / "prefect"
    user, record = _user(home, database)
    try:
        shutil.rmtree(home)
        time.sleep(2.5)  # more than two of the supervisor's checks
        assert all(psutil.pid_exists(pid) for pid in _pids(record)), "stopped under a run using it"
        listed = _listed(record["port"])
        assert listed is not None and listed.home == home and listed.home_state == "deleted"
        assert listed.supervisor is not None and listed.supervisor.pid == record["supervisor_pid"]
        line = next(line for line in local_server_lines(find_running_servers()) if f"port {record['port']} " in line)
        assert f"home {home} (deleted)" in line and "stops once no run uses it" in line
        user.kill()
        user.wait(timeout=10)
        seconds = _all_gone(_pids(record), 20)
        print(f"server gone {seconds} s after its last user died (idle limit {LONG_IDLE} s)")
        assert seconds is not None, "a server whose home is deleted outlived its last user"
    finally:
        user.kill()
        _kill_left(record)


def test_a_server_whose_home_now_belongs_to_another_server_stops(tmp_path: Path, database: str) -> None:
    """A: the home folder is deleted and made again, and B starts in it. B: its server hangs,
    so the next run starts C in the same folder. Each replaced server stops when its own users
    leave, though the new server's users hold theirs; the new one stays, and `arena doctor
    --stop-local-servers PORT` stops it."""
    home = tmp_path / "prefect"
    user_a, a = _user(home, database)
    records = [a]
    users = [user_a]
    try:
        shutil.rmtree(home)
        user_b, b = _user(home, database)
        records.append(b)
        users.append(user_b)
        assert b["supervisor_pid"] != a["supervisor_pid"]
        _release(user_a)
        assert _all_gone(_pids(a), 20) is not None, "the old server outlived its users"
        assert all(psutil.pid_exists(pid) for pid in _pids(b))

        os.kill(int(str(b["server_pid"])), signal.SIGSTOP)  # B hangs: the next run finds it unhealthy
        try:
            user_c, c = _user(home, database)
        finally:
            os.kill(int(str(b["server_pid"])), signal.SIGCONT)
        records.append(c)
        users.append(user_c)
        assert c["supervisor_pid"] != b["supervisor_pid"]
        listed = _listed(b["port"])
        assert listed is not None and listed.home_state == "another server's"
        _release(user_b)
        assert _all_gone(_pids(b), 20) is not None, "a replaced server outlived its users"
        assert all(psutil.pid_exists(pid) for pid in _pids(c))
        assert json.loads((state_dir(home) / "server.json").read_text()) == c

        assert main(["doctor", "--stop-local-servers", str(c["port"])]) == 0
        assert _all_gone(_pids(c), 5) is not None
        assert not (state_dir(home) / "server.json").exists()  # its supervisor removed its record
        _release(user_c)
    finally:
        for user in users:
            user.kill()
        _kill_left(*records)


def test_the_server_dies_with_its_supervisor(tmp_path: Path, database: str) -> None:
    """SIGKILL of the supervisor (no clean-up of its own can run) still ends the server."""
    home = tmp_path / "prefect"
    user, record = _user(home, database)
    try:
        os.kill(int(str(record["supervisor_pid"])), signal.SIGKILL)
        assert ended_within(int(str(record["server_pid"])), 5), "the server outlived its supervisor"
    finally:
        user.kill()
        _kill_left(record)


ABANDONED_START = """
import sys
from pathlib import Path
from flows.local_server import ServerStart
start = ServerStart(Path(sys.argv[1]))  # as `arena run` begins it, before it imports Prefect
start.abandon()  # the run ended before it used the server (its imports failed, Ctrl-C)
print("abandoned", flush=True)
sys.stdin.readline()
"""


def test_a_server_started_for_a_run_that_ended_before_using_it_is_let_go(tmp_path: Path, database: str) -> None:
    """`arena run` finds or starts its server in the background while it imports Prefect. A run
    that ends before it takes the server releases it once it is up, so the server stops when
    idle even while that process lives on (`arena run` called from Python, a test worker)."""
    home = tmp_path / "prefect"
    env = {**_env(home, "1"), "PREFECT_SERVER_DATABASE_CONNECTION_URL": database, **SEEDED_SERVER_SETTINGS, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-c", ABANDONED_START, str(home)], cwd=ROOT, env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    record: dict[str, object] = {}
    try:
        assert process.stdout is not None and process.stdout.readline() == "abandoned\n"
        deadline = time.monotonic() + 120
        while not (state_dir(home) / "server.json").exists():
            assert time.monotonic() < deadline and process.poll() is None, process.communicate(timeout=30)[1][-3000:]
            time.sleep(0.05)
        record = json.loads((state_dir(home) / "server.json").read_text())
        seconds = _all_gone(_pids(record), 20)
        print(f"server gone {seconds} s after it came up (idle limit 1 s), its starter still running")
        assert seconds is not None, "the server stayed held by a process that never used it"
        assert process.poll() is None
    finally:
        _release(process)
        if record:
            _kill_left(record)


def test_arena_runs_in_deleted_temporary_homes_leave_no_server(tmp_path: Path) -> None:
    """The issue's check: an `arena run` that completes and one killed with SIGKILL mid-run,
    each with PREFECT_HOME in a temporary folder deleted afterwards; no server of theirs is
    left within the idle limit plus a few seconds. (The limit is long here, and the servers must
    be gone within half of it, so that deleting the homes is what stops them.)"""
    idle = 60.0
    homes = [tmp_path / "completes" / "prefect", tmp_path / "killed" / "prefect"]
    runs = []
    for home in homes:
        seeded_home(home)
        with (home.parent / "stderr.txt").open("w") as log:
            runs.append(subprocess.Popen(
                [sys.executable, "-m", "flows.cli", "run", "--task", "notepad-append-line", "--pool-size", "1"],
                cwd=home.parent, env={**_env(home, str(idle)), **SEEDED_SERVER_SETTINGS, "PYTHONPATH": str(ROOT)},
                stdout=subprocess.DEVNULL, stderr=log, text=True))
    completes, killed = runs
    records: list[dict[str, object]] = []
    try:
        for home, run in zip(homes, runs):
            err = home.parent / "stderr.txt"
            deadline = time.monotonic() + 180
            while "Prefect UI: " not in err.read_text():  # the run holds its server from here on
                assert time.monotonic() < deadline, err.read_text()[-3000:]
                assert run.poll() is None or run is completes, err.read_text()[-3000:]
                time.sleep(0.2)
            records.append(json.loads((state_dir(home) / "server.json").read_text()))
        killed.kill()
        killed.wait(timeout=10)
        assert completes.wait(timeout=300) == 0, (homes[0].parent / "stderr.txt").read_text()[-3000:]
        # The UI shows the run's task runs: they reach the server as events only, which its
        # task-run recorder service writes (a server without its services shows none).
        printed = (homes[0].parent / "stderr.txt").read_text()
        flow_run_id = re.search(r"Flow run: \S+/runs/flow-run/([0-9a-f-]{36})", printed).group(1)
        assert _task_run_count(str(records[0]["api_url"]), flow_run_id) >= 5  # pool, lane, task, attempt, stages
        for home in homes:
            shutil.rmtree(home)
        seconds = _all_gone([pid for record in records for pid in _pids(record)], idle / 2)
        print(f"both servers gone {seconds} s after their homes were deleted (idle limit {idle:g} s)")
        assert seconds is not None, "a server outlived its deleted home"
        assert not [s for s in find_running_servers() if s.home in homes]
    finally:
        for run in runs:
            run.kill()
        _kill_left(*records)


def _task_run_count(api_url: str, flow_run_id: str, timeout: float = 30.0) -> int:
    """The task runs the server has recorded for a flow run, once their count stops growing."""
    deadline, last = time.monotonic() + timeout, -1
    while True:
        count = requests.post(f"{api_url}/task_runs/count", timeout=10,
                              json={"flow_runs": {"id": {"any_": [flow_run_id]}}}).json()
        if (count and count == last) or time.monotonic() > deadline:
            return int(count)
        last = count
        time.sleep(1.0)


def test_a_server_left_without_its_supervisor_is_listed_and_stopped(tmp_path: Path) -> None:
    """A Prefect server process as versions before this fix left behind (no supervisor, no
    marker: only web server, PREFECT_HOME deleted) is listed as never stopping by itself, and
    `arena doctor --stop-local-servers PORT` ends it. Someone's own `prefect server start` is
    not ours and is not listed."""
    import prefect

    port, other_port = server_port(), server_port()
    home = tmp_path / "prefect"
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parent.parent),
               "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port"]
    env = {**_env(home), "PREFECT__SERVER_WEBSERVER_ONLY": "1"}
    left = subprocess.Popen([*command, str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    theirs = subprocess.Popen([*command, str(other_port)], env={**env, "PREFECT__SERVER_FINAL": "1"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        listed = _listed(port)
        assert listed is not None and listed.supervisor is None and listed.home == home
        assert listed.home_state == "deleted"
        assert _listed(other_port) is None
        line = next(line for line in local_server_lines([listed]) if f"port {port} " in line)
        assert "NO SUPERVISOR: it never stops by itself" in line
        assert main(["doctor", "--stop-local-servers", str(port)]) == 0
        assert left.wait(timeout=5) is not None
        assert theirs.poll() is None
    finally:
        left.kill()
        theirs.kill()


def test_listing_lines() -> None:
    now = 10_000.0
    servers = [
        RunningServer(4300, Path("/h/a/arena-server"), ProcessRef(11, 1.0), ProcessRef(12, 2.0), now - 75, "in place"),
        RunningServer(4301, Path("/h/b/arena-server"), ProcessRef(21, 1.0), None, now - 7400, "another server's"),
        RunningServer(None, None, None, ProcessRef(31, 3.0), now - 5, "unknown"),
    ]
    heading, *lines = local_server_lines(servers, now)
    assert heading == "Local Prefect servers started by arena run (3):"
    assert lines == [
        "  port 4300  up 1m15s  home /h/a  pid 11/12  stops once idle; stop it: arena doctor --stop-local-servers 4300",
        "  port 4301  up 2h03m  home /h/b (now another server's)  pid 21  stops once no run uses it; "
        "stop it: arena doctor --stop-local-servers 4301",
        "  port ?  up 5s  home unknown  pid 31  NO SUPERVISOR: it never stops by itself",
    ]
    assert local_server_lines([], now) == ["Local Prefect servers started by arena run: none running"]
    # On a shared account: the current home's server only, the others counted with how to list them.
    heading, *lines = local_server_lines(servers, now, home=Path("/h/a"))
    assert heading == ("Local Prefect servers started by arena run for /h/a (1); 2 more of other Prefect homes of "
                       "this user: arena doctor --all-local-servers:")
    assert [line.split()[1] for line in lines] == ["4300"]
    assert local_server_lines(servers[1:], now, home=Path("/h/a")) == [
        "Local Prefect servers started by arena run for /h/a: none running; 2 more of other Prefect homes of this "
        "user: arena doctor --all-local-servers"]


def test_doctor_lists_and_stops_only_this_homes_server_unless_told(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """On a shared host (one account, several people's Prefect homes), `arena doctor` listed every
    local server, and its hint `--stop-local-servers` without a port stopped them all."""
    from prefect.settings import PREFECT_HOME, temporary_settings

    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    servers = [ensure_server(mine), ensure_server(theirs)]
    ports = [int(server.api_url.rsplit(":", 1)[1].split("/")[0]) for server in servers]
    try:
        # This process's Prefect settings are loaded already (an `arena doctor` process reads
        # its environment's PREFECT_HOME).
        with temporary_settings({PREFECT_HOME: mine}):
            main(["doctor", "--db", str(tmp_path / "arena.duckdb")])
            out = capsys.readouterr().out
            assert f"port {ports[0]} " in out and f"port {ports[1]} " not in out, out
            assert "more of other Prefect homes of this user: arena doctor --all-local-servers" in out
            main(["doctor", "--db", str(tmp_path / "arena.duckdb"), "--all-local-servers"])
            assert f"port {ports[1]} " in capsys.readouterr().out
            assert main(["doctor", "--stop-local-servers"]) == 0
            said = capsys.readouterr().out
            assert f"stopped the server on port {ports[0]} (home {mine})" in said and str(theirs) not in said
            alive = {s.port for s in find_running_servers()}
            assert ports[1] in alive and ports[0] not in alive
    finally:
        for server in servers:
            server.release()
        stop_server(mine)
        stop_server(theirs)


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_idle_setting_is_named_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ARENA_LOCAL_SERVER_IDLE_SECONDS", value)
    with pytest.raises(LocalServerError, match=f"ARENA_LOCAL_SERVER_IDLE_SECONDS='{value}' is not a number"):
        ensure_server(tmp_path / "prefect")
    assert not (tmp_path / "prefect").exists()


def test_a_prefect_home_that_is_a_file_is_named_in_one_line(tmp_path: Path) -> None:
    """PREFECT_HOME naming a file: `arena run` says so in one line (it was a traceback)."""
    home = tmp_path / "not-a-folder"
    home.write_text("a file")
    with pytest.raises(LocalServerError, match=f"the Prefect home {home} \\(PREFECT_HOME\\) cannot hold"):
        ensure_server(home)
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", "--domain", "notepad"], cwd=tmp_path,
                          env={**_env(home), "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"arena: error: the Prefect home {home} (PREFECT_HOME)")
    assert "Traceback" not in done.stderr
    assert home.read_text() == "a file"


LATE_BOOKKEEPING = """
import sys, time, requests
from prefect import flow
from flows.bookkeeping import in_background
from flows.local_server import configured_or_shared_api

def late_call(api_url):
    time.sleep(4)  # well past the idle limit (1 s) after the run let the server go
    requests.get(api_url + "/health", timeout=5).raise_for_status()
    print("late call reached the server", flush=True)

def failing():
    time.sleep(3)  # gives up after the process's main thread has ended
    raise ConnectionError("no such server")

@flow
def run(api_url):
    in_background("the late call", lambda: late_call(api_url), retry_for=0)
    in_background("the failing call", failing, retry_for=0)

with configured_or_shared_api() as server:
    run(server.api_url)
print("run ended", flush=True)
"""


def test_the_server_is_held_until_the_runs_background_bookkeeping_ends(tmp_path: Path, database: str) -> None:
    """A run's background bookkeeping (removing its concurrency limit) still talks to the shared
    server after the run: the server may not stop under it (an idle server stopping under a late
    call left a traceback in three concurrent `arena run`s). A call that gives up warns on the
    console only, without a traceback, even after the main thread has ended."""
    home = tmp_path / "prefect"
    env = {**_env(home, "1"), "PREFECT_SERVER_DATABASE_CONNECTION_URL": database, **SEEDED_SERVER_SETTINGS, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", LATE_BOOKKEEPING], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["run ended", "late call reached the server"], done.stdout + done.stderr[-3000:]
    assert "the failing call failed" in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "the late call failed" not in done.stderr


CA_FILE_IN_USE = """
import os
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_SSL_CERT_FILE
from flows.local_server import configured_or_shared_api

with configured_or_shared_api() as server:
    print(server.api_url.split(":")[0], os.environ["PREFECT_API_SSL_CERT_FILE"], PREFECT_API_SSL_CERT_FILE.value())
    with get_client(sync_client=True) as client:
        print("healthcheck error:", client.api_healthcheck(), flush=True)
print(os.environ["PREFECT_API_SSL_CERT_FILE"], PREFECT_API_SSL_CERT_FILE.value(), flush=True)
"""


def test_clients_of_the_plain_http_local_server_load_its_one_certificate_ca_file(tmp_path: Path, database: str) -> None:
    """Prefect clients load a CA file even for an http:// API: against the local server they load
    flows/plain_http_ca.pem (one certificate, no key), not certifi's bundle, and the operator's
    own setting is back afterwards. A user's CA file that does not exist proves which one a
    client loaded: loading it fails."""
    import ssl

    from flows.local_server import PLAIN_HTTP_CA_FILE

    assert ssl.create_default_context(cafile=str(PLAIN_HTTP_CA_FILE)).cert_store_stats()["x509_ca"] == 1
    assert "PRIVATE KEY" not in PLAIN_HTTP_CA_FILE.read_text()
    home = tmp_path / "prefect"
    users_ca = str(tmp_path / "no-such-ca.pem")
    env = {**_env(home, "1"), "PREFECT_SERVER_DATABASE_CONNECTION_URL": database, **SEEDED_SERVER_SETTINGS, "PYTHONPATH": str(ROOT),
           "PREFECT_API_SSL_CERT_FILE": users_ca}
    done = subprocess.run([sys.executable, "-c", CA_FILE_IN_USE], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [f"http {PLAIN_HTTP_CA_FILE} {PLAIN_HTTP_CA_FILE}", "healthcheck error: None",
                                        f"{users_ca} {users_ca}"], done.stdout + done.stderr[-3000:]


def test_the_servers_port_is_held_from_the_start_so_no_other_process_takes_it(tmp_path: Path, database: str) -> None:
    """The port is bound by the starter and handed down, before the server spends seconds on its
    imports. It used to be chosen, let go, and bound by the server only then: under load another
    process took it meanwhile ("address already in use") and `arena run` failed (seen in CI)."""
    import errno
    import socket
    import threading

    home = tmp_path / "prefect"
    box: dict[str, tuple[subprocess.Popen[str], dict[str, object]]] = {}
    starter = threading.Thread(target=lambda: box.setdefault("user", _user(home, database)), daemon=True)
    starter.start()
    listed = None
    deadline = time.monotonic() + 60
    while listed is None and time.monotonic() < deadline:  # its supervisor, before the server answers
        listed = next((s for s in find_running_servers() if s.home == home), None)
        time.sleep(0.02)  # a scan of every process costs CPU the starting server needs
    assert listed is not None and listed.port is not None, "no supervisor for the new server"
    try:
        with socket.socket() as other, pytest.raises(OSError) as taken:
            other.bind(("127.0.0.1", listed.port))
        assert taken.value.errno == errno.EADDRINUSE
    finally:
        starter.join(timeout=120)
    user, record = box["user"]
    try:
        assert record["port"] == listed.port
        assert requests.get(f"{record['api_url']}/health", timeout=10).ok
    finally:
        _release(user)
        _kill_left(record)


def test_a_server_that_fails_to_start_is_named_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that exits as it starts (here its database cannot be opened): `arena run`'s error
    says it failed and names its log, as soon as it failed (it said "did not start within 120 s",
    the start timeout, though it had failed at once)."""
    monkeypatch.setenv("PREFECT_SERVER_DATABASE_CONNECTION_URL",
                       f"sqlite+aiosqlite:///{tmp_path / 'no-such-folder' / 'prefect.db'}")
    monkeypatch.setenv("ARENA_LOCAL_SERVER_IDLE_SECONDS", "3")
    home = tmp_path / "prefect"
    with pytest.raises(LocalServerError) as failed:
        ensure_server(home, timeout=100)
    log = state_dir(home) / "server.log"
    assert str(failed.value).startswith(f"the local Prefect server failed to start (its log: {log})"), failed.value
    assert (state_dir(home) / "failed").exists() and not (state_dir(home) / "server.json").exists()
