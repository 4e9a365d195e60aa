"""Signals that stop this process, while a library (DuckDB) holds its main thread.

Two things go wrong when a Ctrl-C (or `arena run`'s SIGTERM) arrives during a DuckDB query:

- The query goes on. Python runs a signal's handler only when the main thread runs Python again,
  and DuckDB looks for a pending signal only now and then: on this 2-core machine under load, a
  query on two threads went on for 25 to over 100 s after the signal (measured with DuckDB
  2.0.1: 4 of 16 queries by hand, and all four such tests in one whole test run; at once on one
  thread or on an idle machine).
  `interrupted_by_signals` makes it stop at once: Python's own C-level handler writes each
  signal's number to a pipe (`signal.set_wakeup_fd`), a thread waiting on that pipe calls the
  query's `interrupt()` (DuckDB's way to stop a query from another thread: within 10 ms, 16 of
  16 times under the same load), and the main thread then runs the signal's handler as usual.
  Only for a signal whose handler raises (`raises_always`): a handler that lets the process go
  on must not cost it its query.
- What the handler raised is lost. DuckDB stops the query and raises RuntimeError("Query
  interrupted") (or, after `interrupt()`, InterruptException) in place of the KeyboardInterrupt
  or TerminationSignal. The process's own handlers note what they raise (`raising`); the store
  raises it again in place of DuckDB's error (adapters/store/connections.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

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


# Signal handlers that always raise, so a query under way may be stopped when their signal comes.
_RAISING_HANDLERS: set[Any] = {signal.default_int_handler}
_STOPPING_SIGNALS = frozenset({int(signal.SIGINT), int(signal.SIGTERM)})

Handler = Callable[[int, Any], Any]


def raises_always(handler: Handler) -> Handler:
    """Mark `handler` (for SIGINT or SIGTERM) as one that always raises, so that the query its
    signal arrives in is stopped at once (`interrupted_by_signals`); returns it."""
    _RAISING_HANDLERS.add(handler)
    return handler


class Interruptible(Protocol):
    """Something under way that another thread can stop (a DuckDB connection's query)."""

    def interrupt(self) -> Any: ...


class _Relay:
    """The thread that reads the signal numbers Python's C-level handler writes to the wakeup
    pipe, and interrupts what the main thread has under way (`interrupted_by_signals`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._under_way: list[Interruptible] = []
        self._pipe: tuple[int, int] | None = None
        self._unavailable = False

    def _installed(self) -> bool:
        """Whether the wakeup pipe is this relay's, installing it if no one else has one (from
        the main thread: Python's rule)."""
        if self._pipe is not None:
            return True
        if self._unavailable:
            return False
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        try:
            previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except ValueError:  # not the main interpreter's main thread after all
            os.close(read_end)
            os.close(write_end)
            return False
        if previous != -1:
            # Someone else's (an asyncio loop's signal handling): theirs stays, queries then stop
            # when DuckDB next looks for a signal, as without this relay.
            signal.set_wakeup_fd(previous)
            os.close(read_end)
            os.close(write_end)
            self._unavailable = True
            return False
        self._pipe = (read_end, write_end)
        threading.Thread(target=self._relay, args=(read_end,), name="arena-signal-relay", daemon=True).start()
        return True

    def _relay(self, read_end: int) -> None:
        while True:
            try:
                received = os.read(read_end, 64)
            except OSError:  # the pipe is gone: nothing more to relay
                return
            if not received:
                return
            if any(signum in _STOPPING_SIGNALS and signal.getsignal(signum) in _RAISING_HANDLERS
                   for signum in received):
                with self._lock:
                    under_way = list(self._under_way)
                for query in under_way:
                    with contextlib.suppress(Exception):  # one already ended has nothing to stop
                        query.interrupt()

    @contextlib.contextmanager
    def watching(self, query: Interruptible) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread() or not self._installed():
            yield
            return
        with self._lock:
            self._under_way.append(query)
        try:
            yield
        finally:
            with self._lock:
                self._under_way.remove(query)

    def forget_in_child(self) -> None:
        """After a fork: the child's signals are its own; its copy of the pipe is given up (the
        parent's thread, not the child's, reads it)."""
        if self._pipe is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(-1)
            for fd in self._pipe:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._under_way, self._pipe, self._unavailable = [], None, False


_relay = _Relay()
os.register_at_fork(after_in_child=_relay.forget_in_child)


def interrupted_by_signals(query: Interruptible) -> contextlib.AbstractContextManager[None]:
    """While the block runs in the main thread, a SIGINT or SIGTERM whose handler always raises
    (`raises_always`, or Python's own Ctrl-C) calls `query.interrupt()` at once, from another
    thread; the handler then runs in the main thread as usual. In any other thread, or where
    another part of the process already uses Python's wakeup fd, the block runs as it is."""
    return _relay.watching(query)
