"""The Prefect server a benchmark's (or test's) in-process runs talk to: the local server's app
with its settings (flows.local_server.serving_app), the server `arena run` uses."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def server_for_this_process(home: Path, log: Path, settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """The local server's app on a free port (Prefect home `home`, output in `log`, further Prefect
    `settings` if given), made this process's Prefect API for the block (`api_for_this_block`);
    yields its URL. Also the process-wide settings, as Prefect's own test harness does (with its
    private helper): threads started without this context would otherwise start a temporary
    server of their own."""
    from prefect.context import _temporary_global_settings_context, get_settings_context

    from flows.local_server import serving_app

    with serving_app(home, log, settings) as api_url, api_for_this_block(api_url):
        with _temporary_global_settings_context(get_settings_context()):
            yield api_url


@contextmanager
def api_for_this_block(api_url: str) -> Iterator[str]:
    """`api_url` as this process's Prefect API for the block, for in-process runs on a server
    other than the process's own (another test server, a proxy in front of it); yields it. The
    process's background work ends before the block and at its end (`end_background_work`), so
    the block's events go to `api_url` and later ones do not."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    end_background_work()
    with temporary_settings({PREFECT_API_URL: api_url}):
        try:
            yield api_url
        finally:
            end_background_work()


def end_background_work() -> None:
    """End this process's Prefect background work: the runs' bookkeeping calls
    (flows/bookkeeping.py), then Prefect's log and event workers, each sending what it holds.

    Prefect's event worker keeps the server it first sent to for as long as it runs, whatever
    API later runs in the process use. Left running after a block on another server, it sends
    every later run's events there: their task runs are never recorded on their own server, and
    once that server stops, the process's exit waits for events retried against nothing. Ended,
    the workers start again with the next log or event, against the API current then."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    from flows.bookkeeping import RETRY_SECONDS, wait_for_background

    wait_for_background(RETRY_SECONDS)
    APILogWorker.drain_all(timeout=10)
    EventsWorker.drain_all(timeout=10)


@contextmanager
def prefect_test_server() -> Iterator[str]:
    """`server_for_this_process` on a new Prefect home (its database migrated at start) that
    is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="arena-bench-prefect-") as folder:
        with server_for_this_process(Path(folder) / "home", Path(folder) / "server.log") as api_url:
            yield api_url
