"""A run id the store refuses (it exists with another configuration) is one line, not a
traceback: `arena run --run-id` prints it and exits 2, and a served on-demand flow run with that
run id ends Failed with the line as its message; against real Prefect servers on 127.0.0.1."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.store.duckdb_store import ResultStore, RunInfo

PROJECT = Path(__file__).resolve().parents[2]
TASK = "notepad-append-line"


def _taken(db: Path, run_id: str) -> None:
    """A run `run_id` of another agent on another suite: what a resume with this configuration
    must not mix into."""
    with ResultStore(db) as store:
        store.start_run(RunInfo(run_id=run_id, agent="random", suite="someone-elses-suite", model_id="other"))


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture()
def prefect_records() -> Iterator[_Records]:
    """Every record Prefect's flow-run loggers emit during the test."""
    handler = _Records()
    logger = logging.getLogger("prefect")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_arena_run_on_a_taken_run_id_prints_one_line(own_prefect_server: str, tmp_path: Path) -> None:
    db = tmp_path / "arena.duckdb"
    _taken(db, "taken-1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--task", TASK, "--run-id", "taken-1", "--db", str(db),
         "--artifacts", str(tmp_path / "art")],
        cwd=PROJECT, capture_output=True, text=True, timeout=300,
        env={**env, "PREFECT_API_URL": own_prefect_server, "PYTHONPATH": str(PROJECT)},
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("arena: error:")]
    assert len(errors) == 1 and "cannot resume run 'taken-1' with a different configuration" in errors[0], proc.stderr
    assert "agent: stored 'random', now 'scripted'" in errors[0]
    with ResultStore(db, read_only=True) as store:  # the other run is as it was
        run = store.get_run("taken-1")
        assert run is not None and run.agent == "random"


def test_a_served_run_with_a_taken_run_id_ends_failed_with_the_line(
    prefect_server: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_records: _Records
) -> None:
    from flows.baselines import evaluate_baseline

    db = tmp_path / "arena.duckdb"
    _taken(db, "taken-2")
    baselines = tmp_path / "baselines.toml"
    baselines.write_text(f'version = 1\n[[baselines]]\nname = "scripted-one"\nagent = "scripted"\nsuite = "bundled"\n'
                         f'task_ids = ["{TASK}"]\npool_size = 1\ndb_path = "{db}"\n'
                         f'artifacts_dir = "{tmp_path / "art"}"\n')
    monkeypatch.setenv("ARENA_BASELINES_FILE", str(baselines))  # the operator's file
    state = evaluate_baseline(baseline="scripted-one", run_id="taken-2", return_state=True)
    assert state.is_failed() and state.name == "Failed"
    assert (state.message or "").startswith(f"Refused: {db}: cannot resume run 'taken-2' with a different configuration")
    assert "\n" not in state.message
    dumped = [r.getMessage() for r in prefect_records.records if r.exc_info is not None]
    assert dumped == [], dumped  # neither the evaluation's run nor the baseline's logged a traceback
    with ResultStore(db, read_only=True) as store:
        run = store.get_run("taken-2")
        assert run is not None and run.agent == "random"


def test_a_completed_run_id_reused_with_another_agent_is_refused_not_reprinted(
        prefect_server: None, tmp_path: Path) -> None:
    """`arena run --run-id X --agent random` on X, a completed scripted run, reprinted X's old
    summary and exited 0, as if the random agent had been measured. It is refused in one line."""
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_API_URL=str(PREFECT_API_URL.value()), PYTHONPATH=str(PROJECT))
    db = tmp_path / "arena.duckdb"

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", "--task", TASK, "--run-id", "done-once", "--db", str(db),
             "--artifacts", str(tmp_path / "art"), *extra],
            cwd=PROJECT, capture_output=True, text=True, timeout=300, env=env,
        )

    first = run()
    assert first.returncode == 0, first.stderr[-3000:]
    again = run("--agent", "random")
    assert again.returncode == 2, (again.stdout[-2000:], again.stderr[-3000:])
    errors = [line for line in again.stderr.splitlines() if line.startswith("arena: error:")]
    assert len(errors) == 1 and "agent: stored 'scripted', now 'random'" in errors[0], again.stderr
    assert "Traceback" not in again.stderr and "WAA run done-once" not in again.stdout
    assert "progress:" not in again.stderr, "the earlier invocation's progress line was shown as this one's"
    same = run()  # the same configuration: nothing to do, the summary again
    assert same.returncode == 0 and "WAA run done-once" in same.stdout, same.stderr[-3000:]
