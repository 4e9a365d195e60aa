"""`arena doctor`: each check, broken, names itself and its fix; all right, it says ok."""

from __future__ import annotations

from pathlib import Path

import duckdb

import pytest

from adapters.agents import AgentOptions
from adapters.store.duckdb_store import SCHEMA_VERSION, ResultStore
from adapters.waa.localenv.launcher import LocalEnvHandle
from flows.cli import EXIT_FAILED, SERVED_DEPLOYMENTS, main
from flows.doctor import check_model, check_prefect, check_store, check_waa_server
from tests.agents.fake_model_servers import FakeModelServer


def test_store_checks(tmp_path: Path) -> None:
    assert check_store(tmp_path / "new.duckdb").ok  # the first run creates it
    missing = check_store(tmp_path / "no" / "such" / "dir.duckdb")
    assert not missing.ok and "not a writable directory" in missing.detail and "fix:" in missing.line()
    db = tmp_path / "arena.duckdb"
    ResultStore(db).close()
    good = check_store(db)
    assert good.ok and f"schema version {SCHEMA_VERSION}" in good.detail
    with duckdb.connect(str(db)) as conn:
        conn.execute("INSERT INTO schema_version VALUES (99)")
    newer = check_store(db)
    assert not newer.ok and "newer" in newer.detail and "upgrade the package" in newer.fix


def test_team_store_checks(postgres_url: str) -> None:
    ResultStore(postgres_url).close()
    assert check_store(postgres_url).ok
    wrong = postgres_url.replace(postgres_url.split("//")[1].split("@")[0].split(":")[1], "wrong-password")
    refused = check_store(wrong)
    assert not refused.ok and "wrong-password" not in refused.line()
    assert "PGPASSWORD" in refused.fix


def test_waa_server_checks(sim: LocalEnvHandle) -> None:
    assert check_waa_server(sim.base_url).ok
    down = check_waa_server("http://127.0.0.1:9")
    assert not down.ok and "arena probe http://127.0.0.1:9" in down.fix


def test_model_endpoint_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeModelServer("openai") as server:
        server.accepted_key = "right-key"
        options = AgentOptions(base_url=server.url, api_key_env="ARENA_TEST_KEY", model="gpt-test")
        monkeypatch.delenv("ARENA_TEST_KEY", raising=False)
        # A vLLM-style server with no key configured anywhere: an unset key is allowed, but this
        # server wants one, so the listing is refused and the fix names the variable.
        refused = check_model("openai", options)[0]
        assert not refused.ok and "HTTP 401" in refused.detail and "ARENA_TEST_KEY" in refused.fix
        monkeypatch.setenv("ARENA_TEST_KEY", "right-key")
        assert check_model("openai", options)[0].ok
        other = check_model("openai", options.model_copy(update={"model": "qwen-7b"}))[0]
        assert not other.ok and "gpt-test" in other.fix
        monkeypatch.setenv("ARENA_TEST_KEY", "wrong-key-value")
        wrong = check_model("openai", options)[0]
        assert not wrong.ok and "wrong-key-value" not in wrong.line()
    with FakeModelServer("anthropic") as server:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "any")
        assert check_model("claude", AgentOptions(base_url=server.url))[0].ok
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    unset = check_model("claude", AgentOptions())[0]
    assert not unset.ok and "export ANTHROPIC_API_KEY" in unset.fix
    assert check_model("scripted", AgentOptions()) == []  # no model, nothing to check


def test_prefect_checks(prefect_server: None) -> None:
    from prefect.settings import PREFECT_API_URL

    checks = check_prefect(PREFECT_API_URL.value(), SERVED_DEPLOYMENTS)
    assert checks[0].ok  # the server answers; nothing is served on this test server
    assert [c.ok for c in checks[1:]] == [False] * len(SERVED_DEPLOYMENTS)
    assert all("deployments.serve" in c.fix for c in checks[1:])
    down = check_prefect("http://127.0.0.1:9/api", SERVED_DEPLOYMENTS)
    assert len(down) == 1 and not down[0].ok


def test_arena_doctor_prints_one_line_per_check_and_fails_when_one_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # no Prefect server configured
        assert main(["doctor", "--db", str(tmp_path / "arena.duckdb")]) == 0
        out = capsys.readouterr().out
        assert "2 of 2 checks passed" in out
        # After the checks, not among them: the local Prefect servers running on this machine.
        assert "Local Prefect servers started by arena run" in out.split("checks passed")[1]
        assert main(["doctor", "--db", str(tmp_path / "arena.duckdb"), "--waa-url", "http://127.0.0.1:9"]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert "FAIL  WAA server http://127.0.0.1:9" in out and "2 of 3 checks passed" in out
