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


# --- round 3: Windows' limits, OS errors, evaluation faults, dropped resets -------------------------

NOTEPAD_TASKS = ["notepad-append-line", "notepad-replace-notes", "notepad-shopping-list-desktop"]


def _set_faults(base_url: str, *faults: dict[str, Any], seed: int = 0) -> None:
    import requests

    requests.post(f"{base_url}/sim/faults", json={"faults": list(faults), "seed": seed}, timeout=10).raise_for_status()


def _fault_hits(base_url: str) -> list[int]:
    import requests

    return [f["hits"] for f in requests.get(f"{base_url}/sim/faults", timeout=10).json()["faults"]]


def _run_on(server_url: str, tmp_path: Path, run_id: str, task_ids: list[str], **settings: Any) -> Any:
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    return run_suite(SuiteRunConfig(
        task_ids=task_ids, provider="existing", waa_urls=[server_url], pool_size=1, reset_level="setup",
        server_wait_seconds=5, db_path=tmp_path / "arena.duckdb", artifacts_dir=tmp_path / "art", run_id=run_id,
        **settings,
    ))


def _one_final_result_each(db: Path, run_id: str, task_ids: list[str], outcome: Any) -> dict[str, str]:
    latest = dict(_rows(db, "SELECT task_id, outcome FROM latest_task_results WHERE run_id = ?", [run_id]))
    assert sorted(latest) == sorted(task_ids)  # exactly one final (latest) row per task
    infra_final = sum(1 for o in latest.values() if o == "infrastructure_error")
    assert outcome.completeness is not None and outcome.completeness.missing == infra_final
    return latest


def test_os_errors_on_actions_never_make_an_agent_failure(prefect_server: None, tmp_path: Path) -> None:
    """A VM whose /execute fails a share of the harness's well-formed actions with `OSError:
    [WinError 5] Access is denied` (returncode 1, HTTP 200): those attempts are infrastructure
    errors, retried; no attempt is scored against the agent for them (R1)."""
    server = start_local_env(tmp_path / "server")
    try:
        _set_faults(server.base_url, {"route": "/execute", "returncode": 1, "rate": 0.3}, seed=5)
        outcome = _run_on(server.base_url, tmp_path, "os-errors", NOTEPAD_TASKS, max_attempts=6)
        hits = _fault_hits(server.base_url)
    finally:
        server.stop()
    db = tmp_path / "arena.duckdb"
    rows = _rows(db, """
        SELECT r.outcome, count(s.step_index) FILTER (WHERE s.error LIKE '%WinError 5%') AS os_errors
        FROM task_results r LEFT JOIN steps s USING (run_id, task_id, attempt)
        WHERE r.run_id = 'os-errors' GROUP BY r.task_id, r.attempt, r.outcome""")
    assert hits[0] > 0 and any(n for _, n in rows), "the OS errors never hit an action"
    assert all(o == "infrastructure_error" for o, n in rows if n)
    assert not [o for o, _ in rows if o == "agent_failure"]
    latest = _one_final_result_each(db, "os-errors", NOTEPAD_TASKS, outcome)
    assert set(latest.values()) <= {"success", "infrastructure_error"}


def test_dropped_connections_on_reset_and_clean_up_cost_no_attempt(prefect_server: None, tmp_path: Path) -> None:
    """WAA's reset and clean-up calls are safe to repeat: a dropped connection is retried (R10)."""
    server = start_local_env(tmp_path / "server")
    try:
        # The first two calls of each are dropped (a reset's first three tries fail, its fourth works).
        _set_faults(server.base_url,
                    {"route": "/setup/close_all", "drop": True, "count": 2},
                    {"route": "/setup/clear_task_files", "drop": True, "count": 2})
        outcome = _run_on(server.base_url, tmp_path, "dropped-resets", FOUR_TASKS)
        hits = _fault_hits(server.base_url)
    finally:
        server.stop()
    assert hits == [2, 2]
    assert outcome.status == "completed", outcome.table
    rows = _rows(tmp_path / "arena.duckdb", "SELECT task_id, attempt, outcome FROM task_results WHERE run_id = 'dropped-resets'")
    assert sorted(rows) == sorted((t, 1, "success") for t in FOUR_TASKS)  # one attempt each


