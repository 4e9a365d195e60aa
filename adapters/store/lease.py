"""Who is running a run: one controller per run id, and a run whose controller died shown as such.

A run's row names its controller (`runs.controller`: host, process id and the process's start
time) and the controller writes `runs.heartbeat_at` every `HEARTBEAT_SECONDS` while it runs. The
row is the run's lease:

- a second `arena run` with a run id whose controller is alive is refused before any VM starts;
- a controller is dead when, on this host, its process is gone (at once: a SIGKILLed run can
  be resumed right away), or, seen from another host, when it has not been heard from for
  `LEASE_SECONDS` (a controller whose store is unreachable cannot write its heartbeat either,
  so the lease is generous);
- reports show a `running` run whose controller is dead as `abandoned`, never `running` forever.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import psutil

HEARTBEAT_SECONDS = 15.0
LEASE_SECONDS = 90.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Controller:
    """A controller process, as `runs.controller` names it: "host/pid/start-time"."""

    host: str
    pid: int
    started: float  # the process's start time (seconds since the epoch, as psutil reports it)

    @classmethod
    def this_process(cls) -> Controller:
        return cls(socket.gethostname(), os.getpid(), round(psutil.Process().create_time(), 2))

    @classmethod
    def parse(cls, text: str | None) -> Controller | None:
        """The controller a `runs.controller` value names, or None (none, or not ours)."""
        if not text:
            return None
        try:
            host, pid, started = text.rsplit("/", 2)
            return cls(host, int(pid), float(started))
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"{self.host}/{self.pid}/{self.started:.2f}"

    def describe(self) -> str:
        return f"PID {self.pid} on {self.host}"

    def process_gone(self) -> bool | None:
        """On this host: whether the process has ended (True), is alive (False); None when it
        runs elsewhere (only its heartbeat can tell)."""
        if self.host != socket.gethostname():
            return None
        try:
            return abs(psutil.Process(self.pid).create_time() - self.started) > 1.0  # the pid was reused
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return True
        except psutil.Error:
            return None


@dataclass(frozen=True)
class Liveness:
    """Whether a run's controller is alive, and in words why not."""

    alive: bool
    reason: str = ""


def liveness(status: str | None, controller: str | None, heartbeat_at: dt.datetime | None,
             now: dt.datetime | None = None) -> Liveness:
    """The liveness of a run's controller from its row (`status`, `controller`, `heartbeat_at`,
    naive UTC). Only a `running` run has a controller to lose; rows of older versions (no
    controller) count as alive."""
    if status != "running":
        return Liveness(True)
    who = Controller.parse(controller)
    if who is None:
        return Liveness(True)
    if who.process_gone():
        return Liveness(False, f"its controller ({who.describe()}) has exited")
    if heartbeat_at is not None:
        now = now or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        silent = (now - heartbeat_at).total_seconds()
        if silent > LEASE_SECONDS:
            return Liveness(False, f"its controller ({who.describe()}) was last heard from {silent:.0f} s ago")
    return Liveness(True)


def shown_status(status: str | None, controller: str | None, heartbeat_at: dt.datetime | None) -> str:
    """The status reports show: the stored one, or `abandoned` for a run left `running` by a
    controller that died."""
    if status == "running" and not liveness(status, controller, heartbeat_at).alive:
        return "abandoned"
    return status or "unknown"


class Heartbeat:
    """While the block runs, call `beat` (the store's `heartbeat` for the run) every `interval`
    seconds from a thread. A failed beat (the store is down) is logged once and tried again; a
    beat that finds the run taken over by another controller is logged as an error."""

    def __init__(self, beat: Callable[[], bool], interval: float = HEARTBEAT_SECONDS) -> None:
        self._beat = beat
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="run-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self._interval):
            try:
                held = self._beat()
            except Exception as exc:  # noqa: BLE001 - the store may be down; the run goes on
                if not failing:
                    log.warning("the run's heartbeat could not be stored (%s); trying again", exc)
                failing = True
                continue
            failing = False
            if not held:
                log.error("another controller has taken over this run (its controller was presumed dead)")
