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
