"""Shard parameters signed by their controller: a worker runs only the shards its controller sent.

Anyone who reaches the Prefect API can start a flow run of the `evaluate-shard` deployment with
any parameters (any suite, store, agent endpoint, the name of any secret's variable). So the
controller signs each shard's parameters with HMAC-SHA256 under a secret the operator sets on
the controller and on every worker host (ARENA_SHARD_SECRET), and the shard refuses parameters
without a valid signature before it starts anything.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
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
