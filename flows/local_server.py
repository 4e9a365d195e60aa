"""One local Prefect server shared by every `arena run` on this machine that names no server.

Prefect's own fallback, a temporary server per process, breaks when runs overlap: each one
migrates the same SQLite database at start-up, and two at once fail ("duplicate column name").
So a run without PREFECT_API_URL uses this instead:

- The first run starts the server (Prefect's API and UI, without its background services) as a
  detached process on a free port and records it in ``$PREFECT_HOME/arena-server/server.json``.
  Later runs find it there and use it; start-up is serialised by a lock file, so two runs
  starting together start one server.
- Every process using it holds a shared lock on ``users.lock`` for as long as it lives (the
  kernel drops the lock when a process ends, however it ends: Ctrl-C, SIGKILL, OOM). The
  server's supervisor stops the server once nobody has held that lock for
  ``ARENA_LOCAL_SERVER_IDLE_SECONDS`` (default 300: long enough to look at the finished run in
  the UI, or to start the next run without waiting for a server).

    python -m flows.local_server STATE_DIR PORT     (the supervisor; started by `ensure_server`)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import requests

IDLE_SECONDS_ENV = "ARENA_LOCAL_SERVER_IDLE_SECONDS"
DEFAULT_IDLE_SECONDS = 300.0
START_TIMEOUT_SECONDS = 120.0
_CHECK_SECONDS = 1.0


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


def _healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        return requests.get(f"{api_url}/health", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def _read_record(directory: Path) -> dict[str, object] | None:
    try:
        record = json.loads((directory / "server.json").read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _locked(path: Path, mode: int) -> IO[str]:
    handle = path.open("a")
    fcntl.flock(handle, mode)
    return handle


def ensure_server(prefect_home: Path, *, timeout: float = START_TIMEOUT_SECONDS) -> LocalServer:
    """Use the shared server of `prefect_home`, starting it if none answers.

    Raises `LocalServerError` (naming the server's log) if a new server does not answer
    within `timeout` seconds.
    """
    directory = state_dir(prefect_home)
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory / "start.lock", fcntl.LOCK_EX):
        record = _read_record(directory)
        started_here = False
        if record is None or not _healthy(str(record.get("api_url"))):
            record = _start(directory, timeout)
            started_here = True
        # Held before the start lock is let go, so the supervisor never sees an idle moment.
        users = _locked(directory / "users.lock", fcntl.LOCK_SH)
    return LocalServer(str(record["api_url"]), str(record["ui_url"]), started_here, users)


def _start(directory: Path, timeout: float) -> dict[str, object]:
    (directory / "server.json").unlink(missing_ok=True)
    port = _free_port()
    log_path = directory / "server.log"
    with log_path.open("ab") as log:
        # The supervisor detaches itself (a second fork) so that it is nobody's child: the
        # watcher that ends what `arena run` started must not end a server others still use.
        subprocess.run(
            [sys.executable, "-m", "flows.local_server", str(directory), str(port)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=True, start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = _read_record(directory)
        if record is not None and record.get("port") == port:
            return record
        if (directory / "failed").exists():
            break
        time.sleep(0.2)
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
    except (ProcessLookupError, ValueError, KeyError):
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _read_record(state_dir(prefect_home)) is not None:
        time.sleep(0.1)
    return True


@contextlib.contextmanager
def configured_or_shared_api() -> Iterator[LocalServer | None]:
    """Run the body against the configured Prefect API (PREFECT_API_URL, from the environment
    or the Prefect profile) when there is one: yields None. Otherwise against the shared local
    server, started if needed: yields it, and it is released on exit."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    settings = get_current_settings()
    if settings.api.url:
        yield None
        return
    server = ensure_server(Path(settings.home))
    # Threads Prefect did not start see the environment, the rest the settings context.
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            yield server
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
        server.release()


# --- the supervisor --------------------------------------------------------------------------


def _idle_seconds() -> float:
    try:
        return float(os.environ.get(IDLE_SECONDS_ENV, DEFAULT_IDLE_SECONDS))
    except ValueError:
        return DEFAULT_IDLE_SECONDS


def _nobody_uses(directory: Path) -> bool:
    with (directory / "users.lock").open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def _server_command(port: int) -> list[str]:
    import prefect

    return [
        sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parent.parent),
        "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "error", "--lifespan", "on",
    ]


def supervise(directory: Path, port: int) -> None:
    """Run the server on `port` until nobody has used it for the idle time, or SIGTERM."""
    (directory / "failed").unlink(missing_ok=True)
    api_url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        # API and UI, no background services (scheduler, late runs...): runs need neither, and
        # a served deployment's schedule belongs to the team's own server.
        "PREFECT__SERVER_WEBSERVER_ONLY": "1",
        "PREFECT_API_URL": api_url,  # the UI calls the API at this address
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    server = subprocess.Popen(_server_command(port), env=env, stdin=subprocess.DEVNULL)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not _healthy(api_url, timeout=1.0):
        if stopping or server.poll() is not None or time.monotonic() > deadline:
            (directory / "failed").touch()
            _end(server)
            return
        time.sleep(0.2)
    record = {
        "api_url": api_url, "ui_url": f"http://127.0.0.1:{port}", "port": port,
        "supervisor_pid": os.getpid(), "server_pid": server.pid,
    }
    (directory / "server.json.tmp").write_text(json.dumps(record))
    (directory / "server.json.tmp").replace(directory / "server.json")
    idle_since: float | None = None
    while not stopping and server.poll() is None:
        time.sleep(_CHECK_SECONDS)
        if not _nobody_uses(directory):
            idle_since = None
            continue
        idle_since = idle_since or time.monotonic()
        if time.monotonic() - idle_since < _idle_seconds():
            continue
        # Under the start lock, so a run about to use the server either gets in first (and
        # the server stays) or finds no record and starts a new one.
        with _locked(directory / "start.lock", fcntl.LOCK_EX):
            if _nobody_uses(directory):
                (directory / "server.json").unlink(missing_ok=True)
                _end(server)
                return
        idle_since = None
    with _locked(directory / "start.lock", fcntl.LOCK_EX):
        record_now = _read_record(directory)
        if record_now is not None and record_now.get("supervisor_pid") == os.getpid():
            (directory / "server.json").unlink(missing_ok=True)
    _end(server)


def _end(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main(argv: list[str]) -> None:
    """Detach (second fork, new session) and supervise; the first process returns at once."""
    directory, port = Path(argv[0]), int(argv[1])
    if os.fork() > 0:
        os._exit(0)  # the starter's subprocess.run returns; the child is adopted by init
    os.setsid()
    supervise(directory, port)


if __name__ == "__main__":
    main(sys.argv[1:])