def test_a_getters_server_500_never_makes_a_scored_outcome(prefect_server: None, tmp_path: Path) -> None:
    """/file (the evaluation channel) answers 500 to a getter through all of its retries: under
    the default scoring that attempt is an infrastructure error and retried; --scoring waa-compat
    scores it as WAA does (0), and says so on the run (R9)."""
    server = start_local_env(tmp_path / "server")
    # A read's 4 tries (3 retries) all fail, twice: at an existing server's reset level (setup) the
    # start-state check reads the file its evaluator reads first (R12; it leaves out a read the
    # server failed), then the evaluation does.
    failing = {"route": "/file", "status": 500, "count": 8}
    try:
        _set_faults(server.base_url, failing)
        strict = _run_on(server.base_url, tmp_path, "eval-500", NOTEPAD_TASKS)
        _set_faults(server.base_url, failing)
        compat = _run_on(server.base_url, tmp_path, "eval-500-compat", NOTEPAD_TASKS, scoring="waa-compat")
    finally:
        server.stop()
    db = tmp_path / "arena.duckdb"
    rows = _rows(db, "SELECT outcome, coalesce(error, reason, '') FROM task_results WHERE run_id = 'eval-500'")
    failed = [o for o, why in rows if "the server failed /file" in why]
    assert failed == ["infrastructure_error"]
    assert all("server failed" not in why for o, why in rows if o in ("success", "agent_failure"))
    assert _one_final_result_each(db, "eval-500", NOTEPAD_TASKS, strict) == {t: "success" for t in NOTEPAD_TASKS}
    compat_rows = _rows(db, "SELECT outcome, reason FROM task_results WHERE run_id = 'eval-500-compat'")
    assert any(o == "agent_failure" and "scoring waa-compat" in (why or "") for o, why in compat_rows)
    assert _rows(db, "SELECT run_id, scoring FROM runs WHERE run_id LIKE 'eval-500%' ORDER BY run_id") == [
        ("eval-500", "strict"), ("eval-500-compat", "waa-compat")]
    assert "scoring: waa-compat" in compat.table and "scoring: strict" in strict.table


def test_a_40000_character_text_arrives_verbatim_through_a_whole_run(prefect_server: None, tmp_path: Path) -> None:
    """A task whose solution types one 40,000-character line into Notepad and saves: the text
    reaches the file exactly, typed in 40 pieces within Windows' command-line limit and WAA's
    /execute timeout (both enforced by the simulation), and the step records how."""
    import shutil

    from adapters.waa.catalog import bundled_suite_dir

    suite = tmp_path / "suite"
    shutil.copytree(bundled_suite_dir(), suite)
    line = "".join(chr(33 + (i * 11) % 94) for i in range(40_000))  # printable ASCII, quotes and backslashes
    task_file = suite / "examples" / "notepad" / "notepad-append-line.json"
    task = json.loads(task_file.read_text())
    task["evaluator"]["expected"]["rules"]["expected"] = ["buy milk", "water the plants", line]
    task_file.write_text(json.dumps(task))
    plans = json.loads((suite / "solutions.json").read_text())
    plans["notepad-append-line"] = [step if "type" not in step else {"type": line} for step in plans["notepad-append-line"]]
    (suite / "solutions.json").write_text(json.dumps(plans))
    server = start_local_env(tmp_path / "server")
    try:
        outcome = _run_on(server.base_url, tmp_path, "long-text", ["notepad-append-line"], suite_dir=suite)
    finally:
        server.stop()
    assert outcome.status == "completed", outcome.table
    db = tmp_path / "arena.duckdb"
    assert _rows(db, "SELECT attempt, outcome FROM task_results WHERE run_id = 'long-text'") == [(1, "success")]
    deliveries = [d for (d,) in _rows(db, "SELECT delivery FROM steps WHERE run_id = 'long-text' AND action_type = 'type'")]
    assert deliveries == ["pyautogui.write through /execute: 40000 characters in 40 piece(s) of at most 1000"]


# --- round 4: faults that repeat, time the server took, where retries run, start states --------

