"""Reading a flow run's events back from the current Prefect server, for the tests that check what
a run sent."""

from __future__ import annotations

import time
from typing import Any

from prefect import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

from flows.flow_run_heartbeats import HEARTBEAT_EVENT


def flow_run_events(run_id: Any, names: list[str]) -> list[Any]:
    """The events named `names` about flow run `run_id` that the server has stored, oldest first."""
    with get_client(sync_client=True) as client:
        page = client.read_events(filter=EventFilter(
            event=EventNameFilter(name=names),
            resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]),
        ), limit=50)
    return sorted(page.events, key=lambda event: event.occurred)


def stored_heartbeats(run_id: Any, timeout: float = 60) -> list[Any]:
    """The flow run's heartbeats, read once the server has stored its final state's event too
    (a run's events are sent and stored in order, so no heartbeat sent before its end is still on
    its way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if flow_run_events(run_id, ["prefect.flow-run.Completed"]):
            return flow_run_events(run_id, [HEARTBEAT_EVENT])
        time.sleep(0.5)
    raise AssertionError(f"flow run {run_id}: no Completed event stored within {timeout} s")
