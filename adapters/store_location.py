"""Where results are stored: a DuckDB file's path or the team store's PostgreSQL URL.

Kept apart from `adapters/store/` (whose package imports DuckDB) and free of every driver, so a
command line can read and check a `--db` value before anything heavy is loaded.

A store location is never shown as it was given: it may hold a password anywhere (the user part,
a query parameter, the path, a libpq ``key=value`` connection string), and what reaches the
server (the database name) ends up in its log. So a location is checked before anything
connects, and shown only through `redact_location`, which hides what it cannot read.
"""

from __future__ import annotations

import os
import re
import urllib.parse

from adapters.secrets import is_secret_key, redact_url, refuse_url_secret

STORE_URL_ENV = "ARENA_STORE_URL"
"""The team store every command uses by default when set (a PostgreSQL URL; README "Team store")."""

SCHEMES = ("postgresql://", "postgres://")

HIDDEN = "(unparseable location, hidden)"
"""What is shown instead of a store location that cannot be read: it may hold a secret anywhere."""

_EXPECTED = "expected postgresql://USER@HOST[:PORT]/DATABASE"
_CONNINFO_FIX = ("is a libpq connection string (key=value); give a URL instead, "
                 "postgresql://USER@HOST[:PORT]/DATABASE, with the password in PGPASSWORD or ~/.pgpass")

# libpq's connection keywords (PostgreSQL 17's list): a location starting with one of them and
# '=' is a libpq connection string, not a file name.
_LIBPQ_KEYWORDS = frozenset({
    "host", "hostaddr", "port", "dbname", "user", "password", "passfile", "require_auth",
    "channel_binding", "connect_timeout", "client_encoding", "options", "application_name",
    "fallback_application_name", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout", "replication", "gssencmode", "sslmode", "sslnegotiation",
    "sslcompression", "sslcert", "sslkey", "sslpassword", "sslcertmode", "sslrootcert", "sslcrl",
    "sslcrldir", "sslsni", "requirepeer", "ssl_min_protocol_version", "ssl_max_protocol_version",
    "krbsrvname", "gsslib", "gssdelegation", "service", "target_session_attrs", "load_balance_hosts",
})
_CONNINFO_START = re.compile(r"\s*([A-Za-z_]+)\s*=")
_CONNINFO_KEY = re.compile(r"([A-Za-z_]+)\s*=\s*")
# A database name as a URL's path: what PostgreSQL names databases with in practice. Anything
# else (spaces, '=', ':') is refused: it reaches the server, whose log shows it.
_DATABASE_NAME = re.compile(r"[\w.$-]{1,63}")


def default_store_url() -> str | None:
    """$ARENA_STORE_URL, or None (the DuckDB file `db_path`)."""
    return os.environ.get(STORE_URL_ENV) or None


def is_conninfo(location: object) -> bool:
    """True when `location` is a libpq connection string (``host=db dbname=arena ...``)."""
    if not isinstance(location, str):
        return False
    match = _CONNINFO_START.match(location)
    return match is not None and match.group(1).lower() in _LIBPQ_KEYWORDS


def is_server_location(location: object) -> bool:
    """True when `location` names a PostgreSQL database (a postgresql:// URL, or a libpq
    connection string, which `check_store_url` refuses) rather than a file."""
    return isinstance(location, str) and (location.startswith(SCHEMES) or is_conninfo(location))


def conninfo_pairs(text: str) -> list[tuple[str, str]]:
    """The ``key=value`` pairs of a libpq connection string (values unquoted as libpq reads
    them: single quotes, backslash escapes); ValueError when it cannot be read (the message
    never holds the text)."""
    pairs: list[tuple[str, str]] = []
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return pairs
        match = _CONNINFO_KEY.match(text, position)
        if match is None:
            raise ValueError("not a key=value connection string")
        position, value = match.end(), []
        quoted = position < len(text) and text[position] == "'"
        position += quoted
        while position < len(text):
            char = text[position]
            if char == "\\" and position + 1 < len(text):
                value.append(text[position + 1])
                position += 2
                continue
            if (quoted and char == "'") or (not quoted and char.isspace()):
                break
            value.append(char)
            position += 1
        if quoted:
            if position >= len(text):
                raise ValueError("unterminated quoted value")
            position += 1
        pairs.append((match.group(1), "".join(value)))


def _conninfo_secret(pairs: list[tuple[str, str]]) -> bool:
    return any(is_secret_key(key) or "password" in key.lower() or "password" in value.lower() for key, value in pairs)


def redact_location(location: str) -> str:
    """`location` as messages may show it: a DuckDB path as it is; a PostgreSQL URL without its
    password or secret parameters; a libpq connection string with its secret values as ***;
    `HIDDEN` when it cannot be read."""
    if not is_server_location(location):
        return location
    if location.startswith(SCHEMES):
        shown = redact_url(location, unparseable=HIDDEN)
        if shown != HIDDEN and _database(location) and not _DATABASE_NAME.fullmatch(_database(location)):
            # not a database name: perhaps a password typed into the path
            shown = urllib.parse.urlunsplit(urllib.parse.urlsplit(shown)._replace(path="/***"))
        return shown
    try:
        pairs = conninfo_pairs(location)
    except ValueError:
        return HIDDEN
    return " ".join(f"{key}={'***' if _conninfo_secret([(key, value)]) else _conninfo_value(value)}"
                    for key, value in pairs)


def _conninfo_value(value: str) -> str:
    if value and not re.search(r"[\s'\\]", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _database(url: str) -> str:
    """The database a PostgreSQL URL names (its path, decoded), "" for none."""
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path[1:])


def location_problem(value: str) -> str | None:
    """What makes `value` unusable as the team store's URL, in words that never repeat it (the
    password is not judged here: `check_store_url` refuses it), or None."""
    if is_conninfo(value):
        return _CONNINFO_FIX
    if not value.startswith(SCHEMES):
        return _EXPECTED
    shown = redact_url(value, unparseable=HIDDEN)
    if shown == HIDDEN:
        return f"its host or port cannot be read; {_EXPECTED}"
    database = _database(value)
    if not urllib.parse.urlsplit(value).hostname or not database:
        return _EXPECTED
    if not _DATABASE_NAME.fullmatch(database):
        return ("its database name may hold only letters, digits, '_', '.', '$' and '-' (at most 63); "
                f"{_EXPECTED}")
    return None


def check_store_url(value: str) -> str:
    """`value` if it is a PostgreSQL URL without a password; ValueError naming what is wrong,
    showing the location only redacted.

    A run's configuration is a flow parameter (visible in the Prefect UI) and is stored with the
    run, so the password comes from libpq's own chain instead: PGPASSWORD or ~/.pgpass.
    """
    if is_conninfo(value):
        try:
            secret = _conninfo_secret(conninfo_pairs(value))
        except ValueError:
            secret = False
        carries = " (and it carries a password)" if secret else ""
        raise ValueError(f"the store location {redact_location(value)}{carries} {_CONNINFO_FIX}")
    if not is_server_location(value):
        raise ValueError(f"store URL {redact_url(value, unparseable=HIDDEN)!r}: {_EXPECTED}")
    refuse_url_secret(value, f"the store URL {redact_location(value)}", "leave it out "
                      "(postgresql://USER@HOST/DATABASE) and set PGPASSWORD or ~/.pgpass")
    problem = location_problem(value)
    if problem is not None:
        raise ValueError(f"store URL {redact_location(value)}: {problem}")
    return value
