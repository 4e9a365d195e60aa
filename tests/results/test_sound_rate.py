"""The headline "success rate (sound environment)" and the run's completeness, wherever a rate is shown.

Rules checked here:

- The headline rate's denominator leaves out exactly the outcomes whose environment was not sound
  (`OutcomeKind.environment_was_sound`: infrastructure errors and setup failures); the raw rate
  keeps them.
- The run metrics (DuckDB SQL) and the comparison (Python over result rows) give the same
  numbers for the same data, overall and per domain.
- An incomplete run shows "INCOMPLETE" and how many selected tasks have no final result in the
  terminal summary, the text report, the HTML report and the comparison.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.benchmark import UNSOUND_OUTCOMES, BenchmarkResult, OutcomeKind
from adapters.results.compare import compare_runs, compare_stored_runs, comparison_markdown, render_comparison_text
from adapters.results.metrics import Rate, compute_run_metrics
from adapters.results.rates import is_sound
from adapters.results.report_html import write_html_report
from adapters.results.report_text import render_text_report
from adapters.store.duckdb_store import ResultStore, RunInfo
from flows.summary import RunCompleteness, format_summary, summary_markdown, summary_rows

from .conftest import EdgeRuns


def _result(task_id: str, domain: str, outcome: OutcomeKind, attempt: int = 1) -> BenchmarkResult:
    return BenchmarkResult(
        task_id=task_id, domain=domain, outcome=outcome, success=outcome is OutcomeKind.SUCCESS,
        score=1.0 if outcome is OutcomeKind.SUCCESS else 0.0, attempt=attempt,
    )


# "partial": 16 selected, 14 recorded: 10 successes, 2 agent failures, 1 setup failure and 1
# infrastructure error (retries ran out, so not a final result): 13 final, 3 missing.
PARTIAL_OUTCOMES = (
    [OutcomeKind.SUCCESS] * 10
    + [OutcomeKind.AGENT_FAILURE] * 2
    + [OutcomeKind.SETUP_FAILURE, OutcomeKind.INFRASTRUCTURE_ERROR]
)


@pytest.fixture()
def partial_store(tmp_path: Path) -> Iterator[ResultStore]:
    """A completed run "full" (16 of 16 tasks) and an incomplete run "partial" (13 of 16 final)."""
    with ResultStore(tmp_path / "partial.duckdb") as store:
        for run_id in ("full", "partial"):
            store.start_run(RunInfo(run_id=run_id, agent="scripted", suite="bundled", task_count=16,
                                    environment="local-simulation"))
        for i in range(16):
            store.record_result("full", _result(f"t{i:02d}", "notepad" if i < 8 else "settings",
                                                OutcomeKind.SUCCESS if i % 2 else OutcomeKind.AGENT_FAILURE))
        for i, outcome in enumerate(PARTIAL_OUTCOMES):
            store.record_result("partial", _result(f"t{i:02d}", "notepad" if i < 8 else "settings", outcome))
        store.finish_run("full", "completed")
        store.finish_run("partial", "incomplete")
        yield store


# --- the denominator -----------------------------------------------------------------------------


def test_the_sound_denominator_is_the_enum_definition_for_every_outcome(tmp_path: Path) -> None:
    """One task per outcome kind: the SQL (metrics) and Python (comparison) filters both leave out
    exactly the kinds whose environment was not sound."""
    assert set(UNSOUND_OUTCOMES) == {OutcomeKind.INFRASTRUCTURE_ERROR, OutcomeKind.SETUP_FAILURE}
    sound_kinds = [k for k in OutcomeKind if k.environment_was_sound]
    assert all(is_sound(k.value) == k.environment_was_sound for k in OutcomeKind)
    with ResultStore(tmp_path / "kinds.duckdb") as store:
        store.start_run(RunInfo(run_id="kinds", agent="scripted", suite="bundled", task_count=len(OutcomeKind)))
        for kind in OutcomeKind:
            store.record_result("kinds", _result(f"task-{kind.value}", "d", kind))
        overall = compute_run_metrics(store, "kinds").overall
        compared = compare_stored_runs(store, "kinds", "kinds").overall
    assert overall.success == Rate.of(1, len(OutcomeKind))
    assert overall.success_sound == Rate.of(1, len(sound_kinds))
    assert (compared.baseline_successes_sound, compared.baseline_total_sound) == (1, len(sound_kinds))
    assert compared.baseline_left_out == len(OutcomeKind) - len(sound_kinds)


def test_setup_failure_and_infrastructure_error_are_out_of_the_sound_rate_only(partial_store: ResultStore) -> None:
    metrics = compute_run_metrics(partial_store, "partial")
    overall = metrics.overall
    # Raw: 10 of all 14 tasks with a result; headline: 10 of the 12 with a sound environment.
    assert overall.success == Rate.of(10, 14)
    assert overall.success_sound == Rate.of(10, 12)
    assert (overall.infrastructure_errors, overall.setup_failures) == (1, 1)
    assert overall.avg_score_sound == pytest.approx(10 / 12) and overall.avg_score == pytest.approx(10 / 14)
    c = compare_runs(
        [{"task_id": t.task_id, "domain": t.domain, "outcome": t.outcome, "success": t.success} for t in metrics.tasks],
        [], "partial", "nothing",
    ).overall
    assert (c.baseline_successes, c.baseline_total, c.baseline_successes_sound, c.baseline_total_sound) == (10, 14, 10, 12)
    assert c.baseline_left_out == 2
    # The terminal summary's headline line: the sound rate with its interval, the raw rate, what is left out.
    low, high = Rate.of(10, 12).ci95  # type: ignore[misc]
    text = format_summary("partial", metrics, "local-simulation")
    assert (
        f"success rate (sound environment): 83.3% (10/12) [{100 * low:.1f}%, {100 * high:.1f}%]   "
        "raw: 71.4% (10/14) [" in text
    )
    assert "left out: setup failures 1, infrastructure errors 1" in text
    rows = {r["domain"]: r for r in summary_rows(metrics)}
    assert rows["ALL"]["success_rate_sound"] == round(10 / 12, 4) and rows["ALL"]["success_rate"] == round(10 / 14, 4)


def _same(rate: Rate, successes: int, total: int, value: float | None, ci95: tuple[float, float] | None) -> None:
    assert (rate.successes, rate.total, rate.rate, rate.ci95) == (successes, total, value, ci95)


@pytest.mark.parametrize("run", ["mixed", "partial"])
def test_metrics_and_compare_give_the_same_rates(
    run: str, metrics_edge_runs: EdgeRuns, metrics_edge_store: ResultStore, partial_store: ResultStore
) -> None:
    store, run_id = (metrics_edge_store, metrics_edge_runs.mixed) if run == "mixed" else (partial_store, "partial")
    metrics = compute_run_metrics(store, run_id)
    comparison = compare_stored_runs(store, run_id, run_id)
    by_domain = {d.domain: d for d in comparison.domains}
    for m in [*metrics.per_domain, metrics.overall]:
        c = by_domain[m.domain]
        for side in ("baseline", "new"):
            _same(m.success_sound, getattr(c, f"{side}_successes_sound"), getattr(c, f"{side}_total_sound"),
                  getattr(c, f"{side}_rate_sound"), getattr(c, f"{side}_ci95_sound"))
            _same(m.success, getattr(c, f"{side}_successes"), getattr(c, f"{side}_total"),
                  getattr(c, f"{side}_rate"), getattr(c, f"{side}_ci95"))
    # And the run status both read from the runs table.
    assert comparison.baseline_status == metrics.run_status()


# --- incomplete runs -------------------------------------------------------------------------------

INCOMPLETE = "INCOMPLETE: 3 of 16 selected tasks have no final result (run status: incomplete)"


def test_an_incomplete_run_says_so_in_the_terminal_summary(partial_store: ResultStore) -> None:
    metrics = compute_run_metrics(partial_store, "partial")
    completeness = RunCompleteness(status="incomplete", selected=16, final=13, not_started=2, retries_exhausted=1,
                                   missing_by_domain={"settings": 3})
    text = format_summary("partial", metrics, "local-simulation", completeness)
    lines = text.splitlines()
    headline = next(i for i, line in enumerate(lines) if line.startswith("success rate (sound environment)"))
    # Right under the headline rate: the status, the missing count and why.
    assert lines[headline + 1] == "status: incomplete   selected: 16   final results: 13   missing: 3"
    assert lines[headline + 2].startswith("INCOMPLETE: 3 of 16 selected task(s) have no final result (2 never attempted, "
                                          "1 still infrastructure_error after the last attempt)")
    markdown = summary_markdown("partial", metrics, "local-simulation", completeness)
    assert "- status: incomplete   selected: 16   final results: 13   missing: 3" in markdown
    assert "- INCOMPLETE: 3 of 16 selected task(s) have no final result" in markdown
    assert markdown.index("**Success rate (sound environment): 83.3% (10/12)") < markdown.index("- status: incomplete")
    # A complete run says it is complete, with nothing missing.
    done = RunCompleteness(status="completed", selected=16, final=16)
    full = format_summary("full", compute_run_metrics(partial_store, "full"), "local-simulation", done)
    assert "status: completed   selected: 16   final results: 16   missing: 0" in full and "INCOMPLETE" not in full


def test_an_incomplete_run_says_so_in_the_text_and_html_reports(partial_store: ResultStore, tmp_path: Path) -> None:
    report = render_text_report(partial_store, "partial")
    lines = report.splitlines()
    status_at = lines.index(INCOMPLETE)
    assert lines[status_at + 1].startswith("success rate (sound environment): 10/12 83.3% [")
    assert "run status: completed, every selected task has a final result" in render_text_report(partial_store, "full")

    page = write_html_report(partial_store, "partial", tmp_path / "partial.html").read_text(encoding="utf-8")
    # A visible card beside the rate cards, and a banner above the cards and the per-domain chart.
    assert ('<div class="card status incomplete" id="incomplete"><div class="sub">run status: incomplete</div>'
            '<div class="big">incomplete</div><div class="sub">3 of 16 selected tasks have no final result</div></div>'
            ) in page
    assert page.count(f'<p class="banner incomplete">{INCOMPLETE}</p>') == 2
    headline = page.index("success rate (sound environment)</div>")
    assert headline < page.index('id="incomplete"') < page.index("feasible tasks</div>")
    full = write_html_report(partial_store, "full", tmp_path / "full.html").read_text(encoding="utf-8")
    assert 'class="card status complete"' in full and "INCOMPLETE" not in full


def test_an_incomplete_run_says_so_in_the_comparison(partial_store: ResultStore) -> None:
    c = compare_stored_runs(partial_store, "full", "partial")
    assert c.warnings() == [f"new run partial: {INCOMPLETE}"]
    text, md = render_comparison_text(c), comparison_markdown(c, "partial vs full")
    assert f"WARNING: new run partial: {INCOMPLETE}" in text and f"**Warning: new run partial: {INCOMPLETE}.**" in md
    for report in (text, md):
        assert "baseline run full: status completed, 0 of 16 selected tasks without a final result; " in report
        assert ("new run partial: status incomplete, 3 of 16 selected tasks without a final result; "
                "success rate (sound environment) 83.3% (10/12)") in report
    # Completed both ways round: no warning.
    assert compare_stored_runs(partial_store, "full", "full").warnings() == []
