"""Secrets kept out of what the product stores and shows: configuration keys that hold one, and
URLs that carry one.

A run's configuration is a Prefect flow parameter (shown in the UI), is stored with the run and
printed in reports, so secrets never travel in it: API keys come from environment variables the
configuration *names*, passwords from libpq's chain (PGPASSWORD, ~/.pgpass). `scrub_secrets`
drops secret-looking keys from what is stored; `url_secret` finds a secret inside a URL (a
password in its user part, or a query parameter such as ``?password=`` or ``?api_key=``), which
every URL the product accepts is checked with, so such a URL is refused with one line instead of
being shown and stored.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

# Whole words of a key that mark it as a secret. "token" only as the key's last word, so
# "access_token" and "hf_token" go but "max_tokens" and "token_budget" (settings we want in
# provenance) stay.
_SECRET_WORDS = frozenset(
    {"secret", "secrets", "password", "passwords", "passwd", "passphrase", "credential",
     "credentials", "authorization"}
)
_SECRET_SQUASHED = ("apikey", "accesskey", "privatekey", "secretkey", "sessionkey", "bearer")


def _key_words(key: str) -> list[str]:
    """Split snake_case, kebab-case and camelCase keys into lowercase words."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def is_secret_key(key: str) -> bool:
    """True if a config key looks like it holds a secret (API key, token, password, ...)."""
    words = _key_words(str(key))
    if not words:
        return False
    if _SECRET_WORDS.intersection(words) or words[-1] == "token":
        return True
    squashed = "".join(words)
    return any(marker in squashed for marker in _SECRET_SQUASHED)


def scrub_secrets(value: Any) -> Any:
    """A copy of `value` with every secret-looking key removed, at any depth.

    Dicts are walked recursively, including dicts inside lists and tuples; other values are
    returned unchanged. The input is never modified.
    """
    if isinstance(value, Mapping):
        return {k: scrub_secrets(v) for k, v in value.items() if not is_secret_key(str(k))}
    if isinstance(value, (list, tuple)):
        return [scrub_secrets(v) for v in value]
    return value


# Query parameter names that carry a secret in URLs besides the secret-looking keys above:
# libpq's password and sslpassword, and the short names web APIs use for keys and signatures.
_URL_SECRET_NAMES = frozenset({"key", "sig", "signature", "pass", "pwd", "auth", "code"})


def _secret_parameter(name: str) -> bool:
    lowered = name.lower()
    return is_secret_key(name) or "password" in lowered or lowered in _URL_SECRET_NAMES


def url_secret(url: str) -> str | None:
    """What secret `url` carries ("a password", "the query parameter 'password'"), or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return None  # not a URL a secret can be read from; its own checks say what is wrong
    if password is not None:
        return "a password in its user part"
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if _secret_parameter(name):
            return f"the query parameter {name!r}"
        if "password" in value.lower():  # libpq reads a connection string inside dbname=...
            return f"a password inside the query parameter {name!r}"
    return None


def refuse_url_secret(url: str, what: str, fix: str) -> str:
    """`url`, or ValueError naming `what` and the secret it carries (never the secret itself)."""
    found = url_secret(url)
    if found is not None:
        raise ValueError(f"{what} carries {found}; {fix}: a URL is shown in the Prefect UI, logs and "
                         "reports, and stored with the run")
    return url


def redact_url(url: str) -> str:
    """`url` with its password and secret query values replaced by ***, for messages."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    netloc = parts.netloc
    if password is not None:
        host = netloc.rsplit("@", 1)[1]
        netloc = f"{parts.username or ''}:***@{host}"
    query = "&".join(
        f"{name}={'***' if _secret_parameter(name) or 'password' in value.lower() else urllib.parse.quote(value, safe='/:')}"
        for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    )
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))
