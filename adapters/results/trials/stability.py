"""Per-task stability across stored runs and trials (`arena tasks stability`): reads each
run's final attempt per (task, trial) with its agent, model and settings hash, groups them with
flaky.py, and renders one line per task version and configuration, flaky ones first."""

from __future__ import annotations

from typing import Any

from adapters.results.trials.flaky import TaskStability, task_stability
from adapters.store.duckdb_store import ResultStore


def stability_rows(store: ResultStore, *, agent: str | None = None, model: str | None = None,
                   runs: int | None = None) -> list[dict[str, Any]]:
    """The final attempt of every (task, trial) of the `runs` most recent runs (all when None)
    of `agent` and `model` (any when None), with the run's agent, model and settings hash."""
    if runs is not None and runs < 1:
        raise ValueError(f"--runs {runs}: must be at least 1")
    where, params = [], []
    for column, value in (("agent", agent), ("model_id", model)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    limit = f"LIMIT {int(runs)}" if runs is not None else ""
    with store.reading() as conn:
        chosen = [r[0] for r in conn.execute(
            f"SELECT run_id FROM runs {clause} ORDER BY started_at DESC NULLS LAST, run_id {limit}", params).fetchall()]
    if not chosen:
        return []
    with store.reading(chosen) as conn:
        cursor = conn.execute(
            "SELECT l.run_id, l.task_id, l.task_fingerprint, l.domain, l.trial, l.outcome, l.success, "
            "r.agent, r.model_id, r.agent_config_hash FROM latest_task_results l JOIN runs r USING (run_id) "
            "WHERE l.run_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY l.task_id, l.run_id, l.trial", [chosen])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, values)) for values in cursor.fetchall()]


def render_stability(groups: list[TaskStability], *, runs: int) -> str:
    """Plain text: a headline, then the flaky task versions with their trial outcomes (those of a
    deterministic agent flagged as pointing at the environment), then the stable ones in one line each."""
    flaky = [g for g in groups if g.flaky]
    environment = [g for g in flaky if g.points_at_environment]
    lines = [f"task stability over {runs} run(s): {len(groups)} task version(s) x configuration, {len(flaky)} flaky"
             + (f", {len(environment)} of them with a deterministic agent: the ENVIRONMENT varied" if environment else "")]
    for g in flaky:
        flag = "ENVIRONMENT (deterministic agent)" if g.points_at_environment else "flaky"
        lines.append(f"  {flag}: {g.domain}/{g.task_id} [{g.agent}{f', {g.model_id}' if g.model_id else ''}] "
                     f"{g.successes}/{g.sound_trials} sound trials succeeded over {g.runs} run(s): {g.outcomes_text()}")
    stable = [g for g in groups if not g.flaky]
    if stable:
        lines.append("stable:")
        for g in stable:
            fraction = "-" if g.success_fraction is None else f"{100 * g.success_fraction:.0f}%"
            lines.append(f"  {g.domain}/{g.task_id} [{g.agent}{f', {g.model_id}' if g.model_id else ''}] {fraction} of "
                         f"{g.sound_trials} sound trial(s) over {g.runs} run(s)")
    return "\n".join(lines)


def stability_report(store: ResultStore, *, agent: str | None = None, model: str | None = None,
                     runs: int | None = None) -> tuple[str, list[TaskStability]]:
    """The text `arena tasks stability` prints and the groups behind it."""
    rows = stability_rows(store, agent=agent, model=model, runs=runs)
    groups = task_stability(rows)
    return render_stability(groups, runs=len({r["run_id"] for r in rows})), groups
