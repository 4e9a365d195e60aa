"""`arena doctor` warns when a real Prefect server answers its API without authentication on a
network address (as the team setup's `--host 0.0.0.0` does), and is quiet once the server asks
for Prefect's own basic authentication."""

from __future__ import annotations

from pathlib import Path

import requests

from server_helpers import PrefectServer


def test_doctor_warns_about_an_open_prefect_api_and_not_about_a_closed_one(tmp_path: Path) -> None:
    from flows.doctor import _own_address, check_prefect_auth

    if _own_address() is None:
        import pytest

        pytest.skip("this machine has no network address besides loopback")
    # Both servers on all addresses start together (each takes seconds): one open, one asking for basic auth.
    # Only their API is asked, so neither runs Prefect's services.
    open_server = PrefectServer(tmp_path / "open-home", tmp_path / "open.log", host="0.0.0.0", services=False)
    closed = PrefectServer(tmp_path / "closed-home", tmp_path / "closed.log", host="0.0.0.0", services=False,
                           env={"PREFECT_SERVER_API_AUTH_STRING": "admin:not-a-real-password"})
    open_server.launch()
    closed.launch()
    try:
        open_server.wait_healthy()
        warning = check_prefect_auth(open_server.api_url)
        assert warning is not None and warning.ok and warning.warning
        assert "without authentication" in warning.detail and "PREFECT_SERVER_API_AUTH_STRING" in warning.fix
        assert warning.line().startswith("WARN  prefect auth:")

        closed.wait_healthy()
        assert check_prefect_auth(closed.api_url) is None
        unauthenticated = requests.post(f"{closed.api_url}/deployments/filter", json={}, timeout=10)
        assert unauthenticated.status_code == 401
    finally:
        open_server.stop()
        closed.stop()
