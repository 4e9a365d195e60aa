"""What earlier runs in the store say for planning a design with trials (`arena plan --trials`):
an agent's success rate on the selected tasks and the trial-to-trial variance of its repeated
trials. Reads the store; the arithmetic is estimates.py's and planning.py's."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pydantic import BaseModel

from adapters.results.trials.estimates import group_trials, suite_rate
from adapters.results.trials.planning import TrialVariance, trial_variance
from adapters.store.duckdb_store import ResultStore


class PlanningHistory(BaseModel):
    """An agent's earlier results on a selection of tasks."""

    runs: int  # earlier runs with a result for one of the tasks
    baseline_rate: float | None  # mean of per-task success fractions over every stored trial
    variance: TrialVariance | None  # from tasks with two sound trials or more in one run


def planning_history(store: ResultStore, task_ids: list[str], agent: str) -> PlanningHistory:
    """The final attempt of every (task, trial) `agent` ran on `task_ids`, summarised: the rate
    the plan assumes for the baseline, and the trial-to-trial variance (per run and task
    version: trials of one run share its settings)."""
    if not task_ids:
        return PlanningHistory(runs=0, baseline_rate=None, variance=None)
    with store.reading() as conn:
        cursor = conn.execute(
            "SELECT l.run_id, l.task_id, l.task_fingerprint, l.domain, l.trial, l.attempt, l.outcome, l.success "
            "FROM latest_task_results l JOIN runs r USING (run_id) "
            "WHERE r.agent = ? AND l.task_id IN (SELECT unnest(?::VARCHAR[]))",
            [agent, list(task_ids)],
        )
        names = [d[0] for d in cursor.description]
        rows: list[dict[str, Any]] = [dict(zip(names, values)) for values in cursor.fetchall()]
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_run[row["run_id"]].append(row)
    per_run = [task for run_id, run_rows in sorted(by_run.items()) for task in group_trials(run_rows, run_id)]
    # Every stored trial of a task, across runs, for its fraction (trials renumbered to stay distinct).
    pooled = group_trials({**row, "trial": index, "attempt": 0} for index, row in enumerate(rows))
    rate = suite_rate(pooled).rate if pooled else None
    return PlanningHistory(runs=len(by_run), baseline_rate=rate, variance=trial_variance(per_run))
