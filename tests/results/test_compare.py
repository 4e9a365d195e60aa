"""Run comparison: rates and intervals, flips, infrastructure errors kept apart, the verdict, and
reading both runs from a real DuckDB result store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from adapters.results.source import UnknownRunError
from adapters.benchmark import BenchmarkResult, OutcomeKind
from adapters.results.compare import (
    compare_runs,
    compare_stored_runs,
    comparison_markdown,
    final_attempts,
    render_comparison_text,
    stored_run_status,
)
from adapters.results.stats import mcnemar_exact, paired_difference_interval, unpaired_difference_interval
from adapters.results.stats import wilson_interval
from adapters.store.duckdb_store import ResultStore, RunInfo, StoreError


def _row(task_id: str, domain: str, outcome: str, attempt: int | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"task_id": task_id, "domain": domain, "outcome": outcome, "success": outcome == "success"}
    if attempt is not None:
        row["attempt"] = attempt
    return row


def _runs(spec: dict[str, tuple[str, str | None, str | None]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """{task_id: (domain, baseline outcome or None, new outcome or None)} -> (baseline rows, new rows)."""
    base = [_row(t, d, b) for t, (d, b, _) in spec.items() if b is not None]
    new = [_row(t, d, n) for t, (d, _, n) in spec.items() if n is not None]
    return base, new


S, F, INFRA, TIMEOUT = "success", "agent_failure", "infrastructure_error", "timeout"


def test_comparison_counts_flips_and_keeps_infrastructure_errors_apart() -> None:
    base, new = _runs(
        {
            "n1": ("notepad", S, S),
            "n2": ("notepad", F, S),  # fixed
            "n3": ("notepad", S, INFRA),  # infra in the new run: not a flip
            "s1": ("settings", S, TIMEOUT),  # broken
            "s2": ("settings", INFRA, S),  # infra in the baseline: not a flip
            "s3": ("settings", F, F),
            "v1": ("vlc", S, None),
            "c1": ("chrome", None, F),
        }
    )
    c = compare_runs(base, new, "base", "new")
    assert [f.task_id for f in c.fixed] == ["n2"] and [f.task_id for f in c.broken] == ["s1"]
    assert (c.broken[0].baseline_outcome, c.broken[0].new_outcome) == (S, TIMEOUT)
    assert [(f.task_id, f.baseline_outcome, f.new_outcome) for f in c.left_out] == [
        ("n3", S, INFRA),
        ("s2", INFRA, S),
    ]
    assert c.only_in_baseline == ["v1"] and c.only_in_new == ["c1"]
    t = c.test
    assert (t.paired_tasks, t.both_succeeded, t.both_failed, t.fixed, t.broken) == (4, 1, 1, 1, 1)
    assert t.p_value == 1.0 and c.verdict == "no significant difference"

    rows = {d.domain: d for d in c.domains}
    assert [d.domain for d in c.domains] == ["chrome", "notepad", "settings", "vlc", "ALL"]
    notepad = rows["notepad"]
    # Each run's rate counts all its tasks, infrastructure errors included, with Wilson intervals.
    assert (notepad.baseline_successes, notepad.baseline_total, notepad.new_successes, notepad.new_total) == (2, 3, 2, 3)
    assert notepad.baseline_ci95 == wilson_interval(2, 3) and notepad.new_left_out == 1
    # The delta is paired over n1 and n2 only (n3 had an infrastructure error): +1 of 2.
    assert notepad.paired_tasks == 2 and notepad.delta_method == "paired" and notepad.delta == 0.5
    assert notepad.delta_ci95 == paired_difference_interval(1, 1, 0, 0)
    assert notepad.delta_basis == "paired, 2 tasks: 1 -> 2 solved"
    # Only one run has tasks in vlc / chrome: no delta at all.
    assert rows["vlc"].delta is None and rows["vlc"].delta_method is None and rows["chrome"].delta is None
    everything = rows["ALL"]
    assert (everything.baseline_total, everything.new_total, everything.paired_tasks) == (7, 7, 4)
    assert everything.delta == 0.0 and everything.delta_ci95 == paired_difference_interval(1, 1, 1, 1)
    assert c.overall is everything


def test_verdict_improved_and_regressed_follow_the_exact_mcnemar_test() -> None:
    # 10 paired tasks, 7 fixed and none broken: p = 2 / 2^7 = 0.0156 < 0.05.
    spec = {f"t{i}": ("d", F, S if i < 7 else F) for i in range(10)}
    improved = compare_runs(*_runs(spec), "a", "b")
    assert improved.verdict == "improved" and improved.p_value == pytest.approx(2 / 2**7)
    assert improved.p_value == mcnemar_exact(0, 7)
    low, high = improved.overall.delta_ci95  # type: ignore[misc]
    assert 0 < low < 0.7 < high
    # The same runs the other way round.
    base, new = _runs(spec)
    regressed = compare_runs(new, base, "b", "a")
    assert regressed.verdict == "regressed" and regressed.test.broken == 7 and regressed.overall.delta == -0.7
    # 4 fixed, 0 broken: p = 0.125, not significant; but significant at alpha = 0.2.
    spec4 = {f"t{i}": ("d", F, S if i < 4 else F) for i in range(10)}
    assert compare_runs(*_runs(spec4), "a", "b").verdict == "no significant difference"
    assert compare_runs(*_runs(spec4), "a", "b", alpha=0.2).verdict == "improved"


def test_insufficient_data_without_paired_tasks() -> None:
    # Disjoint task sets: the domain delta is unpaired, the verdict has nothing to pair.
    base, new = _runs({"a1": ("d", S, None), "a2": ("d", S, None), "b1": ("d", None, F), "b2": ("d", None, S)})
    c = compare_runs(base, new, "x", "y")
    assert c.verdict == "insufficient data" and c.p_value is None and c.test.paired_tasks == 0
    d = c.domains[0]
    assert d.delta_method == "unpaired" and d.delta == -0.5 and d.delta_basis == "unpaired: 2/2 vs 1/2 solved"
    assert d.delta_ci95 == unpaired_difference_interval(1, 2, 2, 2)
    # Only infrastructure errors in common: still nothing to pair.
    base, new = _runs({"a": ("d", INFRA, S), "b": ("d", F, INFRA)})
    assert compare_runs(base, new, "x", "y").verdict == "insufficient data"
    # No rows at all.
    empty = compare_runs([], [], "x", "y")
    assert empty.verdict == "insufficient data" and [d.domain for d in empty.domains] == ["ALL"]
    assert empty.overall.baseline_rate is None and empty.overall.delta is None


def test_rows_with_every_attempt_use_the_last_one() -> None:
    base = [_row("t", "d", INFRA, attempt=1), _row("t", "d", S, attempt=2)]
    new = [_row("t", "d", S, attempt=2), _row("t", "d", INFRA, attempt=1), _row("u", "d", F, attempt=1)]
    c = compare_runs(base, new, "a", "b")
    assert c.left_out == [] and c.test.both_succeeded == 1 and c.only_in_new == ["u"]


@pytest.mark.parametrize(
    ("base", "message"),
    [
        ([{"task_id": "t", "success": True}], "result row #1 of run 'a' lacks outcome"),
        ([_row("t", "d", S), _row("t", "d", F)], "run 'a' has task 't' more than once"),
    ],
)
def test_bad_rows_are_named(base: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ValueError) as info:
        compare_runs(base, [], "a", "b")
    assert message in str(info.value)


def test_alpha_must_be_a_probability() -> None:
    with pytest.raises(ValueError, match="alpha must be between 0 and 1"):
        compare_runs([], [], "a", "b", alpha=5)


def test_markdown_and_text_show_intervals_p_value_and_verdict() -> None:
    spec = {f"t{i}": ("notepad" if i < 5 else "settings", S, F if i < 6 else S) for i in range(10)}
    spec["x"] = ("settings", INFRA, S)
    c = compare_runs(*_runs(spec), "nightly-1", "ckpt-7")
    assert c.verdict == "regressed" and c.test.broken == 6
    md = comparison_markdown(c, "ckpt-7 vs baseline")
    assert md.startswith("# ckpt-7 vs baseline\n")
    assert "**Verdict: regressed (exact McNemar over 10 paired tasks: 0 fixed, 6 broken" in md
    assert "p = 0.031 < alpha 0.05" in md
    lo, hi = c.domains[0].delta_ci95  # type: ignore[misc]
    assert (
        f"| notepad | 100.0% (5/5) | 0.0% (0/5) | -100.0 pts | [{100 * lo:+.1f}, {100 * hi:+.1f}] pts "
        "| paired, 5 tasks: 5 -> 0 solved | [56.6%, 100.0%] | [0.0%, 43.4%] | 100.0% (5/5) | 0.0% (0/5) |" in md
    )
    # settings: the baseline's infrastructure error is out of its headline rate, in its raw rate.
    settings = next(line for line in md.splitlines() if line.startswith("| settings |"))
    assert settings.startswith("| settings | 100.0% (5/5) | 83.3% (5/6) |") and settings.endswith(
        "| 83.3% (5/6) | 83.3% (5/6) |")
    assert "baseline run nightly-1: status not known (compared from result rows)" in md
    assert "## Broken (succeeded before, fail now): 6" in md and "- `t5` (settings): success -> agent_failure" in md
    assert "## Infrastructure errors and setup failures, not compared: 1" in md and "`x` (settings): infrastructure_error -> success" in md

    text = render_comparison_text(c)
    assert "Run comparison: new 'ckpt-7' vs baseline 'nightly-1'" in text
    assert "Verdict: regressed" in text and "p = 0.031" in text
    notepad_line = next(line for line in text.splitlines() if line.startswith("notepad"))
    assert "100.0% (5/5)" in notepad_line and "[56.6%, 100.0%]" in notepad_line and "-100.0 pts" in notepad_line
    assert ("baseline run nightly-1: status not known (compared from result rows); success rate (sound "
            "environment) 100.0% (10/10) [72.2%, 100.0%], raw 90.9% (10/11), left out: setup failures 0, "
            "infrastructure errors 1") in text
    assert "infrastructure errors and setup failures, not compared: 1" in text and "  x (settings): infrastructure_error -> success" in text


def test_insufficient_data_is_explained_in_reports() -> None:
    c = compare_runs([_row("a", "d", S)], [_row("b", "d", S)], "x", "y")
    assert "insufficient data" in comparison_markdown(c, "t") and "insufficient data" in render_comparison_text(c)
    assert "only in the baseline run: a" in render_comparison_text(c)


# --- from DuckDB -----------------------------------------------------------------------------


def _result(task_id: str, domain: str, outcome: OutcomeKind, attempt: int = 1) -> BenchmarkResult:
    return BenchmarkResult(
        task_id=task_id,
        domain=domain,
        outcome=outcome,
        success=outcome is OutcomeKind.SUCCESS,
        score=1.0 if outcome is OutcomeKind.SUCCESS else 0.0,
        attempt=attempt,
    )


@pytest.fixture()
def compare_store(tmp_path: Path) -> Iterator[ResultStore]:
    """Two runs of four tasks; one task needed a retry after an infrastructure error."""
    with ResultStore(tmp_path / "cmp.duckdb") as store:
        # "new" selected 6 tasks: e ends on an infrastructure error and one was never attempted.
        for run_id, task_count in (("base", 5), ("new", 6)):
            store.start_run(RunInfo(run_id=run_id, agent="scripted", suite="bundled", task_count=task_count))
        ok, fail, infra = OutcomeKind.SUCCESS, OutcomeKind.AGENT_FAILURE, OutcomeKind.INFRASTRUCTURE_ERROR
        for task, domain, b, n in [("a", "notepad", ok, ok), ("b", "notepad", fail, ok), ("c", "settings", ok, fail),
                                   ("d", "settings", fail, fail)]:
            store.record_result("base", _result(task, domain, b))
            store.record_result("new", _result(task, domain, n))
        # In the new run, task a failed on infrastructure first, then succeeded on attempt 2;
        # task e's only attempt in the new run was an infrastructure error.
        store.record_result("new", _result("a", "notepad", infra, attempt=1))
        store.record_result("new", _result("a", "notepad", ok, attempt=2))
        store.record_result("base", _result("e", "notepad", ok))
        store.record_result("new", _result("e", "notepad", infra))
        yield store


def test_compare_stored_runs_from_store_and_from_path(compare_store: ResultStore) -> None:
    from_store = compare_stored_runs(compare_store, "base", "new")
    assert [f.task_id for f in from_store.fixed] == ["b"] and [f.task_id for f in from_store.broken] == ["c"]
    assert [f.task_id for f in from_store.left_out] == ["e"]
    assert from_store.test.paired_tasks == 4 and from_store.test.both_succeeded == 1
    assert from_store.overall.new_total == 5 and from_store.overall.new_successes == 2
    # The file's path gives the same comparison (read-only, beside the open store).
    assert compare_stored_runs(compare_store.path, "base", "new") == from_store
    assert [r["attempt"] for r in final_attempts(compare_store, "new") if r["task_id"] == "a"] == [2]


def test_an_incomplete_run_is_named_in_the_comparison(compare_store: ResultStore) -> None:
    compare_store.finish_run("base", "completed")
    compare_store.finish_run("new", "incomplete")
    c = compare_stored_runs(compare_store, "base", "new")
    # "new" has 4 final results of 6 selected (e is still an infrastructure error), "base" 5 of 5.
    assert c.new_status is not None and (c.new_status.status, c.new_status.final, c.new_status.missing) == (
        "incomplete", 4, 2)
    incomplete = "INCOMPLETE: 2 of 6 selected tasks have no final result (run status: incomplete)"
    assert c.warnings() == [f"new run new: {incomplete}"]
    text, md = render_comparison_text(c), comparison_markdown(c, "t")
    assert f"WARNING: new run new: {incomplete}" in text
    assert f"**Warning: new run new: {incomplete}.**" in md
    # Each run's status and missing count stand beside its rates, complete or not.
    for report in (text, md):
        assert "baseline run base: status completed, 0 of 5 selected tasks without a final result; " in report
        assert "new run new: status incomplete, 2 of 6 selected tasks without a final result; " in report
    # Read alone (e.g. when the two runs are in different files), the status is the same.
    assert stored_run_status(compare_store.path, "new") == c.new_status
    assert compare_runs(final_attempts(compare_store, "base"), final_attempts(compare_store, "new"), "base", "new",
                        baseline_status=stored_run_status(compare_store, "base"),
                        new_status=stored_run_status(compare_store, "new")).warnings() == c.warnings()
    # A setup failure is left out of the comparison like an infrastructure error.
    compare_store.record_result("new", _result("d", "settings", OutcomeKind.SETUP_FAILURE, attempt=2))
    assert sorted(f.task_id for f in compare_stored_runs(compare_store, "base", "new").left_out) == ["d", "e"]


def test_unknown_runs_are_named(compare_store: ResultStore) -> None:
    with pytest.raises(UnknownRunError) as info:
        compare_stored_runs(compare_store, "base", "nightly-typo")
    assert "unknown run 'nightly-typo'" in str(info.value) and str(compare_store.path) in str(info.value)
    with pytest.raises(UnknownRunError, match="unknown runs 'x', 'y'"):
        compare_stored_runs(compare_store.path, "x", "y")
    with pytest.raises(UnknownRunError, match="unknown run 'nope'"):
        final_attempts(compare_store, "nope")


def test_missing_database_file_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "typo.duckdb"
    with pytest.raises(StoreError, match="results database not found"):
        compare_stored_runs(missing, "a", "b")
    assert not missing.exists()
    other = tmp_path / "other.duckdb"
    with duckdb.connect(str(other)) as con:
        con.execute("CREATE TABLE t (x INTEGER)")
    with pytest.raises(StoreError, match="not a results database"):
        compare_stored_runs(other, "a", "b")
    not_duckdb = tmp_path / "notes.txt"
    not_duckdb.write_text("hello")
    with pytest.raises(StoreError, match="notes.txt: cannot open as a DuckDB database"):
        compare_stored_runs(not_duckdb, "a", "b")
    with pytest.raises(TypeError, match="source must be a ResultStore, a DuckDB file path or a PostgreSQL URL"):
        compare_stored_runs(42, "a", "b")  # type: ignore[arg-type]
