"""Run metrics: success rates with Wilson intervals, scores, cost and effort, reference accuracy.

Everything counts the *final attempt* of each task (the ``latest_task_results`` view), so a
task retried after an infrastructure error counts once, with its final outcome; the number of
attempts and retried tasks is reported beside it, and ``spent`` adds up every attempt (what the
run really cost).

Definitions (overall and per domain):

* ``success_sound``: the headline rate, "success rate (sound environment)": tasks whose final
  outcome is success / tasks whose final outcome is not in ``UNSOUND_OUTCOMES`` (an
  infrastructure error: the server failed; a setup failure: the task's own data could not be
  set up; neither says anything about the agent), with a Wilson 95% interval. The filter is
  defined once, in ``adapters/results/rates.py`` (``sound_sql`` / ``is_sound``, built from
  ``OutcomeKind.environment_was_sound``), and used by this module, the comparison and every report.
  ``infrastructure_errors`` and ``setup_failures`` count the tasks it leaves out; ``outcomes``
  has every outcome's count.
* ``success``: the raw rate, tasks whose final outcome is success / all tasks with a stored
  result, with a Wilson 95% interval. Shown beside the headline rate.
* ``feasible`` / ``infeasible``: ``success`` over the feasible and the infeasible tasks apart
  (WAA scores an infeasible task 1 only when the agent's last action is FAIL).
* ``avg_score``: mean evaluator score over all tasks, fractional scores kept (infrastructure
  errors and setup failures score 0 here); ``avg_score_sound`` is the mean over the same tasks as
  ``success_sound``'s denominator.
* ``steps``, ``time_seconds``, ``agent_seconds``, ``env_seconds``, ``input_tokens``,
  ``output_tokens``, ``cost_usd``: mean per task and total, over the final attempts that
  report the value.
* ``reference``: step and grounding accuracy against reference trajectories, pooled over the
  tasks that have one (definitions in ``adapters/results/reference.py``). Tasks whose final
  attempt is an infrastructure error or a setup failure are left out: the agent never had a
  fair go at them.

The run's status (``runs.status``) and how many of its selected tasks (``runs.task_count``) have
no final result (``RunMetrics.run_status()``; an infrastructure error after the last attempt is
not final) are shown wherever these rates are.

Counting is done in DuckDB; reference alignment in Python (it is a dynamic programme per task).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
from pydantic import BaseModel, ValidationError

from adapters.benchmark import BenchmarkAction, OutcomeKind
from adapters.results.reference import (
    AgentStep,
    ReferenceCounts,
    ReferenceScore,
    ReferenceTrajectory,
    load_references,
    score_against_reference,
)
from adapters.results.rates import RunStatus, is_final, is_sound, sound_sql
from adapters.results.source import UnknownRunError, results_connection
from adapters.results.stats import wilson_interval
from adapters.store.lease import shown_status
from adapters.store.duckdb_store import ResultStore

References = Mapping[str, ReferenceTrajectory]
"""Reference trajectories by task id."""

ALL_DOMAINS = "ALL"


class Rate(BaseModel):
    """successes / total with its Wilson 95% interval; rate and ci95 are None when total is 0."""

    successes: int
    total: int
    rate: float | None
    ci95: tuple[float, float] | None

    @classmethod
    def of(cls, successes: int, total: int) -> Rate:
        """The rate of `successes` out of `total`."""
        return cls(
            successes=successes,
            total=total,
            rate=successes / total if total else None,
            ci95=wilson_interval(successes, total),
        )


class Stat(BaseModel):
    """Mean per task and total of one quantity, over the `tasks` that report it."""

    mean: float | None
    total: float | None
    tasks: int


class Spend(BaseModel):
    """What every attempt of the tasks took together, retries included."""

    time_seconds: float
    vm_seconds: float
    input_tokens: int
    output_tokens: int
    cost_usd: float
    # Attempts that called a model without a known price (their cost is NULL, not $0): the cost
    # above leaves them out, so it is shown as "unpriced".
    unpriced_attempts: int = 0


class ReferenceSummary(ReferenceCounts):
    """Reference accuracy pooled over tasks (see adapters/results/reference.py)."""

    tasks_with_reference: int
    """Tasks (final attempts) for which a reference trajectory was given."""
    tasks_scored: int
    """Of those, the ones scored (not an infrastructure error or setup failure)."""

    @classmethod
    def pool(cls, tasks_with_reference: int, scores: Sequence[ReferenceScore]) -> ReferenceSummary:
        """Pool per-task scores: sums of numerators and denominators."""
        return cls(
            tasks_with_reference=tasks_with_reference,
            tasks_scored=len(scores),
            reference_steps=sum(s.reference_steps for s in scores),
            matched_steps=sum(s.matched_steps for s in scores),
            pointer_pairs=sum(s.pointer_pairs for s in scores),
            pointer_hits=sum(s.pointer_hits for s in scores),
            pointer_unverifiable=sum(s.pointer_unverifiable for s in scores),
        )


class DomainMetrics(BaseModel):
    """The metrics of one domain, or of the whole run (domain "ALL")."""

    domain: str
    tasks: int
    attempts: int
    retried_tasks: int
    infrastructure_errors: int
    setup_failures: int
    success: Rate
    success_sound: Rate
    feasible: Rate
    infeasible: Rate
    avg_score: float | None
    avg_score_sound: float | None
    outcomes: dict[str, int]
    steps: Stat
    time_seconds: Stat
    agent_seconds: Stat
    env_seconds: Stat
    input_tokens: Stat
    output_tokens: Stat
    cost_usd: Stat
    spent: Spend
    reference: ReferenceSummary | None = None
    """None when no references were given."""

    @property
    def retries(self) -> int:
        """Attempts beyond the first, over all tasks."""
        return self.attempts - self.tasks


class TaskMetrics(BaseModel):
    """The final attempt of one task."""

    task_id: str
    domain: str
    attempt: int
    attempts: int
    outcome: str
    success: bool
    score: float | None
    infeasible: bool
    num_steps: int | None
    total_time_seconds: float | None
    agent_seconds: float | None
    env_seconds: float | None
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    reason: str | None
    error: str | None
    reference: ReferenceScore | None = None


class RunMetrics(BaseModel):
    """Everything the reports show about a run."""

    run_id: str
    provenance: dict[str, Any]
    """The run's `runs` row, every column (older files simply have fewer)."""
    overall: DomainMetrics
    per_domain: list[DomainMetrics]
    tasks: list[TaskMetrics]
    references_given: bool

    def run_status(self) -> RunStatus:
        """The run's status and its selected tasks still without a final result."""
        selected = self.provenance.get("task_count")
        return RunStatus(
            run_id=self.run_id,
            status=self.provenance.get("status"),
            selected=selected if isinstance(selected, int) else None,
            final=sum(is_final(t.outcome) for t in self.tasks),
            scoring=self.provenance.get("scoring"),
        )


