"""The live progress a person watching a run sees: the side file, the artifact's line, the
terminal's line."""

from __future__ import annotations

import io
import json
from pathlib import Path

from adapters.benchmark import BenchmarkResult, ModelUsage, OutcomeKind
from adapters.results.stats import wilson_interval
from flows.progress import RunProgress, progress_line
from flows.terminal import ProgressPrinter


def _result(task_id: str, outcome: OutcomeKind, cost: float = 0.0, tokens: int = 0, attempt: int = 1) -> BenchmarkResult:
    return BenchmarkResult(
        task_id=task_id, outcome=outcome, success=outcome is OutcomeKind.SUCCESS, attempt=attempt,
        usage=ModelUsage(calls=1, input_tokens=tokens, output_tokens=0, cost_usd=cost),
    )


def test_progress_counts_success_errors_cost_and_eta(prefect_server: None, tmp_path: Path) -> None:
    side = tmp_path / "progress.json"
    progress = RunProgress("r", selected=4, final=0, side_file=side)
    progress.expect_attempts(2)  # two attempts each
    progress.recorded(_result("a", OutcomeKind.SUCCESS, cost=0.01, tokens=100))
    progress.recorded(_result("b", OutcomeKind.INFRASTRUCTURE_ERROR))  # retried: not done yet
    progress.recorded(_result("b", OutcomeKind.AGENT_FAILURE, cost=0.02, tokens=50, attempt=2))
    data = json.loads(side.read_text())
    assert (data["done"], data["final"], data["selected"], data["attempts_recorded"]) == (2, 2, 4, 3)
    assert (data["successes"], data["scored"], data["infrastructure_errors"]) == (1, 2, 1)
    assert data["success_ci95"] == list(wilson_interval(1, 2))
    assert data["cost_usd"] == 0.03 and data["tokens"] == 150 and data["eta_seconds"] is not None
    line = progress_line(data)
    assert line.startswith("2/4 done, success 1/2 50% [") and "infra errors: 1 task(s), 1 attempt(s)" in line
    assert "cost $0.0300, 150 tokens" in line and "ETA " in line
    # A setup failure is final but says nothing about the agent: out of the success so far.
    progress.recorded(_result("c", OutcomeKind.SETUP_FAILURE))
    # A task whose last attempt is an infrastructure error is done too: its retries are used up.
    progress.recorded(_result("d", OutcomeKind.INFRASTRUCTURE_ERROR))
    progress.recorded(_result("d", OutcomeKind.INFRASTRUCTURE_ERROR, attempt=2))
    data = json.loads(side.read_text())
    assert (data["done"], data["final"], data["retries_exhausted"], data["scored"], data["successes"]) == (4, 3, 1, 2, 1)
    assert (data["infrastructure_error_tasks"], data["infrastructure_errors"]) == (2, 3)
    assert "1 out of retries" in progress_line(data)
    progress.finish("incomplete")
    final = json.loads(side.read_text())
    assert final["eta_seconds"] is None and final["status"] == "incomplete"
    assert "ETA" not in progress_line(final) and progress_line(final).endswith(", incomplete")
    assert progress.artifact_key() == "waa-progress-r"


def test_the_cost_so_far_includes_the_vm_cost_when_the_run_reckons_it(tmp_path: Path) -> None:
    progress = RunProgress("r", selected=1, final=0, side_file=tmp_path / "p.json", cost=lambda: 1.25)
    progress.recorded(_result("a", OutcomeKind.SUCCESS, cost=0.25))
    assert json.loads((tmp_path / "p.json").read_text())["cost_usd"] == 1.25


def test_the_terminal_prints_a_line_per_change(tmp_path: Path) -> None:
    side = tmp_path / "progress.json"
    out = io.StringIO()
    with ProgressPrinter(side, stream=out, interval=0.01):
        side.write_text(json.dumps({"final": 1, "selected": 2, "status": "running"}))
    assert out.getvalue() == "progress: 1/2 done, infra errors: 0\n"


def test_the_progress_line_says_when_rates_are_scored_as_waa_scores_them() -> None:
    snapshot = {"final": 2, "selected": 4, "successes": 1, "scored": 2, "status": "running"}
    assert "scoring" not in progress_line({**snapshot, "scoring": "strict"})
    assert "success 1/2 50% (scoring waa-compat)" in progress_line({**snapshot, "scoring": "waa-compat"})


def test_progress_with_trials_counts_trials_and_tasks(tmp_path: Path) -> None:
    """A run with repeated trials: "5/6 trials, 1/2 tasks done"; a trial out of retries is done."""
    side = tmp_path / "progress.json"
    progress = RunProgress("r", selected=6, final=1, side_file=side, trials_per_task={"a": 3, "b": 3},
                           done_per_task={"a": 1})
    progress.expect_attempts(2)
    for trial in (2, 3):
        progress.recorded(_result("a", OutcomeKind.SUCCESS).model_copy(update={"trial": trial}))
    progress.recorded(_result("b", OutcomeKind.AGENT_FAILURE))
    progress.recorded(_result("b", OutcomeKind.INFRASTRUCTURE_ERROR).model_copy(update={"trial": 2}))
    data = json.loads(side.read_text())
    assert (data["done"], data["tasks_done"]) == (4, 1)  # b's trial 2 has a retry left
    progress.recorded(_result("b", OutcomeKind.INFRASTRUCTURE_ERROR, attempt=3).model_copy(update={"trial": 2}))
    data = json.loads(side.read_text())
    assert (data["done"], data["retries_exhausted"], data["tasks_done"]) == (5, 1, 1)
    # The rate is the mean over tasks (a 2/2, b 0/1), its interval groups trials by task.
    assert progress_line(data).startswith("5/6 trials, 1/2 tasks done, success 2/3 trials, 50% by task [")
    assert data["success_rate_by_task"] == 0.5 and data["success_ci95"] != list(wilson_interval(2, 3))
