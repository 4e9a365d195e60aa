"""The end-of-run summary: a terminal table and the rows of the Prefect table artifact."""

from __future__ import annotations

from typing import Any

from adapters.store.duckdb_store import RunSummary


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:5.1f}%"


def summary_rows(summary: RunSummary) -> list[dict[str, Any]]:
    """One row per domain plus a total row, for `create_table_artifact`."""
    rows = [
        {
            "domain": d.domain,
            "tasks": d.total,
            "successes": d.successes,
            "success_rate": round(d.success_rate, 4),
            "avg_score": round(d.avg_score, 4),
        }
        for d in summary.per_domain
    ]
    rows.append(
        {
            "domain": "ALL",
            "tasks": summary.total,
            "successes": summary.successes,
            "success_rate": round(summary.success_rate, 4),
            "avg_score": round(sum(d.avg_score * d.total for d in summary.per_domain) / max(1, summary.total), 4),
        }
    )
    return rows


def format_summary(run_id: str, summary: RunSummary, environment: str) -> str:
    """A plain-text table: success per domain, then totals raw and excluding infrastructure errors."""
    label = "LOCAL SIMULATION, not a Windows VM" if environment == "local-simulation" else environment
    lines = [
        f"WAA run {run_id}  [{label}]",
        f"{'domain':<20} {'tasks':>5} {'success':>7} {'rate':>7} {'avg score':>9}",
        "-" * 52,
    ]
    for d in summary.per_domain:
        lines.append(f"{d.domain:<20} {d.total:>5} {d.successes:>7} {_pct(d.success_rate):>7} {d.avg_score:>9.3f}")
    lines.append("-" * 52)
    lines.append(f"{'ALL':<20} {summary.total:>5} {summary.successes:>7} {_pct(summary.success_rate):>7}")
    lines.append(f"success rate excluding infrastructure errors: {_pct(summary.success_rate_excluding_infra)}")
    lines.append(
        f"feasible tasks: {_pct(summary.feasible_success_rate)}   infeasible tasks: {_pct(summary.infeasible_success_rate)}"
    )
    outcomes = ", ".join(f"{k}={v}" for k, v in sorted(summary.per_outcome.items()) if v)
    lines.append(f"outcomes: {outcomes}")
    return "\n".join(lines)
