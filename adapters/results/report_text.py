"""The run report for the terminal (``arena report RUN``): provenance, a per-domain table, headline
rates with Wilson 95% intervals, effort and cost, reference accuracy and the unsolved tasks.

The headline is the success rate over the tasks whose environment was sound (infrastructure
errors and setup failures left out, adapters/results/rates.py), shown beside the raw rate, the
counts left out, and the run's status with how many selected tasks have no final result.

Strings that come from tasks, models or evaluators are data: control characters (terminal
escape sequences included) are replaced before they reach the terminal.

The formatting helpers here (`pct`, `ci`, `seconds`, `usd`, ...) are shared with the HTML report
so both say the same thing the same way.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from adapters.benchmark import UNSOUND_OUTCOMES
from adapters.results.metrics import DomainMetrics, Rate, References, RunMetrics, compute_run_metrics
from adapters.results.rates import RunStatus
from adapters.store.duckdb_store import ResultStore

if TYPE_CHECKING:
    from adapters.results.trials.report import TrialStatistics

SIMULATION_LABEL = "LOCAL SIMULATION, not a Windows VM"

PROVENANCE_GROUPS: tuple[tuple[tuple[str, str], ...], ...] = (
    (("status", "status"), ("started", "started_at"), ("finished", "finished_at")),
    (("agent", "agent"), ("model", "model_id"), ("checkpoint", "model_checkpoint"),
     ("endpoint", "model_endpoint"), ("agent config hash", "agent_config_hash")),
    (("suite", "suite"), ("suite hash", "suite_hash"), ("tasks selected", "task_count")),
    (("provider", "provider"), ("pool size", "pool_size"), ("reset level", "reset_level"),
     ("environment", "environment"), ("VM image", "vm_image")),
    (("code revision", "code_revision"), ("Prefect flow run", "prefect_flow_run_id")),
)
"""(label, `runs` column) pairs the reports show, in related groups; absent columns show "-"."""

PROVENANCE_FIELDS: tuple[tuple[str, str], ...] = tuple(pair for group in PROVENANCE_GROUPS for pair in group)

# Hashes are shown shortened in the terminal (12 hex digits identify a suite or config well enough).
_HASH_COLUMNS = frozenset({"suite_hash", "agent_config_hash"})

# C0 and C1 control characters and DEL; ESC among them, so no terminal escape sequence survives.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


# --- formatting helpers (shared with report_html) ----------------------------------------------


def pct(value: float | None, digits: int = 1) -> str:
    """0.5 -> "50.0%"; None -> "-"."""
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def ci(rate: Rate) -> str:
    """A Wilson interval as "[56.6%, 100.0%]"; "-" when the denominator is 0."""
    if rate.ci95 is None:
        return "-"
    low, high = rate.ci95
    return f"[{pct(low)}, {pct(high)}]"


def fraction(rate: Rate) -> str:
    """"12/16 75.0%", or "0/0 -" for an empty denominator."""
    return f"{rate.successes}/{rate.total} {pct(rate.rate)}"


def rate_text(rate: Rate) -> str:
    """"12/16 75.0% [50.5%, 89.8%]", or "0/0 -" for an empty denominator."""
    if rate.total == 0:
        return "0/0 -"
    return f"{fraction(rate)} {ci(rate)}"


def seconds(value: float | None) -> str:
    """Seconds for people: "0.42 s", "12.3 s", "4 min 05 s"; None -> "-"."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f} s"
    if value < 120:
        return f"{value:.1f} s"
    minutes, rest = divmod(round(value), 60)
    return f"{minutes} min {rest:02d} s"


def usd(value: float | None, *, unpriced: bool = False) -> str:
    """"$0.0123"; None -> "-"; "unpriced" when a model without a known price was called (its
    cost is not known, never $0)."""
    if unpriced:
        return "unpriced"
    return "-" if value is None else f"${value:.4f}"


