"""adapters/secrets.py: no URL the product accepts carries a secret, in any form, and none is
ever printed; `arena` refuses such a URL in one line that does not repeat the secret."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from adapters.secrets import redact_url, url_secret

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
])
def test_secrets_in_urls_are_found_and_redacted(url: str, found: str) -> None:
    assert found in (url_secret(url) or "")
    assert SECRET not in redact_url(url) and "***" in redact_url(url)


@pytest.mark.parametrize("url", ["postgresql://arena@db:5432/arena?sslmode=require&application_name=x",
                                 "http://gpu-host:8000/v1", "https://api.example.org/v1?model=x&max_tokens=5"])
def test_ordinary_urls_pass_unchanged(url: str) -> None:
    assert url_secret(url) is None and redact_url(url) == url


def _arena(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("ARENA_STORE_URL",)}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**base, "PREFECT_API_URL": "http://127.0.0.1:9/api", **env})


@pytest.mark.parametrize("args, env", [
    (["run", "--db", f"postgresql://arena@127.0.0.1:9/arena?password={SECRET}"], {}),
    (["run"], {"ARENA_STORE_URL": f"postgresql://arena@127.0.0.1:9/arena?password={SECRET}"}),
    (["report", "latest", "--db", f"postgresql://arena:{SECRET}@127.0.0.1:9/arena"], {}),
    (["run", "--agent", "openai", "--model", "m", "--base-url", f"http://127.0.0.1:9/v1?api_key={SECRET}"], {}),
    (["run", "--waa-url", f"http://127.0.0.1:9?token={SECRET}"], {}),
    (["notify", "model-updated", "m", "--endpoint", f"http://127.0.0.1:9/v1?key={SECRET}"], {}),
], ids=["store-query", "store-env", "store-userinfo", "base-url", "waa-url", "notify-endpoint"])
def test_arena_refuses_a_url_with_a_secret_in_one_line_without_repeating_it(args: list[str], env: dict[str, str]) -> None:
    done = _arena(args, **env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert SECRET not in done.stdout + done.stderr
    assert "carries" in done.stderr
