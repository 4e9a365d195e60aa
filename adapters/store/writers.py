"""Who may add results to a run: its current controller, and the shards that controller issued a
ticket to. Nobody else, and nobody at all once the run is completed.

A shard's flow-run parameters, signature included, are readable by anyone who reaches the Prefect
API, and a new flow run with exactly those parameters passes the signature check
(flows/shard_signing.py). So the signature alone cannot stop a replay: each shard also carries a
**ticket**, a random value the controller records in the run's store before it starts the shard
(`issue`), valid until the shard must have started. The shard spends it before anything runs
(`spend`: one flow run, once); a ticket that is unknown, spent, expired, or issued by a
controller that no longer runs the run is refused. Every result a shard writes into the run's
store (the team store) is checked against its spent ticket (`check_writer`), so even a shard
that got past the start cannot add results to a run that has ended or changed hands.

The store keeps only each ticket's SHA-256 (`ticket_digest`): a reader of the store learns
nothing it could present.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from adapters.store.errors import StoreError
from adapters.store.lease import Controller

TICKETS_DDL = """
    CREATE TABLE IF NOT EXISTS shard_tickets (
        ticket_hash VARCHAR PRIMARY KEY,
        run_id VARCHAR NOT NULL,
        shard INTEGER NOT NULL,
        controller VARCHAR NOT NULL,
        issued_at TIMESTAMP NOT NULL,
        expires_at TIMESTAMP NOT NULL,
        spent_at TIMESTAMP,
        flow_run_id VARCHAR
    )
