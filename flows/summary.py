"""The end-of-run summary: a terminal table, the rows of the Prefect table artifact and a
markdown report.

A run is never silently partial: `RunCompleteness` says how many selected tasks have no final
result (never attempted, stopped by the budget, or still on an infrastructure error after the
last attempt), and every rendering shows it right under the headline rate.

The headline rate is the success rate over the tasks whose environment was sound
(adapters/results/rates.py: infrastructure errors and setup failures left out of its
denominator), with its Wilson 95% interval, beside the raw rate and the counts left out. In a
run with repeated trials it is the mean over tasks of each task's success over its sound trials,
with an interval that groups trials by task (adapters/results/trials/report.py): a Wilson
interval over every trial would treat a task's trials as independent draws.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from adapters.benchmark import BenchmarkTask, OutcomeKind
from adapters.results.metrics import DomainMetrics, Rate, RunMetrics
from adapters.results.report_text import left_out_text
from adapters.store.duckdb_store import ResultStore

if TYPE_CHECKING:
    from adapters.results.trials.report import TrialStatistics


class RunCompleteness(BaseModel):
    """How much of the selected suite has a final result, and why the rest has none."""

    status: str  # the run's final status (completed, incomplete, budget_exhausted, failed)
    selected: int  # runs.task_count: tasks selected for the run
    final: int  # tasks whose last attempt has a final (non-retryable) outcome
    not_started: int = 0  # tasks with no attempt at all (e.g. left when the budget ran out)
    retries_exhausted: int = 0  # tasks whose last attempt is still an infrastructure error
    budget_reason: str | None = None  # set when the run budget stopped the run
    missing_by_domain: dict[str, int] = Field(default_factory=dict)
    cost_usd: float | None = None  # model cost + VM cost of this invocation (budget accounting)
    unpriced: list[str] = Field(default_factory=list)  # models called without a known price: cost unknown
    tokens: int | None = None
    # Runs with repeated trials (None otherwise): trials wanted, and those with a final result.
    # A task counts as final above only once every one of its trials is.
    trials_selected: int | None = None
    trials_final: int | None = None

    @property
    def missing(self) -> int:
        """Selected tasks without a final result: what a resume would still run."""
        return max(0, self.selected - self.final)


def _label(environment: str) -> str:
    """How the summary names where the run ran; the simulation always says so."""
    return "LOCAL SIMULATION, not a Windows VM" if environment.startswith("local-simulation") else environment


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:5.1f}%"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def summary_rows(metrics: RunMetrics, completeness: RunCompleteness | None = None,
                 vm_hour_price_usd: float = 0.0, trials: TrialStatistics | str | None = None) -> list[dict[str, Any]]:
    """One row per domain plus a total row, for `create_table_artifact`: rates with their 95 %
    intervals, and cost (model, plus VM-hours at `vm_hour_price_usd`). With repeated trials
    (`trials`: the run's statistics) the sound rate of each row is the mean of its tasks' fractions
    with the interval that groups trials by task, as the headline."""
    missing = completeness.missing_by_domain if completeness else {}

    def cost(d: DomainMetrics) -> float | str:
        if d.spent.unpriced_attempts:
            return "unpriced"  # a model without a known price: not $0
        return round(d.spent.cost_usd + d.spent.vm_seconds / 3600.0 * vm_hour_price_usd, 4)

    rows = [
        {
            "domain": d.domain,
            "tasks": d.tasks,
            "successes": d.success.successes,
            "success_rate": _round(d.success.rate),
            "success_rate_sound": _round(d.success_sound.rate),
            "ci95_sound": _interval(d.success_sound),
            "avg_score": _round(d.avg_score),
            "infrastructure_errors": d.infrastructure_errors,
            "cost_usd": cost(d),
            **({"missing": missing.get(d.domain, 0)} if completeness else {}),
        }
        for d in metrics.per_domain
    ]
    # Domains whose tasks all lack a result do not appear in the summary; show them anyway.
    seen = {d.domain for d in metrics.per_domain}
    for domain, n in sorted(missing.items()):
        if domain not in seen and n:
            rows.append({"domain": domain, "tasks": 0, "successes": 0, "success_rate": 0.0,
                         "success_rate_sound": None, "ci95_sound": None, "avg_score": 0.0,
                         "infrastructure_errors": 0, "cost_usd": 0.0, "missing": n})
    overall = metrics.overall
    rows.append(
        {
            "domain": "ALL",
            "tasks": overall.tasks,
            "successes": overall.success.successes,
            "success_rate": _round(overall.success.rate or 0.0),
            "success_rate_sound": _round(overall.success_sound.rate),
            "ci95_sound": _interval(overall.success_sound),
            "avg_score": _round(overall.avg_score or 0.0),
            "infrastructure_errors": overall.infrastructure_errors,
            "cost_usd": cost(overall),
            **({"missing": completeness.missing} if completeness else {}),
        }
    )
    if trials is not None and not isinstance(trials, str):
        for row in rows:
            grouped = trials.rate if row["domain"] == "ALL" else trials.domains.get(row["domain"])
            if grouped is not None and grouped.rate is not None:
                interval = grouped.tasks_like_these.interval
                row["success_rate_sound"] = _round(grouped.rate)
                row["ci95_sound"] = None if interval is None else f"[{100 * interval[0]:.1f}%, {100 * interval[1]:.1f}%]"
    return rows


def _interval(rate: Rate) -> str | None:
    """"[20.8%, 93.9%]", or None for an empty denominator."""
    return None if rate.ci95 is None else f"[{100 * rate.ci95[0]:.1f}%, {100 * rate.ci95[1]:.1f}%]"


def _rate(rate: Rate) -> str:
    """"66.7% (2/3) [20.8%, 93.9%]"; "- (0/0)" for an empty denominator."""
    if rate.ci95 is None:
        return f"- ({rate.successes}/{rate.total})"
    low, high = rate.ci95
    return f"{_pct(rate.rate).strip()} ({rate.successes}/{rate.total}) [{_pct(low).strip()}, {_pct(high).strip()}]"


def sound_rate_line(metrics: RunMetrics, trials: TrialStatistics | str | None = None) -> str:
    """The headline rate (adapters/results/rates.py) with its interval, the raw rate and what it
    leaves out. With repeated trials (`trials`, trials/report.py) the headline groups trials by
    task and the raw rate is a count of trials, without an interval that would treat them as
    independent; without SciPy the per-trial rate stays, saying what it is."""
    overall = metrics.overall
    left_out = f"left out: {left_out_text(overall.outcomes)}"
    if trials is None:
        return (f"success rate (sound environment): {_rate(overall.success_sound)}   raw: {_rate(overall.success)}   "
                f"{left_out}")
    raw = f"raw: {overall.success.successes}/{overall.success.total} trials ({_pct(overall.success.rate).strip()})"
    if isinstance(trials, str):
        return (f"success rate (sound environment, every trial counted as independent: {trials}): "
                f"{_rate(overall.success_sound)}   {raw}   {left_out}")
    return f"{trials.headline()}   {raw}   {left_out}"


def _outcomes(metrics: RunMetrics) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(metrics.overall.outcomes.items()) if v)


def completeness_lines(completeness: RunCompleteness) -> list[str]:
    """Plain-text lines about what the run did not finish (always at least the status line)."""
    lines = [
        f"status: {completeness.status}   selected: {completeness.selected}   "
        f"final results: {completeness.final}   missing: {completeness.missing}"
    ]
    if completeness.trials_selected is not None:
        lines[0] += (f"   trials: {completeness.trials_final}/{completeness.trials_selected} with a final result "
                     f"({completeness.final}/{completeness.selected} tasks with every trial done)")
    if completeness.budget_reason:
        lines.append(
            f"STOPPED BY BUDGET: {completeness.budget_reason}; {completeness.not_started} task(s) not started"
        )
    if completeness.missing:
        parts = []
        if completeness.not_started:
            parts.append(f"{completeness.not_started} never attempted")
        if completeness.retries_exhausted:
            parts.append(f"{completeness.retries_exhausted} still infrastructure_error after the last attempt")
        other = completeness.missing - completeness.not_started - completeness.retries_exhausted
        if other > 0:
            parts.append(f"{other} other")
        lines.append(
            f"INCOMPLETE: {completeness.missing} of {completeness.selected} selected task(s) have no final result "
            f"({', '.join(parts)}); "
            "rerun with the same run id to resume"
        )
    if completeness.unpriced:
        lines.append(f"cost (model + VM): unpriced: no known price for {', '.join(completeness.unpriced)} "
                     f"(--prices FILE sets one: docs/agents.md)   tokens: {completeness.tokens or 0}")
    elif completeness.cost_usd is not None:
        lines.append(f"cost (model + VM): ${completeness.cost_usd:.4f}   tokens: {completeness.tokens or 0}")
    return lines


def format_summary(
    run_id: str, metrics: RunMetrics, environment: str, completeness: RunCompleteness | None = None,
    trials: TrialStatistics | str | None = None,
) -> str:
    """A plain-text table: success per domain, the headline (sound environment) rate and, right
    under it, the run's status and its selected tasks without a final result. `trials`: the
    run's repeated-trial statistics (trials/report.py `trial_section`) for its headline."""
    label = _label(environment)
    lines = [
        f"WAA run {run_id}  [{label}]",
        f"{'domain':<20} {'tasks':>5} {'success':>7} {'rate':>7} {'sound env':>9} {'avg score':>9}",
        "-" * 62,
    ]
    for d in metrics.per_domain:
        avg = "-" if d.avg_score is None else f"{d.avg_score:.3f}"
        lines.append(
            f"{d.domain:<20} {d.tasks:>5} {d.success.successes:>7} {_pct(d.success.rate):>7} "
            f"{_pct(d.success_sound.rate):>9} {avg:>9}"
        )
    overall = metrics.overall
    lines.append("-" * 62)
    lines.append(
        f"{'ALL':<20} {overall.tasks:>5} {overall.success.successes:>7} {_pct(overall.success.rate):>7} "
        f"{_pct(overall.success_sound.rate):>9}"
    )
    lines.append(sound_rate_line(metrics, trials))
    if completeness is not None:
        lines.extend(completeness_lines(completeness))
    lines.append(metrics.run_status().scoring_line())
    lines.append(f"feasible tasks: {_pct(overall.feasible.rate)}   infeasible tasks: {_pct(overall.infeasible.rate)}")
    lines.append(f"outcomes: {_outcomes(metrics)}")
    return "\n".join(lines)


def summary_markdown(
    run_id: str, metrics: RunMetrics, environment: str, completeness: RunCompleteness | None = None,
    trials: TrialStatistics | str | None = None,
) -> str:
    """The summary as markdown, for `create_markdown_artifact`: the headline rate and the run's
    status first, then the table (`trials` as for `format_summary`)."""
    label = _label(environment)
    rows = summary_rows(metrics, completeness, trials=trials)
    columns = list(rows[0]) if rows else ["domain"]
    headline = sound_rate_line(metrics, trials)
    out = [f"# WAA run `{run_id}`", "", f"Environment: **{label}**", ""]
    out += [f"**{headline[0].upper() + headline[1:]}**", ""]
    if completeness is not None:
        out += [f"- {line}" for line in completeness_lines(completeness)] + [""]
    out += [metrics.run_status().scoring_line(), ""]
    out.append("| " + " | ".join(columns) + " |")
    out.append("| " + " | ".join("---" for _ in columns) + " |")
    for row in rows:
        out.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    out += ["", "Outcomes (last attempt per task): " + (_outcomes(metrics) or "none")]
    return "\n".join(out)


class BudgetReading(Protocol):
    """What completeness reads of the run's budget (flows/budget.py RunBudget)."""

    reason: str | None
    tokens: int

    def cost_usd(self) -> float: ...


def run_completeness(store: ResultStore, run_id: str, tasks: list[BenchmarkTask], budget: BudgetReading,
                     trials: dict[str, int] | None = None) -> RunCompleteness:
    """What share of the selected tasks has a final result, and why the rest has none.

    `trials` (per task, the trials the run wants; 1 each when None): a task is final once every
    one of its trials has a final result; trials are counted beside when any task has more than one.
    """
    wanted = {t.task_id: (trials or {}).get(t.task_id, 1) for t in tasks}
    finished = store.finished_trials(run_id)
    final = {t for t, k in wanted.items() if all((t, n) in finished for n in range(1, k + 1))}
    latest_rows = store.latest_attempts(run_id)
    latest = {r["task_id"]: r["outcome"] for r in latest_rows}
    selected = {t.task_id for t in tasks}
    missing_by_domain: dict[str, int] = {}
    for t in tasks:
        if t.task_id not in final:
            missing_by_domain[t.domain] = missing_by_domain.get(t.domain, 0) + 1
    run = store.get_run(run_id)
    task_count = run.task_count if run is not None and run.task_count is not None else len(tasks)
    n_final = len(final & selected)
    if budget.reason is not None and n_final < task_count:
        status = "budget_exhausted"
    elif n_final < task_count:
        status = "incomplete"
    else:
        status = "completed"
    return RunCompleteness(
        status=status,
        selected=task_count,
        final=n_final,
        not_started=len(selected - set(latest)),
        retries_exhausted=sum(
            1 for t in selected - final
            if any(r["task_id"] == t and r["outcome"] == OutcomeKind.INFRASTRUCTURE_ERROR.value for r in latest_rows)
        ),
        budget_reason=budget.reason,
        missing_by_domain=missing_by_domain,
        cost_usd=round(budget.cost_usd(), 6),
        unpriced=list(budget.unpriced),
        tokens=budget.tokens,
        **({"trials_selected": sum(wanted.values()),
            "trials_final": sum(1 for t, n in finished if t in wanted and n <= wanted[t])}
           if any(k > 1 for k in wanted.values()) else {}),
    )


def problem_sections(pool_errors: list[str], shard_errors: list[str]) -> tuple[str, str]:
    """Why tasks are missing, as text and markdown to append wherever the summary is shown."""
    text, markdown = "", ""
    for title, lines in (("VMs lost during the run", pool_errors), ("shards without results", shard_errors)):
        if lines:
            text += f"\n{title}:\n" + "\n".join(f"  {e}" for e in lines)
            markdown += f"\n\n**{title[0].upper() + title[1:]}**\n\n" + "\n".join(f"- {e}" for e in lines)
    return text, markdown


def trial_statistics(rows: list[dict[str, Any]], trials: int | None) -> TrialStatistics | str | None:
    """A run's repeated-trial statistics for its summary (trials/report.py `trial_section`):
    `rows` its final attempt per task and trial, `trials` the K it asked for of every task (its
    configuration's `trials`; pass@k is for that K, whatever trials some tasks got beyond it)."""
    from adapters.results.trials.report import trial_section

    return trial_section(rows, trials)


def trials_section(section: TrialStatistics | str | None) -> tuple[str, str]:
    """For a run with repeated trials (`trial_statistics`), both estimands' intervals and
    pass@1 / pass@K / pass^K, as text and markdown to append to the summary; empty for a
    single-trial run, whose summary stays as it was. Without SciPy one line says so."""
    if section is None:
        return "", ""
    lines = [section] if isinstance(section, str) else section.lines()
    text = ("\nrepeated trials (the per-domain rows above count trials as if independent; these intervals "
            "account for trials grouped by task):\n" + "\n".join(f"  {line}" for line in lines))
    markdown = "\n\n**Repeated trials** (the per-domain rows count trials)\n\n" + "\n".join(f"- {line}" for line in lines)
    return text, markdown
