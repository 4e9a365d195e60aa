"""Bookkeeping calls (flows/bookkeeping.py): retried, never fatal, and off the run's path when
nobody waits for them."""

from __future__ import annotations

import time

from flows.bookkeeping import best_effort, in_background


def test_best_effort_retries_then_gives_up_without_raising() -> None:
    calls: list[float] = []

    def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 2:
            raise ConnectionError("server restarting")
        return "done"

    assert best_effort("flaky", flaky, retry_for=5) == "done" and len(calls) == 2
    assert best_effort("never", lambda: 1 / 0, retry_for=0.5) is None


def test_background_bookkeeping_runs_in_the_callers_prefect_context_and_is_waited_for_at_exit() -> None:
    """The thread sees the caller's Prefect settings (the run's API URL: without it Prefect
    would start a temporary server of its own), and is not a daemon, so the process finishes
    it before exiting."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    seen: list[str | None] = []
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        thread = in_background("reading the API URL", lambda: seen.append(PREFECT_API_URL.value()))
    thread.join(10)
    assert seen == ["http://127.0.0.1:9/api"] and not thread.daemon


def test_background_bookkeeping_outlives_the_runs_api_client(prefect_server: None) -> None:
    """Started inside a flow run and still working after the run has ended (and closed its API
    client), a background call gets a client of its own: its first try succeeds, where the
    run's closed client would fail every try until the call gave up."""
    import threading

    from prefect import flow, get_client

    flow_ended = threading.Event()
    tries: list[str] = []

    def read_after_the_flow() -> None:
        flow_ended.wait(10)
        tries.append("try")
        with get_client(sync_client=True) as client:
            client.api_healthcheck()

    @flow
    def with_bookkeeping() -> threading.Thread:
        with get_client(sync_client=True) as client:  # the run's client, as Prefect's own calls use it
            client.hello()
        return in_background("reading after the flow", read_after_the_flow, retry_for=5)

    thread = with_bookkeeping()
    flow_ended.set()
    thread.join(20)
    assert tries == ["try"]