def unpriced_note(attempts: int) -> str:
    """The line that says why a cost is "unpriced" (empty when it is not)."""
    if not attempts:
        return ""
    return (f"unpriced: {attempts} attempt(s) called a model without a known price; its cost is not known "
            "(--prices FILE sets one: docs/agents.md)")


def number(value: float | None, digits: int = 1) -> str:
    """A count or mean: integers stay integers; None -> "-"."""
    if value is None:
        return "-"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.{digits}f}"


def score_text(value: float | None) -> str:
    """Scores keep three decimals (WAA scores may be fractional)."""
    return "-" if value is None else f"{value:.3f}"


def timestamp(value: Any) -> str:
    """A stored (UTC) timestamp as "2025-01-01 12:00:00 UTC"."""
    if value is None:
        return "-"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S") + " UTC"
    return str(value)


def provenance_value(provenance: dict[str, Any], column: str) -> str:
    """One provenance field as text ("-" when absent or NULL)."""
    value = provenance.get(column)
    if value is None or value == "":
        return "-"
    if column in ("started_at", "finished_at"):
        return timestamp(value)
    return str(value)


def environment_label(provenance: dict[str, Any]) -> str:
    """"LOCAL SIMULATION, not a Windows VM" for the simulation, else the environment named."""
    environment = provenance.get("environment")
    if str(environment or "").startswith("local-simulation"):  # also reached as an existing server
        return SIMULATION_LABEL
    return str(environment or "environment unknown")


def outcome_counts(metrics: DomainMetrics) -> str:
    """"agent_failure=3, success=13" (only outcomes that occurred), or "none"."""
    return ", ".join(f"{k}={v}" for k, v in sorted(metrics.outcomes.items()) if v) or "none"


def left_out_text(outcomes: Mapping[str, int]) -> str:
    """What the headline rate leaves out, from its one definition (UNSOUND_OUTCOMES), e.g.
    "infrastructure errors 1, setup failures 0"."""
    return ", ".join(f"{o.value.replace('_', ' ')}s {outcomes.get(o.value, 0)}" for o in UNSOUND_OUTCOMES)


def left_out(metrics: DomainMetrics) -> int:
    """Tasks the headline rate leaves out of its denominator."""
    return metrics.tasks - metrics.success_sound.total


def incomplete_text(status: RunStatus) -> str | None:
    """None for a completed run with every selected task finished; else one line saying so, e.g.
    "INCOMPLETE: 3 of 16 selected tasks have no final result (run status: budget_exhausted)".

    Shown next to every rate, so an incomplete run never passes for a complete one.
    """
    state = status.status or "unknown"
    if status.missing:
        return (
            f"INCOMPLETE: {status.missing} of {status.selected} selected tasks have no final result "
            f"(run status: {state})"
        )
    if status.status != "completed":
        return f"INCOMPLETE: run status is {state}, not completed"
    return None


def status_line(status: RunStatus) -> str:
    """"run status: completed, every selected task has a final result" or the incomplete line."""
    return incomplete_text(status) or "run status: completed, every selected task has a final result"


def reference_line(metrics: RunMetrics) -> str:
    """One sentence on reference accuracy (or why there is none)."""
    ref = metrics.overall.reference
    if not metrics.references_given or ref is None:
        return "reference trajectories: none given (no step or grounding accuracy)"
    if ref.tasks_with_reference == 0:
        return f"reference trajectories: none of the {metrics.overall.tasks} tasks has one"
    excluded = ref.tasks_with_reference - ref.tasks_scored
    note = f", {excluded} left out (infrastructure error or setup failure)" if excluded else ""
    grounding = (
        f"{pct(ref.grounding_accuracy)} ({ref.pointer_hits}/{ref.pointer_pairs} pointer steps"
        f"{f', {ref.pointer_unverifiable} unverifiable' if ref.pointer_unverifiable else ''})"
    )
    return (
        f"reference trajectories: {ref.tasks_with_reference} of {metrics.overall.tasks} tasks{note}; "
        f"step accuracy {pct(ref.step_accuracy)} ({ref.matched_steps}/{ref.reference_steps} steps); "
        f"grounding accuracy {grounding}"
    )