# --- database access ---------------------------------------------------------------------------


def query_store(
    store: ResultStore, sql: str, params: Sequence[Any], run_ids: Sequence[str] = (), *, with_steps: bool = False
) -> list[dict[str, Any]]:
    """Rows of a read-only query on the store, as dicts; JSON columns are decoded. `run_ids`
    and `with_steps` name what the query reads (see `results_connection`)."""
    with results_connection(store, run_ids, with_steps=with_steps) as conn:
        return _rows(conn, sql, params)


def _rows(conn: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    """Rows of one query on an open reading connection, as dicts; JSON columns are decoded."""
    cursor = conn.execute(sql, list(params))
    names = [d[0] for d in cursor.description]
    json_columns = [d[0] for d in cursor.description if str(d[1]) == "JSON"]
    rows = [dict(zip(names, values)) for values in cursor.fetchall()]
    for row in rows:
        for name in json_columns:
            if isinstance(row[name], str):
                row[name] = json.loads(row[name])
    return rows


def run_row(store: ResultStore, run_id: str) -> dict[str, Any]:
    """The run's `runs` row (all columns); StoreError naming the run and the store when unknown."""
    with results_connection(store) as conn:
        return _run_row(conn, store.location, run_id)


def _run_row(conn: duckdb.DuckDBPyConnection, where: str, run_id: str) -> dict[str, Any]:
    rows = _rows(conn, "SELECT * FROM runs WHERE run_id = ?", [run_id])
    if not rows:
        known = [r["run_id"] for r in _rows(conn, "SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 5", [])]
        hint = f"; recent runs: {', '.join(known)}" if known else "; the file has no runs"
        raise UnknownRunError(f"{where}: unknown run {run_id!r}{hint}")
    row = rows[0]
    # A `running` run whose controller died is shown as abandoned, never running forever.
    row["status"] = shown_status(row.get("status"), row.get("controller"), row.get("heartbeat_at"))
    return row


_DOMAIN_SQL = """
WITH attempts AS (
    SELECT task_id, trial, count(*) AS attempts,
           coalesce(sum(total_time_seconds), 0) AS time_all, coalesce(sum(vm_seconds), 0) AS vm_all,
           coalesce(sum(input_tokens), 0) AS in_all, coalesce(sum(output_tokens), 0) AS out_all,
           coalesce(sum(cost_usd), 0) AS cost_all,
           count(*) FILTER (WHERE model_calls > 0 AND cost_usd IS NULL) AS unpriced_all
    FROM task_results WHERE run_id = ? GROUP BY task_id, trial
), final AS (
    SELECT coalesce(l.domain, '') AS dom, l.success, l.score, l.num_steps, l.total_time_seconds,
           l.agent_seconds, l.env_seconds, l.input_tokens, l.output_tokens, l.cost_usd,
           coalesce(l.infeasible, false) AS inf, NOT {sound} AS unsound, a.*
    FROM latest_task_results l JOIN attempts a USING (task_id, trial)
    WHERE l.run_id = ?
)
SELECT grouping(dom) = 1 AS is_all, dom,
       count(*) AS tasks,
       coalesce(sum(attempts), 0) AS attempts,
       coalesce(count_if(attempts > 1), 0) AS retried_tasks,
       coalesce(count_if(success), 0) AS successes,
       coalesce(count_if(unsound), 0) AS unsound,
       coalesce(count_if(success AND NOT unsound), 0) AS sound_successes,
       coalesce(count_if(NOT inf), 0) AS feasible_total,
       coalesce(count_if(NOT inf AND success), 0) AS feasible_successes,
       coalesce(count_if(inf), 0) AS infeasible_total,
       coalesce(count_if(inf AND success), 0) AS infeasible_successes,
       avg(score) AS avg_score,
       avg(score) FILTER (WHERE NOT unsound) AS avg_score_sound,
       avg(num_steps) AS steps_mean, sum(num_steps) AS steps_total, count(num_steps) AS steps_n,
       avg(total_time_seconds) AS time_mean, sum(total_time_seconds) AS time_total,
       count(total_time_seconds) AS time_n,
       avg(agent_seconds) AS agent_mean, sum(agent_seconds) AS agent_total, count(agent_seconds) AS agent_n,
       avg(env_seconds) AS env_mean, sum(env_seconds) AS env_total, count(env_seconds) AS env_n,
       avg(input_tokens) AS in_mean, sum(input_tokens) AS in_total, count(input_tokens) AS in_n,
       avg(output_tokens) AS out_mean, sum(output_tokens) AS out_total, count(output_tokens) AS out_n,
       avg(cost_usd) AS cost_mean, sum(cost_usd) AS cost_total, count(cost_usd) AS cost_n,
       coalesce(sum(time_all), 0) AS spent_time, coalesce(sum(vm_all), 0) AS spent_vm,
       coalesce(sum(in_all), 0) AS spent_in, coalesce(sum(out_all), 0) AS spent_out,
       coalesce(sum(cost_all), 0) AS spent_cost, coalesce(sum(unpriced_all), 0) AS spent_unpriced
FROM final
GROUP BY GROUPING SETS ((dom), ())
ORDER BY is_all, dom
""".replace("{sound}", sound_sql("l.outcome"))

_OUTCOME_SQL = """
SELECT grouping(dom) = 1 AS is_all, dom, outcome, count(*) AS n
FROM (SELECT coalesce(domain, '') AS dom, outcome FROM latest_task_results WHERE run_id = ?)
GROUP BY GROUPING SETS ((dom, outcome), (outcome))
"""

_TASK_SQL = """
SELECT l.*, a.attempts
FROM latest_task_results l
JOIN (SELECT task_id, trial, count(*) AS attempts FROM task_results WHERE run_id = ? GROUP BY task_id, trial) a
    USING (task_id, trial)
WHERE l.run_id = ?
ORDER BY l.task_id, l.trial
"""

# Steps of the final attempts; `SELECT *` so files from before schema 3 (no click_x) work too.
_FINAL_STEPS_SQL = """
SELECT s.*
FROM steps s JOIN latest_task_results l USING (run_id, task_id, attempt)
WHERE s.run_id = ?
ORDER BY s.task_id, s.step_index
"""


# --- building the models -----------------------------------------------------------------------


def _stat(row: Mapping[str, Any], prefix: str) -> Stat:
    mean, total, n = row[f"{prefix}_mean"], row[f"{prefix}_total"], int(row[f"{prefix}_n"])
    return Stat(
        mean=None if mean is None else float(mean),
        total=None if total is None else float(total),
        tasks=n,
    )


def _domain_metrics(row: Mapping[str, Any], outcomes: dict[str, int]) -> DomainMetrics:
    """One DomainMetrics from one row of _DOMAIN_SQL."""
    tasks, successes, unsound = int(row["tasks"]), int(row["successes"]), int(row["unsound"])
    per_outcome = {o.value: 0 for o in OutcomeKind}  # stable columns: every outcome, 0 if absent
    per_outcome.update(outcomes)
    return DomainMetrics(
        domain=ALL_DOMAINS if row["is_all"] else row["dom"],
        tasks=tasks,
        attempts=int(row["attempts"]),
        retried_tasks=int(row["retried_tasks"]),
        infrastructure_errors=per_outcome[OutcomeKind.INFRASTRUCTURE_ERROR.value],
        setup_failures=per_outcome[OutcomeKind.SETUP_FAILURE.value],
        success=Rate.of(successes, tasks),
        success_sound=Rate.of(int(row["sound_successes"]), tasks - unsound),
        feasible=Rate.of(int(row["feasible_successes"]), int(row["feasible_total"])),
        infeasible=Rate.of(int(row["infeasible_successes"]), int(row["infeasible_total"])),
        avg_score=_float(row["avg_score"]),
        avg_score_sound=_float(row["avg_score_sound"]),
        outcomes=per_outcome,
        steps=_stat(row, "steps"),
        time_seconds=_stat(row, "time"),
        agent_seconds=_stat(row, "agent"),
        env_seconds=_stat(row, "env"),
        input_tokens=_stat(row, "in"),
        output_tokens=_stat(row, "out"),
        cost_usd=_stat(row, "cost"),
        spent=Spend(
            time_seconds=float(row["spent_time"]),
            vm_seconds=float(row["spent_vm"]),
            input_tokens=int(row["spent_in"]),
            output_tokens=int(row["spent_out"]),
            cost_usd=float(row["spent_cost"]),
            unpriced_attempts=int(row["spent_unpriced"]),
        ),
    )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def click_point(
    row: Mapping[str, Any], action: BenchmarkAction | None, screen: tuple[int, int] | None = None
) -> tuple[float, float] | None:
    """Where a stored pointer step aimed, in screenshot pixels, when known without the image.

    The `click_x`/`click_y` columns (schema 3) when set; else `BenchmarkAction.aim_point` (rows
    written before schema 3, and normalised points placed on a `screen` of (width, height)).
    """
    if row.get("click_x") is not None and row.get("click_y") is not None:
        return float(row["click_x"]), float(row["click_y"])
    return None if action is None else action.aim_point(screen)


def stored_action(row: Mapping[str, Any]) -> BenchmarkAction | None:
    """The step's BenchmarkAction from its `action` JSON; None when it is missing or invalid."""
    raw = row.get("action")
    if not isinstance(raw, Mapping):
        return None
    try:
        return BenchmarkAction.model_validate(raw)
    except ValidationError:
        return None


def agent_step(row: Mapping[str, Any]) -> AgentStep:
    """A `steps` row as the reference metrics see it."""
    action = stored_action(row)
    return AgentStep(step_index=int(row["step_index"]), action=action, click=click_point(row, action))


def _reference_scores(
    conn: duckdb.DuckDBPyConnection, run_id: str, tasks: list[dict[str, Any]], references: References
) -> dict[str, ReferenceScore]:
    """Scores of the final attempts that have a reference and had a fair go (see module doc)."""
    scored = {
        t["task_id"] for t in tasks if t["task_id"] in references and is_sound(t["outcome"])
    }
    steps: dict[str, list[AgentStep]] = {task_id: [] for task_id in scored}
    for row in _rows(conn, _FINAL_STEPS_SQL, [run_id]):
        if row["task_id"] in steps:
            steps[row["task_id"]].append(agent_step(row))
    return {task_id: score_against_reference(references[task_id], steps[task_id]) for task_id in sorted(scored)}


def _task_metrics(row: Mapping[str, Any], score: ReferenceScore | None) -> TaskMetrics:
    return TaskMetrics(
        task_id=row["task_id"],
        domain=row["domain"] or "",
        attempt=int(row["attempt"]),
        attempts=int(row["attempts"]),
        outcome=row["outcome"],
        success=bool(row["success"]),
        score=_float(row["score"]),
        infeasible=bool(row["infeasible"]),
        num_steps=row["num_steps"],
        total_time_seconds=_float(row["total_time_seconds"]),
        agent_seconds=_float(row.get("agent_seconds")),
        env_seconds=_float(row.get("env_seconds")),
        input_tokens=row.get("input_tokens"),
        output_tokens=row.get("output_tokens"),
        cost_usd=_float(row.get("cost_usd")),
        reason=row["reason"],
        error=row["error"],
        reference=score,
    )


def compute_run_metrics(store: ResultStore, run_id: str, references: References | None = None) -> RunMetrics:
    """All metrics of a run, over the final attempt of each task.

    `references` maps task ids to reference trajectories (see `adapters.results.reference`);
    None computes no reference metrics. StoreError naming the run when it is unknown. An empty
    run, or one whose tasks all ended in infrastructure errors, gives rates of None (0 out of 0)
    where the denominator is empty.
    """
    with results_connection(store, [run_id], with_steps=references is not None) as conn:
        provenance = _run_row(conn, store.location, run_id)
        domain_rows = _rows(conn, _DOMAIN_SQL, [run_id, run_id])
        outcomes: dict[str | None, dict[str, int]] = {}
        for row in _rows(conn, _OUTCOME_SQL, [run_id]):
            key = None if row["is_all"] else row["dom"]
            outcomes.setdefault(key, {})[row["outcome"]] = int(row["n"])
        task_rows = _rows(conn, _TASK_SQL, [run_id, run_id])
        scores = _reference_scores(conn, run_id, task_rows, references) if references is not None else {}

    tasks = [_task_metrics(row, scores.get(row["task_id"])) for row in task_rows]
    per_domain: list[DomainMetrics] = []
    overall: DomainMetrics | None = None
    for row in domain_rows:
        metrics = _domain_metrics(row, outcomes.get(None if row["is_all"] else row["dom"], {}))
        if references is not None:
            members = [t for t in tasks if row["is_all"] or t.domain == row["dom"]]
            with_reference = sum(t.task_id in references for t in members)
            metrics.reference = ReferenceSummary.pool(
                with_reference, [t.reference for t in members if t.reference is not None]
            )
        if row["is_all"]:
            overall = metrics
        else:
            per_domain.append(metrics)
    assert overall is not None  # GROUPING SETS with () always yields the total row, even for no rows
    return RunMetrics(
        run_id=run_id,
        provenance=provenance,
        overall=overall,
        per_domain=per_domain,
        tasks=tasks,
        references_given=references is not None,
    )


def references_for_run(store: ResultStore, run_id: str, demo_library: Path | None = None) -> dict[str, ReferenceTrajectory]:
    """The references a run can be scored against: its suite's ``solutions.json`` when the suite
    directory recorded in `runs.suite` still has one, plus demos recorded on its tasks from
    `demo_library` (a plan wins over a demo for the same task). Empty when there are none."""
    suite = run_row(store, run_id).get("suite")
    solutions = Path(suite) / "solutions.json" if suite else None
    return load_references(
        solutions=solutions if solutions is not None and solutions.is_file() else None,
        demo_library=demo_library,
    )
