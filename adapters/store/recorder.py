"""Storing a run's attempts in the background, so lanes never wait for the store, and never
losing one when the store blinks.

A lane used to write each attempt (about 30 ms on a DuckDB file, 70-120 ms when lanes ended
together, one network round trip per statement on a distant PostgreSQL server) before it could
take its next task. Here a lane hands the result over and goes on; one thread per run writes
whatever has queued up, several results per store session, in the order they came.

When the store cannot take a result (a PostgreSQL restart, a lost connection, a full disk, a
DuckDB file another process holds), the result is not dropped: it goes to the run's durable
spool (adapters/store/spool.py; kept in memory too, and only there when even the spool's disk is
full) and the recorder keeps offering it to the store, backing off up to `max_retry_seconds`
between tries, until the store takes it. `wait_for_room` lets lanes hold back new tasks while
more than a bound of results are waiting (the run does not spend VM time and model money on
results it cannot store). When the run ends with results still waiting, `close` says which are
safe in the spool (the next `arena run --run-id` writes them) and which, if any, could not be
written anywhere.

A result the store refuses for its own content (not an outage: e.g. duplicate step indexes) is
not retried; it is reported in `failed` and kept in the spool for inspection.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from time import monotonic as _monotonic
from collections.abc import Callable
from dataclasses import dataclass, field

from adapters.benchmark import BenchmarkResult
from adapters.store.duckdb_store import ResultStore
from adapters.store.errors import StoreError, error_text, is_outage
from adapters.store.spool import ResultSpool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnstoredResult:
    """An attempt whose result could not be stored, and why."""

    result: BenchmarkResult
    error: str

    def describe(self) -> str:
        return f"task {self.result.task_id} attempt {self.result.attempt}: result not stored: {self.error}"


@dataclass
class RecorderClose:
    """What `ResultRecorder.close` left: everything stored, or what waits where, and why."""

    spooled: list[BenchmarkResult] = field(default_factory=list)  # safe on disk, written on resume
    lost: list[BenchmarkResult] = field(default_factory=list)  # in memory only: neither store nor spool took them
    outage: str | None = None  # the store's last error while results waited (None: none waited)

    @property
    def complete(self) -> bool:
        return not self.spooled and not self.lost


class ResultRecorder:
    """Writes the attempts of one run to its store from a background thread.

    `record` queues a result and returns at once; `flush` waits until everything queued so far
    is stored (or has failed for good); `close` flushes and stops the thread. `on_stored` is
    called (from the writer thread) with each result once it is stored, so live progress never
    counts a result a report could not show yet.
    """

    def __init__(
        self,
        store: ResultStore,
        run_id: str,
        *,
        spool: ResultSpool | None = None,
        retry_seconds: float = 1.0,
        max_retry_seconds: float = 15.0,
        on_stored: Callable[[BenchmarkResult], None] | None = None,
    ) -> None:
        self.store = store
        self.on_stored = on_stored
        self.run_id = run_id
        self.spool = spool
        self.retry_seconds = retry_seconds
        self.max_retry_seconds = max_retry_seconds
        self.failed: list[UnstoredResult] = []
        self.outage: str | None = None  # the store's error while results wait for it
        self._queue: deque[BenchmarkResult] = deque()
        self._waiting: list[BenchmarkResult] = []  # refused by an outage: retried until stored
        self._spooled: set[tuple[str, int]] = set()  # (task, attempt) of those the spool holds
        self._writing = 0  # results taken for a write and not yet settled
        self._held_back = False  # lanes were told to hold back during this outage
        self._gave_up = False  # this outage outlasted a lane's `max_wait`: the run starts nothing more
        self._closed = False
        self._stop_retrying = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"recorder-{run_id}", daemon=True)
        self._thread.start()

    def record(self, result: BenchmarkResult) -> None:
        """Queue one attempt's result for storing."""
        with self._cond:
            if self._closed:
                raise RuntimeError(f"the recorder of run {self.run_id} is closed")
            self._queue.append(result)
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Results not stored yet: queued, being written, or waiting for the store."""
        with self._cond:
            return self._unstored()

    def _unstored(self) -> int:
        return len(self._queue) + len(self._waiting) + self._writing

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every result queued so far is stored or has failed for good; False on
        timeout (results still wait for the store)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._unstored() == 0, timeout)

    def wait_for_room(self, bound: int, *, max_wait: float, stop: Callable[[], bool],
                      poll_seconds: float = 1.0) -> bool:
        """Block while `bound` or more results wait for an unreachable store (new work would only
        add to them), until the store takes them (True), `stop()` says the run is stopping
        (True: the caller sees the stop itself) or `max_wait` seconds pass (False: the store is
        gone for good, start nothing more). Returns True at once when the store keeps up."""
        deadline = None
        with self._cond:
            if self._gave_up and self.outage is not None:
                return False
            # Counted with those being offered to the store again (a retry empties the waiting list).
            while self.outage is not None and self._unstored() >= bound and not stop():
                now = _monotonic()
                if deadline is None:
                    deadline = now + max_wait
                    if not self._held_back:  # said once per outage, not once per lane
                        log.warning("run %s: %d finished result(s) wait for the store; no new task starts until it "
                                    "takes them (for up to %.0f s)", self.run_id, self._unstored(), max_wait)
                        self._held_back = True
                if now >= deadline:
                    log.error("run %s: the store has not come back in %.0f s; no new task starts", self.run_id, max_wait)
                    self._gave_up = True
                    return False
                self._cond.wait(min(poll_seconds, deadline - now))
        return True

    def close(self, timeout: float | None = None) -> RecorderClose:
        """Flush for up to `timeout` seconds, then stop the writer thread. Results the store
        has not taken by then stay in the spool (or, if it could not take them either, are
        reported as lost). After an outage that already outlasted `wait_for_room`'s wait, it
        does not wait again: the run has waited for that store once."""
        with self._cond:
            waiting, gave_up = self._unstored(), self._gave_up and self.outage is not None
        if waiting and gave_up:
            timeout = 0.0
        elif waiting and self.outage is not None:
            log.warning("run %s: %d result(s) wait for the store; the run ends when it takes them%s", self.run_id,
                        waiting, "" if timeout is None else f", or in {timeout:.0f} s with them in its spool")
        flushed = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._stop_retrying = True
            self._cond.notify_all()
        self._thread.join(None if flushed else 30.0)
        with self._cond:
            waiting = list(self._waiting) + list(self._queue)
            outage = self.outage
        report = RecorderClose(outage=outage if waiting else None)
        for result in waiting:
            if (result.task_id, result.attempt) in self._spooled or self._to_spool(result):
                report.spooled.append(result)
            else:
                report.lost.append(result)
        return report

    # --- the writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        delay = self.retry_seconds
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._waiting or self._closed)
                if self._stop_retrying and not self._queue:
                    return  # closing: what still waits is close()'s to report
                if self._closed and not self._queue and not self._waiting:
                    return
                batch = list(self._waiting) + list(self._queue)
                self._queue.clear()
                self._waiting.clear()
                self._writing = len(batch)
            refused = self._write(batch)
            with self._cond:
                self._waiting.extend(refused)
                self._writing = 0
                self._cond.notify_all()
                if refused:  # the store is down: try again later, not in a tight loop
                    self._cond.wait_for(lambda: self._stop_retrying, timeout=delay)
                    delay = min(delay * 2, self.max_retry_seconds)
                else:
                    delay = self.retry_seconds

    def _write(self, batch: list[BenchmarkResult]) -> list[BenchmarkResult]:
        """Offer `batch` to the store; the results an outage refused (spooled), to try again."""
        try:
            errors: list[Exception | None] = list(self.store.record_results(self.run_id, batch))
        except Exception as exc:  # noqa: BLE001 - the store could not be opened: every result waits
            errors = [exc] * len(batch)
        refused: list[BenchmarkResult] = []
        for result, error in zip(batch, errors):
            if error is None:
                self._stored(result)
            elif is_outage(error):
                self._set_outage(error)
                if (result.task_id, result.attempt) not in self._spooled:
                    self._to_spool(result)
                refused.append(result)
            else:
                unstored = UnstoredResult(result, f"{type(error).__name__}: {error}")
                log.error("run %s: %s", self.run_id, unstored.describe())
                self._to_spool(result)  # kept for inspection; a resume offers it again
                with self._cond:
                    self.failed.append(unstored)
        if not refused and self.outage is not None:
            log.warning("run %s: the store is back; every waiting result is stored", self.run_id)
            with self._cond:
                self.outage = None
                self._held_back = False
                self._gave_up = False
        return refused

    def _stored(self, result: BenchmarkResult) -> None:
        key = (result.task_id, result.attempt)
        if key in self._spooled and self.spool is not None:
            try:
                self.spool.remove(result)
                self._spooled.discard(key)
            except OSError as exc:  # a leftover file is written again (the same row) on resume
                log.warning("run %s: spooled %s attempt %d stays on disk: %s", self.run_id, *key, exc)
        if self.on_stored is not None:
            try:
                self.on_stored(result)
            except Exception:  # noqa: BLE001 - progress is bookkeeping; the result is stored
                log.exception("run %s: on_stored failed for task %s", self.run_id, result.task_id)

    def _to_spool(self, result: BenchmarkResult) -> bool:
        """Put `result` in the spool; False when there is none or its disk refuses (then the
        result is only in memory)."""
        if self.spool is None:
            return False
        try:
            self.spool.put(result)
        except OSError as exc:
            log.error("run %s: cannot spool %s attempt %d (%s); it is kept in memory", self.run_id,
                      result.task_id, result.attempt, exc)
            return False
        self._spooled.add((result.task_id, result.attempt))
        return True

    def _set_outage(self, error: Exception) -> None:
        reason = error_text(error)
        with self._cond:
            if self.outage is None:
                log.error("run %s: the store cannot take results (%s); they wait in %s until it is back",
                          self.run_id, reason, self.spool.directory if self.spool is not None else "memory")
            self.outage = reason


__all__ = ["RecorderClose", "ResultRecorder", "StoreError", "UnstoredResult"]
