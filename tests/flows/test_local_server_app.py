"""The local Prefect server's app retries, inside the server, a request that met a busy SQLite
database (flows/local_server_app.py).

A real SQLite file that a second connection keeps locked, written through SQLAlchemy as
Prefect's server writes it, behind Prefect's own exception handler (which turns the lock into
its 503), mounted under /api as Prefect mounts its API; served by uvicorn on 127.0.0.1 and
called over HTTP.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa
import uvicorn
from fastapi import FastAPI, Request

from flows import local_server_app
from flows.local_server_app import RetryWhileBusy


class Rows:
    """A table written by the app, and how many times each route's handler ran."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # No busy timeout: a locked database fails at once, as a busy snapshot does in Prefect's server.
        self.engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
        with self.engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE rows (body TEXT)"))
        self.calls: dict[str, int] = {}

    def count(self, route: str) -> None:
        self.calls[route] = self.calls.get(route, 0) + 1

    def bodies(self) -> list[str]:
        with self.engine.connect() as conn:
            return [row[0] for row in conn.execute(sa.text("SELECT body FROM rows"))]

    def lock(self) -> sqlite3.Connection:
        """Another connection holding the file's write lock until it commits."""
        holder = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN EXCLUSIVE")
        return holder


def _app(rows: Rows) -> FastAPI:
    # Prefect's server modules, imported when a test runs rather than at collection (tests/installed.py).
    from prefect.server.api.server import custom_internal_exception_handler

    api = FastAPI(exception_handlers={Exception: custom_internal_exception_handler})

    @api.post("/rows")
    async def add(request: Request) -> dict[str, str]:
        rows.count("rows")
        body = (await request.body()).decode()
        with rows.engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO rows VALUES (:body)"), {"body": body})
        return {"stored": body}

    @api.get("/broken")
    async def broken() -> None:
        rows.count("broken")
        raise ValueError("not a database error")

    app = FastAPI()
    app.mount("/api", api)
    return app


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Rows, RetryWhileBusy]]:
    rows = Rows(tmp_path / "prefect.db")
    app = RetryWhileBusy(_app(rows), retry_seconds=2.0)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/api", rows, app
    finally:
        server.should_exit = True
        thread.join(10)


def _commit_once(holder: sqlite3.Connection, ready: Callable[[], bool], timeout: float = 10.0) -> None:
    """Let the lock go once `ready()` (or after `timeout`, so a failing test does not hang)."""
    deadline = time.monotonic() + timeout
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.005)
    holder.commit()


def test_a_request_that_meets_a_locked_database_is_answered_once_the_lock_is_gone(served) -> None:
    url, rows, _ = served
    holder = rows.lock()
    # The lock goes once the request met it and was run again (not after a fixed time, which a
    # loaded machine's request could arrive after).
    threading.Thread(target=_commit_once, args=(holder, lambda: rows.calls.get("rows", 0) >= 2), daemon=True).start()
    response = requests.post(f"{url}/rows", data="the same body each time", timeout=10)
    assert response.status_code == 200, response.text
    assert response.json() == {"stored": "the same body each time"}
    assert rows.bodies() == ["the same body each time"]  # stored once, with the body as sent
    assert rows.calls["rows"] > 1  # it met the lock and was run again, inside the server


def test_a_database_locked_for_longer_than_the_retry_window_answers_prefects_503(served) -> None:
    url, rows, app = served
    app.retry_seconds = 0.3
    holder = rows.lock()
    try:
        # The lock outlasts the request: an answer at all (not requests' 10 s timeout) is the
        # server giving up once its window is over.
        response = requests.post(f"{url}/rows", data="x", timeout=10)
    finally:
        holder.commit()
    assert response.status_code == 503
    assert response.json() == {"exception_message": "Service Unavailable"}
    assert rows.calls["rows"] > 2
    assert rows.bodies() == []


def test_other_answers_and_errors_pass_through_untouched(served) -> None:
    url, rows, _ = served
    response = requests.get(f"{url}/broken", timeout=10)
    assert response.status_code == 500
    assert rows.calls["broken"] == 1  # an error that is not a busy database is not retried
    assert requests.get(f"{url}/nowhere", timeout=10).status_code == 404
    assert requests.post(f"{url}/rows", data="y", timeout=10).json() == {"stored": "y"}
    assert rows.calls["rows"] == 1


def test_the_apps_database_connections_give_up_on_a_lock_after_five_seconds(tmp_path: Path) -> None:
    """Prefect sets SQLite's busy timeout to 60 s; the local server's app sets 5 s, so a request
    stuck behind another connection's lock fails (a 503, retried) instead of holding a run for a
    minute. Read back from a connection of Prefect's own database interface."""
    import asyncio

    from prefect.server.database import provide_database_interface
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings

    from flows.local_server_app import BUSY_TIMEOUT_MS, create_app

    async def busy_timeout() -> int:
        db = provide_database_interface()
        async with db.session_context() as session:
            return int((await session.execute(sa.text("PRAGMA busy_timeout"))).scalar())

    url = f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}"
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: url}):
        try:
            create_app()
            assert asyncio.run(busy_timeout()) == BUSY_TIMEOUT_MS == 5000
        finally:  # the listener is process-wide; other tests' engines keep Prefect's own
            sa.event.remove(sa.pool.Pool, "checkout", local_server_app._shorter_busy_timeout)
