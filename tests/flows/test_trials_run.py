"""Repeated trials through the whole pipeline (issue 33): `trials = 3` on a few bundled tasks with
the `noisy-scripted` test agent on the local simulation: a stored row per (task, trial), the
trial number reaching the agent, the summary's numbers equal to the statistics library's on the
stored outcomes, progress counting trials and tasks, Prefect task runs named by trial, and a
resume after deleting trial rows running only those trials."""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import pytest

from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir

SEED = 11
P = 0.5
TRIALS = 3
RUN = "trials-e2e"


def _rows(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, params or []).fetchall()


def _config(db: Path, artifacts: Path, ids: list[str]):
    from adapters.agents import AgentOptions
    from flows.run_config import SuiteRunConfig

    return SuiteRunConfig(agent="noisy-scripted", agent_options=AgentOptions(success_probability=P, seed=SEED),
                          task_ids=ids, trials=TRIALS, pool_size=2, db_path=db, artifacts_dir=artifacts, run_id=RUN)


def test_trials_run_store_summarise_and_resume_per_task_and_trial(prefect_server: None, tmp_path: Path) -> None:
    from adapters.agents.noisy_scripted import trial_draw
    from adapters.results.trials import group_trials, pass_at_k, pass_hat_k, suite_rate
    from flows.evaluate_suite import run_suite

    ids = WAATaskCatalog(bundled_suite_dir()).task_ids()[:4]
    db, artifacts = tmp_path / "arena.duckdb", tmp_path / "artifacts"
    outcome = run_suite(_config(db, artifacts, ids))

    assert outcome.status == "completed", outcome.table
    assert len(outcome.results) == len(ids) * TRIALS
    finals = _rows(db, f"SELECT task_id, trial, outcome, success, attempt FROM latest_task_results WHERE run_id = '{RUN}'")
    assert sorted((t, k) for t, k, *_ in finals) == sorted((t, k) for t in ids for k in range(1, TRIALS + 1))
    # Each trial drew its own number: the stored outcome is the one the agent's seeded draw for
    # that (task, trial) gives, so the trial number reached the agent.
    assert {(t, k): s for t, k, _, s, _ in finals} == {(t, k): trial_draw(SEED, t, k) < P for t, k, *_ in finals}
    assert len({s for *_, s, _ in finals}) == 2  # both outcomes occur (the seed is chosen so)
    # Attempt numbers count per task across its trials: never two rows of one task with one number.
    attempts = _rows(db, f"SELECT task_id, attempt FROM task_results WHERE run_id = '{RUN}'")
    assert len(attempts) == len(set(attempts)) >= len(ids) * TRIALS

    # The summary's numbers are the library's on the stored outcomes.
    rows = [{"task_id": t, "trial": k, "outcome": o, "success": s, "attempt": a} for t, k, o, s, a in finals]
    tasks = group_trials(rows)
    rate = suite_rate(tasks)
    low, high = rate.these_tasks.interval
    low2, high2 = rate.tasks_like_these.interval
    assert (f"success rate over trials (mean of per-task fractions): {100 * rate.rate:.1f}%   95 % intervals: "
            f"these tasks [{100 * low:.1f}%, {100 * high:.1f}%], tasks like these [{100 * low2:.1f}%, {100 * high2:.1f}%]"
            ) in outcome.table
    for metric in (pass_at_k(tasks, TRIALS), pass_hat_k(tasks, TRIALS), pass_at_k(tasks, 1)):
        label = metric.metric.replace("k", str(metric.k))
        assert f"{label} {100 * metric.value:.1f}%" in outcome.table
    # pass@k is for the run's K, said so; the headline groups trials by task (no per-trial Wilson).
    assert f"trials: K = {TRIALS} per task (the run's configuration)" in outcome.table
    assert (f"success rate (sound environment): {100 * rate.rate:.1f}% [{100 * low2:.1f}%, {100 * high2:.1f}%] over "
            f"{len(ids)} task(s) x K={TRIALS} trial(s)") in outcome.table
    assert outcome.completeness.trials_selected == outcome.completeness.trials_final == len(ids) * TRIALS
    assert f"trials: {len(ids) * TRIALS}/{len(ids) * TRIALS} with a final result" in outcome.table
    progress = json.loads((artifacts / RUN / "progress.json").read_text())
    assert (progress["done"], progress["selected"], progress["tasks_done"], progress["tasks_selected"]) == (
        len(ids) * TRIALS, len(ids) * TRIALS, len(ids), len(ids))

    # Prefect's task runs carry the trial: `<domain>/<task> trial 2`. Their names are recorded
    # from events, a moment after the flow returned.
    deadline = time.monotonic() + 30
    while True:
        names = _evaluate_task_names(db)
        if len(names) >= len(ids) * TRIALS or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sum(n.endswith(" trial 2") for n in names) == len(ids) and sum(n.endswith(" trial 3") for n in names) == len(ids)

    # Resume after deleting two trials' rows: only those two run again, with new attempt numbers.
    gone = [(ids[0], 2), (ids[1], 3)]
    before = dict(((t, k), a) for t, k, _, _, a in finals)
    with duckdb.connect(str(db)) as con:
        for task_id, trial in gone:
            con.execute(f"DELETE FROM task_results WHERE run_id = '{RUN}' AND task_id = ? AND trial = ?", [task_id, trial])
    resumed = run_suite(_config(db, artifacts, ids))
    assert sorted((r.task_id, r.trial) for r in resumed.results) == sorted(gone)
    assert resumed.status == "completed" and resumed.completeness.trials_final == len(ids) * TRIALS
    again = _rows(db, f"SELECT task_id, trial, success, attempt FROM latest_task_results WHERE run_id = '{RUN}'")
    attempts = _rows(db, f"SELECT task_id, attempt FROM task_results WHERE run_id = '{RUN}'")
    assert len(attempts) == len(set(attempts))
    assert len(again) == len(ids) * TRIALS
    for task_id, trial, success, attempt in again:
        assert success == (trial_draw(SEED, task_id, trial) < P)
        if (task_id, trial) in gone:  # numbered after every attempt the task still has stored
            assert attempt > max(a for (t, k), a in before.items() if t == task_id and (t, k) not in gone)
        else:
            assert attempt == before[(task_id, trial)]


def _evaluate_task_names(db: Path) -> list[str]:
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterName

    (flow_run_id,) = _rows(db, f"SELECT prefect_flow_run_id FROM runs WHERE run_id = '{RUN}'")[0]
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_=" trial ")),
        )
    return [r.name for r in runs]


@pytest.mark.parametrize("trials", [0, 101])
def test_a_trial_count_out_of_range_is_refused(trials: int) -> None:
    from pydantic import ValidationError

    from flows.run_config import SuiteRunConfig

    with pytest.raises(ValidationError, match="trials"):
        SuiteRunConfig(trials=trials)


def test_trials_with_shards_are_refused_in_one_line() -> None:
    from pydantic import ValidationError

    from flows.run_config import SuiteRunConfig

    with pytest.raises(ValidationError, match="trials > 1 with shards is not built yet"):
        SuiteRunConfig(trials=2, shards=2)
