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
    settle_late_cancel(id, state)
                                a cancel that came after the run had ended: Prefect is told how
                                it ended instead of staying Cancelling
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


def settle_late_cancel(flow_run_id: UUID | str, final: Any) -> bool:
    """After the run's flow has ended in `final` (its own state: what the store says), make
    Prefect say the same when a cancel reached the server too late to stop anything.

    A cancel that arrives after the run stopped watching for it (its work done, its results
    stored) leaves the flow run Cancelling: Prefect then refuses the flow's own final state (from
    Cancelling only Cancelled is allowed) and, with no runner to finish the cancel, later calls
    it "cancellation timed out", while the store says `completed` and `arena run` exits 0.
    The run's end is what happened, so that state is set, by force, with a note that the cancel
    came after it. True when it was needed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import State, StateType

    def settle() -> bool:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run_id).state
            if state is None or state.type != StateType.CANCELLING:
                return False
            note = "the cancel arrived after the run had ended"
            message = f"{final.message} ({note})" if final.message else note
            client.set_flow_run_state(flow_run_id, State(type=final.type, name=final.name, message=message), force=True)
            return True

    return bool(best_effort("telling Prefect how the run ended after a late cancel", settle, retry_for=30.0))
