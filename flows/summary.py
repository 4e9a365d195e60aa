"""The end-of-run summary: a terminal table, the rows of the Prefect table artifact and a
markdown report.

A run is never silently partial: `RunCompleteness` says how many selected tasks have no final
result (never attempted, stopped by the budget, or still on an infrastructure error after the
last attempt), and every rendering shows it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from adapters.store.duckdb_store import RunSummary


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
    tokens: int | None = None

    @property
    def missing(self) -> int:
        """Selected tasks without a final result: what a resume would still run."""
        return max(0, self.selected - self.final)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:5.1f}%"


def summary_rows(summary: RunSummary, completeness: RunCompleteness | None = None) -> list[dict[str, Any]]:
    """One row per domain plus a total row, for `create_table_artifact`."""
    missing = completeness.missing_by_domain if completeness else {}
    rows = [
        {
            "domain": d.domain,
            "tasks": d.total,
            "successes": d.successes,
            "success_rate": round(d.success_rate, 4),
            "success_rate_sound": None if d.success_rate_sound is None else round(d.success_rate_sound, 4),
            "avg_score": round(d.avg_score, 4),
            **({"missing": missing.get(d.domain, 0)} if completeness else {}),
        }
        for d in summary.per_domain
    ]
    # Domains whose tasks all lack a result do not appear in the summary; show them anyway.
    seen = {d.domain for d in summary.per_domain}
    for domain, n in sorted(missing.items()):
        if domain not in seen and n:
            rows.append({"domain": domain, "tasks": 0, "successes": 0, "success_rate": 0.0, "avg_score": 0.0, "missing": n})
    rows.append(
        {
            "domain": "ALL",
            "tasks": summary.total,
            "successes": summary.successes,
            "success_rate": round(summary.success_rate or 0.0, 4),
            "success_rate_sound": None if summary.success_rate_sound is None else round(summary.success_rate_sound, 4),
            "avg_score": round(sum((d.avg_score or 0.0) * d.total for d in summary.per_domain) / max(1, summary.total), 4),
            **({"missing": completeness.missing} if completeness else {}),
        }
    )
    return rows


def sound_rate_line(summary: RunSummary) -> str:
    """The headline rate (adapters/results/rates.py) with what it leaves out."""
    return (
        f"success rate (sound environment): {_pct(summary.success_rate_sound).strip()}   left out: "
        f"{summary.infrastructure_errors} infrastructure error(s), {summary.setup_failures} setup failure(s)"
    )


def completeness_lines(completeness: RunCompleteness) -> list[str]:
    """Plain-text lines about what the run did not finish (always at least the status line)."""
    lines = [
        f"status: {completeness.status}   selected: {completeness.selected}   "
        f"final results: {completeness.final}   missing: {completeness.missing}"
    ]
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
            f"INCOMPLETE: {completeness.missing} selected task(s) have no final result ({', '.join(parts)}); "
            "rerun with the same run id to resume"
        )
    if completeness.cost_usd is not None:
        lines.append(f"cost (model + VM): ${completeness.cost_usd:.4f}   tokens: {completeness.tokens or 0}")
    return lines


def format_summary(
    run_id: str, summary: RunSummary, environment: str, completeness: RunCompleteness | None = None
) -> str:
    """A plain-text table: success per domain, the headline (sound environment) rate, the status."""
    label = "LOCAL SIMULATION, not a Windows VM" if environment == "local-simulation" else environment
    lines = [
        f"WAA run {run_id}  [{label}]",
        f"{'domain':<20} {'tasks':>5} {'success':>7} {'rate':>7} {'avg score':>9}",
        "-" * 52,
    ]
    for d in summary.per_domain:
        avg = "-" if d.avg_score is None else f"{d.avg_score:.3f}"
        lines.append(f"{d.domain:<20} {d.total:>5} {d.successes:>7} {_pct(d.success_rate):>7} {avg:>9}")
    lines.append("-" * 52)
    lines.append(f"{'ALL':<20} {summary.total:>5} {summary.successes:>7} {_pct(summary.success_rate):>7}")
    lines.append(sound_rate_line(summary))
    lines.append(
        f"feasible tasks: {_pct(summary.feasible_success_rate)}   infeasible tasks: {_pct(summary.infeasible_success_rate)}"
    )
    outcomes = ", ".join(f"{k}={v}" for k, v in sorted(summary.per_outcome.items()) if v)
    lines.append(f"outcomes: {outcomes}")
    if completeness is not None:
        lines.extend(completeness_lines(completeness))
    return "\n".join(lines)


def summary_markdown(
    run_id: str, summary: RunSummary, environment: str, completeness: RunCompleteness | None = None
) -> str:
    """The summary as markdown, for `create_markdown_artifact`."""
    label = "LOCAL SIMULATION, not a Windows VM" if environment == "local-simulation" else environment
    rows = summary_rows(summary, completeness)
    columns = list(rows[0]) if rows else ["domain"]
    out = [f"# WAA run `{run_id}`", "", f"Environment: **{label}**", ""]
    if completeness is not None:
        out += [f"- {line}" for line in completeness_lines(completeness)] + [""]
    out.append("| " + " | ".join(columns) + " |")
    out.append("| " + " | ".join("---" for _ in columns) + " |")
    for row in rows:
        out.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    out += [
        "",
        sound_rate_line(summary)[0].upper() + sound_rate_line(summary)[1:],
        "",
        "Outcomes (last attempt per task): "
        + (", ".join(f"{k}={v}" for k, v in sorted(summary.per_outcome.items()) if v) or "none"),
    ]
    return "\n".join(out)
