"""What a signal raised in this process, for when a library swallows it.

DuckDB runs Python's signal handlers while a query runs and, when one raises, stops the query and
raises RuntimeError("Query interrupted") in its place: the KeyboardInterrupt of a Ctrl-C (or the
TerminationSignal of `arena run`'s SIGTERM) is lost, and the caller fails with a traceback
instead of stopping as it does on a Ctrl-C anywhere else. The process's own signal handlers note
what they raise here (`raising`); the store raises it again in place of DuckDB's error
(adapters/store/connections.py).
"""

from __future__ import annotations

_raised: BaseException | None = None


def raising(exc: BaseException) -> BaseException:
    """Note `exc`, which a signal handler is about to raise; returns it."""
    global _raised
    _raised = exc
    return exc


def swallowed_signal() -> BaseException:
    """The exception the last signal's handler noted, to raise again (its old traceback dropped),
    else a KeyboardInterrupt (the only signal Python itself turns into an exception)."""
    return _raised.with_traceback(None) if _raised is not None else KeyboardInterrupt()