"""


class ResultRefused(StoreError):
    """A result (or a run's status) offered by someone who may not write that run now: not its
    current controller nor one of its shards, or the run is completed. Not an outage: retrying
    cannot help."""


class TicketRefused(StoreError):
    """A shard's ticket is unknown, spent, expired, or from a controller that no longer runs its
    run: the shard must not run."""


@dataclass(frozen=True)
class ShardTicket:
    """A shard flow run writing its run's results with the ticket it spent."""

    run_id: str
    ticket: str
    flow_run_id: str


@dataclass(frozen=True)
class IssuedTicket:
    """One ticket as its controller issues it: for which shard, and until when it may be spent."""

    ticket: str
    shard: int
    expires_at: dt.datetime  # naive UTC, like every timestamp in the store


Writer = Controller | ShardTicket | None


def new_ticket() -> str:
    """A fresh random ticket (128 bits)."""
    return secrets.token_hex(16)


def ticket_digest(ticket: str) -> str:
    """What the store keeps of a ticket: its SHA-256, hex."""
    return hashlib.sha256(ticket.encode()).hexdigest()


def issue(conn: Any, run_id: str, controller: Controller, tickets: list[IssuedTicket], now: dt.datetime) -> None:
    """Record `tickets` for `run_id`'s shards, issued by `controller`, which must be the run's
    controller now (`ResultRefused` otherwise)."""
    owner = _run_row(conn, run_id)[1]
    if owner != str(controller):
        raise ResultRefused(f"run {run_id!r} is not run by this controller ({controller.describe()}); "
                            "it cannot start shards of it")
    for t in tickets:
        conn.execute(
            "INSERT INTO shard_tickets (ticket_hash, run_id, shard, controller, issued_at, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [ticket_digest(t.ticket), run_id, t.shard, str(controller), now, t.expires_at],
        )


def spend(conn: Any, writer: ShardTicket, now: dt.datetime, *, lock: str = "") -> None:
    """Spend `writer.ticket` for flow run `writer.flow_run_id`: `TicketRefused` saying why when
    it is unknown, spent already, expired, or its run is no longer running under the controller
    that issued it. `lock` (" FOR UPDATE" on PostgreSQL) keeps two shard runs from spending one
    ticket at once."""
    row = conn.execute(
        f"SELECT run_id, controller, expires_at, spent_at, flow_run_id FROM shard_tickets WHERE ticket_hash = ?{lock}",
        [ticket_digest(writer.ticket)],
    ).fetchone()
    if row is None or row[0] != writer.run_id:
        raise TicketRefused(f"this shard's ticket was never issued for run {writer.run_id!r}: refused "
                            "(shards are started by their controller, `arena run --shards N`)")
    _, issuer, expires_at, spent_at, spent_by = row
    if spent_at is not None:
        raise TicketRefused(f"this shard's ticket was spent at {spent_at:%Y-%m-%d %H:%M:%S} UTC by flow run {spent_by}: "
                            "a shard runs once; a replay of its parameters is refused")
    if now > expires_at:
        raise TicketRefused(f"this shard's ticket expired at {expires_at:%Y-%m-%d %H:%M:%S} UTC (a shard must start "
                            "within the run's shard start timeout): refused")
    status, owner = _run_row(conn, writer.run_id)
    if status != "running" or owner != issuer:
        raise TicketRefused(f"run {writer.run_id!r} is {status} and its ticket's controller no longer runs it: refused")
    conn.execute("UPDATE shard_tickets SET spent_at = ?, flow_run_id = ? WHERE ticket_hash = ?",
                  [now, writer.flow_run_id, ticket_digest(writer.ticket)])


def revoke(conn: Any, run_id: str, now: dt.datetime) -> None:
    """Let no ticket of `run_id` that is still unspent be spent from now on (its controller
    has stopped: a shard started later would run for nobody)."""
    conn.execute("UPDATE shard_tickets SET expires_at = ? WHERE run_id = ? AND spent_at IS NULL AND expires_at > ?",
                 [now, run_id, now])


def check_writer(conn: Any, run_id: str, writer: Writer, where: str) -> None:
    """Refuse (`ResultRefused`) a write into `run_id` by `writer` unless it may write the run
    now (see the module docstring); `StoreError` when the run is unknown.

    A run without a controller (recorded by older versions, a shard's own file, a script) takes
    results from anyone but a completed run; its lease-less writers have nothing to check."""
    status, owner = _run_row(conn, run_id, where)
    if status == "completed":
        raise ResultRefused(f"{where}: run {run_id!r} is completed; it takes no more results "
                            f"(resume it, `arena run --run-id {run_id}`, to add some)")
    if owner is None:
        return
    if isinstance(writer, Controller):
        check_controller(conn, run_id, writer, where)
        return
    if isinstance(writer, ShardTicket) and writer.run_id == run_id and status == "running":
        valid = conn.execute(
            "SELECT 1 FROM shard_tickets WHERE ticket_hash = ? AND run_id = ? AND flow_run_id = ? AND controller = ? "
            "AND spent_at IS NOT NULL",
            [ticket_digest(writer.ticket), run_id, writer.flow_run_id, owner],
        ).fetchone()
        if valid is not None:
            return
    raise ResultRefused(f"{where}: run {run_id!r} takes results only from its controller ({_who(owner)}) and the "
                        f"shards it started; {'this shard' if isinstance(writer, ShardTicket) else 'this writer'} "
                        f"is neither (the run is {status})")


def check_controller(conn: Any, run_id: str, controller: Controller, where: str) -> None:
    """Refuse (`ResultRefused`) a write into `run_id` by `controller` when another controller
    has taken the run over (this one was presumed dead and lost its lease)."""
    owner = _run_row(conn, run_id, where)[1]
    if owner is not None and owner != str(controller):
        raise ResultRefused(f"{where}: run {run_id!r} is now run by another controller ({_who(owner)}); "
                            f"this one ({controller.describe()}) lost its lease and may not write it")


def _run_row(conn: Any, run_id: str, where: str = "the store") -> tuple[str | None, str | None]:
    row = conn.execute("SELECT status, controller FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        raise StoreError(f"{where}: unknown run {run_id!r}; call start_run first")
    return row[0], row[1]


def _who(owner: str) -> str:
    controller = Controller.parse(owner)
    return controller.describe() if controller is not None else owner
