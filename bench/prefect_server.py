"""The Prefect server a benchmark's (or test's) in-process runs talk to: the local server's app
with its settings (flows.local_server.serving_app), the server `arena run` uses."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def server_for_this_process(home: Path, log: Path) -> Iterator[str]:
    """The local server's app on a free port (Prefect home `home`, output in `log`), made this
    process's Prefect API for the block; yields its URL. Also the process-wide settings, as
    Prefect's own test harness does (with its private helper): threads started without this
    context would otherwise start a temporary server of their own. Before the server stops, the
    runs' background bookkeeping, logs and events end, or they would retry against nothing and
    hold the process's exit."""
    from prefect.context import _temporary_global_settings_context, get_settings_context
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.bookkeeping import RETRY_SECONDS, wait_for_background
    from flows.local_server import serving_app

    with serving_app(home, log) as api_url:
        with temporary_settings({PREFECT_API_URL: api_url}), _temporary_global_settings_context(get_settings_context()):
            try:
                yield api_url
            finally:
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
