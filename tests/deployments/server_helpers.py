"""Helpers for the tests that run a real `prefect server start` and its workers in subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import requests

from machine_pace import scaled
from ports import server_port
from prefect_home import DATABASE, PREFECT_BIN, SEEDED_SERVER_SETTINGS, seeded_home

PROJECT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T:
    """Poll `fn` until it returns something truthy; AssertionError naming `what` after `timeout`
    (written for a quiet machine: stretched by its pace, tests/machine_pace.py)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last error: {last_error!r})")


def stop(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """SIGTERM the process group (a server's uvicorn, a runner's or worker's flow-run processes),
    then SIGKILL what is left."""
    stop_all([proc], timeout)


def stop_all(procs: list[subprocess.Popen[bytes]], timeout: float = 10) -> None:
    """`stop` for several processes at once: every group gets its SIGTERM first, then all share
    one `timeout` (a `prefect worker start` takes 15 s and more to end after its SIGTERM)."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def tail(path: Path, n: int = 4000) -> str:
    """The last `n` characters of a log file, for failure messages."""
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def clean_env() -> dict[str, str]:
    """This environment without Prefect's or the product's settings (a subprocess chooses its own)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ARENA_"))}


class PrefectServer:
    """`prefect server start` on a fixed port and home, so it can be killed and started again."""

    def __init__(self, home: Path, log: Path, host: str = "127.0.0.1", env: dict[str, str] | None = None,
                 services: bool = True) -> None:
        self.port = server_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.home, self.log, self.host, self.env, self.services = home, log, host, env or {}, services
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (on a new home, with its database already migrated) and wait until it answers."""
        self.launch()
        self.wait_healthy()

    def launch(self) -> None:
        """Start it without waiting (several servers can then come up together)."""
        if not (self.home / DATABASE).exists():
            seeded_home(self.home)
        env = {
            **clean_env(),
            "PREFECT_HOME": str(self.home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "prefect.server.concurrency.lease_storage.filesystem",
            "PREFECT_LOGGING_LEVEL": "WARNING",
            # Scheduled runs appear within seconds of a deployment being (re)activated.
            "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5",
            **SEEDED_SERVER_SETTINGS,
            **self.env,
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(PREFECT_BIN), "server", "start", "--host", self.host, "--port", str(self.port), "--no-ui",
                 *([] if self.services else ["--no-services"])],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def wait_healthy(self) -> None:
        """Wait until its API answers (90 s at most); its log's tail in the failure."""
        try:
            wait_for("the server's /api/health", lambda: requests.get(f"{self.api_url}/health", timeout=2).ok, 90)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nserver log:\n{tail(self.log)}") from None

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a crashed host would: no shutdown of any kind."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


@contextlib.contextmanager
def running_server(folder: Path) -> Iterator[PrefectServer]:
    """A `prefect server start` with its home and log in `folder`, stopped at the end."""
    server = PrefectServer(folder / "server-home", folder / "server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()
