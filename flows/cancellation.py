"""Cancelling a run from Prefect: the UI's Cancel, `prefect flow-run cancel`, on the run itself
or on a flow run above it (a served baseline, the nightly).

Every evaluation watches its own flow run and those above it while it runs (`watch_cancellation`)
and, once one is Cancelling or Cancelled, sets an event the pool engine waits on: no new task
starts, running attempts get a grace period, the pool is torn down, and the flow ends in
Prefect's Cancelled state with the store saying `cancelled`. This works the same for a run a
runner or worker started (which also sends the process SIGTERM), for `arena run` (whose flow run
belongs to a deployment so the UI's Cancel button works, but which no runner watches) and for a
run nested in another flow, which no runner would stop at all.

    terminate_on_sigterm()      this process stops on SIGTERM by raising TerminationSignal
    watch_cancellation(event)   while the block runs, set `event` once the run (or one above it) is cancelled
    cancellation_requested()    whether the server holds the current flow run (or one above it) in
                                Cancelling/Cancelled
"""

from __future__ import annotations

import contextvars
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from prefect.exceptions import TerminationSignal

from adapters.interrupts import raises_always, raising
from flows.bookkeeping import best_effort

POLL_SECONDS = 2.0


def _raise_termination(signum: int, frame: Any) -> None:
    raise raising(TerminationSignal(signal=signum))


def terminate_on_sigterm() -> None:
    """SIGTERM raises TerminationSignal in the main thread, before, during and after the flow, so
    `arena run` can end with its own message and exit status. Only for a process that is ours
    (`arena run`), never a test's."""
    signal.signal(signal.SIGTERM, raises_always(_raise_termination))


def _current_flow_run() -> Any:
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        raise RuntimeError("called outside a flow run")
    return context.flow_run


_CANCELLED = {"CANCELLING", "CANCELLED"}


def _lineage_cancelled(flow_run_id: UUID | str) -> bool:
    """Whether the flow run or any flow run above it (a served flow runs the suite as a subflow:
    the on-demand baseline, the nightly) is Cancelling or Cancelled."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        current: UUID | str | None = flow_run_id
        for _ in range(10):  # the product nests flows three deep at most
            if current is None:
                return False
            flow_run = client.read_flow_run(current)
            if flow_run.state is not None and flow_run.state.type.value in _CANCELLED:
                return True
            if flow_run.parent_task_run_id is None:
                return False
            current = client.read_task_run(flow_run.parent_task_run_id).flow_run_id
    return False


def cancellation_requested() -> bool:
    """Whether the server holds the current flow run, or a flow run above it, in Cancelling or
    Cancelled (False if it cannot be asked)."""
    flow_run_id = _current_flow_run().id
    return bool(best_effort("reading the flow run's state", lambda: _lineage_cancelled(flow_run_id), retry_for=5.0))


@contextmanager
def watch_cancellation(cancelled: threading.Event) -> Iterator[None]:
    """While the block runs, poll the current flow run and those above it every POLL_SECONDS;
    set `cancelled` once one is Cancelling or Cancelled (a server that does not answer is asked
    again)."""
    flow_run_id = _current_flow_run().id
    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL_SECONDS):
            try:
                if _lineage_cancelled(flow_run_id):
                    cancelled.set()
                    return
            except Exception:  # noqa: BLE001 - the server may be restarting; ask again
                continue

    # Run in the flow's context: the Prefect settings (its server's API URL) are context
    # variables, and a Prefect call without them would start a temporary server of its own.
    watcher = threading.Thread(target=contextvars.copy_context().run, args=(watch,), name="arena-cancel-watch",
                               daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
