"""adapters/secrets.py: no URL the product accepts carries a secret, in any form, and none is
ever printed; `arena` refuses such a URL in one line that does not repeat the secret."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.secrets import redact_url, url_secret

ROOT = Path(__file__).resolve().parents[1]
SECRET = "hunter2-not-real"


@pytest.mark.parametrize("url, found", [
    (f"postgresql://arena:{SECRET}@db/arena", "a password in its user part"),
    (f"postgresql://arena@db/arena?password={SECRET}", "'password'"),
    (f"postgresql://arena@db/arena?sslmode=require&sslpassword={SECRET}", "'sslpassword'"),
    (f"postgresql://arena@db/arena?PassWord={SECRET}", "'PassWord'"),
    (f"postgresql:///arena?dbname=host%3Ddb%20password%3D{SECRET}", "inside the query parameter 'dbname'"),
    (f"http://gpu:8000/v1?api_key={SECRET}", "'api_key'"),
    (f"http://gpu:8000/v1?key={SECRET}", "'key'"),
    (f"http://gpu:8000/v1?access_token={SECRET}", "'access_token'"),
    (f"http://user:{SECRET}@gpu:8000/v1", "a password in its user part"),
    # Fragments and ;parameters of a path travel with the URL into results, reports and Prefect.
    (f"http://gpu:8000/v1#token={SECRET}", "the fragment parameter 'token'"),
    (f"http://gpu:8000/v1#a=1&access_token={SECRET}", "the fragment parameter 'access_token'"),
    (f"http://gpu:8000/v1#x=password%3D{SECRET}", "a password inside the fragment parameter 'x'"),
    (f"http://gpu:8000/v1;key={SECRET}", "the path parameter 'key'"),
    (f"http://gpu:8000/v1;a=1;api_key={SECRET}/chat", "the path parameter 'api_key'"),
    (f"postgresql://arena@db/arena;password={SECRET}", "the path parameter 'password'"),
    # A password in a store URL's path (libpq reads the path as the database name and sends it).
    (f"postgresql://arena@db/arena%20password%3D{SECRET}", "a password in its path"),
])
def test_secrets_in_urls_are_found_and_redacted(url: str, found: str) -> None:
    assert found in (url_secret(url) or "")
    assert SECRET not in redact_url(url) and "***" in redact_url(url)


@pytest.mark.parametrize("url", [
    f"postgresql://arena@db:{SECRET}/arena",  # a password typed where the port goes
    f"postgresql://arena:{SECRET}]@db/arena",  # an unmatched bracket: Python cannot split it
    f"http://[::1:{SECRET}/v1",
    f"postgresql://arena@db1:5432,db2:{SECRET}/arena",
])
def test_a_url_that_cannot_be_read_is_refused_and_never_shown(url: str) -> None:
    assert "cannot be read" in (url_secret(url) or "")
    assert redact_url(url) == "(unparseable URL, hidden)"


@pytest.mark.parametrize("location, shown", [
    (f"host=db port=5432 password={SECRET} dbname=arena", "host=db port=5432 password=*** dbname=arena"),
    (f"host=db sslpassword='{SECRET} x' dbname=arena", "host=db sslpassword=*** dbname=arena"),
    (f"dbname='host=db password={SECRET}'", "dbname=***"),
    (f"host=db password='{SECRET}", "(unparseable location, hidden)"),  # an unterminated quote
    (f"postgresql://arena@db/arena:{SECRET}", "postgresql://arena@db/***"),  # not a database name
    (f"postgresql://arena@db/arena {SECRET}", "postgresql://arena@db/***"),
    (f"postgresql://arena:{SECRET}@db/arena", "postgresql://arena:***@db/arena"),
    (f"postgresql://arena@db:{SECRET}/arena", "(unparseable location, hidden)"),
    (f"postgresql://arena@db/arena#password={SECRET}", "postgresql://arena@db/arena#***"),
    ("postgresql://arena@db:5432/arena?sslmode=require", "postgresql://arena@db:5432/arena?sslmode=require"),
    ("results/arena.duckdb", "results/arena.duckdb"),
])
def test_store_locations_are_shown_redacted(location: str, shown: str) -> None:
    from adapters.store_location import redact_location

    assert redact_location(location) == shown


@pytest.mark.parametrize("location", [
    f"host=db port=5432 password={SECRET} dbname=arena",
    "host=db dbname=arena",  # no secret, but a form nothing else here accepts
    f"postgresql://arena@db/arena%20password%3D{SECRET}",
    f"postgresql://arena@db/arena:{SECRET}",
    f"postgresql://arena@db:{SECRET}/arena",
    f"postgresql://arena:{SECRET}]@db/arena",
    f"postgresql://arena@db/arena#password={SECRET}",
    f"postgresql://arena@db/arena;password={SECRET}",
])
def test_a_store_location_with_a_secret_or_that_cannot_be_read_is_refused_without_repeating_it(location: str) -> None:
    from adapters.store_location import check_store_url

    with pytest.raises(ValueError) as refused:
        check_store_url(location)
    assert SECRET not in str(refused.value) and len(str(refused.value).splitlines()) == 1


def test_nothing_of_a_malformed_store_url_reaches_the_server_or_its_log() -> None:
    """Before: the database name 'arena password=...' was sent to the server, whose log kept
    it ('database ... does not exist'), and the error repeated it."""
    from pg_server import postgres_bindir, postgres_server

    from adapters.store import ResultStore
    from adapters.store.errors import StoreError

    if postgres_bindir() is None:
        pytest.skip("PostgreSQL is not installed")
    with postgres_server() as server:
        base = server.url.rsplit("/", 1)[0]
        for location in (f"{base}/arena%20password%3D{SECRET}", f"{base}/arena:{SECRET}"):
            with pytest.raises(StoreError) as refused:
                ResultStore(location)
            assert SECRET not in str(refused.value)
        assert SECRET not in (server.root / "log").read_text()


@pytest.mark.parametrize("url", ["postgresql://arena@db:5432/arena?sslmode=require&application_name=x",
                                 "http://gpu-host:8000/v1", "https://api.example.org/v1?model=x&max_tokens=5"])
def test_ordinary_urls_pass_unchanged(url: str) -> None:
    assert url_secret(url) is None and redact_url(url) == url


def _arena(args: list[str], cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("ARENA_STORE_URL",)}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**base, "PREFECT_API_URL": "http://127.0.0.1:9/api",
                                        "PYTHONPATH": str(ROOT), **env})


@pytest.mark.parametrize("args, env", [
    (["run", "--db", f"postgresql://arena@127.0.0.1:9/arena?password={SECRET}"], {}),
    (["run"], {"ARENA_STORE_URL": f"postgresql://arena@127.0.0.1:9/arena?password={SECRET}"}),
    (["report", "latest", "--db", f"postgresql://arena:{SECRET}@127.0.0.1:9/arena"], {}),
    (["run", "--agent", "openai", "--model", "m", "--base-url", f"http://127.0.0.1:9/v1?api_key={SECRET}"], {}),
    (["run", "--waa-url", f"http://127.0.0.1:9?token={SECRET}"], {}),
    (["notify", "model-updated", "m", "--endpoint", f"http://127.0.0.1:9/v1?key={SECRET}"], {}),
    (["run", "--waa-url", f"http://user:{SECRET}@127.0.0.1:9"], {}),
    (["run", "--agent", "openai", "--model", "m", "--base-url", f"http://127.0.0.1:9/v1#token={SECRET}"], {}),
    (["run", "--agent", "openai", "--model", "m", "--base-url", f"http://127.0.0.1:9/v1;key={SECRET}"], {}),
    (["report", "latest", "--db", f"host=127.0.0.1 port=9 password={SECRET} dbname=arena"], {}),
    (["run"], {"ARENA_STORE_URL": f"host=127.0.0.1 port=9 sslpassword={SECRET} dbname=arena"}),
    (["report", "latest", "--db", f"postgresql://arena@127.0.0.1:9/arena%20password%3D{SECRET}"], {}),
    (["report", "latest", "--db", f"postgresql://arena@127.0.0.1:{SECRET}/arena"], {}),
    (["sql", "SELECT 1", "--db", f"postgresql://arena:{SECRET}]@127.0.0.1/arena"], {}),
    (["probe", f"http://user:{SECRET}@127.0.0.1:9"], {}),
], ids=["store-query", "store-env", "store-userinfo", "base-url", "waa-url", "notify-endpoint", "waa-url-userinfo",
        "base-url-fragment", "base-url-path-parameter", "store-conninfo", "store-env-conninfo", "store-path",
        "store-port", "store-bracket", "probe-userinfo"])
def test_arena_refuses_a_url_with_a_secret_in_one_line_without_repeating_it(
    args: list[str], env: dict[str, str], tmp_path: Path
) -> None:
    done = _arena(args, cwd=tmp_path, **env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert SECRET not in done.stdout + done.stderr
    error = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and ("carries" in error[0] or "connection string" in error[0]), done.stderr
    assert not list(tmp_path.iterdir())  # nothing made: a connection string was once a DuckDB file's name