def clean(text: Any, limit: int | None = None) -> str:
    """Data for one terminal line: whitespace runs collapsed, control characters replaced by "?",
    cut to `limit` characters with "..."."""
    value = " ".join(_CONTROL.sub("?", str(text)).split())
    if limit is not None and len(value) > limit:
        return value[: max(0, limit - 3)] + "..."
    return value


# --- the report --------------------------------------------------------------------------------


def _provenance_lines(metrics: RunMetrics) -> list[str]:
    lines = []
    for group in PROVENANCE_GROUPS:
        parts = []
        for label, column in group:
            value = clean(provenance_value(metrics.provenance, column), 80)
            parts.append(f"{label}: {value[:12] if column in _HASH_COLUMNS else value}")
        lines.append("  " + "   ".join(parts))
    return lines


def _domain_table(metrics: RunMetrics) -> list[str]:
    with_reference = metrics.references_given
    # The headline (sound environment) rate and its interval first, then the raw rate and how
    # many tasks the headline leaves out (infrastructure errors and setup failures).
    header = (
        f"{'domain':<20} {'tasks':>5} {'solved':>6} {'sound env':>9} {'95% CI':>17} {'raw':>7} "
        f"{'left out':>8} {'avg score':>9} {'attempts':>8}"
    )
    if with_reference:
        header += f" {'step acc':>8} {'grounding':>9}"
    rule = "-" * len(header)
    lines = [header, rule]
    for d in [*metrics.per_domain, None, metrics.overall]:
        if d is None:
            lines.append(rule)
            continue
        line = (
            f"{clean(d.domain, 20):<20} {d.tasks:>5} {d.success.successes:>6} {pct(d.success_sound.rate):>9} "
            f"{ci(d.success_sound):>17} {pct(d.success.rate):>7} {left_out(d):>8} {score_text(d.avg_score):>9} "
            f"{d.attempts:>8}"
        )
        if with_reference and d.reference is not None:
            line += f" {pct(d.reference.step_accuracy):>8} {pct(d.reference.grounding_accuracy):>9}"
        lines.append(line)
    return lines


def _effort_lines(overall: DomainMetrics) -> list[str]:
    spent = overall.spent
    unpriced = spent.unpriced_attempts > 0
    return [
        f"attempts: {overall.attempts} for {overall.tasks} tasks "
        f"({overall.retries} retries; {overall.retried_tasks} tasks retried)",
        "per task, mean (total): "
        f"steps {number(overall.steps.mean)} ({number(overall.steps.total)})   "
        f"time {seconds(overall.time_seconds.mean)} ({seconds(overall.time_seconds.total)})   "
        f"agent {seconds(overall.agent_seconds.mean)}   env {seconds(overall.env_seconds.mean)}",
        f"tokens per task, mean (total): input {number(overall.input_tokens.mean)} "
        f"({number(overall.input_tokens.total)})   output {number(overall.output_tokens.mean)} "
        f"({number(overall.output_tokens.total)})   cost {usd(overall.cost_usd.mean, unpriced=unpriced)} "
        f"({usd(overall.cost_usd.total, unpriced=unpriced)})",
        f"all attempts (retries included): time {seconds(spent.time_seconds)}   VM {seconds(spent.vm_seconds)}   "
        f"tokens {spent.input_tokens:,} in / {spent.output_tokens:,} out   model cost {usd(spent.cost_usd, unpriced=unpriced)}",
        *([unpriced_note(spent.unpriced_attempts)] if unpriced else []),
    ]


