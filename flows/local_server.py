"""One local Prefect server shared by every `arena run` on this machine that names no server.

Prefect's own fallback, a temporary server per process, breaks when runs overlap: each one
migrates the same SQLite database at start-up, and two at once fail ("duplicate column name").
So a run without PREFECT_API_URL uses this instead:

- The first run starts the server (Prefect's API and UI, with the services that record task runs
  and events, without the scheduler and the other background services) as a
  detached process on a free port and records it in ``$PREFECT_HOME/arena-server/server.json``.
  The port's socket is bound by the starter and handed down to the server, so no other process
  can take the port while the server starts (a server binding it only once its seconds of
  imports were done lost it to another process under load: "address already in use").
  Later runs find it there and use it; start-up is serialised by a lock file, so two runs
  starting together start one server.
- Every process using it holds a shared lock on the server's ``users-<supervisor pid>.lock`` for
  as long as it lives (the kernel drops the lock when a process ends, however it ends: Ctrl-C,
  SIGKILL, OOM). The server's supervisor stops the server once nobody has held that lock for
  ``ARENA_LOCAL_SERVER_IDLE_SECONDS`` (default 300: long enough to look at the finished run in
  the UI, or to start the next run without waiting for a server).
- The supervisor keeps its lock files open from the start, so it can tell whether anyone uses
  the server without opening anything inside the home folder. When that folder is deleted (a
  home in a temporary directory), or now belongs to another server, no run can find this server
  any more, so it stops as soon as no run uses it, without waiting for the idle time.
- The server process can never outlive its supervisor: the supervisor ends it on every way out,
  and on Linux the kernel kills it if the supervisor itself is killed (PR_SET_PDEATHSIG).

    python -m flows.local_server STATE_DIR PORT     (the supervisor; started by `ensure_server`)

`find_running_servers` finds the servers still running from their processes alone (a deleted
home cannot list them), and `stop_running` stops one; `arena doctor` shows and stops them.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import psutil
import requests

from adapters.whole_files import replace_text

IDLE_SECONDS_ENV = "ARENA_LOCAL_SERVER_IDLE_SECONDS"
DEFAULT_IDLE_SECONDS = 300.0
START_TIMEOUT_SECONDS = 120.0
# Set on the server process: marks it as ours (and names its state directory) when it has to be
# found without its supervisor.
SERVER_DIR_ENV = "ARENA_LOCAL_SERVER_DIR"
# The listening socket's file descriptor, handed from the starter to the supervisor.
_SOCKET_FD_ENV = "ARENA_LOCAL_SERVER_SOCKET_FD"
_SUPERVISOR_MODULE = "flows.local_server"
# The server's app: Prefect's, retrying requests that met a busy database (flows/local_server_app.py).
_SERVER_APP = "flows.local_server_app:create_app"
# Prefect's own app, as servers of earlier versions ran it (still found and stopped).
_PREFECT_APP = "prefect.server.api.server:create_app"
_CHECK_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# The CA file of Prefect clients of the local server (PREFECT_API_SSL_CERT_FILE): the server speaks
# plain http, yet each client loads a CA file up front, and this one-certificate file costs under
# 1 ms where the default bundle costs 30-40 (the file says more).
PLAIN_HTTP_CA_FILE = Path(__file__).with_name("plain_http_ca.pem")


class LocalServerError(RuntimeError):
    """The shared local server could not be started; the message names its log file."""


@dataclass
class LocalServer:
    """A use of the shared server: its API URL, held until `release` or process exit."""

    api_url: str
    ui_url: str
    started_here: bool
    _users_lock: IO[str]

    def release(self) -> None:
        """Stop using the server (the supervisor may stop it once idle). Idempotent."""
        if not self._users_lock.closed:
            self._users_lock.close()


def state_dir(prefect_home: Path) -> Path:
    """Where the shared server's record, locks and log live."""
    return prefect_home / "arena-server"


def idle_seconds() -> float:
    """ARENA_LOCAL_SERVER_IDLE_SECONDS as seconds (default 300); ValueError naming the variable
    when it is not a number of seconds."""
    raw = os.environ.get(IDLE_SECONDS_ENV, "").strip()
    if not raw:
        return DEFAULT_IDLE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{IDLE_SECONDS_ENV}={raw!r} is not a number of seconds (0 or more)")
    return value


def _users_lock_name(supervisor_pid: int) -> str:
    # One lock file per server: users of a server that replaced this one in the same folder
    # must not keep this one alive.
    return f"users-{supervisor_pid}.lock"


