"""Prefect API calls that only keep books: releasing the pool's concurrency slots, removing its
limit, publishing artifacts, naming task runs.

A run's status comes from its recorded results, not from these calls: they are retried through a
short Prefect server outage (a restart, a proxy blip) and, if the server stays away, logged and
given up. None of them may turn a finished evaluation into a failed one.

    best_effort(what, call)     call, retried with back-off for up to `retry_for` seconds
    in_background(what, call)   the same in a thread of its own, which the process waits for at exit
    after_background(then)      `then()` once every background call started so far has ended
    wait_for_background(limit)  block until they have ended (for callers that own the server)
    pool_slots(name, occupy)    hold `occupy` slots of a global concurrency limit for a block
"""

from __future__ import annotations

import contextvars
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from prefect import get_run_logger
from prefect.concurrency.sync import concurrency
from prefect.context import AsyncClientContext, SyncClientContext

T = TypeVar("T")

# How long bookkeeping keeps retrying before it gives up (the Prefect client's own retries
# cover a few seconds; a server restart under load takes longer).
RETRY_SECONDS = 60.0


# Background bookkeeping still under way: whoever holds the Prefect server for this process
# (flows/local_server.py) lets it go only after these end.
_pending: set[threading.Thread] = set()
_pending_lock = threading.Lock()


def warn(message: str, to_api: bool = True) -> None:
    """A warning in the run's log (nothing outside a flow or task run). `to_api=False` keeps it
    on the console: for a warning that the Prefect API itself is unreachable, sending it there
    would only fail again, noisily."""
    try:
        get_run_logger().warning(message, extra={} if to_api else {"send_to_api": False})
    except Exception:  # noqa: BLE001 - no run context (e.g. a background thread)
        pass


def best_effort(what: str, call: Callable[[], T], retry_for: float = RETRY_SECONDS,
                log_to_api: bool = True) -> T | None:
    """`call()`, retried with exponential back-off (1 s, 2 s, ... 10 s) for up to `retry_for`
    seconds; on giving up, a warning naming `what` and None. Never raises an Exception."""
    deadline = time.monotonic() + retry_for
    delay = 1.0
    while True:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail the run
            if time.monotonic() + delay > deadline:
                warn(f"{what} failed (given up after {retry_for:g} s; the run's results are not affected): "
                     f"{type(exc).__name__}: {exc}", to_api=log_to_api)
                return None
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def in_background(what: str, call: Callable[[], object], retry_for: float = RETRY_SECONDS) -> threading.Thread:
    """`best_effort(what, call)` in a thread of its own, in the caller's context (its Prefect
    settings and run), for bookkeeping nobody waits for: the run goes on to its summary and
    report meanwhile. Not a daemon: the interpreter waits for it before the process exits.
    Its warning stays on the console: by then the run has ended, and the API may be gone."""
    context = contextvars.copy_context()
    # Without the run's API clients: Prefect hands out the client of the surrounding run, which
    # the run closes when it ends, and a call still under way (or retried) then would fail until
    # it gives up. Prefect's `get_client` makes a client of the call's own instead.
    context.run(SyncClientContext.__var__.set, None)
    context.run(AsyncClientContext.__var__.set, None)

    def work() -> None:
        try:
            context.run(best_effort, what, call, retry_for, log_to_api=False)
        finally:
            with _pending_lock:
                _pending.discard(threading.current_thread())

    thread = threading.Thread(target=work, name="bookkeeping", daemon=False)
    with _pending_lock:
        _pending.add(thread)
    thread.start()
    return thread


def after_background(then: Callable[[], object]) -> None:
    """`then()` once every background call started so far has ended: at once when none is under
    way, else in a thread of its own (not a daemon) that waits for them."""
    with _pending_lock:
        waiting = list(_pending)
    if not waiting:
        then()
        return

    def wait_then() -> None:
        for thread in waiting:
            thread.join()
        then()

    threading.Thread(target=wait_then, name="bookkeeping-then", daemon=False).start()


def wait_for_background(timeout: float) -> bool:
    """Block until every background call started so far has ended, for up to `timeout` seconds;
    True when they all did. For whoever stops the Prefect server a process ran against (a test
    server, a benchmark's): stopped first, the calls still under way would retry against nothing
    for `RETRY_SECONDS` and hold the process's exit that long."""
    deadline = time.monotonic() + timeout
    with _pending_lock:
        waiting = list(_pending)
    for thread in waiting:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in waiting)


@contextmanager
def pool_slots(name: str, occupy: int, lease_seconds: float = 300.0,
               timeout_seconds: float | None = None) -> Iterator[None]:
    """Hold `occupy` slots of the strict global concurrency limit `name` while the block runs.

    Taking the slots must succeed (a missing limit fails loudly; TimeoutError when they are not
    free within `timeout_seconds`, if given). Renewing their lease and
    releasing them are bookkeeping: a renewal that fails does not stop the run, and a release
    that fails is logged; the lease then expires by itself after `lease_seconds`.
    """
    slots = concurrency(name, occupy=occupy, strict=True, lease_duration=lease_seconds,
                        timeout_seconds=timeout_seconds, raise_on_lease_renewal_failure=False)
    slots.__enter__()
    try:
        yield
    except BaseException:
        _release(slots, *sys.exc_info())
        raise
    else:
        _release(slots, None, None, None)


def _release(slots: object, *exc_info: object) -> None:
    try:
        slots.__exit__(*exc_info)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - see pool_slots
        warn(f"could not release the pool's concurrency slots (they expire with their lease): "
             f"{type(exc).__name__}: {exc}")


def slug(text: str) -> str:
    """Lowercase letters, digits and dashes (Prefect artifact keys allow nothing else)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"
