"""Short DuckDB connections that wait their turn, so many processes can share one results file.

DuckDB lets one process write a database file, or several processes read it, never both at
once; a second process that opens it meets "Could not set lock on file". So nothing in this
product holds the results file open: every operation connects, does its work and closes (a
write of one task result, with its steps, costs about 30 ms; a report's read about 15 ms), and
a connection that meets another process's lock waits and tries again. Any number of runs,
reports and `arena sql` queries then share one file, each waiting at most for the others'
short operations.

DuckDB's own lock is not enough for this. Measured with DuckDB 2.0.1: three processes each
writing 40 rows in such short connections while a fourth reads, about one run in four lost a
committed row without any error, or failed a write reading past the file's end. So the
product's processes also take turns through a lock file beside the database (`<file>.lock`,
shared for reading, exclusive for writing) around each connection: with it, no run lost a row.
Other programs (a DuckDB shell) still meet DuckDB's own lock.

The one thing that can hold the file for long is a person: a `duckdb results.duckdb` shell left
open. Writers then wait (nothing is lost) and say, every `NOTICE_SECONDS`, which process holds
the file, so the person can close it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
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


# The lock file this process holds for each database file while a connection to it is open
# (a nested connection of the same thread shares it: a second flock would wait for the first).
_turns: dict[Path, int] = {}


def lock_file(path: Path) -> Path:
    """The lock file beside the database `path` through which this product's processes take turns."""
    return path.with_name(path.name + ".lock")


def _take_turn(path: Path, read_only: bool) -> int | None:
    """The lock file's descriptor, locked (shared to read, exclusive to write), or None when
    another process has it the other way; -1 when there is no lock file to open (a folder
    nobody may write in): DuckDB's own lock is then all there is, and its own error says why a
    write cannot open the database."""
    try:
        fd = os.open(lock_file(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if read_only else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _end_turn(fd: int) -> None:
    if fd >= 0:
        os.close(fd)  # releases the flock


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
        nested = path in _turns  # this thread's connection is already open: share its turn
        while True:
            turn = _turns[path] if nested else _take_turn(path, read_only)
            conflict: duckdb.Error | None = None
            if turn is None:
                holder = f"another process of this product (through {lock_file(path).name})"
            else:
                try:
                    conn = _open(path, read_only)
                    break
                except BaseException as exc:
                    if not nested:
                        _end_turn(turn)
                    if not isinstance(exc, duckdb.Error) or not _is_lock_conflict(exc):
                        raise
                    holder, conflict = lock_holder(exc), exc
            waited = time.monotonic() - started
            if wait_seconds is not None and waited >= wait_seconds:
                raise StoreBusyError(
                    f"{path}: locked by {holder} for {waited:.0f} s; close that process's connection "
                    "(a DuckDB shell?) or try again when its write ends"
                ) from conflict
            if time.monotonic() >= next_notice:
                log.warning(
                    "%s: waiting %.0f s for %s to release the file; if that is a DuckDB shell, "
                    "quit it (queries while runs write: arena sql)", path, waited, holder,
                )
                next_notice += NOTICE_SECONDS
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, 0.25)
        if not nested:
            _turns[path] = turn
        try:
            yield conn
        finally:
            conn.close()
            if not nested:
                del _turns[path]
                _end_turn(turn)


def _open(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    try:
        return duckdb.connect(str(path), read_only=read_only)
    except duckdb.ConnectionException:
        if not read_only:
            raise
        # This thread already has the file open for writing (a nested read): join it.
        return duckdb.connect(str(path), read_only=False)
