"""Fixtures for the metrics and report tests: real runs of the bundled suite, and hand-built edge cases."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from adapters.benchmark import (
    ActionType,
    BenchmarkAction,
    BenchmarkResult,
    ModelUsage,
    OutcomeKind,
    StepRecord,
)
from adapters.store.duckdb_store import ResultStore, RunInfo

# Strings a model could produce that would break a page if not escaped.
HOSTILE_REASONING = '<script>alert("x")</script></details><b>bold</b> & "quotes"'


@dataclass(frozen=True)
class BundledRuns:
    """One DuckDB file holding a scripted run (16/16) and a random run (0/16) of the bundled suite."""

    db: Path
    scripted: str
    random: str


def _run_bundled_suite(root: Path) -> None:
    """The scripted and the random agent on the bundled suite, through the real flow, into
    `root`'s arena.duckdb and artifacts folder."""
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    # The random agent gets 6 steps (its failures need no more); the scripted one the default.
    # The run ids are the ones the README's example queries name (tests/results/test_readme_queries.py).
    for agent, run_id, max_steps in (("scripted", "nightly-scripted", 15), ("random", "nightly-random", 6)):
        run_suite(
            SuiteRunConfig(
                agent=agent, pool_size=4, max_steps=max_steps, db_path=root / "arena.duckdb",
                artifacts_dir=root / "artifacts", run_id=run_id,
            )
        )


