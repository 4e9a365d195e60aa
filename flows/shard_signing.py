"""Shard parameters signed by their controller, and spent once: a worker runs only the shards its
controller sent, each one time.

Anyone who reaches the Prefect API can start a flow run of the `evaluate-shard` deployment with
any parameters (any suite, store, agent endpoint, the name of any secret's variable). So the
controller signs each shard's parameters with HMAC-SHA256 under a secret the operator sets on
the controller and on every worker host (ARENA_SHARD_SECRET), and the shard refuses parameters
without a valid signature before it starts anything.

A signature does not stop a replay: the parameters, signature included, are readable by anyone
who reads the API, and a new flow run with exactly those parameters passes the check. So the
signed parameters also carry a **ticket** (a random value, adapters/store/writers.py) and the
time by which the shard must start; before anything runs, the shard (`check_shard_ticket`)
refuses one whose time is past, one whose own flow run was not created for that ticket (the
controller creates each shard's flow run with the ticket in its idempotency key, which Prefect
keeps unique: a second flow run with the same key cannot exist beside the first), and one spent
on this host already (a marker file per ticket). On the team store the ticket is also spent in
the run's store, which then takes the shard's results only with it; see docs/deployments.md for
what a replay can still do.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

SHARD_SECRET_ENV = "ARENA_SHARD_SECRET"


class ShardSignatureError(ValueError):
    """The shard secret is missing, or a shard's parameters do not carry its controller's
    signature; the message says which."""


def shard_secret() -> bytes:
    """The operator's shard secret ($ARENA_SHARD_SECRET), or `ShardSignatureError` saying to set it."""
    secret = os.environ.get(SHARD_SECRET_ENV, "")
    if len(secret) < 16:
        raise ShardSignatureError(
            f"shard mode needs {SHARD_SECRET_ENV}: the same secret (16 characters or more) on the controller and "
            "every worker host, so a worker runs only shards its controller started"
        )
    return secret.encode()


def sign_shard(parameters: dict[str, Any]) -> str:
    """The HMAC-SHA256 of a shard's parameters (as JSON, keys sorted) under the shard secret."""
    text = json.dumps(parameters, sort_keys=True, separators=(",", ":"), default=str)
    return hmac.new(shard_secret(), text.encode(), hashlib.sha256).hexdigest()


def check_shard_signature(parameters: dict[str, Any], signature: str | None) -> None:
    """Refuse parameters their controller did not sign (`ShardSignatureError`)."""
    if not signature or not hmac.compare_digest(sign_shard(parameters), signature):
        raise ShardSignatureError(
            "this shard's parameters are not signed by a controller holding this host's "
            f"{SHARD_SECRET_ENV}: refused (shards are started by `arena run --shards N`, not by hand)"
        )


def shard_idempotency_key(flow_run_name: str, ticket: str) -> str:
    """The idempotency key a shard's flow run is created with: its name and its ticket."""
    return f"{flow_run_name}/{ticket}"


def check_shard_ticket(ticket: str | None, expires_at: str | None, *, flow_run_name: str,
                       idempotency_key: str | None, spent_dir: Path, now: dt.datetime | None = None) -> Path:
    """Refuse (`ShardSignatureError`) a shard whose signed ticket is missing, past its start
    time, not the one its own flow run was created for, or spent on this host already; else mark
    it spent here and return the marker file. Call after `check_shard_signature`."""
    if not ticket or not expires_at:
        raise ShardSignatureError("this shard carries no ticket: refused (shards are started by `arena run --shards N`, "
                                  "whose controller issues one per shard)")
    try:
        deadline = dt.datetime.fromisoformat(expires_at)
    except ValueError:
        raise ShardSignatureError(f"this shard's ticket has an unreadable start deadline {expires_at!r}: refused") from None
    now = now or dt.datetime.now(dt.timezone.utc)
    if deadline.tzinfo is None or now > deadline:
        raise ShardSignatureError(f"this shard's ticket had to be used by {expires_at} (the run's shard start timeout); "
                                  "it is too late: refused")
    if idempotency_key != shard_idempotency_key(flow_run_name, ticket):
        raise ShardSignatureError("this flow run is not the one its controller created for this shard (another flow run "
                                  "with a copy of its parameters): refused")
    spent_dir.mkdir(parents=True, exist_ok=True)
    marker = spent_dir / hashlib.sha256(ticket.encode()).hexdigest()
    try:
        with marker.open("x") as file:  # exclusive: one flow run on this host spends it
            file.write(f"{now.isoformat()} {flow_run_name}\n")
    except FileExistsError:
        raise ShardSignatureError(f"this shard's ticket was already spent on this host ({marker.read_text().strip()}): "
                                  "a shard runs once; a replay of its parameters is refused") from None
    return marker
