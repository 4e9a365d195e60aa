"""Whole runs against servers that behave like WAA's real one: every attempt stored, server
faults never scored, a dead server ends the run by itself (adapters/outcomes.py R1, R2).

These drive the real flow (Prefect test server, simulation processes, DuckDB) and the `arena`
command's entry point, then read what was stored.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from adapters.waa.localenv.launcher import start_local_env

FOUR_TASKS = ["notepad-append-line", "explorer-create-projects-folder", "settings-storage-sense-on", "explorer-rename-file"]


def _rows(db: Path, sql: str, params: list[Any] | None = None) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, params or []).fetchall()


def test_half_of_all_actions_failing_server_side_scores_no_tainted_attempt(
    prefect_server: None, tmp_path: Path
) -> None:
    """With /execute and /execute_windows failing half the time, no attempt holding a failed
    server call is scored, and every task still ends with a stored final result."""
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig
    from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir

    ids = WAATaskCatalog(bundled_suite_dir()).task_ids()[:6]
    db = tmp_path / "arena.duckdb"
    outcome = run_suite(
        SuiteRunConfig(
            task_ids=ids,
            pool_size=2,
            quirks=True,
            quirk_settings={"ready_delay": 0.0, "accessibility_delay": 0.0, "launch_delay": 0.0,
                            "failsafe": False, "action_fault_rate": 0.5, "fault_seed": 7},
            max_attempts=3,
            db_path=db,
            artifacts_dir=tmp_path / "art",
            run_id="half-faults",
        )
    )
    rows = _rows(
        db,
        """
        SELECT r.task_id, r.attempt, r.outcome,
               count(s.step_index) FILTER (WHERE s.error LIKE 'server failed%') AS server_failed_steps
        FROM task_results r LEFT JOIN steps s USING (run_id, task_id, attempt)
        WHERE r.run_id = 'half-faults' GROUP BY ALL ORDER BY ALL
        """,
    )
    assert {task_id for task_id, *_ in rows} == set(ids)  # every task has a stored result
    tainted = [r for r in rows if r[3] > 0]
    assert tainted, "the injected faults never hit an action"
    assert all(outcome == "infrastructure_error" for _, _, outcome, _ in tainted)
    scored = [r for r in rows if r[2] in ("success", "agent_failure")]
    assert all(n == 0 for *_, n in scored)
    # Exactly one final (latest) row per task; the run says how many are still missing.
    latest = _rows(db, "SELECT task_id, outcome FROM latest_task_results WHERE run_id = 'half-faults'")
    assert len(latest) == len(ids)
    infra_final = sum(1 for _, o in latest if o == "infrastructure_error")
    assert outcome.completeness is not None and outcome.completeness.missing == infra_final
    assert outcome.status == ("completed" if infra_final == 0 else "incomplete")


def _kill_after_first_result(progress: Path, kill: Any, timeout: float = 120.0) -> threading.Thread:
    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if json.loads(progress.read_text()).get("attempts_recorded", 0) >= 1:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        kill()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_dead_existing_server_ends_the_run_incomplete_with_one_line_and_exit_3(
    prefect_server: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--waa-url: the server dies mid-run; the run ends by itself within the server wait, the
    interrupted attempt is stored, the rest is counted missing, the exit status says so."""
    from flows.cli import main

    server = start_local_env(tmp_path / "server")
    db = tmp_path / "arena.duckdb"
    art = tmp_path / "art"
    watcher = _kill_after_first_result(art / "dead-server" / "progress.json", server.stop)
    started = time.monotonic()
    try:
        code = main([
            "run", "--waa-url", server.base_url, "--reset-level", "setup", "--server-wait", "2",
            "--db", str(db), "--artifacts", str(art), "--run-id", "dead-server",
            *[arg for t in FOUR_TASKS for arg in ("--task", t)],
        ])
    finally:
        watcher.join(5)
        server.stop()
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    assert code == 3
    assert "arena: run dead-server ended incomplete" in captured.err
    assert "Traceback" not in captured.err and "Traceback" not in captured.out
    assert "no WAA server left" in captured.out  # the summary says why tasks are missing
    rows = _rows(db, "SELECT task_id, outcome FROM task_results WHERE run_id = 'dead-server' ORDER BY recorded_at")
    assert rows[0][1] == "success" and any(o == "infrastructure_error" for _, o in rows[1:])
    (status,) = _rows(db, "SELECT status FROM runs WHERE run_id = 'dead-server'")[0]
    assert status == "incomplete"
    assert elapsed < 120


def test_a_spare_server_takes_over_from_a_dead_one(prefect_server: None, tmp_path: Path) -> None:
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    first = start_local_env(tmp_path / "first")
    spare = start_local_env(tmp_path / "spare")
    db = tmp_path / "arena.duckdb"
    art = tmp_path / "art"
    watcher = _kill_after_first_result(art / "spare" / "progress.json", first.stop)
    try:
        outcome = run_suite(
            SuiteRunConfig(
                task_ids=FOUR_TASKS,
                provider="existing",
                waa_urls=[first.base_url, spare.base_url],
                pool_size=1,
                reset_level="setup",
                server_wait_seconds=2,
                db_path=db,
                artifacts_dir=art,
                run_id="spare",
            )
        )
    finally:
        watcher.join(5)
        first.stop()
        spare.stop()
    assert outcome.status == "completed", outcome.table
    latest = dict(_rows(db, "SELECT task_id, outcome FROM latest_task_results WHERE run_id = 'spare'"))
    assert latest == {t: "success" for t in FOUR_TASKS}
    servers = {vm for (vm,) in _rows(db, "SELECT DISTINCT vm_id FROM task_results WHERE run_id = 'spare'")}
    assert len(servers) == 2  # the first server, then the spare under the replacement's name
    # Reached as existing servers, but labelled by what they are.
    assert _rows(db, "SELECT environment FROM runs WHERE run_id = 'spare'") == [("local-simulation (existing server)",)]
