"""The end of a run that finished: its summary in the log, as the Prefect artifacts, and as the
flow's outcome (flows/summary.py formats it; adapters/results computes it)."""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from adapters.benchmark import BenchmarkResult
from adapters.results.metrics import compute_run_metrics
from adapters.store.duckdb_store import ResultStore
from flows.bookkeeping import best_effort, slug
from flows.run_config import RunOutcome, SuiteRunConfig
from flows.summary import (
    RunCompleteness,
    format_summary,
    problem_sections,
    summary_markdown,
    summary_rows,
    trial_statistics,
    trials_section,
)


def summarize(
    config: SuiteRunConfig, run_id: str, selected: int, environment: str, store: ResultStore,
    completeness: RunCompleteness, results: list[BenchmarkResult], pool_errors: list[str], shard_errors: list[str],
    hedging: str | None = None,
) -> RunOutcome:
    """The run's summary: in the log, as the summary artifacts, and as the flow's return value.
    `hedging`: what hedge copies did and cost (flows/hedging.py), when any ran."""
    logger = get_run_logger()
    summary = compute_run_metrics(store, run_id)
    extra_text, extra_markdown = problem_sections(pool_errors, shard_errors)
    if hedging is not None:
        extra_text, extra_markdown = f"\n{hedging}" + extra_text, f"\n\n{hedging}" + extra_markdown
    # pass@k is for the K this run asked for of every task (not the most trials one task got).
    trials = trial_statistics(store.latest_attempts(run_id), config.trials)
    trials_text, trials_markdown = trials_section(trials)
    extra_text, extra_markdown = trials_text + extra_text, trials_markdown + extra_markdown
    table = format_summary(run_id, summary, environment, completeness, trials) + extra_text
    markdown = summary_markdown(run_id, summary, environment, completeness, trials) + extra_markdown
    logger.info("Run summary\n%s", table)
    if completeness.missing:
        logger.warning(
            "run %s is %s: %d of %d selected tasks have no final result",
            run_id, completeness.status, completeness.missing, completeness.selected,
        )
    description = f"WAA run {run_id}: {config.agent} agent on {selected} tasks ({environment}), {completeness.status}"
    rows = summary_rows(summary, completeness, config.vm_hour_price_usd, trials)
    # One series per baseline (its nights side by side in the UI's artifact history), else per run.
    series = slug(config.baseline or run_id)
    best_effort("publishing the summary table artifact",
                lambda: create_table_artifact(key=f"waa-summary-{series}", table=rows, description=description))
    best_effort("publishing the summary report artifact",
                lambda: create_markdown_artifact(key=f"waa-report-{series}", markdown=markdown, description=description))
    return RunOutcome(
        run_id=run_id,
        store=store.location,
        results=results,
        table=table,
        status=completeness.status,
        completeness=completeness,
        shard_errors=shard_errors,
        pool_errors=pool_errors,
    )
