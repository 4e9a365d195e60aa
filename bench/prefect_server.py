"""A Prefect test server for a benchmark's in-process runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def prefect_test_server() -> Iterator[None]:
    """Prefect's test harness (a temporary server and database) for the block. Before it stops,
    the runs' background bookkeeping (removing a run's concurrency limit, which a busy server can
    take seconds to answer) is waited for: otherwise it would retry against the stopped server and
    hold the benchmark's exit for a minute."""
    from prefect.testing.utilities import prefect_test_harness

    from flows.bookkeeping import RETRY_SECONDS, wait_for_background

    with prefect_test_harness(server_startup_timeout=90):
        try:
            yield
        finally:
            wait_for_background(RETRY_SECONDS)
