"""Secrets kept out of what the product stores and shows: configuration keys that hold one, and
URLs that carry one.

A run's configuration is a Prefect flow parameter (shown in the UI), is stored with the run and
printed in reports, so secrets never travel in it: API keys come from environment variables the
configuration *names*, passwords from libpq's chain (PGPASSWORD, ~/.pgpass). `scrub_secrets`
drops secret-looking keys from what is stored; `url_secret` finds a secret inside a URL (a
password in its user part; a parameter such as ``?password=``, ``?api_key=``, ``#token=`` or
``;key=`` in the query, the fragment or a path segment; a password in the path; a host or port
that cannot be read, which may hide one), which every URL the product accepts is checked with, so
such a URL is refused with one line instead of being shown and stored. `redact_url` hides the same
parts for messages, and shows a URL it cannot read as a placeholder, never as it was given.
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


UNPARSEABLE_URL = "(unparseable URL, hidden)"
"""What `redact_url` shows instead of a URL it cannot read (it may hold a secret anywhere)."""

_UNREADABLE = ("a host or port that cannot be read (a port that is not a number, or an unmatched "
               "bracket), which may hide a secret")


def _split(url: str) -> urllib.parse.SplitResult:
    """`url` split into its parts; ValueError when its host or port cannot be read (a password
    typed where the port goes, an unmatched bracket). Every host of a libpq multi-host list
    (``h1:5432,h2:5433``) is checked."""
    parts = urllib.parse.urlsplit(url)
    _ = parts.password  # raises on a malformed user part
    for host in parts.netloc.rpartition("@")[2].split(","):
        if host.startswith("["):
            address, bracket, port = host[1:].partition("]")
            if not bracket or (port and not port.startswith(":")):
                raise ValueError("unreadable host")
            port = port[1:]
        else:
            port = host.partition(":")[2]
        if port and not port.isdigit():
            raise ValueError("unreadable port")
    return parts


def _path_parameters(path: str) -> list[tuple[str, str]]:
    """The ``;name=value`` parameters of every segment of a URL's path (RFC 3986)."""
    found = []
    for segment in path.split("/"):
        for parameter in segment.split(";")[1:]:
            name, _, value = parameter.partition("=")
            found.append((urllib.parse.unquote(name), urllib.parse.unquote(value)))
    return found


def _secret_pair(name: str, value: str) -> bool:
    # libpq reads a connection string inside dbname=..., so a password can hide in a value too.
    return _secret_parameter(name) or "password" in value.lower()


def url_secret(url: str) -> str | None:
    """What secret `url` carries ("a password in its user part", "the query parameter
    'password'", "the fragment parameter 'token'", ...), or None. A URL whose host or port cannot
    be read counts as carrying one: whatever stands there would be shown as it is."""
    try:
        parts = _split(url)
    except ValueError:
        return _UNREADABLE
    if parts.password is not None:
        return "a password in its user part"
    places = (("query", urllib.parse.parse_qsl(parts.query, keep_blank_values=True)),
              ("fragment", urllib.parse.parse_qsl(parts.fragment, keep_blank_values=True)),
              ("path", _path_parameters(parts.path)))
    for place, pairs in places:
        for name, value in pairs:
            if _secret_parameter(name):
                return f"the {place} parameter {name!r}"
            if "password" in value.lower():
                return f"a password inside the {place} parameter {name!r}"
    if "password" in urllib.parse.unquote(parts.path).lower():
        return "a password in its path"
    if "password" in urllib.parse.unquote(parts.fragment).lower():
        return "a password in its fragment"
    return None


def refuse_url_secret(url: str, what: str, fix: str) -> str:
    """`url`, or ValueError naming `what` and the secret it carries (never the secret itself)."""
    found = url_secret(url)
    if found is not None:
        raise ValueError(f"{what} carries {found}; {fix}: a URL is shown in the Prefect UI, logs and "
                         "reports, and stored with the run")
    return url


def redact_url(url: str, unparseable: str = UNPARSEABLE_URL) -> str:
    """`url` with its password and the values of its secret parameters (query, fragment, path)
    replaced by ***, a path holding a password by /***, for messages; `unparseable` (a
    placeholder, never the text) when its host or port cannot be read."""
    try:
        parts = _split(url)
    except ValueError:
        return unparseable
    netloc = parts.netloc
    if parts.password is not None:
        host = netloc.rsplit("@", 1)[1]
        netloc = f"{parts.username or ''}:***@{host}"
    query = "&".join(
        f"{name}={'***' if _secret_pair(name, value) else urllib.parse.quote(value, safe='/:')}"
        for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    )
    fragment = parts.fragment
    pairs = urllib.parse.parse_qsl(fragment, keep_blank_values=True)
    if any(_secret_pair(name, value) for name, value in pairs):  # else left exactly as it was
        fragment = "&".join(f"{name}={'***' if _secret_pair(name, value) else value}" for name, value in pairs)
    if "password" in urllib.parse.unquote(fragment).lower():
        fragment = "***"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query, fragment=fragment,
                                                  path=_redact_path(parts.path)))


def _redact_path(path: str) -> str:
    """A URL's path with the values of its secret ``;name=value`` parameters replaced by ***, or
    /*** when a password shows in it otherwise."""
    segments = []
    for segment in path.split("/"):
        head, *parameters = segment.split(";")
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            secret = _secret_pair(urllib.parse.unquote(name), urllib.parse.unquote(value))
            head += f";{name}=***" if secret else f";{parameter}"
        segments.append(head)
    redacted = "/".join(segments)
    return "/***" if "password" in urllib.parse.unquote(redacted).lower() else redacted
