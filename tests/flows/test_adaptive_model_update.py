"""The adaptive model-update design driven over real local runs (flows/baselines.py
`run_adaptive_design`): the `noisy-scripted` test agent with known success probabilities as the
baseline and as a clearly better candidate; each batch resumes both runs with more trials of the
tasks the design picks, and the design stops with "better" on the confidence sequence."""

from __future__ import annotations

from pathlib import Path

import duckdb

from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir


def _config(db: Path, tmp_path: Path, ids: list[str], p: float, run_id: str):
    from adapters.agents import AgentOptions
    from flows.run_config import SuiteRunConfig

    return SuiteRunConfig(agent="noisy-scripted", agent_options=AgentOptions(success_probability=p, seed=5),
                          task_ids=ids, pool_size=2, db_path=db, artifacts_dir=tmp_path / "a", run_id=run_id)


def test_the_adaptive_design_resumes_both_runs_in_batches_until_it_decides(prefect_server: None, tmp_path: Path) -> None:
    from flows.baselines import ModelUpdates, run_adaptive_design
    from flows.evaluate_suite import run_suite

    ids = WAATaskCatalog(bundled_suite_dir()).task_ids()[:8]
    db = tmp_path / "arena.duckdb"
    reference, candidate = _config(db, tmp_path, ids, 0.1, "base"), _config(db, tmp_path, ids, 0.9, "cand")
    for config in (reference, candidate):
        assert run_suite(config).status == "completed"
    settings = ModelUpdates(models=["x"], adaptive=True, batch_size=16, budget_trials=160)
    design = run_adaptive_design(reference, "base", candidate, "cand", settings, run=run_suite)

    report = design.report
    assert report.decision == "better", report.render()
    assert report.given_trials == 2 * len(ids) and design.batches >= 1
    assert report.history[-1].lower > 0 and len(report.history) == design.batches + 1
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute("SELECT count(*) FROM latest_task_results").fetchone()[0]
        trials = con.execute("SELECT max(trial) FROM latest_task_results").fetchone()[0]
    # Every episode the design spent is a stored trial of one of the two runs.
    assert stored == 2 * len(ids) + report.episodes and trials > 1
    text = design.markdown()
    assert "## Adaptive design: **better**" in text and f"{report.episodes} further trials" in text
    assert design.fixed is not None and f"{design.fixed.episodes} episodes" in text
