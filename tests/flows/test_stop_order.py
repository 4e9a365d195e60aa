"""A stopped run says so: in the store before its pool is torn down, and in Prefect also when it
was stopped as it started.

A Prefect runner or worker SIGKILLs a cancelled flow run's process 30 s after its SIGTERM, and a
cloud pool's teardown can take longer than that (Azure deletes a VM in minutes). A status stored
only after the teardown was then never stored: the run read `running`, later `abandoned`,
though someone had cancelled it (seen once under load in the served-run cancellation test).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from prefect.exceptions import TerminationSignal

from adapters.store.duckdb_store import ResultStore
from adapters.vms.local import LocalSimulationProvider
from adapters.vms.registry import PROVIDERS, ProviderSettings


@pytest.mark.parametrize("stop", [TerminationSignal(signal=15), KeyboardInterrupt()], ids=["sigterm", "ctrl-c"])
def test_a_stop_is_told_before_the_teardown_and_still_raised(stop: BaseException) -> None:
    from flows.pool_engine import _stop_told_first

    events: list[str] = []
    with pytest.raises(type(stop)):
        try:
            with _stop_told_first(threading.Event(), lambda seen: events.append(f"told {type(seen).__name__}")):
                raise stop
        finally:
            events.append("teardown")
    assert events == [f"told {type(stop).__name__}", "teardown"]


def test_a_run_that_ends_by_itself_or_by_its_own_error_tells_nothing_a_cancelled_one_tells() -> None:
    from flows.pool_engine import _stop_told_first

    told: list[object] = []
    cancelled = threading.Event()
    with _stop_told_first(cancelled, told.append):
        pass
    with pytest.raises(ValueError), _stop_told_first(cancelled, told.append):
        raise ValueError("an error is the run's own, not a stop")
    assert told == []
    cancelled.set()  # a cancellation from Prefect stops the lanes without an exception
    with _stop_told_first(cancelled, told.append):
        pass
    assert told == [None]


def test_a_cancelled_runs_status_is_stored_before_its_provider_is_closed(prefect_server: None, tmp_path: Path) -> None:
    """Cancel (the UI's Cancel) an in-process run once an attempt is recorded: when the pool is
    torn down and the provider closed, the store already says `cancelled`."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    db, artifacts, run_id = tmp_path / "arena.duckdb", tmp_path / "art", "stop-order"
    at_close: list[str | None] = []

    class StatusAtClose(LocalSimulationProvider):
        """The simulation, reading the run's stored status as the teardown's last step runs."""

        def close(self) -> None:
            with ResultStore(db, read_only=True) as store:
                run = store.get_run(run_id)
            at_close.append(run.status if run is not None else None)
            super().close()

    def build(settings: ProviderSettings) -> LocalSimulationProvider:
        return StatusAtClose(quirks=settings.quirks)

    flow_run_ids: list[str] = []

    def cancel_after_an_attempt() -> None:
        progress = artifacts / run_id / "progress.json"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if json.loads(progress.read_text()).get("attempts_recorded", 0) >= 1 and flow_run_ids:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run_ids[0], Cancelling(message="cancelled by the test"), force=True)

    PROVIDERS.add("local-status-at-close", build)
    canceller = threading.Thread(target=cancel_after_an_attempt, daemon=True)
    try:
        canceller.start()
        outcome = run_suite(
            SuiteRunConfig(agent="scripted", provider="local-status-at-close", pool_size=1,
                           hedging="off", db_path=db, artifacts_dir=artifacts, run_id=run_id),
            announce=lambda url: flow_run_ids.append(url.rstrip("/").rsplit("/", 1)[-1]),
        )
    finally:
        del PROVIDERS["local-status-at-close"]
        canceller.join(timeout=5)
    assert (outcome.status, outcome.stopped_by) == ("cancelled", "prefect"), outcome.table
    # The pool's teardown closes it, and the evaluation's end again (closing is safe to repeat):
    # each time the store already says `cancelled`.
    assert at_close and set(at_close) == {"cancelled"}, at_close
    with ResultStore(db, read_only=True) as store:
        assert store.get_run(run_id).status == "cancelled"


@pytest.mark.parametrize("where", ["announced", "set-up"])
def test_a_ctrl_c_as_the_run_starts_leaves_its_flow_run_cancelled(where: str, prefect_server: None,
                                                                  tmp_path: Path) -> None:
    """A Ctrl-C while `arena run` announces its flow run (Prefect had it Scheduled, and nothing
    would ever run it) or during the run's set-up, before the flow's own stop handling (Prefect's
    engine marks any interrupt Crashed): the flow run ends Cancelled, as a later Ctrl-C's does."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType

    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    flow_run_ids: list[str] = []

    def announce(url: str) -> None:
        flow_run_ids.append(url.rstrip("/").rsplit("/", 1)[-1])
        if where == "announced":
            raise KeyboardInterrupt

    def build(settings: ProviderSettings) -> LocalSimulationProvider:
        raise KeyboardInterrupt  # as the run builds its provider, inside the flow

    PROVIDERS.add("local-interrupted", build)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_suite(SuiteRunConfig(agent="scripted", provider="local-interrupted", db_path=tmp_path / "arena.duckdb",
                                     artifacts_dir=tmp_path / "art", run_id=f"stop-{where}"), announce=announce)
    finally:
        del PROVIDERS["local-interrupted"]
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_ids[0]).state
    had = "Scheduled" if where == "announced" else "Crashed"
    assert state.type == StateType.CANCELLED, state
    assert state.message == f"Interrupted (Ctrl-C) while the run was starting (Prefect had it {had})", state


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), TerminationSignal(signal=15)], ids=["ctrl-c", "sigterm"])
def test_the_terminal_leaves_out_prefects_crash_lines_for_a_stop(stop: BaseException) -> None:
    """Prefect's engine logs "Crash detected! <its crashed state's message>" for a stop that
    lands in a flow's or task's run; `arena run`'s terminal leaves those lines out (the run ends
    Cancelled and says so in its own line), and nothing else. The messages are Prefect's own."""
    import logging

    from prefect._internal.states import exception_to_crashed_state_sync

    from flows.terminal import _WithoutInterruptCrashes

    crashed = exception_to_crashed_state_sync(stop)

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, message, None, None)

    quiet = _WithoutInterruptCrashes()
    assert not quiet.filter(record(f"Crash detected! {crashed.message}"))
    assert not quiet.filter(record(f"Finished in state Crashed({crashed.message!r})"))
    assert quiet.filter(record("Crash detected! Execution was cancelled by the runtime environment."))
    assert quiet.filter(record("the store refused 2 result(s); the run counts those tasks as missing"))


@pytest.mark.scenario
def test_the_terminal_leaves_task_state_logs_to_the_ui_unless_verbose(tmp_path: Path) -> None:
    """An agent that misses a task printed two ERROR lines for it ("Finished in state Agent
    failure(...)", for its attempt and its task): Prefect's task-state logs, which the terminal
    leaves to the UI (docs/output.md). A real `arena run` of an agent that fails every task."""
    import subprocess
    import sys

    from prefect_home import seeded_run_env

    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--agent", "random", "--seed", "0", "--task", "notepad-append-line",
         "--task", "settings-notifications-off", "--db", str(tmp_path / "arena.duckdb"), "--artifacts",
         str(tmp_path / "art")],
        cwd=Path(__file__).resolve().parents[2], env=seeded_run_env(tmp_path / "prefect"), capture_output=True,
        text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "outcomes: agent_failure=2" in done.stdout
    assert "Finished in state" not in done.stderr and "ERROR" not in done.stderr, done.stderr[-3000:]