def _healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        return requests.get(f"{api_url}/health", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


_RECORD_FIELDS: dict[str, type] = {"api_url": str, "ui_url": str, "port": int, "supervisor_pid": int, "server_pid": int}


def _read_record(directory: Path) -> dict[str, object] | None:
    """The server record in `directory`, or None when missing or not of the shape we write."""
    try:
        record = json.loads((directory / "server.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    for field, kind in _RECORD_FIELDS.items():
        if not isinstance(record.get(field), kind) or isinstance(record.get(field), bool):
            return None
    return record


def server_pid(prefect_home: Path) -> int | None:
    """The pid of the shared server's web process for `prefect_home` as its record says (a
    benchmark watches its CPU); None when there is no record."""
    record = _read_record(state_dir(prefect_home))
    return int(str(record["server_pid"])) if record is not None else None


def listening_socket(port: int = 0) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:`port` (0: a free port), inheritable, for a server
    process to take over (`server_command`'s fd)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(socket.SOMAXCONN)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def _locked(path: Path, mode: int) -> IO[str]:
    handle = path.open("a")
    fcntl.flock(handle, mode)
    return handle


def ensure_server(prefect_home: Path, *, timeout: float = START_TIMEOUT_SECONDS) -> LocalServer:
    """Use the shared server of `prefect_home`, starting it if none answers.

    Raises `LocalServerError` (naming the server's log) if a new server does not answer
    within `timeout` seconds, or naming ARENA_LOCAL_SERVER_IDLE_SECONDS when it is not a number.
    """
    try:
        idle_seconds()  # checked here, where the user sees the error, not in the detached supervisor
    except ValueError as exc:
        raise LocalServerError(str(exc)) from None
    directory = state_dir(prefect_home)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LocalServerError(f"the Prefect home {prefect_home} (PREFECT_HOME) cannot hold the local server's "
                               f"files: {exc.strerror or exc}") from None
    with _locked(directory / "start.lock", fcntl.LOCK_EX):
        record = _read_record(directory)
        users = _users_file(directory, record) if record is not None and _healthy(str(record["api_url"])) else None
        started_here = users is None
        if users is None:
            record = _start(directory, timeout)
            users = _users_file(directory, record)
            if users is None:
                raise LocalServerError(f"the local Prefect server's lock file in {directory} vanished as it started")
        # Held before the start lock is let go, so the supervisor never sees an idle moment.
        fcntl.flock(users, fcntl.LOCK_SH)
    return LocalServer(str(record["api_url"]), str(record["ui_url"]), started_here, users)


def _users_file(directory: Path, record: dict[str, object]) -> IO[str] | None:
    """The server's users lock file, opened; None when it is gone. Never created here: the
    supervisor watches the file it created, and takes a server whose file is gone for one no
    run can find (so it stops once unused)."""
    try:
        return (directory / _users_lock_name(int(str(record["supervisor_pid"])))).open("r")
    except FileNotFoundError:
        return None


def _start(directory: Path, timeout: float) -> dict[str, object]:
    (directory / "server.json").unlink(missing_ok=True)
    (directory / "failed").unlink(missing_ok=True)
    log_path = directory / "server.log"
    with listening_socket() as sock, log_path.open("ab") as log:
        port = int(sock.getsockname()[1])
        # The supervisor detaches itself (a second fork) so that it is nobody's child: the
        # watcher that ends what `arena run` started must not end a server others still use.
        subprocess.run(
            [sys.executable, "-m", _SUPERVISOR_MODULE, str(directory), str(port)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=True, start_new_session=True,
            pass_fds=(sock.fileno(),), env={**os.environ, _SOCKET_FD_ENV: str(sock.fileno())},
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = _read_record(directory)
        if record is not None and record.get("port") == port:
            return record
        if (directory / "failed").exists():
            raise LocalServerError(
                f"the local Prefect server failed to start (its log: {log_path}); "
                "or set PREFECT_API_URL to a running server (`prefect server start`)"
            )
        time.sleep(0.05)  # reading a small file: cheap, and the run waits on it
    raise LocalServerError(
        f"the local Prefect server did not start within {timeout:.0f} s (its log: {log_path}); "
        "or set PREFECT_API_URL to a running server (`prefect server start`)"
    )


def stop_server(prefect_home: Path, *, timeout: float = 15.0) -> bool:
    """Stop the shared server of `prefect_home` now, whoever uses it; True if one was running."""
    record = _read_record(state_dir(prefect_home))
    if record is None:
        return False
    try:
        os.kill(int(str(record["supervisor_pid"])), signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _read_record(state_dir(prefect_home)) is not None:
        time.sleep(0.1)
    return True


class ServerStart:
    """The shared local server of a Prefect home, being found or started (`ensure_server`) in a
    background thread: a server's start takes seconds, mostly in its own processes, which can
    run on another core while the run imports Prefect."""

    def __init__(self, prefect_home: Path) -> None:
        self._future: Future[LocalServer] = Future()
        self._taken = False
        # A daemon thread: a run stopped meanwhile (Ctrl-C) does not wait for the server's start.
        threading.Thread(target=self._find_or_start, args=(prefect_home,), name="local-server-start",
                         daemon=True).start()

    def _find_or_start(self, prefect_home: Path) -> None:
        try:
            self._future.set_result(ensure_server(prefect_home))
        except BaseException as exc:  # noqa: BLE001 - raised again in the thread that takes the server
            self._future.set_exception(exc)

    def take(self) -> LocalServer:
        """The server, once found or started (waits for it); raises what `ensure_server` raised.
        The caller releases it."""
        server = self._future.result()
        self._taken = True
        return server

    def abandon(self) -> None:
        """Unless `take` handed the server out: release it as soon as it is found or started (the
        run ended before it used the server, which may then stop once idle)."""
        if not self._taken:
            self._future.add_done_callback(_release_found)


def _release_found(done: Future[LocalServer]) -> None:
    if done.exception() is None:
        done.result().release()


def start_shared_api() -> ServerStart | None:
    """None when a Prefect API is configured (PREFECT_API_URL, in the environment or the Prefect
    profile); otherwise the shared local server of this Prefect home, being found or started in
    the background (see `use_api`)."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    return None if settings.api.url else ServerStart(Path(settings.home))


@contextlib.contextmanager
def use_api(start: ServerStart | None) -> Iterator[LocalServer | None]:
    """Run the body against the configured Prefect API when `start` is None (yields None);
    otherwise against the shared local server `start` finds or starts: waits for it, yields it,
    and releases it on exit."""
    from prefect.settings import PREFECT_API_SSL_CERT_FILE, PREFECT_API_URL, temporary_settings

    if start is None:
        yield None
        return
    server = start.take()
    # Threads Prefect did not start (and child processes) see the environment, the rest the
    # settings context. The CA file: see PLAIN_HTTP_CA_FILE (the server's address is http://).
    updates = {PREFECT_API_URL: server.api_url, PREFECT_API_SSL_CERT_FILE: str(PLAIN_HTTP_CA_FILE)}
    previous = {setting.name: os.environ.get(setting.name) for setting in updates}
    os.environ.update({setting.name: value for setting, value in updates.items()})
    try:
        with temporary_settings(updates=updates):
            yield server
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        # Bookkeeping the run left in the background (removing its concurrency limit) still
        # talks to this server: held until it ends, or an idle server could stop under it.
        from flows.bookkeeping import after_background

        after_background(server.release)


@contextlib.contextmanager
def configured_or_shared_api() -> Iterator[LocalServer | None]:
    """`use_api` with the server looked for (and started if needed) here."""
    with use_api(start_shared_api()) as server:
        yield server


# --- the supervisor --------------------------------------------------------------------------


def _file_id(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino


class _HeldHome:
    """The supervisor's hold on its state directory. Its lock files stay open for the
    supervisor's whole life: an open file outlives its folder's deletion, so whether the server
    is in use never depends on a path, and a deleted or replaced folder is told from ours by
    its identity (device and inode), never by opening something inside it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.pid = os.getpid()
        self.dir_id = _file_id(os.stat(directory))
        self.users_path = directory / _users_lock_name(self.pid)
        self.users = self.users_path.open("a")
        self.start = (directory / "start.lock").open("a")

    def in_use(self) -> bool:
        """Whether any process holds the server (a shared lock on its users file)."""
        try:
            fcntl.flock(self.users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self.users, fcntl.LOCK_UN)
        return False

    def is_ours(self) -> bool:
        """Whether a run can still find this server: the folder is the one it started in, with
        its users file, and the record there names this supervisor."""
        try:
            if _file_id(os.stat(self.directory)) != self.dir_id:
                return False
            if _file_id(os.stat(self.users_path)) != _file_id(os.fstat(self.users.fileno())):
                return False
        except OSError:
            return False
        record = _read_record(self.directory)
        return record is not None and record["supervisor_pid"] == self.pid

    @contextlib.contextmanager
    def start_locked(self) -> Iterator[None]:
        """Hold the start lock (through the open file: no path is opened)."""
        fcntl.flock(self.start, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.start, fcntl.LOCK_UN)

    def forget(self) -> None:
        """Remove the record and users file, if the folder is still ours (call under the start
        lock): a run arriving later starts a new server instead of finding this one."""
        if self.is_ours():
            (self.directory / "server.json").unlink(missing_ok=True)
            self.users_path.unlink(missing_ok=True)


# The task-run recorder's batch and its longest wait before writing (see `server_settings`).
# Whole seconds: Prefect truncates the interval to an int, and 0 would flush in a busy loop.
RECORDER_BATCH_SIZE = 100
RECORDER_FLUSH_SECONDS = 1

# Prefect server services the shared local server does not run (see `supervise`).
_SERVICES_OFF = ("SCHEDULER", "LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "REPOSSESSOR", "DB_VACUUM")


def server_command(port: int, fd: int) -> list[str]:
    """The local server's process: uvicorn serving `_SERVER_APP` on the listening socket `fd`
    (bound to 127.0.0.1:`port`; see `listening_socket`; the caller passes it down)."""
    # Where Prefect is installed, found without importing it: the supervisor that calls this
    # would otherwise spend about a second importing Prefect before the server can start.
    prefect_spec = importlib.util.find_spec("prefect")
    if prefect_spec is None or prefect_spec.origin is None:
        raise LocalServerError("Prefect is not installed in this Python environment")
    return [
        sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect_spec.origin).parent.parent),
        # --fd wins over --host and --port, which stay for those who read the process list.
        "--factory", _SERVER_APP, "--fd", str(fd), "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "error", "--lifespan", "on",
        # An open UI connection must not hold a stop back for long.
        "--timeout-graceful-shutdown", "5",
    ]


def server_settings(port: int) -> dict[str, str]:
    """The Prefect settings (environment variables) of the local server on `port`."""
    return {
        # The services that make runs visible: task runs reach the server only as events, which
        # the task-run recorder writes (without it the UI shows every run with no task runs), the
        # event persister feeds the run graph and the event feed, triggers run a user's automations,
        # cancellation clean-up ends a cancelled run's children. Off: the scheduler, late runs and
        # the rest; runs need none of them, and a served deployment's schedule belongs to the
        # team's own server.
        **{f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in _SERVICES_OFF},
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",  # the UI calls the API at this address
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # Task-run events written in batches, at least once a second: Prefect's default writes
        # each one in its own four statements (about 290 writes per default run, half of the
        # server's CPU, measured); the UI shows a task's state at most a second later.
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": str(RECORDER_BATCH_SIZE),
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": str(RECORDER_FLUSH_SECONDS),
    }


def dies_with_this_process() -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel SIGKILL the child when this process ends, even by
    SIGKILL (Linux's PR_SET_PDEATHSIG); None where that does not exist."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork: the child only calls it
    parent = os.getpid()

    def arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(1)

    return arm


def supervise(directory: Path, port: int) -> None:
    """Run the server on `port` until nobody has used it for the idle time, nobody uses it and
    its home is gone or another server's, or SIGTERM. The server ends with this function,
    whatever ends it."""
    with contextlib.suppress(OSError):
        (directory / "failed").unlink(missing_ok=True)
    try:
        idle = idle_seconds()
    except ValueError as exc:
        print(f"{exc}; using {DEFAULT_IDLE_SECONDS:g}", file=sys.stderr, flush=True)
        idle = DEFAULT_IDLE_SECONDS
    home = _HeldHome(directory)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    api_url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, **server_settings(port), SERVER_DIR_ENV: str(directory)}
    try:
        sock = _handed_down_socket(env) or listening_socket(port)
    except OSError as exc:
        print(f"the local server's port {port}: {exc}", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            (directory / "failed").touch()
        return
    with sock:
        server = subprocess.Popen(server_command(port, sock.fileno()), env=env, stdin=subprocess.DEVNULL,
                                  pass_fds=(sock.fileno(),), preexec_fn=dies_with_this_process())
    try:
        if _wait_healthy(server, api_url, lambda: stopping):
            _write_record(home, api_url, port, server.pid)
            _serve_until_unused(home, server, idle, lambda: stopping)
        else:
            with contextlib.suppress(OSError):
                (directory / "failed").touch()
    finally:
        try:
            if home.is_ours():  # else there is nothing of ours to remove, and no lock to wait for
                with contextlib.suppress(OSError), home.start_locked():
                    home.forget()
        finally:
            _end(server)


def _handed_down_socket(env: dict[str, str]) -> socket.socket | None:
    """The listening socket the starter handed down (`_start`), taken out of `env` (the server
    gets it by its own fd); None when run without one."""
    fd = env.pop(_SOCKET_FD_ENV, None)
    return socket.socket(fileno=int(fd)) if fd is not None and fd.isdigit() else None


def _wait_healthy(server: subprocess.Popen[bytes], api_url: str, stopping: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not _healthy(api_url, timeout=1.0):
        if stopping() or server.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _write_record(home: _HeldHome, api_url: str, port: int, server_pid: int) -> None:
    record = {"api_url": api_url, "ui_url": f"http://127.0.0.1:{port}", "port": port,
              "supervisor_pid": home.pid, "server_pid": server_pid}
    replace_text(home.directory / "server.json", json.dumps(record))


def _serve_until_unused(home: _HeldHome, server: subprocess.Popen[bytes], idle: float,
                        stopping: Callable[[], bool]) -> None:
    idle_since: float | None = None
    while not stopping() and server.poll() is None:
        time.sleep(_CHECK_SECONDS)
        if home.in_use():
            idle_since = None
            continue
        if not home.is_ours():
            return  # nobody uses it and no run can find it any more: waiting helps no one
        idle_since = idle_since or time.monotonic()
        if time.monotonic() - idle_since < idle:
            continue
        # Under the start lock, so a run about to use the server either gets in first (and
        # the server stays) or finds no record and starts a new one.
        with home.start_locked():
            if not home.in_use():
                home.forget()
                return
        idle_since = None


def _end(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@contextlib.contextmanager
def serving_app(home: Path, log: Path, settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """The local server's app with its settings, in the foreground and without a supervisor, on
    a free port with its Prefect home at `home` and its output in `log`, for the block: the
    server the tests and benchmarks run flows on. Further Prefect `settings` (environment
    variables) are the caller's. Yields its API URL; stops it (and nothing else) at the end, and
    with this process even when that is killed."""
    sock = listening_socket()
    port = int(sock.getsockname()[1])
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        **server_settings(port),
        "PREFECT_HOME": str(home),
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        **(settings or {}),
    }
    with sock, log.open("ab") as out:
        server = subprocess.Popen(server_command(port, sock.fileno()), env=env, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(sock.fileno(),),
                                  preexec_fn=dies_with_this_process())
    api_url = env["PREFECT_API_URL"]
    try:
        if not _wait_healthy(server, api_url, lambda: False):
            raise RuntimeError(f"the Prefect server did not start (exit {server.poll()}); its log, "
                               f"{log}:\n{log.read_text(errors='replace')[-3000:]}")
        yield api_url
    finally:
        _end(server)


def main(argv: list[str]) -> None:
    """Detach (second fork, new session) and supervise; the first process returns at once."""
    directory, port = Path(argv[0]), int(argv[1])
    if os.fork() > 0:
        os._exit(0)  # the starter's subprocess.run returns; the child is adopted by init
    os.setsid()
    supervise(directory, port)


# --- finding running servers without their home ------------------------------------------------

HomeState = Literal["in place", "deleted", "another server's", "no record", "unknown"]


@dataclass(frozen=True)
class ProcessRef:
    """A process by pid and start time, so a recycled pid is never taken for it."""

    pid: int
    create_time: float

    def process(self) -> psutil.Process | None:
        """The process if it still runs, else None."""
        try:
            process = psutil.Process(self.pid)
            return process if process.create_time() == self.create_time else None
        except psutil.Error:
            return None


@dataclass(frozen=True)
class RunningServer:
    """A local server `ensure_server` started that is still running, found from its processes.

    `supervisor` is None for a server left without one (by versions before the supervisor
    ended its server on every way out); such a server never stops by itself."""

    port: int | None
    state_dir: Path | None
    supervisor: ProcessRef | None
    server: ProcessRef | None
    started: float
    home_state: HomeState

    @property
    def home(self) -> Path | None:
        """The PREFECT_HOME it serves (it may no longer exist)."""
        return self.state_dir.parent if self.state_dir is not None else None


def find_running_servers() -> list[RunningServer]:
    """This user's local servers that are running, oldest first: each supervisor
    (``python -m flows.local_server STATE_DIR PORT``) with its server process, and any Prefect
    server process of ours that has no supervisor."""
    supervisors: dict[int, tuple[psutil.Process, Path, int]] = {}
    servers: list[psutil.Process] = []
    for process in psutil.process_iter(["cmdline", "uids"]):
        cmdline, uids = process.info["cmdline"], process.info["uids"]
        if not cmdline or uids is None or uids.real != os.getuid():
            continue
        if len(cmdline) == 5 and cmdline[1:3] == ["-m", _SUPERVISOR_MODULE] and cmdline[4].isdigit():
            supervisors[process.pid] = (process, Path(cmdline[3]), int(cmdline[4]))
        elif "uvicorn" in cmdline and {_SERVER_APP, _PREFECT_APP} & set(cmdline):
            servers.append(process)
    found: list[RunningServer] = []
    supervised: set[int] = set()
    for process in servers:
        with contextlib.suppress(psutil.Error):
            if process.ppid() in supervisors:
                supervised.add(process.ppid())
                supervisor, directory, port = supervisors[process.ppid()]
                found.append(_running(supervisor, process, directory, port))
            elif (directory := _unsupervised_dir(process)) is not None:
                found.append(_running(None, process, directory, _port_of(process.cmdline())))
    for pid, (supervisor, directory, port) in supervisors.items():
        if pid not in supervised:  # starting, or between its server's end and its own
            with contextlib.suppress(psutil.Error):
                found.append(_running(supervisor, None, directory, port))
    return sorted(found, key=lambda server: server.started)


def _unsupervised_dir(process: psutil.Process) -> Path | None:
    """The state directory of a Prefect server process of ours that lost its supervisor, from
    its environment; None if it is not ours (someone's `prefect server start`, Prefect's own
    temporary server)."""
    env = process.environ()
    if SERVER_DIR_ENV in env:
        return Path(env[SERVER_DIR_ENV])
    # Left by a version that did not mark its servers: ours were the only ones started with
    # only the web server and neither `prefect server start`'s nor the temporary server's flag.
    if env.get("PREFECT__SERVER_WEBSERVER_ONLY") == "1" and not {
            "PREFECT__SERVER_FINAL", "PREFECT__SERVER_EPHEMERAL"} & env.keys():
        home = env.get("PREFECT_HOME") or str(Path(env.get("HOME", "~")) / ".prefect")
        return state_dir(Path(home))
    return None


def _port_of(cmdline: list[str]) -> int | None:
    for option, value in zip(cmdline, cmdline[1:]):
        if option == "--port" and value.isdigit():
            return int(value)
    return None


def _running(supervisor: psutil.Process | None, server: psutil.Process | None, directory: Path,
             port: int | None) -> RunningServer:
    first = supervisor or server
    assert first is not None
    supervisor_ref = ProcessRef(supervisor.pid, supervisor.create_time()) if supervisor else None
    server_ref = ProcessRef(server.pid, server.create_time()) if server else None
    return RunningServer(port, directory, supervisor_ref, server_ref, first.create_time(),
                         _home_state(directory, supervisor_ref, server_ref))


def _home_state(directory: Path, supervisor: ProcessRef | None, server: ProcessRef | None) -> HomeState:
    if not directory.is_dir():
        return "deleted"
    record = _read_record(directory)
    if record is None:
        return "no record"
    if supervisor is not None:
        return "in place" if record["supervisor_pid"] == supervisor.pid else "another server's"
    return "in place" if server is not None and record["server_pid"] == server.pid else "another server's"


def stop_running(server: RunningServer, *, timeout: float = 20.0) -> bool:
    """Stop `server` now, whoever uses it: SIGTERM to its supervisor (which ends the server and
    removes its record), or to the server when it has none; SIGKILL for what is left after
    `timeout` seconds. True when none of its processes runs any more."""
    processes = [p for p in (ref.process() for ref in (server.supervisor, server.server) if ref) if p]
    if not processes:
        return True
    with contextlib.suppress(psutil.Error):
        processes[0].terminate()
    if _wait_ended(processes, timeout):
        return True
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
    return _wait_ended(processes, 5.0)


def _wait_ended(processes: list[psutil.Process], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if not any(_alive(p) for p in processes):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def _alive(process: psutil.Process) -> bool:
    # A zombie has ended; only its parent's wait() is missing (init reaps it).
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


if __name__ == "__main__":
    main(sys.argv[1:])
