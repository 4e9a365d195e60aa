"""The adaptive model-update design driven over real local runs (flows/baselines.py
`run_adaptive_design`): the `noisy-scripted` test agent with known success probabilities as the
baseline and as a clearly better candidate; each batch resumes both runs with more trials of the
tasks the design picks, and the design stops with "better" on the confidence sequence.

One verdict per model update (issue 64): when the design ran, its decision is the comparison's
verdict and the artifact's headline; the fixed-sample test is not applied to the trials it
collected (it gave 6.5 % false verdicts between equal models in bench/adaptive_trials.py and
could contradict the design in the same artifact). A batch size of 1 in the baselines file is refused, saying why."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

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

    # The model update's comparison of the two runs, as the flow builds it: one verdict, the design's.
    from adapters.results.compare import compare_runs, final_attempts
    from flows.baselines import model_update_report

    comparison = compare_runs(final_attempts(db, "base"), final_attempts(db, "cand"), "base", "cand")
    markdown = model_update_report(comparison, design, "p 0.9 vs baseline p 0.1")
    assert comparison.verdict == "improved" and comparison.p_value is None
    _one_verdict(markdown, "improved", "better")


def _design_rows(state, model: str) -> list[dict]:
    """A simulated design's trials of one model as the stored rows of its run (first pass, then
    the drawn trials in order)."""
    rows = []
    for i, task_id in enumerate(state.task_ids):
        outcomes = list(state.first_pass[model][i]) + [
            d.success for d in state.draws if d.task == i and d.model == model and d.success is not None]
        rows += [{"task_id": task_id, "trial": k + 1, "domain": "notepad", "success": bool(o),
                  "outcome": "success" if o else "agent_failure"} for k, o in enumerate(outcomes)]
    return rows


def _one_verdict(markdown: str, verdict: str, decision: str) -> None:
    """The artifact has one verdict, the design's, and no fixed-sample test of its trials."""
    assert markdown.count("Verdict:") == 1
    assert f"**Verdict: {verdict} (the adaptive design's decision: {decision}" in markdown
    assert f"## Adaptive design: **{decision}** (the model update's verdict)" in markdown
    for fixed_sample in ("p = ", "stratified permutation", "exact McNemar", "detectable difference",
                         "per-task means over trials, ", "no significant difference"):
        assert fixed_sample not in markdown, fixed_sample
    assert "described, not tested" in markdown


def test_the_design_is_the_model_updates_one_verdict() -> None:
    """A small improvement the design does not settle within its budget, on data where the
    fixed-sample test would say "improved": the verdict is the design's "undecided"."""
    from adapters.results.compare import compare_runs
    from adapters.results.trials.adaptive import fixed_design_cost
    from adapters.results.trials.simulation import run_adaptive, shifted, task_probabilities
    from flows.baselines import AdaptiveDesign, model_update_report, model_update_state

    rng = np.random.default_rng(2)
    p = task_probabilities(20, rng)
    run = run_adaptive(p, shifted(p, 0.05, rng), rng, budget=120, batch_size=8, seed=2, given_trials=1)
    assert run.report.decision == "budget_exhausted"
    rows = {m: _design_rows(run.state, m) for m in ("baseline", "candidate")}
    fixed_sample = compare_runs(rows["baseline"], rows["candidate"], "base", "cand")
    assert fixed_sample.verdict == "improved"  # what the artifact said before, beside the design's decision

    comparison = compare_runs(rows["baseline"], rows["candidate"], "base", "cand")
    design = AdaptiveDesign(report=run.report, fixed=fixed_design_cost(run.state), batches=run.state.batches)
    markdown = model_update_report(comparison, design, "ckpt vs baseline b")
    assert comparison.verdict == "undecided" and comparison.p_value is None
    assert comparison.trials is not None and comparison.trials.verdict == "not tested"
    assert comparison.trials.these_tasks.p_value is None and comparison.trials.these_tasks.interval is None
    _one_verdict(markdown, "undecided", "budget_exhausted")
    assert model_update_state(comparison).message == "verdict: undecided (the adaptive design's decision: budget_exhausted)"


@pytest.mark.parametrize("size", [0, 1])
def test_a_baselines_file_with_a_batch_of_one_is_refused_saying_why(tmp_path: Path, size: int) -> None:
    from flows.baselines import BaselinesFileError, load_baselines

    file = tmp_path / "baselines.toml"
    file.write_text('version = 1\n[[baselines]]\nname = "m"\nagent = "openai"\n'
                    f'[baselines.model_updates]\nmodels = ["x"]\nadaptive = true\nbatch_size = {size}\n')
    with pytest.raises(BaselinesFileError) as refused:
        load_baselines(file)
    message = str(refused.value)
    assert "\n" not in message and "model_updates.batch_size" in message and f"must be at least 2, got {size}" in message
    assert "one trial gives no estimate" in message
