"""A run's life: the states a run goes through, what moves it from one to the next, and how each
end is stored, shown in Prefect and left to the exit status. One place to read it, beside
docs/outcomes.md (the statuses and exit codes) and docs/prefect-ui.md (the states).

| from    | what happened                                              | to (runs.status) | stopped_by       | Prefect state | exit      |
|---------|------------------------------------------------------------|------------------|------------------|---------------|-----------|
| (none)  | `start_run` records it; this controller takes its lease    | running          |                  | Running       |           |
| any     | a resume of the run id (`--run-id`): a new controller      | running          |                  | Running       |           |
| running | every selected task (and trial) has a final result         | completed        |                  | Completed     | 0         |
| running | infrastructure errors outlasted their retries              | incomplete       |                  | Failed        | 3         |
| running | `--max-cost`, `--max-tokens`, `--max-wall-seconds` reached | budget_exhausted |                  | Failed        | 4         |
| running | Cancel in the Prefect UI or API (this run or one above it) | cancelled        | prefect          | Cancelled     | 5         |
| running | Ctrl-C or SIGTERM                                          | interrupted      | ctrl-c / sigterm | Cancelled     | 130 / 143 |
| running | the store did not take every result, or failed at the end  | store_failed     |                  | Failed        | 6         |
| running | an error nobody expected                                   | failed           |                  | Failed        | 1         |

A store that fails for good leaves the row `running` with a heartbeat that has stopped: reports
show such a run `abandoned`, and a resume finishes it (the spool's results first).

A stop that comes while the run is already stopping is the same stop (asked once, `stop_kind`);
an error on the way out of a cancelled run is the cancellation's, not a failure. A cancel that
reaches the server after the run's end leaves the end as it was (flows/cancellation.py
`settle_late_cancel`). The statuses and Prefect states of the table are `RunLife.status`,
flows/run_states.py `run_state`; the exit codes flows/cli/common.py `RUN_EXIT_CODES`
(tests/flows/test_run_life.py holds the three to this table).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from adapters.benchmark import BenchmarkResult
from adapters.store.duckdb_store import ResultStore
from adapters.store.errors import StoreUnavailable, error_text
from adapters.store.recorder import RecorderClose
from adapters.store.spool import spool_dir
from flows.bookkeeping import best_effort
from flows.cancellation import cancellation_requested
from flows.run_config import STORE_FAILED, RunOutcome, SuiteRunConfig
from flows.summary import RunCompleteness

class RunLife:
    """One run's way to its end: which status it ends in and who stopped it."""

    def __init__(self, run_id: str, cancelled: threading.Event, count: Callable[[], RunCompleteness],
                 cancel_requested: Callable[[], bool] = cancellation_requested) -> None:
        self.run_id = run_id
        self.status = "failed"  # until something better is known: an error nobody expected
        self.stopped_by: str | None = None
        self.store_failure: str | None = None
        self.completeness: RunCompleteness | None = None
        self._cancelled = cancelled  # set by the cancellation watcher (flows/cancellation.py)
        self._cancel_requested = cancel_requested  # asks the server (the watcher may not have yet)
        self._count = count
        self._stop_seen: tuple[str, str] | None = None

    # --- the events --------------------------------------------------------------------------

    def finished(self, completeness: RunCompleteness, unstored: RecorderClose | None) -> None:
        """The work ended by itself, or because it was cancelled."""
        self.completeness = completeness
        if unstored is not None:
            self.store_failure = unstored.outage or "the store did not take every result"
            self.status = STORE_FAILED
        elif self._cancelled.is_set():
            self.status, self.stopped_by = self.stop_kind(None)
        else:
            self.status = completeness.status

    def store_failed(self, error: BaseException) -> None:
        """The store failed outside the recorder (reading the run back at its end): the results
        the recorder could not store are in the spool."""
        self.store_failure, self.status = error_text(error), STORE_FAILED

    def stopped(self, stop: BaseException) -> None:
        """Ctrl-C, a runner stopping a cancelled run, another SIGTERM: the recorded attempts
        stand, and a resume finishes the run."""
        self.status, self.stopped_by = self.stop_kind(stop)
        self.completeness = self._counted_so_far()

    def failed_while_cancelled(self, error: BaseException) -> bool:
        """An error on the way out of a run that was being cancelled (a runner's SIGTERM can land
        in the middle of the stop and its teardown) ends it cancelled, not failed: True then.
        False for any other error: the run failed."""
        if not (self._cancelled.is_set() or self._cancel_requested()):
            return False
        self.status, self.stopped_by = "cancelled", "prefect"
        self.completeness = self._counted_so_far()
        return True

    def stop_kind(self, stop: BaseException | None) -> tuple[str, str]:
        """A stopped run's status and who stopped it: "prefect" for a cancellation (also one that
        came with a runner's SIGTERM), else "ctrl-c" or "sigterm". Asked once."""
        if self._stop_seen is None:
            if self._cancelled.is_set() or self._cancel_requested():
                self._stop_seen = ("cancelled", "prefect")
            else:
                self._stop_seen = ("interrupted", "ctrl-c" if isinstance(stop, KeyboardInterrupt) else "sigterm")
        return self._stop_seen

    def on_stop(self, store: ResultStore) -> Callable[[BaseException | None], None]:
        """What the pool calls when it is stopped, before its teardown (PoolRunRequest.on_stop):
        the stop's status stored at once (and again at the end, with the rest)."""
        def store_stop(stop: BaseException | None) -> None:
            status = self.stop_kind(stop)[0]
            best_effort(f"storing the run's status ({status})", lambda: store.finish_run(self.run_id, status),
                        retry_for=0)
        return store_stop

    def _counted_so_far(self) -> RunCompleteness | None:
        """The run's results on the way out of a stop (best effort: the store may be why)."""
        return best_effort("counting the run's results", self._count, retry_for=0)

    # --- the end ------------------------------------------------------------------------------

    def record_end(self, store: ResultStore, logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        """Store the status the run ended in. A store that cannot take it makes the end a store
        failure: the run's row stays `running`, its heartbeat stops, so reports show it abandoned
        and `arena run --run-id` resumes it."""
        try:
            store.finish_run(self.run_id, self.status)
        except StoreUnavailable as exc:
            logger.error("run %s: its final status (%s) could not be stored: %s", self.run_id, self.status,
                         error_text(exc))
            self.store_failure = self.store_failure or error_text(exc)
            self.status = STORE_FAILED


def stopped_outcome(run_id: str, store: ResultStore, life: RunLife, results: list[BenchmarkResult],
                    logger: logging.Logger | logging.LoggerAdapter[Any]) -> RunOutcome:
    """The end of a run someone stopped (Ctrl-C, SIGTERM, Prefect's Cancel): the attempts recorded
    so far stand, and a resume (`--run-id`) finishes the run."""
    assert life.stopped_by is not None
    how = {"prefect": "cancelled from Prefect", "ctrl-c": "interrupted (Ctrl-C)", "sigterm": "stopped (SIGTERM)"}
    line = f"run {run_id} was {how[life.stopped_by]}; attempts recorded so far are kept"
    logger.warning("%s", line)
    return RunOutcome(run_id=run_id, store=store.location, results=results, table=line, status=life.status,
                      completeness=life.completeness, stopped_by=life.stopped_by)


def store_failed_outcome(config: SuiteRunConfig, run_id: str, store: ResultStore, life: RunLife,
                         unstored: RecorderClose | None, results: list[BenchmarkResult],
                         logger: logging.Logger | logging.LoggerAdapter[Any]) -> RunOutcome:
    """The end of a run whose store failed: no summary (the store cannot be read back), one line
    saying why and what waits where, and how to finish the run."""
    cause = life.store_failure or "unknown"
    spooled = len(unstored.spooled) if unstored else 0
    lost = len(unstored.lost) if unstored else 0
    where = spool_dir(config.artifacts_dir, run_id)
    line = (f"the results store failed ({cause})" + (f"; {spooled} finished result(s) wait in {where}" if spooled else "")
            + (f"; {lost} result(s) could not be written anywhere (their tasks run again)" if lost else ""))
    logger.error("run %s: %s", run_id, line)
    return RunOutcome(run_id=run_id, store=store.location, results=results, table=line, status=STORE_FAILED,
                      store_failure=cause, spooled=spooled, lost=lost)