def _unsolved_lines(metrics: RunMetrics, limit: int = 100) -> list[str]:
    unsolved = [t for t in metrics.tasks if not t.success]
    lines = [f"not solved: {len(unsolved)} of {len(metrics.tasks)} tasks"]
    if unsolved:
        lines.append(f"  {'task':<36} {'domain':<14} {'outcome':<20} {'score':>5} {'att.':>4}  reason / error")
    for task in unsolved:
        why = task.error or task.reason or ""
        lines.append(
            f"  {clean(task.task_id, 36):<36} {clean(task.domain, 14):<14} {task.outcome:<20} "
            f"{score_text(task.score):>5} {task.attempts:>4}  {clean(why, limit)}"
        )
    return lines


def headline_lines(metrics: RunMetrics, trials: TrialStatistics | None = None) -> list[str]:
    """The headline rate (sound environment) and the raw rate. With repeated trials (`trials`: the
    run's TrialStatistics, adapters/results/trials/report.py) the headline is the mean of per-task
    fractions with an interval that groups trials by task, and the raw rate a count of trials
    without an interval that would treat them as independent."""
    overall = metrics.overall
    left_out = f"(left out: {left_out_text(overall.outcomes)})"
    if trials is None:
        return [f"success rate (sound environment): {rate_text(overall.success_sound)} {left_out}",
                f"success rate (raw, all tasks with a result): {rate_text(overall.success)}"]
    raw = overall.success
    return [f"{trials.headline()} {left_out}",
            f"success rate (raw, every trial with a result): {pct(raw.rate)} ({raw.successes}/{raw.total} trials)"]


def format_text_report(metrics: RunMetrics, trials: TrialStatistics | None = None) -> str:
    """The terminal report of already computed metrics (`trials`: see `headline_lines`)."""
    overall = metrics.overall
    status = metrics.run_status()
    lines = [f"WAA run report {clean(metrics.run_id)}  [{clean(environment_label(metrics.provenance))}]"]
    lines += _provenance_lines(metrics)
    lines.append("")
    if overall.tasks == 0:
        lines.append("no task results recorded for this run")
    lines += _domain_table(metrics)
    lines += [
        clean(status_line(status)),
        *headline_lines(metrics, trials),
        f"feasible tasks: {rate_text(overall.feasible)}   infeasible tasks: {rate_text(overall.infeasible)}",
        f"average score: {score_text(overall.avg_score)} "
        f"(sound environment: {score_text(overall.avg_score_sound)})",
        f"outcomes: {outcome_counts(overall)}",
        clean(status.scoring_line()),
    ]
    lines += _effort_lines(overall)
    lines.append(reference_line(metrics))
    lines.append("")
    lines += _unsolved_lines(metrics)
    return "\n".join(lines)


def render_text_report(store: ResultStore, run_id: str, references: References | None = None) -> str:
    """The terminal report of a run (``arena report RUN``); StoreError naming the run if unknown.
    A run with repeated trials gets a headline that groups trials by task and the trial
    statistics at the end, pass@k for the run's K (trials/report.py).

    `references` (task id -> ReferenceTrajectory, e.g. from `references_for_run`) adds step and
    grounding accuracy; None leaves them out and the report says so.
    """
    metrics = compute_run_metrics(store, run_id, references)
    from adapters.results.trials.report import trial_section  # SciPy is imported only for runs with trials

    section = trial_section(store.latest_attempts(run_id), configured_trials(store, run_id))
    if section is None:
        return format_text_report(metrics)
    lines = [section] if isinstance(section, str) else section.lines()
    report = format_text_report(metrics, None if isinstance(section, str) else section)
    return (report.rstrip("\n") + "\n\nRepeated trials (the rows above are one per task and trial; these "
            "intervals account for trials grouped by task):\n" + "\n".join(f"  {line}" for line in lines) + "\n")


def configured_trials(store: ResultStore, run_id: str) -> int | None:
    """The trials per task the run's configuration asked for (runs.run_config), None when it is
    not recorded: what pass@k of the run's reports is about."""
    run = store.get_run(run_id)
    value = (run.run_config or {}).get("trials") if run is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None
