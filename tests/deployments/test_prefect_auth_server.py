"""`arena doctor` warns when a real Prefect server answers its API without authentication on a
network address (as the team setup's `--host 0.0.0.0` does), and is quiet once the server asks
for Prefect's own basic authentication."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import requests

from prefect_home import seeded_home
from server_helpers import PREFECT_BIN, free_port, stop, tail, wait_for


def _start(tmp_path: Path, port: int, **env: str) -> subprocess.Popen[bytes]:
    """A real `prefect server start` on all addresses at `port`, on a home already migrated."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    with (tmp_path / f"server-{port}.log").open("wb") as out:
        return subprocess.Popen(
            [str(PREFECT_BIN), "server", "start", "--host", "0.0.0.0", "--port", str(port), "--no-ui", "--no-services"],
            env={**base, "PREFECT_HOME": str(seeded_home(tmp_path / f"home-{port}")),
                 "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **env},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )


def _wait_healthy(tmp_path: Path, port: int) -> None:
    try:
        wait_for("the server's /api/health", lambda: requests.get(f"http://127.0.0.1:{port}/api/health", timeout=2).ok,
                 90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{tail(tmp_path / f'server-{port}.log')}") from None


def test_doctor_warns_about_an_open_prefect_api_and_not_about_a_closed_one(tmp_path: Path) -> None:
    from flows.doctor import _own_address, check_prefect_auth

    if _own_address() is None:
        import pytest

        pytest.skip("this machine has no network address besides loopback")
    # Both servers start together (each takes seconds): one open, one asking for basic auth.
    port = free_port()
    closed_port = next(p for p in iter(free_port, None) if p != port)
    open_server = _start(tmp_path, port)
    closed = _start(tmp_path, closed_port, PREFECT_SERVER_API_AUTH_STRING="admin:not-a-real-password")
    try:
        _wait_healthy(tmp_path, port)
        warning = check_prefect_auth(f"http://127.0.0.1:{port}/api")
        assert warning is not None and warning.ok and warning.warning
        assert "without authentication" in warning.detail and "PREFECT_SERVER_API_AUTH_STRING" in warning.fix
        assert warning.line().startswith("WARN  prefect auth:")

        _wait_healthy(tmp_path, closed_port)
        assert check_prefect_auth(f"http://127.0.0.1:{closed_port}/api") is None
        unauthenticated = requests.post(f"http://127.0.0.1:{closed_port}/api/deployments/filter", json={}, timeout=10)
        assert unauthenticated.status_code == 401
    finally:
        stop(open_server)
        stop(closed)
