"""A durable local spool for finished results the store could not take yet.

When the results store is unreachable (a PostgreSQL restart, a lost network) or cannot write (a
full disk, a DuckDB file held by another process past its wait), a finished attempt must not be
lost: it cost VM time and model money. The recorder puts it here, one JSON file per attempt,
written to a temporary name, fsynced, renamed into place and the folder fsynced, so a result in
the spool survives a crash of the controller and even a power cut. The recorder keeps offering
spooled results to the store and removes each file once its row is committed; the next
`arena run --run-id RUN` writes whatever a run left behind before it does anything else
(`drain_spool`).

    <spool>/<run_id>/<task_id>--attempt-<n>.json     one BenchmarkResult each
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from adapters.benchmark import BenchmarkResult

log = logging.getLogger(__name__)


def spool_dir(artifacts_dir: Path, run_id: str) -> Path:
    """Where a run's spool lives: beside its screenshots (`<artifacts_dir>/<run_id>/spool`)."""
    return Path(artifacts_dir) / run_id / "spool"


class ResultSpool:
    """The spooled results of one run, as files under `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def _path(self, result: BenchmarkResult) -> Path:
        # Task ids and run ids are plain names (the catalog and the run config check them).
        return self.directory / f"{result.task_id}--attempt-{result.attempt}.json"

    def put(self, result: BenchmarkResult) -> None:
        """Write `result` durably (OSError, e.g. no space left, when it cannot be: the caller
        keeps it in memory then)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        data = result.model_dump_json().encode("utf-8")
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".part-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self._path(result))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        _fsync_dir(self.directory)

    def remove(self, result: BenchmarkResult) -> None:
        """Forget `result` once the store holds it (a missing file is fine)."""
        with contextlib.suppress(FileNotFoundError):
            self._path(result).unlink()

    def pending(self) -> list[BenchmarkResult]:
        """Every spooled result, oldest first; unreadable files are named in the log and kept."""
        if not self.directory.is_dir():
            return []
        found: list[tuple[float, BenchmarkResult]] = []
        for path in self.directory.glob("*--attempt-*.json"):
            try:
                found.append((path.stat().st_mtime, BenchmarkResult.model_validate_json(path.read_bytes())))
            except (OSError, ValueError) as exc:
                log.error("spooled result %s cannot be read (%s); it is kept for inspection", path, exc)
        return [result for _, result in sorted(found, key=lambda item: item[0])]

    def __len__(self) -> int:
        return len(list(self.directory.glob("*--attempt-*.json"))) if self.directory.is_dir() else 0


def drain_spool(spool: ResultSpool, write: Callable[[list[BenchmarkResult]], list[Exception | None]]) -> tuple[int, int]:
    """Offer every spooled result to the store's `write` (ResultStore.record_results of the
    run); (written, still spooled). A store that cannot be opened raises, as `write` does."""
    pending = spool.pending()
    if not pending:
        return 0, 0
    errors = write(pending)
    written = 0
    for result, error in zip(pending, errors):
        if error is None:
            spool.remove(result)
            written += 1
    return written, len(pending) - written


def _fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (the directory entry itself is fsynced)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def describe_results(results: list[BenchmarkResult]) -> str:
    """"3 results (notepad-a attempt 1, ...)" for messages."""
    names = ", ".join(f"{r.task_id} attempt {r.attempt}" for r in results[:5])
    more = f", and {len(results) - 5} more" if len(results) > 5 else ""
    return f"{len(results)} result(s) ({names}{more})"


def json_safe(value: object) -> str:
    """A JSON string of `value` (for logs that must stay one line)."""
    return json.dumps(value, default=str)
