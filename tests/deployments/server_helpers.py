"""Helpers for the tests that run a real `prefect server start` and its workers in subprocesses."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

PROJECT = Path(__file__).resolve().parents[2]
PREFECT_BIN = Path(sys.executable).parent / "prefect"
T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, fn: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T:
    """Poll `fn` until it returns something truthy; AssertionError naming `what` after `timeout`."""
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
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def tail(path: Path, n: int = 4000) -> str:
    """The last `n` characters of a log file, for failure messages."""
    return path.read_text(errors="replace")[-n:] if path.exists() else ""
