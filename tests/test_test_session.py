"""The test suite leaves alone what it did not start: a test session run beside a user's `arena run`
keeps to a Prefect home of its own and stops only its own servers (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.scenario
def test_a_test_session_leaves_the_users_local_prefect_server_running(tmp_path: Path) -> None:
    """A user's `arena run` holds the local Prefect server of their PREFECT_HOME; a test session
    started from the same shell (PREFECT_HOME and PREFECT_API_URL exported) stopped that server
    at its end, and the user's run printed connection-refused tracebacks for minutes."""
    from flows.local_server import ensure_server, stop_server

    user_home = tmp_path / "users-prefect-home"
    user_home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "ARENA_TEST_SESSION_PREFECT_HOME"}
    server = ensure_server(user_home)  # as the user's `arena run` holds it
    try:
        health = f"{server.api_url}/health"
        assert requests.get(health, timeout=10).ok
        session = subprocess.run(
            [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", "tests/test_ports.py"],
            cwd=ROOT, env={**env, "PREFECT_HOME": str(user_home), "PREFECT_API_URL": server.api_url},
            capture_output=True, text=True, timeout=300,
        )
        assert session.returncode == 0, session.stdout[-3000:] + session.stderr[-3000:]
        assert requests.get(health, timeout=10).ok, "the test session stopped the user's Prefect server"
        # Nothing of the session's went into the user's home.
        assert not [p for p in user_home.rglob("*") if "arena-test" in p.name]
    finally:
        server.release()
        stop_server(user_home)
