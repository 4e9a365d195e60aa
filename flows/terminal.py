"""What `arena` prints in the terminal while a run goes on.

By default the terminal shows one progress line (done/total, success so far with its interval,
infrastructure errors, cost, ETA), Prefect's warnings and errors, and the summary once at the
end; `--verbose` adds Prefect's task-state logs (the Prefect UI always has them all).

Prefect logs every failed task run with its traceback. For failures the pipeline expects and
turns into a stored outcome (a WAA server that failed or vanished, a VM the provider could not
give, a setup step the task's data broke, a stage past its deadline) the traceback says nothing
the one-line message does not, and reads like a crash. The terminal shows those as one line;
the Prefect UI keeps the full record (its log handler runs before the console's).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from adapters.outcomes import EnvironmentFault
from adapters.vms.base import ProviderError
from adapters.waa.errors import WAAError
from adapters.waa.setup_steps import SetupStepError
from flows.stage_limits import StageTimeout
from flows.progress import progress_line

EXPECTED_FAILURES: tuple[type[BaseException], ...] = (
    WAAError,
    EnvironmentFault,
    ProviderError,
    SetupStepError,
    StageTimeout,
)


class _OneLineForExpectedFailures(logging.Filter):
    """Drops the traceback of a log record whose exception is an expected failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], EXPECTED_FAILURES):
            record.exc_info = None
            record.exc_text = None
        return True


class _WithoutSuspensionObserverNoise(logging.Filter):
    """Prefect 3.8.8's suspension observer (it watches deployment runs, `arena run`'s included)
    asks `task.exception()` of its cancelled polling task when the server goes away, and asyncio
    prints the CancelledError's traceback; the run itself is unaffected (its bookkeeping rides out
    the outage). Those records are dropped; Prefect's own one-line warning stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "FlowRunSuspendingObserver" not in record.getMessage()


class _OneLineForObserverOutages(logging.Filter):
    """Prefect's run observers (they watch `arena run`'s deployment run for a cancel or a
    suspension) log a server outage as a warning with the connection error's traceback, then
    poll until the server is back; the warning alone says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info = None
        record.exc_text = None
        return True


OBSERVER_LOGGERS = ("prefect.FlowRunSuspendingObserver", "prefect.FlowRunCancellingObserver")


class _WithoutInterruptCrashes(logging.Filter):
    """Prefect's engine logs a Ctrl-C or SIGTERM that lands in a flow's or task's run as "Crash
    detected! Execution was aborted by an interrupt signal." and that run as Crashed. `arena run`
    ends such a run as stopped (Cancelled in Prefect, `interrupted` in the store) and says so in
    its own line; on the terminal, "crash" would say the opposite. The Prefect UI keeps the
    records."""

    ABORTED = ("Execution was aborted by an interrupt signal.", "Execution was aborted by a termination signal.")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(aborted in message for aborted in self.ABORTED)


class _WithoutTaskStateLogs(logging.Filter):
    """Prefect logs each task run's end as "Finished in state ...", at ERROR for a Failed one: an
    agent that misses a task printed two ERROR lines for it (its attempt and its task), though
    that is a result, recorded and counted in the summary. Those are Prefect's task-state logs,
    which the terminal leaves to the UI unless `--verbose`; the run's own warnings and errors
    stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("prefect.task_runs") and record.getMessage().startswith("Finished in state"))


def _add_filter_once(logger: logging.Logger | logging.Handler, kind: type[logging.Filter]) -> None:
    if not any(isinstance(f, kind) for f in logger.filters):
        logger.addFilter(kind())


def quiet_expected_tracebacks(verbose: bool = False) -> None:
    """Make Prefect's console handler print expected failures as one line, and only warnings
    and errors unless `verbose` (idempotent)."""
    from prefect.logging.configuration import setup_logging
    from prefect.logging.handlers import PrefectConsoleHandler

    root = logging.getLogger()
    if not any(isinstance(h, PrefectConsoleHandler) for h in root.handlers):
        setup_logging()
    _add_filter_once(logging.getLogger("asyncio"), _WithoutSuspensionObserverNoise)
    for name in OBSERVER_LOGGERS:
        _add_filter_once(logging.getLogger(name), _OneLineForObserverOutages)
    for handler in root.handlers:
        if not isinstance(handler, PrefectConsoleHandler):
            continue
        if not verbose:
            handler.setLevel(logging.WARNING)
            _add_filter_once(handler, _WithoutInterruptCrashes)
            _add_filter_once(handler, _WithoutTaskStateLogs)
        _add_filter_once(handler, _OneLineForExpectedFailures)


class ProgressPrinter:
    """Prints the run's progress line whenever its side file changes, from a daemon thread.

    On a terminal the line is rewritten in place; otherwise (a log file, CI) each change is a
    new line.
    """

    def __init__(self, side_file: Path, stream: TextIO | None = None, interval: float = 1.0) -> None:
        self.side_file = side_file
        self.stream = stream or sys.stderr
        self.interval = interval
        # A side file an earlier invocation of the run left is not this one's progress (a resume
        # that is refused printed the earlier run's "completed" line before its refusal).
        self._since = time.time() - 1.0
        self._stop = threading.Event()
        self._last = ""
        self._thread = threading.Thread(target=self._loop, name="arena-progress", daemon=True)

    def __enter__(self) -> "ProgressPrinter":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._print_once()
        if self._last and self.stream.isatty():
            self.stream.write("\n")
            self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._print_once()

    def _print_once(self) -> None:
        try:
            if self.side_file.stat().st_mtime < self._since:
                return
            line = "progress: " + progress_line(json.loads(self.side_file.read_text()))
        except (OSError, ValueError):
            return  # not written yet, or being replaced
        if line == self._last:
            return
        self._last = line
        if self.stream.isatty():
            self.stream.write("\r\x1b[2K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