CODE_PAGE_TASK = {
    "id": "notepad-read-names-cp",
    "snapshot": "notepad",
    "instruction": "Leave the list of names as it is.",
    "source": "round 4 stand-in",
    "config": [{"type": "create_file", "parameters": {
        "path": "C:\\Users\\Docker\\Desktop\\names.txt", "content": "Ёлка\nMüller\n"}}],
    "trajectory": "trajectories/",
    "related_apps": ["notepad"],
    "evaluator": {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": 'cmd /c type "C:\\Users\\Docker\\Desktop\\names.txt"'},
        "expected": {"type": "rule", "rules": {"expected": "Ёлка\r\nMüller\r\n"}},
    },
}


def _suite_with(tmp_path: Path, *tasks: dict[str, Any], plans: dict[str, Any] | None = None) -> Path:
    """The bundled suite plus `tasks` (each done at once unless `plans` says otherwise)."""
    import shutil

    from adapters.waa.catalog import bundled_suite_dir

    suite = tmp_path / "suite"
    shutil.copytree(bundled_suite_dir(), suite)
    index = json.loads((suite / "test_all.json").read_text())
    solutions = json.loads((suite / "solutions.json").read_text())
    for task in tasks:
        domain = task["snapshot"]
        (suite / "examples" / domain / f"{task['id']}.json").write_text(json.dumps(task, ensure_ascii=False))
        index[domain].append(task["id"])
        solutions[task["id"]] = (plans or {}).get(task["id"], [{"done": True}])
    (suite / "test_all.json").write_text(json.dumps(index))
    (suite / "solutions.json").write_text(json.dumps(solutions, ensure_ascii=False))
    return suite


def test_a_getter_that_fails_the_same_way_on_a_fresh_vm_is_the_tasks_evaluation_error(
    prefect_server: None, tmp_path: Path
) -> None:
    """A getter prints a UTF-8 file through `cmd /c type`; WAA's /execute decodes a command's
    output in cp1252, so the server answers 500 ("'charmap' codec can't decode byte 0x81") every
    time. The first attempt is retried from a fresh reset on a fresh VM; when it fails the same
    way there, the task's evaluation error ends it (R11): no third VM, the run completes."""
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    suite = _suite_with(tmp_path, CODE_PAGE_TASK)
    db = tmp_path / "arena.duckdb"
    outcome = run_suite(SuiteRunConfig(
        suite_dir=suite, task_ids=[CODE_PAGE_TASK["id"], "notepad-append-line"], pool_size=2, max_attempts=3,
        db_path=db, artifacts_dir=tmp_path / "art", run_id="repeats"))
    rows = _rows(db, "SELECT attempt, outcome, vm_id, coalesce(error, '') FROM task_results "
                     "WHERE run_id = 'repeats' AND task_id = ? ORDER BY attempt", [CODE_PAGE_TASK["id"]])
    assert [(a, o) for a, o, _, _ in rows] == [(1, "infrastructure_error"), (2, "evaluation_error")]
    assert "codec can't decode byte 0x81" in rows[0][3] and rows[0][2] != rows[1][2]  # two VMs
    assert "failed the same way" in rows[1][3] and "codec can't decode byte 0x81" in rows[1][3]
    assert outcome.status == "completed", outcome.table


class _Lines:
    """A logger for the scheduling core that keeps its lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args)

    def error(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args)


def test_retry_messages_say_where_the_retry_runs(tmp_path: Path) -> None:
    """An existing server (WAA's only kind of "replacement": the same server, back at the same
    address) fails two attempts of a task: each retry's line says it runs on the same VM, and no
    line claims another VM. With two servers, the retry's line names the other one."""
    from adapters.benchmark import BenchmarkResult, BenchmarkTask, OutcomeKind
    from adapters.vms.existing import ExistingServersProvider
    from adapters.vms.pool import VMPool
    from flows.scheduling import AttemptHooks, Schedule, WorkQueue, attempt_loop

    def attempt(task: BenchmarkTask, vm: Any, number: int) -> BenchmarkResult:
        if number < 3:
            vm.healthy = False  # as run_attempt does after the server failed a call
            return BenchmarkResult(task_id=task.task_id, outcome=OutcomeKind.INFRASTRUCTURE_ERROR, attempt=number,
                                   vm_id=vm.vm_id, error="setup: the server failed /setup/launch: HTTP 500")
        return BenchmarkResult(task_id=task.task_id, outcome=OutcomeKind.SUCCESS, success=True, attempt=number,
                               vm_id=vm.vm_id)

    first, second = start_local_env(tmp_path / "first"), start_local_env(tmp_path / "second")
    try:
        said: dict[int, list[str]] = {}
        for urls in ([first.base_url], [first.base_url, second.base_url]):
            pool = VMPool(ExistingServersProvider(urls, server_wait_seconds=2), size=1, run_id="where")
            pool.provision()
            lines = _Lines()
            task = BenchmarkTask(task_id="t", instruction="", domain="notepad")
            schedule = Schedule(work=WorkQueue([]), pool=pool, max_attempts=3)
            hooks = AttemptHooks(attempt=attempt if len(urls) == 1 else _fail_first_then_stop_server(attempt, first),
                                 record=lambda r: None, logger=lines)
            result = attempt_loop(task, schedule, hooks)
            pool.teardown()
            assert result is not None and result.outcome is OutcomeKind.SUCCESS
            said[len(urls)] = lines.lines
    finally:
        first.stop()
        second.stop()
    one = said[1]
    assert not any("another VM" in line for line in one), one
    assert sum("(a retry) runs on" in line and "the same VM as the failed attempt" in line for line in one) == 2, one
    two = [line for line in said[2] if "(a retry) runs on" in line]
    assert two and "another VM than the failed attempt's" in two[0], said[2]


