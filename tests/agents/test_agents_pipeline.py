"""A model agent through the whole Prefect pipeline: tokens and cost land in DuckDB and add up,
the model's id and endpoint are recorded with the run, and the API key appears nowhere."""

from __future__ import annotations

import logging
from pathlib import Path

import duckdb
import pytest
from fake_model_servers import FakeModelServer, RecordedRequest, element_id, openai_completion, user_text

SECRET = "sk-pipeline-SECRET-0b1c2d3e"
KEY_ENV = "WAA_PIPELINE_TEST_KEY"


def test_openai_agent_run_records_usage_and_never_the_key(
    prefect_server: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from adapters.agents import AgentOptions
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    monkeypatch.setenv(KEY_ENV, SECRET)
    prices = tmp_path / "prices.json"
    prices.write_text('{"gpt-test": [2.0, 8.0]}')

    def click_new_folder(request: RecordedRequest) -> dict:
        node = element_id(user_text(request), "Button", "New folder")
        return openai_completion(f"CLICK([{node}])", prompt_tokens=1000, completion_tokens=10)

    caplog.set_level(logging.DEBUG)
    with FakeModelServer("openai") as server:
        server.add(
            click_new_folder,
            openai_completion('TYPE("Projects")', prompt_tokens=1100, completion_tokens=11),
            openai_completion('KEY("Enter")', prompt_tokens=1200, completion_tokens=12),
            openai_completion("DONE()", prompt_tokens=1300, completion_tokens=13),
        )
        db = tmp_path / "arena.duckdb"
        options = AgentOptions(
            model="gpt-test", base_url=server.url, api_key_env=KEY_ENV, observation="a11y_tree", prices_path=prices
        )
        outcome = run_suite(
            SuiteRunConfig(
                agent="openai",
                agent_options=options,
                task_ids=["explorer-create-projects-folder"],
                pool_size=1,
                db_path=db,
                artifacts_dir=tmp_path / "artifacts",
                run_id="openai-run",
            )
        )
    assert [r.outcome.value for r in outcome.results] == ["success"]
    with duckdb.connect(str(db), read_only=True) as con:
        task = con.execute(
            "SELECT model_calls, input_tokens, output_tokens, cost_usd FROM task_results WHERE run_id = 'openai-run'"
        ).fetchone()
        steps = con.execute(
            "SELECT sum(model_calls), sum(input_tokens), sum(output_tokens), sum(cost_usd) FROM steps WHERE run_id = 'openai-run'"
        ).fetchone()
        run = con.execute("SELECT model_id, model_endpoint, agent_config FROM runs WHERE run_id = 'openai-run'").fetchone()
    assert task[:3] == (4, 4600, 46) and task[3] == pytest.approx((4600 * 2.0 + 46 * 8.0) / 1e6)
    assert steps[:3] == task[:3] and steps[3] == pytest.approx(task[3])
    assert run[0] == "gpt-test" and run[1].startswith(server.url)
    assert KEY_ENV not in run[2] or SECRET not in run[2]

    # The key was really sent to the model API...
    assert server.requests[0].header("authorization") == f"Bearer {SECRET}"
    # ...and is nowhere in what the product wrote or logged.
    assert SECRET.encode() not in db.read_bytes()
    for path in (tmp_path / "artifacts").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in caplog.text


def test_a_model_without_a_price_is_unpriced_everywhere_never_zero(
    prefect_server: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint nobody priced (a vLLM model, the plan-replay endpoint) cost "$0.0000" in the
    summary, reports and Prefect, and the "no price" warning reached only a terminal. Its cost is
    now NULL in the store and "unpriced" wherever a cost is shown, with the reason."""
    import json

    from adapters.agents import AgentOptions
    from adapters.results.history import baseline_history
    from flows.cli.results import write_run_report
    from flows.evaluate_suite import run_suite
    from flows.progress import progress_line
    from flows.run_config import SuiteRunConfig

    monkeypatch.setenv(KEY_ENV, SECRET)
    with FakeModelServer("openai") as server:
        server.add(openai_completion("DONE()", prompt_tokens=900, completion_tokens=9))
        db = tmp_path / "arena.duckdb"
        options = AgentOptions(model="my-finetune-ckpt-7", base_url=server.url, api_key_env=KEY_ENV,
                               observation="a11y_tree")
        outcome = run_suite(SuiteRunConfig(agent="openai", agent_options=options, task_ids=["notepad-append-line"],
                                           pool_size=1, db_path=db, artifacts_dir=tmp_path / "art", run_id="unpriced",
                                           baseline="priced-never"))
    assert "cost (model + VM): unpriced: no known price for my-finetune-ckpt-7" in outcome.table
    assert "$0.0000" not in outcome.table
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT model_calls, cost_usd FROM task_results").fetchone() == (1, None)
    progress = json.loads((tmp_path / "art" / "unpriced" / "progress.json").read_text())
    assert "cost unpriced, 909 tokens" in progress_line(progress)
    text, html_path = write_run_report(db, "unpriced", tmp_path / "report.html")
    assert "unpriced" in text and "model cost unpriced" in text and "$0.0000" not in text
    html = html_path.read_text()
    assert "model cost unpriced" in html and "without a known price" in html
    night = baseline_history(db, "priced-never").nights[0]
    assert night.cost_usd is None and "without a known price" in night.cost_note
