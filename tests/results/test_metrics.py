"""Run metrics and reference accuracy, on real runs of the bundled suite and hand-built edge cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.agents.demos import DEFAULT_DEMO_LIBRARY, load_demo_library
from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkResult, OutcomeKind
from adapters.results.metrics import (
    ALL_DOMAINS,
    Rate,
    click_point,
    compute_run_metrics,
    query_store,
    references_for_run,
)
from adapters.results.reference import (
    AgentStep,
    ReferenceLoadError,
    ReferenceStep,
    ReferenceTrajectory,
    canonical_keys,
    load_demo_references,
    load_references,
    load_solution_references,
    parse_demo_step,
    reference_from_demo,
    reference_from_plan,
    score_against_reference,
)
from adapters.results.report_text import incomplete_text
from adapters.results.stats import wilson_interval
from adapters.store.duckdb_store import ResultStore, StoreError
from adapters.waa.catalog import bundled_suite_dir

from .conftest import BundledRuns, EdgeRuns

SOLUTIONS = bundled_suite_dir() / "solutions.json"


# --- bundled suite, through the real flow --------------------------------------------------------


def test_scripted_run_metrics(bundled_run_db: BundledRuns, bundled_run_store: ResultStore) -> None:
    metrics = compute_run_metrics(bundled_run_store, bundled_run_db.scripted)
    overall = metrics.overall
    assert overall.domain == ALL_DOMAINS
    assert overall.success == Rate(successes=16, total=16, rate=1.0, ci95=wilson_interval(16, 16))
    assert overall.success_sound == overall.success
    assert (overall.feasible.total, overall.infeasible.total) == (14, 2)
    assert overall.feasible.rate == overall.infeasible.rate == 1.0
    assert overall.avg_score == 1.0
    assert overall.outcomes["success"] == 16 and sum(overall.outcomes.values()) == 16
    assert (overall.attempts, overall.retries, overall.retried_tasks) == (16, 0, 0)
    assert [d.domain for d in metrics.per_domain] == ["file_explorer", "notepad", "settings"]
    assert sum(d.tasks for d in metrics.per_domain) == 16
    for d in metrics.per_domain:
        assert d.success.ci95 == wilson_interval(d.tasks, d.tasks)
    # Effort: totals agree with the steps table, means with totals.
    steps = query_store(bundled_run_store, "SELECT count(*) AS n FROM steps WHERE run_id = ?", [bundled_run_db.scripted])
    assert overall.steps.total == steps[0]["n"]
    assert overall.steps.mean == pytest.approx(steps[0]["n"] / 16)
    assert overall.time_seconds.total and overall.time_seconds.total > 0
    assert overall.spent.time_seconds == pytest.approx(overall.time_seconds.total)
    assert metrics.provenance["agent"] == "scripted" and metrics.provenance["suite_hash"]
    assert overall.reference is None and not metrics.references_given


def test_reference_accuracy_separates_the_scripted_and_random_agents(
    bundled_run_db: BundledRuns, bundled_run_store: ResultStore
) -> None:
    references = references_for_run(bundled_run_store, bundled_run_db.scripted)
    assert len(references) == 16
    scripted = compute_run_metrics(bundled_run_store, bundled_run_db.scripted, references).overall.reference
    random = compute_run_metrics(bundled_run_store, bundled_run_db.random, references).overall.reference
    assert scripted is not None and random is not None
    # The scripted agent follows the plans exactly: every non-wait step, every element.
    plan_steps = sum(len(r.steps) for r in references.values())
    assert (scripted.tasks_with_reference, scripted.tasks_scored) == (16, 16)
    assert scripted.matched_steps == scripted.reference_steps == plan_steps
    assert scripted.step_accuracy == 1.0 and scripted.grounding_accuracy == 1.0
    assert scripted.pointer_pairs == sum(s.is_pointer for r in references.values() for s in r.steps)
    # The random agent clicks normalised coordinates: against plans naming elements without boxes
    # its clicks cannot be checked, so grounding is unknown, never a made-up number.
    assert random.step_accuracy is not None and random.step_accuracy < 0.3
    assert random.pointer_pairs == 0 and random.grounding_accuracy is None and random.pointer_unverifiable > 0


def test_per_task_reference_scores(bundled_run_db: BundledRuns, bundled_run_store: ResultStore) -> None:
    references = load_solution_references(SOLUTIONS)
    metrics = compute_run_metrics(bundled_run_store, bundled_run_db.scripted, references)
    by_id = {t.task_id: t for t in metrics.tasks}
    task = by_id["notepad-draft-documents"]
    assert task.reference is not None
    assert task.reference.reference_steps == 7  # 8 plan steps, one of them a wait
    assert task.reference.step_accuracy == 1.0
    assert [p.reference_index for p in task.reference.pairs] == list(range(7))
    for domain in metrics.per_domain:
        assert domain.reference is not None and domain.reference.step_accuracy == 1.0


# --- edge cases ----------------------------------------------------------------------------------


def test_fractional_scores_infeasible_and_retries(metrics_edge_runs: EdgeRuns, metrics_edge_store: ResultStore) -> None:
    metrics = compute_run_metrics(metrics_edge_store, metrics_edge_runs.mixed)
    overall = metrics.overall
    # Final attempts: frac (0.5), inf (1, success), retried (1, success on attempt 2), infra, setup.
    assert overall.tasks == 5
    assert overall.success == Rate.of(2, 5)
    assert (overall.infrastructure_errors, overall.setup_failures) == (1, 1)
    # The headline rate leaves out the infrastructure error and the setup failure.
    assert overall.success_sound == Rate.of(2, 3)
    assert overall.avg_score == pytest.approx((0.5 + 1 + 1 + 0 + 0) / 5)
    assert overall.avg_score_sound == pytest.approx((0.5 + 1 + 1) / 3)
    assert overall.feasible == Rate.of(1, 4) and overall.infeasible == Rate.of(1, 1)
    assert (overall.attempts, overall.retries, overall.retried_tasks) == (7, 2, 2)
    assert overall.outcomes["infrastructure_error"] == 1 and overall.outcomes["setup_failure"] == 1
    # Spend counts every attempt; per-task stats only the final one.
    assert overall.spent.time_seconds == pytest.approx(10 + 2 + 30 + 4 + 5 + 5 + 31)
    assert overall.time_seconds.total == pytest.approx(10 + 2 + 4 + 5 + 31)
    assert overall.spent.vm_seconds == pytest.approx(34.0)
    assert overall.input_tokens.total == 2000 and overall.cost_usd.total == pytest.approx(0.02)
    settings = next(d for d in metrics.per_domain if d.domain == "settings")
    assert settings.success == Rate.of(1, 3) and settings.success_sound == Rate.of(1, 1)
    # 6 tasks selected, 4 with a final result (infra-task is still an infrastructure error).
    status = metrics.run_status()
    assert (status.selected, status.final, status.missing) == (6, 4, 2)
    assert status.warning() == "run edge-mixed is completed: 2 of 6 selected tasks have no final result"
    assert incomplete_text(status) == "INCOMPLETE: 2 of 6 selected tasks have no final result (run status: completed)"
    retried = next(t for t in metrics.tasks if t.task_id == "retried-task")
    assert (retried.attempt, retried.attempts, retried.outcome) == (2, 2, "success")


def test_all_infrastructure_errors_have_no_rate_excluding_them(metrics_edge_runs: EdgeRuns, metrics_edge_store: ResultStore) -> None:
    overall = compute_run_metrics(metrics_edge_store, metrics_edge_runs.all_infra).overall
    assert overall.success == Rate.of(0, 2) and overall.success.ci95 == wilson_interval(0, 2)
    assert overall.success_sound == Rate(successes=0, total=0, rate=None, ci95=None)
    assert overall.avg_score_sound is None


def test_empty_run(metrics_edge_runs: EdgeRuns, metrics_edge_store: ResultStore) -> None:
    metrics = compute_run_metrics(metrics_edge_store, metrics_edge_runs.empty, references={})
    assert metrics.per_domain == [] and metrics.tasks == []
    overall = metrics.overall
    assert overall.tasks == overall.attempts == 0
    assert overall.success.rate is None and overall.success.ci95 is None
    assert overall.avg_score is None and overall.steps.mean is None and overall.steps.tasks == 0
    assert overall.reference is not None and overall.reference.step_accuracy is None


def test_unknown_run_is_a_store_error_naming_it(metrics_edge_runs: EdgeRuns, metrics_edge_store: ResultStore) -> None:
    with pytest.raises(StoreError, match=r"unknown run 'no-such-run'.*edge-mixed"):
        compute_run_metrics(metrics_edge_store, "no-such-run")


def test_reference_metrics_leave_out_tasks_the_agent_never_played(metrics_edge_runs: EdgeRuns, metrics_edge_store: ResultStore) -> None:
    click_save = ReferenceStep(kind="click", role="Button", name="Save")
    references = {
        task_id: ReferenceTrajectory(task_id=task_id, source="solution_plan", source_ref="test", steps=(click_save,))
        for task_id in ("frac-task", "infra-task", "setup-task")
    }
    reference = compute_run_metrics(metrics_edge_store, metrics_edge_runs.mixed, references).overall.reference
    assert reference is not None
    assert (reference.tasks_with_reference, reference.tasks_scored) == (3, 1)
    # frac-task clicked Button "Save" first: one step, one grounded pointer pair.
    assert (reference.matched_steps, reference.reference_steps) == (1, 1)
    assert (reference.pointer_hits, reference.pointer_pairs) == (1, 1)


# --- reference loading ---------------------------------------------------------------------------


def test_solution_plans_load_without_waits() -> None:
    references = load_solution_references(SOLUTIONS)
    plans = json.loads(SOLUTIONS.read_text())
    assert set(references) == set(plans)
    for task_id, plan in plans.items():
        kinds = [next(iter(step)) for step in plan]
        assert [s.kind for s in references[task_id].steps] == [k for k in kinds if k != "wait"]
        assert references[task_id].waits_dropped == kinds.count("wait")
    first = references["notepad-draft-documents"].steps
    assert (first[0].role, first[0].name) == ("Edit", "Text Editor")
    assert (first[2].key, first[2].modifiers) == ("s", ("ctrl",))


def test_bad_plans_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "plans.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ReferenceLoadError, match=str(bad)):
        load_solution_references(bad)
    with pytest.raises(ReferenceLoadError, match=r"task 't1', step 1: .*unknown step kind 'jump'"):
        reference_from_plan("t1", [{"type": "x"}, {"jump": 3}], "plans.json")
    with pytest.raises(ReferenceLoadError, match=r"step 0"):
        reference_from_plan("t1", [{"click": {"role": "Button"}}])  # no element name


def test_demo_sentences_parse_into_steps() -> None:
    steps, waits = parse_demo_step('CLICK the "Name Box" and TYPE "A11", then PRESS Enter')
    assert [(s.kind, s.name, s.text, s.key) for s in steps] == [
        ("click", "Name Box", None, None), ("type", None, "A11", None), ("key", None, None, "Enter")
    ]
    assert waits == 0
    (press,), _ = parse_demo_step('PRESS Ctrl+Shift+S to open the "Save As" dialog')
    assert (press.key, press.modifiers) == ("S", ("ctrl", "shift"))
    (typed,), _ = parse_demo_step('TYPE "DONE CLICK" (quoted verbs are text)')
    assert typed.text == "DONE CLICK"
    steps, waits = parse_demo_step("WAIT for the dialog, then DONE")
    assert [s.kind for s in steps] == ["done"] and waits == 1
    (scroll,), _ = parse_demo_step("SCROLL down the list")
    assert scroll.direction == "down"
    with pytest.raises(ValueError, match="no action verb"):
        parse_demo_step("look at the screen")
    with pytest.raises(ValueError, match="CLICK names no element"):
        parse_demo_step("CLICK somewhere")


def test_every_bundled_demo_parses() -> None:
    for demo in load_demo_library(DEFAULT_DEMO_LIBRARY):
        reference = reference_from_demo(demo.model_copy(update={"source_task_id": "some-task"}))
        assert reference.steps and reference.steps[-1].kind == "done"
    # None of the bundled demos is a recording of a task, so they give no references.
    assert load_demo_references(DEFAULT_DEMO_LIBRARY) == {}


def test_demo_library_references_and_precedence(tmp_path: Path) -> None:
    demo = {
        "demo_id": "draft-recording", "domain": "notepad", "source_task_id": "notepad-draft-documents",
        "task_instruction": "Save a draft.", "steps": ['CLICK the "Text Editor" area', 'TYPE "This is a draft."', "DONE"],
    }
    (tmp_path / "draft.json").write_text(json.dumps(demo))
    (tmp_path / "broken.json").write_text(json.dumps({**demo, "demo_id": "broken", "steps": ["think hard"]}))
    with pytest.raises(ReferenceLoadError, match=r"demo 'broken', step 0: no action verb"):
        load_demo_references(tmp_path)
    (tmp_path / "broken.json").unlink()
    demos = load_demo_references(tmp_path)
    assert demos["notepad-draft-documents"].source == "demo"
    assert [s.kind for s in demos["notepad-draft-documents"].steps] == ["click", "type", "done"]
    merged = load_references(solutions=SOLUTIONS, demo_library=tmp_path)
    assert merged["notepad-draft-documents"].source == "solution_plan"
    assert load_references(demo_library=tmp_path)["notepad-draft-documents"].source == "demo"


# --- step and grounding accuracy -----------------------------------------------------------------


def _step(index: int, **action: object) -> AgentStep:
    parsed = BenchmarkAction.model_validate(action)
    return AgentStep(step_index=index, action=parsed, click=click_point({}, parsed))


def _reference(*steps: ReferenceStep) -> ReferenceTrajectory:
    return ReferenceTrajectory(task_id="t", source="solution_plan", source_ref="test", steps=steps)


SAVE = ReferenceStep(kind="click", role="Button", name="Save")
TYPE_NAME = ReferenceStep(kind="type", text="draft.txt")
CTRL_S = ReferenceStep(kind="key", key="s", modifiers=("ctrl",))
DONE = ReferenceStep(kind="done")


def test_exact_reproduction_scores_one_and_extra_steps_are_not_penalised() -> None:
    reference = _reference(CTRL_S, TYPE_NAME, SAVE, DONE)
    steps = [
        _step(0, type="key", key="ctrl+S"),
        _step(1, type="wait", seconds=0.5),
        _step(2, type="scroll", scroll_direction="down"),
        _step(3, type="type", text="draft.txt"),
        _step(4, type="click", target_node_id="9", target_role="button", target_name=" save ", target_bbox=(0, 0, 9, 9)),
        _step(5, type="done"),
    ]
    score = score_against_reference(reference, steps)
    assert (score.matched_steps, score.reference_steps, score.agent_steps) == (4, 4, 5)
    assert score.step_accuracy == 1.0 and score.grounding_accuracy == 1.0
    assert [(p.reference_index, p.step_index) for p in score.pairs] == [(0, 0), (1, 3), (2, 4), (3, 5)]


def test_wrong_element_and_wrong_text_count_against() -> None:
    reference = _reference(TYPE_NAME, SAVE, DONE)
    steps = [
        _step(0, type="type", text="Draft.txt"),  # case matters for typed text
        _step(1, type="click", target_role="Button", target_name="Cancel", target_bbox=(0, 0, 9, 9)),
        _step(2, type="done"),
    ]
    score = score_against_reference(reference, steps)
    assert score.matched_steps == 1 and score.step_accuracy == pytest.approx(1 / 3)
    assert (score.pointer_hits, score.pointer_pairs) == (0, 1) and score.grounding_accuracy == 0.0
    assert [p.matched for p in score.pairs] == [False, False, True]


def test_order_matters() -> None:
    reference = _reference(TYPE_NAME, CTRL_S)
    steps = [_step(0, type="key", key="s", modifiers=["ctrl"]), _step(1, type="type", text="draft.txt")]
    assert score_against_reference(reference, steps).matched_steps == 1


def test_operations_must_agree() -> None:
    reference = _reference(SAVE)
    steps = [_step(0, type="double_click", target_role="Button", target_name="Save", target_bbox=(0, 0, 9, 9))]
    score = score_against_reference(reference, steps)
    assert score.matched_steps == 0 and score.pairs == [] and score.grounding_accuracy is None


def test_grounding_by_box_point_and_unverifiable() -> None:
    boxed = ReferenceStep(kind="click", bbox=(100, 100, 200, 150))
    point = ReferenceStep(kind="click", point=(500.0, 300.0))
    named = ReferenceStep(kind="click", name="OK")
    steps = [
        _step(0, type="click", x=150, y=120),  # inside the reference box: hit
        _step(1, type="click", x=506, y=306),  # 8.5 px from the reference point: hit
        _step(2, type="click", x=0.5, y=0.5, normalized=True),  # no name, no box: unverifiable
    ]
    score = score_against_reference(_reference(boxed, point, named), steps)
    assert [p.hit for p in score.pairs] == [True, True, None]
    assert (score.matched_steps, score.pointer_hits, score.pointer_pairs, score.pointer_unverifiable) == (2, 2, 2, 1)
    far = score_against_reference(_reference(point), [_step(0, type="click", x=520, y=300)])
    assert far.pairs[0].hit is False
    in_box = score_against_reference(_reference(point), [_step(0, type="click", target_bbox=(480, 280, 520, 320))])
    assert in_box.pairs[0].hit is True


def test_alignment_prefers_matches_over_earlier_pairs() -> None:
    reference = _reference(SAVE)
    steps = [
        _step(0, type="click", target_role="Button", target_name="Cancel", target_bbox=(0, 0, 9, 9)),
        _step(1, type="click", target_role="Button", target_name="Save", target_bbox=(0, 0, 9, 9)),
    ]
    score = score_against_reference(reference, steps)
    assert [(p.step_index, p.matched) for p in score.pairs] == [(1, True)]


def test_key_names_are_normalised() -> None:
    assert canonical_keys("s", ["ctrl"]) == canonical_keys("Ctrl+S") == canonical_keys("control+s")
    assert canonical_keys("Return") == canonical_keys("enter")
    assert canonical_keys("s", ["ctrl", "shift"]) == canonical_keys("S", ["shift", "ctrl"])
    assert canonical_keys("s", ["ctrl"]) != canonical_keys("s")
    assert canonical_keys("ctrl++") == (frozenset({"ctrl"}), ("+",))


def test_click_point_without_the_schema_3_columns() -> None:
    bbox = BenchmarkAction(type=ActionType.CLICK, target_bbox=(10, 20, 30, 40))
    assert click_point({}, bbox) == (20.0, 30.0)
    assert click_point({"click_x": 1.0, "click_y": 2.0}, bbox) == (1.0, 2.0)
    assert click_point({}, BenchmarkAction(type=ActionType.CLICK, x=0.5, y=0.5, normalized=True)) is None
    assert click_point({}, BenchmarkAction(type=ActionType.TYPE, text="x")) is None


def test_metrics_see_what_the_open_store_just_recorded(metrics_edge_runs: EdgeRuns, metrics_edge_store: ResultStore) -> None:
    before = compute_run_metrics(metrics_edge_store, metrics_edge_runs.empty).overall.tasks
    metrics_edge_store.record_result(
        metrics_edge_runs.empty, BenchmarkResult(task_id="late", domain="vlc", outcome=OutcomeKind.TIMEOUT)
    )
    after = compute_run_metrics(metrics_edge_store, metrics_edge_runs.empty)
    assert (before, after.overall.tasks, after.overall.outcomes["timeout"]) == (0, 1, 1)
    assert [d.domain for d in after.per_domain] == ["vlc"]
