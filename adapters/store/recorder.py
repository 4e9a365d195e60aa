"""Storing a run's attempts in the background, so lanes never wait for the store.

A lane used to write each attempt (about 30 ms on a DuckDB file, 70-120 ms when lanes ended
together, one network round trip per statement on a distant PostgreSQL server) before it could
take its next task. Here a lane hands the result over and goes on; one thread per run writes
whatever has queued up, several results per store session, in the order they came.

What this changes for a crash: a result still in the queue when the controller dies is not
stored, so a resumed run attempts that task again; nothing stored is ever wrong. A write that
keeps failing (store unreachable) is retried, then reported in `failed` and logged; that task
counts as missing and the run ends incomplete, as it would have before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from adapters.benchmark import BenchmarkResult
from adapters.store.duckdb_store import ResultStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnstoredResult:
    """An attempt whose result could not be stored, and why."""

    result: BenchmarkResult
    error: str

    def describe(self) -> str:
        return f"task {self.result.task_id} attempt {self.result.attempt}: result not stored: {self.error}"


class ResultRecorder:
    """Writes the attempts of one run to its store from a background thread.

    `record` queues a result and returns at once; `flush` waits until everything queued so far
    is stored (or has failed for good); `close` flushes and stops the thread. A write that fails
    is retried `retries` times `retry_seconds` apart. `on_stored` is called (from the writer
    thread) with each result once it is stored, so live progress never counts a result a report
    could not show yet.
    """

    def __init__(
        self,
        store: ResultStore,
        run_id: str,
        *,
        retries: int = 2,
        retry_seconds: float = 1.0,
        on_stored: Callable[[BenchmarkResult], None] | None = None,
    ) -> None:
        self.store = store
        self.on_stored = on_stored
        self.run_id = run_id
        self.retries = retries
        self.retry_seconds = retry_seconds
        self.failed: list[UnstoredResult] = []
        self._queue: deque[BenchmarkResult] = deque()
        self._unfinished = 0  # queued or being written
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"recorder-{run_id}", daemon=True)
        self._thread.start()

    def record(self, result: BenchmarkResult) -> None:
        """Queue one attempt's result for storing."""
        with self._cond:
            if self._closed:
                raise RuntimeError(f"the recorder of run {self.run_id} is closed")
            self._queue.append(result)
            self._unfinished += 1
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every result queued so far is stored or has failed; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._unfinished == 0, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Flush, then stop the writer thread; False if results were still unwritten at the timeout."""
        flushed = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if flushed:
            self._thread.join(timeout)
        return flushed

    @property
    def pending(self) -> int:
        """Results queued or being written."""
        with self._cond:
            return self._unfinished

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                batch = list(self._queue)
                self._queue.clear()
            try:
                self._write(batch)
            finally:
                with self._cond:
                    self._unfinished -= len(batch)
                    self._cond.notify_all()

    def _notify(self, result: BenchmarkResult) -> None:
        try:
            self.on_stored(result)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - progress is bookkeeping; the result is stored
            log.exception("run %s: on_stored failed for task %s", self.run_id, result.task_id)

    def _write(self, batch: list[BenchmarkResult]) -> None:
        for attempt in range(self.retries + 1):
            try:
                errors: list[Exception | None] = list(self.store.record_results(self.run_id, batch))
            except Exception as exc:  # noqa: BLE001 - the store could not be opened: all retried
                errors = [exc] * len(batch)
            failures = [(result, error) for result, error in zip(batch, errors) if error is not None]
            if self.on_stored is not None:
                for result, error in zip(batch, errors):
                    if error is None:
                        self._notify(result)
            if not failures:
                return
            if attempt == self.retries:
                for result, error in failures:
                    unstored = UnstoredResult(result, f"{type(error).__name__}: {error}")
                    log.error("run %s: %s", self.run_id, unstored.describe())
                    with self._cond:
                        self.failed.append(unstored)
                return
            batch = [result for result, _ in failures]
            time.sleep(self.retry_seconds)
