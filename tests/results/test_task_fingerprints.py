"""Task fingerprints: every stored result carries the hash of the exact task definition it
attempted, and a comparison pairs only tasks of the same version, listing the others."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from adapters.benchmark import task_fingerprint
from adapters.results.compare import compare_runs, compare_stored_runs, comparison_markdown, render_comparison_text
from adapters.store.duckdb_store import ResultStore
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir

TASKS = ["notepad-append-line", "explorer-rename-file", "notepad-replace-notes"]
CHANGED = "explorer-rename-file"


def _changed_suite(root: Path) -> Path:
    """A copy of the bundled suite with one task's evaluator changed (a new version of it) and
    another merely re-indented (the same version)."""
    suite = root / "suite-v2"
    shutil.copytree(bundled_suite_dir(), suite)
    catalog = WAATaskCatalog(suite)
    for task_id in (CHANGED, "notepad-append-line"):
        path = suite / "examples" / catalog.load(task_id).domain / f"{task_id}.json"
        data = json.loads(path.read_text())
        if task_id == CHANGED:
            data["instruction"] += " Keep the original extension."
        path.write_text(json.dumps(data, indent=4 if task_id != CHANGED else 2))
    return suite


def test_fingerprint_is_the_definition_not_its_formatting() -> None:
    a = {"id": "x", "instruction": "do it", "evaluator": {"func": "exact_match"}}
    assert task_fingerprint(a) == task_fingerprint(json.loads(json.dumps(a, indent=4)))
    assert task_fingerprint(a) == task_fingerprint(dict(reversed(list(a.items()))))
    assert task_fingerprint(a) != task_fingerprint({**a, "instruction": "do it!"})


def test_results_carry_fingerprints_and_comparison_pairs_only_the_same_version(
        prefect_server: None, tmp_path: Path) -> None:
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    suite = _changed_suite(tmp_path)
    db = tmp_path / "arena.duckdb"
    for run_id, suite_dir in (("on-v1", bundled_suite_dir()), ("on-v2", suite)):
        run_suite(SuiteRunConfig(suite_dir=suite_dir, task_ids=TASKS, pool_size=2, db_path=db,
                                 artifacts_dir=tmp_path / "a", run_id=run_id))
    with ResultStore(db, read_only=True) as store, store.reading() as conn:
        stored = dict(((r, t), f) for r, t, f in conn.execute(
            "SELECT run_id, task_id, task_fingerprint FROM latest_task_results").fetchall())
    v1, v2 = WAATaskCatalog(bundled_suite_dir()), WAATaskCatalog(suite)
    for task_id in TASKS:
        assert stored[("on-v1", task_id)] == v1.load(task_id).fingerprint
        assert stored[("on-v2", task_id)] == v2.load(task_id).fingerprint

    comparison = compare_stored_runs(db, "on-v1", "on-v2")
    assert [c.task_id for c in comparison.changed] == [CHANGED]
    assert comparison.test.paired_tasks == len(TASKS) - 1  # the re-indented task still pairs
    assert comparison.changed[0].baseline_fingerprint == v1.load(CHANGED).fingerprint
    text = render_comparison_text(comparison)
    assert "different task versions, not compared: 1" in text and CHANGED in text
    assert "have a different definition in each run" in text
    assert f"`{CHANGED}`" in comparison_markdown(comparison, "v1 vs v2")


def test_rows_without_fingerprints_still_pair() -> None:
    rows = [{"task_id": "a", "success": True, "outcome": "success", "task_fingerprint": None},
            {"task_id": "b", "success": False, "outcome": "agent_failure"}]
    comparison = compare_runs(rows, rows, "old", "new")
    assert comparison.changed == [] and comparison.test.paired_tasks == 2


@pytest.mark.parametrize("old, new, paired", [("f1", "f1", 1), ("f1", "f2", 0), (None, "f2", 1)])
def test_pairing_rule(old: str | None, new: str | None, paired: int) -> None:
    base = [{"task_id": "a", "success": True, "outcome": "success", "task_fingerprint": old}]
    after = [{"task_id": "a", "success": False, "outcome": "agent_failure", "task_fingerprint": new}]
    assert compare_runs(base, after, "b", "n").test.paired_tasks == paired
