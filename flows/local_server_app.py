"""The web app of the local Prefect server (flows/local_server.py): Prefect's own, with requests
that failed only because its SQLite database was busy retried inside the server.

Why: Prefect's server answers 503 when SQLite reports the database busy or locked, and on a
server writing a run's events that is routine. A read-then-write in a deferred transaction (the
removal of a run's concurrency limit reads the limit, then deletes it) fails at once when another
writer committed in between; SQLite's busy timeout does not apply there. Prefect's client then
waits 2 s before it tries again (4, 8, 16, 32 s after further 503s), and `arena run` ends that
much later. Tried again here a few milliseconds later, the same request succeeds; only when the
database stays busy for `RETRY_SECONDS` does the client get the 503 (and retries as before).

The request is replayed exactly (its body is read once and kept); the handler rolled its
transaction back when it failed, so a replay is what the client's own retry would send.

Its SQLite connections also wait at most `BUSY_TIMEOUT_MS` for another connection's lock, where
Prefect sets 60 s: about one warm `arena run` in thirty spent a minute at its end on a request
waiting out those 60 s (a lock held that long; its holder was not found). Given up after 5 s, the
request fails with the same 503 and is tried again.

    python -m uvicorn --factory flows.local_server_app:create_app ...
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

# How long a request keeps being retried while the database is busy, and the first pause
# (doubling up to MAX_PAUSE_SECONDS): a busy snapshot clears as soon as the other write commits.
RETRY_SECONDS = 3.0
FIRST_PAUSE_SECONDS = 0.02
MAX_PAUSE_SECONDS = 0.5
BUSY_TIMEOUT_MS = 5000
# The body of Prefect's 503 for a retryable database error (prefect/server/api/server.py).
_BUSY_BODY = {"exception_message": "Service Unavailable"}


def create_app() -> ASGIApp:
    """Prefect's server app (API and UI) behind `RetryWhileBusy`, its SQLite connections waiting
    at most `BUSY_TIMEOUT_MS` for a lock: uvicorn's factory."""
    from adapters.import_gc import paused_for_imports

    with paused_for_imports():  # Prefect's server imports and builds its app (adapters/import_gc.py)
        import sqlalchemy as sa
        from prefect.server.api.server import create_app as prefect_app

        sa.event.listen(sa.pool.Pool, "checkout", _shorter_busy_timeout)
        return RetryWhileBusy(prefect_app())


def _shorter_busy_timeout(dbapi_connection: Any, *_: Any) -> None:
    from sqlalchemy.dialects.sqlite.aiosqlite import AsyncAdapt_aiosqlite_connection

    if not isinstance(dbapi_connection, AsyncAdapt_aiosqlite_connection):
        return  # a server told to use PostgreSQL (PREFECT_API_DATABASE_CONNECTION_URL)
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    finally:
        cursor.close()


class RetryWhileBusy:
    """ASGI middleware: an HTTP request whose answer is Prefect's "database busy" 503 is run
    again after a short pause, for up to `retry_seconds`; every other answer, and every
    WebSocket and lifespan message, passes through untouched."""

    def __init__(self, app: ASGIApp, retry_seconds: float = RETRY_SECONDS) -> None:
        self.app = app
        self.retry_seconds = retry_seconds

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body, after = await _read_body(receive)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_seconds
        pause = FIRST_PAUSE_SECONDS
        while True:
            held: list[Message] = []
            failure: Exception | None = None
            try:
                # A copy of the scope each time: routing rewrites it (a mount adds its path to
                # `root_path`), and a second pass over the same one would find no route.
                await self.app(dict(scope), _replay(body, after, receive), _holding_busy(send, held))
            except Exception as exc:
                # Starlette raises the error again after its handler has answered (the 503 held
                # here), for the server to log; anything else is not ours to handle.
                if not held:
                    raise
                failure = exc
            if not held:
                return  # answered otherwise: already sent
            if not _is_busy(held) or loop.time() + pause > deadline:
                for message in held:
                    await send(message)
                if failure is not None:
                    raise failure
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_SECONDS)


async def _read_body(receive: Receive) -> tuple[bytes, Message | None]:
    """The request's whole body, and the first message after it if the client already sent one
    (a disconnect), to hand on."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _replay(body: bytes, after: Message | None, receive: Receive) -> Receive:
    """A `receive` that gives the kept body once, then what the client sends next."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return after if after is not None else await receive()

    return replayed


def _holding_busy(send: Send, held: list[Message]) -> Send:
    """A `send` that keeps a 503 answer (its start and body) in `held` and sends anything else."""

    async def sending(message: Message) -> None:
        if held or (message["type"] == "http.response.start" and message.get("status") == 503):
            held.append(message)
            return
        await send(message)

    return sending


def _is_busy(held: list[Message]) -> bool:
    """Whether the held 503 is Prefect's answer to a retryable database error."""
    body = b"".join(m.get("body", b"") for m in held if m["type"] == "http.response.body")
    try:
        return json.loads(body) == _BUSY_BODY
    except ValueError:
        return False