def _fail_first_then_stop_server(attempt: Any, server: Any) -> Any:
    """The first attempt fails and its server goes away, so the pool's replacement is the spare."""

    def run(task: Any, vm: Any, number: int) -> Any:
        if number == 1:
            server.stop()
        return attempt(task, vm, number if number == 1 else 3)

    return run


def test_a_task_that_cannot_be_isolated_at_setup_level_is_reported_before_it_is_scored(
    prefect_server: None, tmp_path: Path
) -> None:
    """An existing server at --reset-level setup (WAA's own reset: no snapshot): one Settings task
    turns Storage Sense on, the next one starts with it on, so its agent's click turns it off.
    Before, the second task was an agent failure (2 of 2 times); it is now a setup failure
    saying what its evaluator reads was left changed and by which task, out of the headline."""
    server = start_local_env(tmp_path / "server")
    tasks = ["settings-storage-sense-on", "settings-storage-sense-monthly"]
    try:
        outcome = _run_on(server.base_url, tmp_path, "shared-state", tasks)
    finally:
        server.stop()
    db = tmp_path / "arena.duckdb"
    rows = {t: (o, e) for t, o, e in _rows(db, "SELECT task_id, outcome, coalesce(error, '') FROM task_results "
                                               "WHERE run_id = 'shared-state'")}
    assert rows["settings-storage-sense-on"][0] == "success"
    outcome_kind, error = rows["settings-storage-sense-monthly"]
    assert outcome_kind == "setup_failure", rows
    assert "cannot be isolated at reset level setup" in error and "settings-storage-sense-on" in error
    assert "Name '01'" in error  # what changed: the registry value its evaluator reads
    assert outcome.status == "completed"


def test_an_episode_the_slow_server_ran_out_of_time_is_not_the_agents_timeout(
    prefect_server: None, tmp_path: Path
) -> None:
    """WAA's slow accessibility tree (quirks: 2 s a read) against a 3 s episode limit: the scripted
    agent spends almost nothing, the server the rest. Before: `timeout`, in the headline rate, a
    reason without times. Now: an infrastructure error (retried, never scored) whose reason gives
    the agent's and the environment's time."""
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    db = tmp_path / "arena.duckdb"
    outcome = run_suite(SuiteRunConfig(
        task_ids=["notepad-append-line"], pool_size=1, quirks=True, max_attempts=2, episode_timeout_seconds=3.0,
        quirk_settings={"ready_delay": 0.0, "accessibility_delay": 2.0, "launch_delay": 0.0, "failsafe": False},
        db_path=db, artifacts_dir=tmp_path / "art", run_id="slow-tree"))
    rows = _rows(db, "SELECT attempt, outcome, error FROM task_results WHERE run_id = 'slow-tree' ORDER BY attempt")
    assert [(a, o) for a, o, _ in rows] == [(1, "infrastructure_error"), (2, "infrastructure_error")]
    for _, _, error in rows:
        assert "because the server was slow" in error and "the agent 0.0 s, the environment (WAA server)" in error
    assert outcome.status == "incomplete"
