"""Cancelling a run from Prefect: the UI's Cancel button, `prefect flow-run cancel`.

A run started by a runner or worker (`deployments.serve`, a work pool) is stopped by it: the
server marks the run Cancelling, the runner sends its process SIGTERM, and Prefect turns that
into a `TerminationSignal` in the flow. A run `arena run` started in its own process has no
runner, so nothing would stop it: `stop_when_cancelled` watches its state and sends the process
the same SIGTERM, and the flow then stops as it does under a runner (no new task, a grace period
for running attempts, teardown, status `cancelled`).

    terminate_on_sigterm()      this process stops on SIGTERM by raising TerminationSignal
    stop_when_cancelled()       while the block runs, SIGTERM this process once its run is cancelled
    cancellation_requested()    whether the server holds the current flow run (or one above it) in
                                Cancelling/Cancelled
"""

from __future__ import annotations

import contextvars
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from prefect.exceptions import TerminationSignal

from flows.bookkeeping import best_effort

POLL_SECONDS = 2.0
_self_stop_allowed = False


def _raise_termination(signum: int, frame: Any) -> None:
    raise TerminationSignal(signal=signum)


def terminate_on_sigterm() -> None:
    """SIGTERM raises TerminationSignal in the main thread, before, during and after the flow, so
    `arena run` can end with its own message and exit status; and the process may stop itself
    when its run is cancelled. Only for a process that is ours (`arena run`), never a test's."""
    global _self_stop_allowed
    signal.signal(signal.SIGTERM, _raise_termination)
    _self_stop_allowed = True


def _state_type(flow_run_id: UUID | str) -> str | None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
    return state.type.value if state else None


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
def stop_when_cancelled() -> Iterator[None]:
    """While the block runs, poll the current flow run's state and SIGTERM this process once it
    is cancelled. Does nothing for deployment runs (their runner or worker stops them) or when
    `terminate_on_sigterm` was not called."""
    flow_run = _current_flow_run()
    flow_run_id = flow_run.id
    if flow_run.deployment_id is not None or not _self_stop_allowed:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL_SECONDS):
            try:
                cancelled = _state_type(flow_run_id) in _CANCELLED
            except Exception:  # noqa: BLE001 - the server may be restarting; ask again
                continue
            if cancelled:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    # Run in the flow's context: the Prefect settings (its server's API URL) are context
    # variables, and a Prefect call without them would start a temporary server of its own.
    watcher = threading.Thread(target=contextvars.copy_context().run, args=(watch,), name="arena-cancel-watch",
                               daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
