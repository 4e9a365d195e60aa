"""Where results are stored: a DuckDB file's path or the team store's PostgreSQL URL.

Kept apart from `adapters/store/` (whose package imports DuckDB) and free of every driver, so a
command line can read and check a `--db` value before anything heavy is loaded.
"""

from __future__ import annotations

import os
import urllib.parse

from adapters.secrets import refuse_url_secret

STORE_URL_ENV = "ARENA_STORE_URL"
"""The team store every command uses by default when set (a PostgreSQL URL; README "Team store")."""

SCHEMES = ("postgresql://", "postgres://")


def default_store_url() -> str | None:
    """$ARENA_STORE_URL, or None (the DuckDB file `db_path`)."""
    return os.environ.get(STORE_URL_ENV) or None


def is_server_location(location: object) -> bool:
    """True when `location` names a PostgreSQL database (a postgresql:// URL) rather than a file."""
    return isinstance(location, str) and location.startswith(SCHEMES)


def check_store_url(value: str) -> str:
    """`value` if it is a PostgreSQL URL without a password; ValueError naming what is wrong.

    A run's configuration is a flow parameter (visible in the Prefect UI) and is stored with the
    run, so the password comes from libpq's own chain instead: PGPASSWORD or ~/.pgpass.
    """
    if not is_server_location(value):
        raise ValueError(f"store URL {value!r}: expected postgresql://USER@HOST[:PORT]/DATABASE")
    refuse_url_secret(value, "the store URL", "leave it out (postgresql://USER@HOST/DATABASE) and set PGPASSWORD "
                      "or ~/.pgpass")
    parts = urllib.parse.urlsplit(value)
    if not parts.hostname or not parts.path.strip("/"):
        raise ValueError(f"store URL {value!r}: expected postgresql://USER@HOST[:PORT]/DATABASE")
    return value
