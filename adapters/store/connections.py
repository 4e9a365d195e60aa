"""Short DuckDB connections that wait their turn, so many processes can share one results file.

DuckDB lets one process write a database file, or several processes read it, never both at
once; a second process that opens it meets "Could not set lock on file". So nothing in this
product holds the results file open: every operation connects, does its work and closes (a
write of one task result, with its steps, costs about 30 ms; a report's read about 15 ms), and
a connection that meets another process's lock waits and tries again. Any number of runs,
reports and `arena sql` queries then share one file, each waiting at most for the others'
short operations.

The one thing that can hold the file for long is a person: a `duckdb results.duckdb` shell left
open. Writers then wait (nothing is lost) and say, every `NOTICE_SECONDS`, which process holds
the file, so the person can close it.
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb

log = logging.getLogger(__name__)

NOTICE_SECONDS = 30.0
"""How often a waiting connection says who holds the file."""

_HOLDER = re.compile(r"Conflicting lock is held in (?P<program>.*?) \(PID (?P<pid>\d+)\)")

# Within one process DuckDB shares one database per file between connections, and refuses a
# connection whose read-only setting differs from the open one's. Connections of this process
# to one file are therefore taken one at a time.
_process_locks: dict[Path, threading.RLock] = {}
_process_locks_guard = threading.Lock()


class StoreBusyError(RuntimeError):
    """The file stayed locked by another process for longer than the caller would wait."""


def _process_lock(path: Path) -> threading.RLock:
    with _process_locks_guard:
        return _process_locks.setdefault(path, threading.RLock())


def lock_holder(error: BaseException) -> str | None:
    """'PID n (program)' of the process DuckDB says holds the file, or None if not a lock error."""
    match = _HOLDER.search(str(error))
    if match is None:
        return None
    return f"PID {match['pid']} ({match['program']})"


def _is_lock_conflict(error: duckdb.Error) -> bool:
    return isinstance(error, duckdb.IOException) and "Could not set lock" in str(error)


@contextlib.contextmanager
def connect(path: Path, *, read_only: bool, wait_seconds: float | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to the DuckDB file `path`, opened when no other process's lock is in the
    way and closed on exit.

    Waits (retrying with a short, growing, jittered pause) while another process holds the
    file; `wait_seconds=None` waits as long as it takes, logging a notice that names the holder
    every `NOTICE_SECONDS`. Raises `StoreBusyError` after `wait_seconds`, and `duckdb.Error`
    for any other failure to open.
    """
    started = time.monotonic()
    next_notice = started + NOTICE_SECONDS
    pause = 0.005
    with _process_lock(path):
        while True:
            try:
                conn = duckdb.connect(str(path), read_only=read_only)
                break
            except duckdb.ConnectionException:
                if not read_only:
                    raise
                # This thread already has the file open for writing (a nested read): join it.
                conn = duckdb.connect(str(path), read_only=False)
                break
            except duckdb.Error as exc:
                if not _is_lock_conflict(exc):
                    raise
                holder = lock_holder(exc)
                waited = time.monotonic() - started
                if wait_seconds is not None and waited >= wait_seconds:
                    raise StoreBusyError(
                        f"{path}: locked by {holder} for {waited:.0f} s; close that process's connection "
                        "(a DuckDB shell?) or try again when its write ends"
                    ) from exc
                if time.monotonic() >= next_notice:
                    log.warning(
                        "%s: waiting %.0f s for %s to release the file; if that is a DuckDB shell, "
                        "quit it (queries while runs write: arena sql)", path, waited, holder,
                    )
                    next_notice += NOTICE_SECONDS
                time.sleep(pause * (0.5 + random.random()))
                pause = min(pause * 2, 0.25)
        try:
            yield conn
        finally:
            conn.close()
