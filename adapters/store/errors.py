"""The store's errors, shared by its engines (DuckDB files and PostgreSQL)."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The store cannot do what was asked; the message names the file or server, run or task."""


class SchemaVersionError(StoreError):
    """The store was written by a newer schema than this code understands."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or written for now (a server down, a lost connection, a full
    disk, a file another process holds): what was asked may succeed later."""


class StoreDamaged(StoreError):
    """The store's file is damaged (truncated, checksums that do not match); nothing is written
    into it."""


class RunLeaseHeld(StoreError):
    """Another controller is running this run id; the message names it and when it was last
    heard from."""


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` (from a store call) means the store is unavailable for now, as opposed to a
    problem with what was written: retrying later can succeed."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StoreUnavailable) or isinstance(current, OSError):
            return True
        if _engine_outage(current):
            return True
        current = current.__cause__ or current.__context__
    return False


# Words of an engine error that come from the machine, not from what was written.
_OUTAGE_WORDS = ("No space left on device", "Could not write file", "Input/output error", "Disk quota exceeded")


def _engine_outage(exc: BaseException) -> bool:
    import duckdb

    # A failed commit (a full disk under the write-ahead log, a write conflict) may succeed later.
    if isinstance(exc, (duckdb.IOException, duckdb.ConnectionException, duckdb.OutOfMemoryException,
                        duckdb.TransactionException)):
        return True
    if any(word in str(exc) for word in _OUTAGE_WORDS):
        return True
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))


def error_text(exc: BaseException) -> str:
    """The cause of a store failure in one line: the innermost engine or OS error's message
    ("No space left on device", "connection refused"), never a traceback."""
    innermost: BaseException = exc
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        innermost = current
        current = current.__cause__
    text = " ".join(str(innermost).split()) or type(innermost).__name__
    return text[:300]