@pytest.fixture(scope="session")
def bundled_run_db(prefect_server: None, tmp_path_factory: pytest.TempPathFactory) -> BundledRuns:
    """The bundled suite run once per test session through the real flow by the scripted and the
    random agent, in a results folder of this test process's own.

    Under xdist the first worker that needs the runs makes them in a folder the session's workers
    share (each worker used to make its own: about 17 CPU-s each), and every worker copies that
    results folder; the store keeps screenshot paths relative to the DuckDB file's folder, so a
    copy keeps its screenshots."""
    root = tmp_path_factory.mktemp("bundled-runs")
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one test process: nothing to share
        _run_bundled_suite(root)
    else:
        # The workers' base folders sit side by side in this session's own folder.
        shared = tmp_path_factory.getbasetemp().parent / "bundled-runs-shared"
        shared.mkdir(exist_ok=True)
        made, complete = shared / "results", shared / "complete"
        with open(shared / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one worker makes them; the others wait for it
            if not complete.exists():
                shutil.rmtree(made, ignore_errors=True)  # what a worker that failed midway left
                made.mkdir()
                _run_bundled_suite(made)
                complete.touch()
        shutil.copytree(made, root, dirs_exist_ok=True)
    return BundledRuns(db=root / "arena.duckdb", scripted="nightly-scripted", random="nightly-random")


@pytest.fixture()
def bundled_run_store(bundled_run_db: BundledRuns) -> Iterator[ResultStore]:
    """The bundled runs' store, opened for one test."""
    with ResultStore(bundled_run_db.db) as store:
        yield store


@dataclass(frozen=True)
class EdgeRuns:
    """Hand-built runs: `mixed` (fractional, infeasible, retries, missing screenshot, hostile text),
    `all_infra` (every task an infrastructure error) and `empty` (no task at all)."""

    db: Path
    mixed: str
    all_infra: str
    empty: str
    missing_screenshot: Path
    outside_screenshot: Path


def _screenshot(path: Path, size: tuple[int, int] = (1280, 800)) -> str:
    """A real PNG (a desktop-ish picture with a button), written to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", size, (32, 80, 128))
    draw = ImageDraw.Draw(image)
    draw.rectangle((600, 380, 700, 420), fill=(240, 240, 240), outline=(0, 0, 0))
    draw.text((615, 392), "Save", fill=(0, 0, 0))
    image.save(path)
    return str(path)


def _mixed_results(db_dir: Path, outside: Path) -> list[BenchmarkResult]:
    shots = db_dir / "artifacts" / "edge-mixed"
    steps = [
        StepRecord(
            index=0,
            action=BenchmarkAction(
                type=ActionType.CLICK, target_node_id="7", target_bbox=(600, 380, 700, 420),
                target_role="Button", target_name="Save", reasoning=HOSTILE_REASONING,
            ),
            screenshot_path=_screenshot(shots / "step_000.png"),
            agent_seconds=1.5, env_seconds=0.5,
            usage=ModelUsage(calls=1, input_tokens=1000, output_tokens=50, cost_usd=0.01),
        ),
        StepRecord(
            index=1,
            action=BenchmarkAction(type=ActionType.DOUBLE_CLICK, x=0.25, y=0.5, normalized=True),
            screenshot_path=_screenshot(outside),
            agent_seconds=1.0, env_seconds=0.5, error="element <not> found",
        ),
        StepRecord(
            index=2,
            action=BenchmarkAction(type=ActionType.TYPE, text="hello"),
            screenshot_path=str(shots / "step_002_never_written.png"),
        ),
        StepRecord(index=3, action=BenchmarkAction(type=ActionType.DONE)),
    ]
    usage = ModelUsage(calls=2, input_tokens=2000, output_tokens=100, cost_usd=0.02)
    return [
        BenchmarkResult(
            task_id="frac-task", domain="notepad", outcome=OutcomeKind.AGENT_FAILURE, score=0.5, steps=steps,
            num_steps=4, reason="half the lines </details> are right", total_time_seconds=10.0, usage=usage,
            timings={"reset": 1.0, "setup": 2.0, "episode": 6.0, "evaluate": 1.0, "agent": 2.5, "env": 1.0},
            agent_details={"demo_id": "<demo>"},
        ),
        BenchmarkResult(
            task_id="inf-task", domain="notepad", outcome=OutcomeKind.SUCCESS, success=True, score=1.0,
            infeasible=True, total_time_seconds=2.0,
            steps=[StepRecord(index=0, action=BenchmarkAction(type=ActionType.FAIL))], num_steps=1,
        ),
        BenchmarkResult(
            task_id="retried-task", domain="settings", outcome=OutcomeKind.INFRASTRUCTURE_ERROR, attempt=1,
            error="VM unreachable", total_time_seconds=30.0, timings={"vm": 30.0},
        ),
        BenchmarkResult(
            task_id="retried-task", domain="settings", outcome=OutcomeKind.SUCCESS, success=True, score=1.0,
            attempt=2, total_time_seconds=4.0, timings={"vm": 4.0},
        ),
        BenchmarkResult(
            task_id="infra-task", domain="settings", outcome=OutcomeKind.INFRASTRUCTURE_ERROR, attempt=1,
            error="reset failed", total_time_seconds=5.0,
        ),
        BenchmarkResult(
            task_id="infra-task", domain="settings", outcome=OutcomeKind.INFRASTRUCTURE_ERROR, attempt=2,
            error="reset failed \x1b[31magain\x1b[0m", total_time_seconds=5.0,
        ),
        BenchmarkResult(
            task_id="setup-task", domain="settings", outcome=OutcomeKind.SETUP_FAILURE,
            error="open: [WinError 2] The system cannot find the file specified: 'C:\\Users\\Docker\\draft.docx'",
            total_time_seconds=31.0,
        ),
    ]


@pytest.fixture()
def metrics_edge_runs(tmp_path: Path) -> EdgeRuns:
    """A fresh DuckDB file with the hand-built edge-case runs (see EdgeRuns)."""
    db = tmp_path / "results" / "edge.duckdb"
    outside = tmp_path / "elsewhere" / "step_001.png"
    with ResultStore(db) as store:
        for run_id, task_count in (("edge-mixed", 6), ("edge-all-infra", 2), ("edge-empty", 0)):
            store.start_run(RunInfo(run_id=run_id, agent="hand-built", suite="edge", task_count=task_count,
                                    environment="local-simulation"))
        for result in _mixed_results(db.parent, outside):
            store.record_result("edge-mixed", result)
        for task_id in ("down-1", "down-2"):
            store.record_result(
                "edge-all-infra",
                BenchmarkResult(task_id=task_id, domain="chrome", outcome=OutcomeKind.INFRASTRUCTURE_ERROR,
                                error="VM unreachable"),
            )
        store.finish_run("edge-mixed", "completed")
    return EdgeRuns(
        db=db, mixed="edge-mixed", all_infra="edge-all-infra", empty="edge-empty",
        missing_screenshot=db.parent / "artifacts" / "edge-mixed" / "step_002_never_written.png",
        outside_screenshot=outside,
    )


@pytest.fixture()
def metrics_edge_store(metrics_edge_runs: EdgeRuns) -> Iterator[ResultStore]:
    """The edge-case store, opened for one test."""
    with ResultStore(metrics_edge_runs.db) as store:
        yield store
