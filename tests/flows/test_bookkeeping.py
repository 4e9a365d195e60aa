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


def test_a_busy_server_is_retried_on_bookkeepings_schedule_not_the_clients_back_off() -> None:
    """A Prefect server on SQLite answers 503 while its database is busy. Prefect's client would
    try such a call six times over about two minutes (2, 4, ... 64 s apart); for a bookkeeping call
    the retries are best_effort's own (1 s, then doubling up to 10 s, within `retry_for`), so a
    call given half a second is tried once, and gives up without raising."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    seen: list[str] = []

    class Busy(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
            pass

        def busy(self) -> None:
            seen.append(f"{self.command} {self.path}")
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_DELETE = busy

    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        def delete_limit() -> None:
            with get_client(sync_client=True) as client:
                client.delete_global_concurrency_limit_by_name("waa-pool-busy")

        with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{server.server_address[1]}/api"}):
            assert best_effort("removing a limit", delete_limit, retry_for=0.5) is None
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    # One request (the client's first, for a CSRF token), not the client's six over two minutes.
    assert len(seen) == 1, seen
