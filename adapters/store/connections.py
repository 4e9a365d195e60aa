"""Short DuckDB connections that wait their turn, so many processes can share one results file.

DuckDB lets one process write a database file, or several processes read it, never both at
once; a second process that opens it meets "Could not set lock on file". So nothing in this
product holds the results file open: every operation connects, does its work and closes (a
write of one task result, with five steps, costs about 30 ms of CPU; a run's read about 5 ms), and
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

Opening a DuckDB database builds its catalog of built-in functions: about 30 ms of CPU, on every
connection, even in memory (measured with DuckDB 2.0.1; a default run makes about 30). So each
process keeps one in-memory database and each connection attaches the file to it and detaches
it on close (about 3 ms): the file is locked, read and written back exactly as by a connection
of its own (the same locks, the same errors, no write-ahead log left behind), and the catalog is
built once per process. Measured: a result's write 64 -> 29 ms of CPU, a run's read 29 -> 5 ms,
and a default run's controller about 1.3 CPU-s less.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import random
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb

from adapters.interrupts import interrupted_by_signals, swallowed_signal

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
def connect(
    path: Path, *, read_only: bool, wait_seconds: float | None = None, private: bool = False
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to the DuckDB file `path`, opened when no other process's lock is in the
    way and closed on exit. A Ctrl-C or SIGTERM that arrives during a query in the block stops it
    at once and raises what its handler raised (a Ctrl-C: KeyboardInterrupt), not DuckDB's error
    (adapters/interrupts.py).

    Waits (retrying with a short, growing, jittered pause) while another process holds the
    file; `wait_seconds=None` waits as long as it takes, logging a notice that names the holder
    every `NOTICE_SECONDS`. Raises `StoreBusyError` after `wait_seconds`, and `duckdb.Error`
    for any other failure to open.

    The connection's unqualified names are the file's tables. `private` gives it a database of
    its own instead of the process's shared one, for a connection whose settings must not reach
    any other (`arena sql` turns off file access for good).
    """
    with _signals_raised_again(), _connection(path, read_only, wait_seconds, private) as conn:
        with interrupted_by_signals(conn):
            yield conn


@contextlib.contextmanager
def _signals_raised_again() -> Iterator[None]:
    try:
        yield
    except (RuntimeError, duckdb.InterruptException) as exc:
        # Only a signal interrupts a query here (adapters/interrupts.py calls interrupt() for one).
        if isinstance(exc, duckdb.InterruptException) or str(exc) == "Query interrupted":
            raise swallowed_signal() from exc
        raise


@contextlib.contextmanager
def _connection(
    path: Path, read_only: bool, wait_seconds: float | None, private: bool
) -> Iterator[duckdb.DuckDBPyConnection]:
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
                    conn = duckdb.connect(str(path), read_only=read_only) if private else _attach(path, read_only)
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
            if private:
                conn.close()
            else:
                _detach(path, conn)
            if not nested:
                del _turns[path]
                _end_turn(turn)


@dataclass
class _Attachment:
    """A results file attached to this process's database, and how many connections use it."""

    alias: str
    read_only: bool
    users: int = 0


_instance: tuple[int, duckdb.DuckDBPyConnection] | None = None  # (pid, this process's database)
_instance_guard = threading.Lock()
_attachments: dict[Path, _Attachment] = {}  # taken under the file's process lock
_aliases = itertools.count()


def _process_database() -> duckdb.DuckDBPyConnection:
    """This process's in-memory DuckDB database, which results files are attached to."""
    global _instance
    with _instance_guard:
        if _instance is None or _instance[0] != os.getpid():  # a forked child makes its own
            # Large queries spill to the system's temporary folder, not to the working directory.
            spill = os.path.join(tempfile.gettempdir(), f"arena-duckdb-{os.getpid()}")
            _instance = (os.getpid(), duckdb.connect(":memory:", config={"temp_directory": spill}))
        return _instance[1]


def _attach(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A connection whose unqualified names are the file `path`'s, attached for it (or shared
    with this thread's open connection to it: a nested read joins a write)."""
    database = _process_database()
    attached = _attachments.get(path)
    if attached is None:
        attached = _Attachment(f"results_{next(_aliases)}", read_only)
        control = database.cursor()
        try:
            # The path is a parameter: a quote in a folder's name stays part of the name.
            control.execute(f"ATTACH ? AS {attached.alias}{' (READ_ONLY)' if read_only else ''}", [str(path)])
        finally:
            control.close()
        _attachments[path] = attached
    elif attached.read_only and not read_only:
        raise duckdb.ConnectionException(f"{path}: this thread has the file open read-only and cannot write to it")
    conn = database.cursor()
    attached.users += 1
    try:
        conn.execute(f"USE {attached.alias}")
    except BaseException:
        _detach(path, conn)
        raise
    return conn


def second_cursor(conn: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Another connection to the database `conn` reads, for a second query open beside its own
    (DuckDB's `cursor()` starts in the process's database, not in the attached file)."""
    (database,) = conn.execute("SELECT current_database()").fetchone()
    quoted = database.replace('"', '""')
    cursor = conn.cursor()
    cursor.execute(f'USE "{quoted}"')
    return cursor


def _detach(path: Path, conn: duckdb.DuckDBPyConnection) -> None:
    """Close `conn`; the file is detached (written back, its lock released) with its last user."""
    conn.close()
    attached = _attachments[path]
    attached.users -= 1
    if attached.users:
        return
    del _attachments[path]
    control = _process_database().cursor()
    try:
        control.execute(f"DETACH {attached.alias}")
    except duckdb.Error as exc:
        # DuckDB detaches even when writing its log back into the file fails (a full disk):
        # what was committed stays in the write-ahead log beside the file, and the next open
        # replays it, as a closing connection of its own did without a word. The operation
        # stands; only a file still attached is an error.
        still = "SELECT count(*) FROM duckdb_databases() WHERE database_name = ?"
        if control.execute(still, [attached.alias]).fetchone()[0]:
            raise
        log.warning("%s: not written back from its write-ahead log yet (the next open does it): %s",
                    path, str(exc).splitlines()[0])
    finally:
        control.close()
