"""The run's life (flows/run_life.py): its table of ends is what the code does (the store's status,
Prefect's state, `arena run`'s exit status) and what docs/outcomes.md and docs/prefect-ui.md say;
and its events move the run as the table says."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from prefect.exceptions import TerminationSignal

import flows.run_life as run_life
from flows.cli.common import RUN_EXIT_CODES
from flows.run_config import RunOutcome
from flows.run_life import RunLife
from flows.run_states import run_state
from flows.summary import RunCompleteness

ROOT = Path(__file__).resolve().parents[2]


def _rows() -> list[dict[str, str]]:
    lines = [line for line in (run_life.__doc__ or "").splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[2:]]


def _ends() -> list[tuple[str, str, str, str]]:
    """(status, stopped_by, Prefect state, exit) for each way a run ends, one per stopper."""
    ends = []
    for row in _rows():
        if not row["exit"]:
            continue
        stoppers = [s.strip() for s in row["stopped_by"].split("/")] or [""]
        exits = [e.strip() for e in row["exit"].split("/")]
        for stopper, code in zip(stoppers, exits * len(stoppers) if len(exits) == 1 else exits):
            ends.append((row["to (runs.status)"], stopper, row["Prefect state"], code))
    return ends


def test_the_table_covers_every_exit_status_the_cli_knows() -> None:
    assert {status for status, *_ in _ends()} == set(RUN_EXIT_CODES)


@pytest.mark.parametrize("status, stopped_by, state, code", _ends())
def test_each_end_is_stored_shown_and_exits_as_the_table_says(status: str, stopped_by: str, state: str,
                                                              code: str) -> None:
    expected_exit = {"sigterm": 143}.get(stopped_by, RUN_EXIT_CODES[status])
    assert int(code) == expected_exit
    if status == "failed":
        return  # an error nobody expected: the flow raises, Prefect marks it Failed itself
    outcome = RunOutcome(run_id="r", store="s", results=[], table="", status=status, stopped_by=stopped_by or None)
    assert run_state(outcome).type.value == state.upper()
    outcomes = (ROOT / "docs" / "outcomes.md").read_text()
    assert re.search(rf"\| {code} \| `{status}` \|", outcomes), f"docs/outcomes.md has no row '| {code} | `{status}` |'"


def test_the_prefect_states_are_the_ones_docs_prefect_ui_lists() -> None:
    page = (ROOT / "docs" / "prefect-ui.md").read_text()
    for _, _, state, _ in _ends():
        assert f"`{state}`" in page


def _counted() -> RunCompleteness:
    return RunCompleteness(status="incomplete", selected=2, final=1)


def test_events_move_the_run_as_the_table_says() -> None:
    from adapters.store.recorder import RecorderClose

    cancelled = threading.Event()
    life = RunLife("r", cancelled, _counted, lambda: False)
    life.finished(RunCompleteness(status="completed", selected=1, final=1), None)
    assert (life.status, life.stopped_by) == ("completed", None)

    life = RunLife("r", cancelled, _counted, lambda: False)
    life.finished(_counted(), RecorderClose(outage="disk full"))
    assert (life.status, life.store_failure) == ("store_failed", "disk full")

    life = RunLife("r", cancelled, _counted, lambda: False)
    life.stopped(KeyboardInterrupt())
    life.stopped(TerminationSignal(signal=15))  # a second stop is the same stop
    assert (life.status, life.stopped_by, life.completeness.status) == ("interrupted", "ctrl-c", "incomplete")

    cancelled.set()
    life = RunLife("r", cancelled, _counted, lambda: False)
    life.finished(_counted(), None)
    assert (life.status, life.stopped_by) == ("cancelled", "prefect")
    life = RunLife("r", cancelled, _counted, lambda: False)
    assert life.failed_while_cancelled(RuntimeError("torn down mid-stop")) and life.status == "cancelled"
