"""Fault injection on the whole flow: a VM dying mid-episode, a hanging server, a controller
killed mid-run and resumed, a throttling model endpoint, and the run budget.

Each test runs the real flow (Prefect test server, local simulation VMs, DuckDB) and then checks
the stored attempts: every selected task ends with exactly one final result (its last attempt),
retried attempts are all recorded, and nothing is counted twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pytest

from adapters.benchmark import (
    AgentInfrastructureError,
    BenchmarkAction,
    BenchmarkAgent,
    BenchmarkObservation,
    BenchmarkTask,
    StepRecord,
)
from adapters.waa.catalog import bundled_suite_dir
from adapters.store import connections

REPO = Path(__file__).resolve().parents[2]
SIM_MODULE = "adapters.waa.localenv"


# --- helpers ---------------------------------------------------------------------------------


def _make_suite(root: Path, size: int) -> list[str]:
    """A suite in WAA's layout with `size` tasks: the bundled ones plus copies under new ids."""
    source = bundled_suite_dir()
    index: dict[str, list[str]] = json.loads((source / "test_all.json").read_text())
    plans: dict[str, Any] = json.loads((source / "solutions.json").read_text())
    originals = [(domain, task_id) for domain, ids in index.items() for task_id in ids]
    out_index: dict[str, list[str]] = {domain: [] for domain in index}
    out_plans: dict[str, Any] = {}
    for n in range(size):
        domain, task_id = originals[n % len(originals)]
        new_id = task_id if n < len(originals) else f"{task_id}-copy{n // len(originals)}"
        raw = json.loads((source / "examples" / domain / f"{task_id}.json").read_text())
        raw["id"] = new_id
        target = root / "examples" / domain / f"{new_id}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(raw, indent=1))
        out_index[domain].append(new_id)
        out_plans[new_id] = plans[task_id]
    (root / "test_all.json").write_text(json.dumps(out_index, indent=1))
    (root / "solutions.json").write_text(json.dumps(out_plans, indent=1))
    return [t for ids in out_index.values() for t in ids]


def _rows(db: Path, sql: str, params: list[Any] | None = None) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, params or []).fetchall()


def _attempts(db: Path, run_id: str) -> dict[str, list[tuple[int, str, str]]]:
    """(attempt, outcome, vm_id) of every stored attempt, by task."""
    out: dict[str, list[tuple[int, str, str]]] = {}
    for task_id, attempt, outcome, vm_id in _rows(
        db, "SELECT task_id, attempt, outcome, vm_id FROM task_results WHERE run_id = ? ORDER BY task_id, attempt", [run_id]
    ):
        out.setdefault(task_id, []).append((attempt, outcome, vm_id))
    return out


def _sim_processes(root: psutil.Process | None = None) -> list[psutil.Process]:
    """Simulation processes among the children of `root` (default: this process)."""
    root = root or psutil.Process()
    found = []
    for child in root.children(recursive=True):
        try:
            if SIM_MODULE in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            pass
    return found


@pytest.fixture()
def no_sim_leak() -> Iterator[None]:
    """Fails the test if a simulation process it started (a child of this process) outlives it."""
    before = {p.pid for p in _sim_processes()}
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        leaked = [p for p in _sim_processes() if p.pid not in before]
        if not leaked:
            return
        time.sleep(0.1)
    pytest.fail(f"simulation processes leaked: {[' '.join(p.cmdline()) for p in leaked]}")


class _WrappedAgent(BenchmarkAgent):
    """Delegates to another agent, calling `before_act(step_index)` before each action."""

    def __init__(self, inner: BenchmarkAgent, before_act: Callable[[int], None]) -> None:
        self.inner = inner
        self.name = f"wrapped-{inner.name}"
        self.before_act = before_act

    def reset(self, task: BenchmarkTask) -> None:
        self.inner.reset(task)

    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        self.before_act(len(history))
        return self.inner.act(task, observation, history)

    def config(self) -> dict[str, Any]:
        return self.inner.config()


def _inject_on_first_attempt(monkeypatch: pytest.MonkeyPatch, task_id: str, before_act: Callable[[Any, int], None]) -> None:
    """On attempt 1 of `task_id`, wrap the attempt's agent with `before_act(vm, step_index)`."""
    import flows.pool_engine as engine

    original = engine.run_attempt

    def run_attempt(task: BenchmarkTask, vm: Any, ctx: Any, attempt: int, **options: Any) -> Any:
        if task.task_id == task_id and attempt == 1:
            factory = ctx.agent_factory
            ctx = dataclasses.replace(
                ctx, agent_factory=lambda: _WrappedAgent(factory(), lambda step: before_act(vm, step))
            )
        return original(task, vm, ctx, attempt, **options)

    monkeypatch.setattr(engine, "run_attempt", run_attempt)


# --- (a) a VM dies mid-episode during a 30-task run ------------------------------------------


def test_vm_killed_mid_episode_is_retried_on_another_vm(
    prefect_server: None, no_sim_leak: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    suite_dir = tmp_path / "suite"
    ids = _make_suite(suite_dir, 30)
    victim = "notepad-draft-documents-copy1"  # an 8-step plan; killed before its third action
    assert victim in ids
    killed: list[int] = []

    def kill_vm(vm: Any, step: int) -> None:
        if step == 2 and not killed:
            killed.append(vm.details["pid"])
            os.kill(vm.details["pid"], signal.SIGKILL)

    _inject_on_first_attempt(monkeypatch, victim, kill_vm)
    db = tmp_path / "arena.duckdb"
    outcome = run_suite(
        SuiteRunConfig(suite_dir=suite_dir, pool_size=3, db_path=db, artifacts_dir=tmp_path / "art", run_id="faults-kill")
    )
    assert killed and not psutil.pid_exists(killed[0])  # killed, then reaped by the pool's replacement

    attempts = _attempts(db, "faults-kill")
    assert sorted(attempts) == sorted(ids)
    # The victim: an infrastructure error on one VM, then a success on another.
    (a1, o1, vm1), (a2, o2, vm2) = attempts[victim]
    assert (a1, o1, a2, o2) == (1, "infrastructure_error", 2, "success") and vm1 != vm2
    # The reason gives the cause beside the server's symptom: the VM's process and how it ended.
    ((reason,),) = _rows(db, "SELECT reason FROM task_results WHERE run_id = 'faults-kill' AND task_id = ? "
                         "AND attempt = 1", [victim])
    assert f"(pid {killed[0]}) was killed by signal 9" in reason, reason
    steps_before_kill = _rows(
        db, "SELECT step_index, error FROM steps WHERE run_id = 'faults-kill' AND task_id = ? AND attempt = 1 "
        "ORDER BY step_index", [victim],
    )
    # Two steps played, then the step the dead server failed: kept, with the server's failure.
    assert [i for i, _ in steps_before_kill] == [0, 1, 2]
    assert steps_before_kill[0][1] is None and "server failed" in steps_before_kill[2][1]
    # Every other task: exactly one attempt. Nothing counted twice.
    assert all(len(a) == 1 and a[0][1] == "success" for t, a in attempts.items() if t != victim)
    assert sum(len(a) for a in attempts.values()) == 31
    latest = _rows(db, "SELECT task_id, outcome FROM latest_task_results WHERE run_id = 'faults-kill'")
    assert len(latest) == 30 and {o for _, o in latest} == {"success"}
    # The pool replaced the dead VM, and a later task ran on the replacement.
    assert any(vm.endswith("-r1") for a in attempts.values() for _, _, vm in a)
    assert outcome.status == "completed" and outcome.completeness.missing == 0
    assert len(outcome.results) == 30 and all(r.success for r in outcome.results)
    assert "missing: 0" in outcome.table
    # The Prefect UI story: progress reached 100 % and the markdown report says nothing is missing.
    flow_run_id = _rows(db, "SELECT prefect_flow_run_id FROM runs WHERE run_id = 'faults-kill'")[0][0]
    artifacts = _artifacts(flow_run_id)
    assert artifacts["waa-progress-faults-kill"].data == 100.0
    assert "missing: 0" in artifacts["waa-report-faults-kill"].data
    assert "waa-summary-faults-kill" in artifacts
    progress = json.loads((tmp_path / "art" / "faults-kill" / "progress.json").read_text())
    assert progress == {**progress, "final": 30, "selected": 30, "attempts_recorded": 31, "status": "completed"}


# --- (b) a server hanging on /accessibility ---------------------------------------------------


def test_hanging_accessibility_is_infrastructure_within_the_limit(
    prefect_server: None, no_sim_leak: None, tmp_path: Path
) -> None:
    """R7: an episode blocked on the server's first observation is infrastructure, not a timeout."""
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    db = tmp_path / "arena.duckdb"
    limit = 3.0
    started = time.monotonic()
    outcome = run_suite(
        SuiteRunConfig(
            task_ids=["notepad-append-line"],
            pool_size=1,
            quirks=True,
            # /accessibility sleeps 600 s (longer than the client's 300 s deadline).
            quirk_settings={"ready_delay": 0.0, "accessibility_delay": 600.0, "launch_delay": 0.0, "failsafe": False},
            episode_timeout_seconds=2.0,
            stage_timeouts={"reset": 20.0, "setup": 20.0, "episode": limit, "evaluate": 20.0},
            max_attempts=2,
            db_path=db,
            artifacts_dir=tmp_path / "art",
            run_id="faults-hang",
        )
    )
    elapsed = time.monotonic() - started
    (result,) = outcome.results
    assert result.outcome.value == "infrastructure_error" and result.attempt == 2
    assert "episode stage exceeded its wall-clock limit of 3 s" in (result.error or "")
    assert "did not answer the first observation" in (result.error or "")
    # Bounds far below the 300 s the client alone would wait, with room for a loaded machine.
    assert limit <= result.timings["episode"] < limit + 10.0
    assert result.total_time_seconds < limit + 20.0
    assert elapsed < 150  # the whole flow, two attempts, the VM's replacements and teardown
    rows = _rows(db, "SELECT attempt, outcome, num_steps FROM task_results WHERE run_id = 'faults-hang' ORDER BY attempt")
    assert rows == [(1, "infrastructure_error", 0), (2, "infrastructure_error", 0)]  # retried, never scored
    assert outcome.status == "incomplete"


# --- (c) the controller is SIGKILLed mid-run and the run is resumed ---------------------------

_CONTROLLER = """
import sys
from pathlib import Path
from flows.evaluate_suite import run_suite
from flows.run_config import SuiteRunConfig
suite, db, art, run_id = sys.argv[1:5]
run_suite(SuiteRunConfig(suite_dir=Path(suite), pool_size=3, db_path=Path(db), artifacts_dir=Path(art),
                         run_id=run_id, settle=0.05))
"""


def test_controller_killed_mid_run_is_resumed_exactly(prefect_server: None, no_sim_leak: None, tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    from flows.evaluate_suite import run_suite

    from flows.run_config import SuiteRunConfig

    suite_dir = tmp_path / "suite"
    ids = _make_suite(suite_dir, 30)
    db, art, run_id = tmp_path / "arena.duckdb", tmp_path / "art", "faults-resume"
    # A temporary folder of its own: no watcher removes what a bare `run_suite` killed leaves there.
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": str(REPO),
           "TMPDIR": str(tmp_path / "tmp")}
    controller = subprocess.Popen(
        [sys.executable, "-c", _CONTROLLER, str(suite_dir), str(db), str(art), run_id],
        cwd=REPO, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    progress = art / run_id / "progress.json"
    deadline = time.monotonic() + 60
    try:
        while True:
            assert controller.poll() is None, controller.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the controller recorded no results in 60 s"
            if progress.exists() and json.loads(progress.read_text())["final"] >= 4:
                break
            time.sleep(0.05)
        # The file is readable while the controller writes it (each write holds it briefly).
        with connections.connect(db, read_only=True, wait_seconds=30) as conn:
            assert conn.execute("SELECT count(*) FROM task_results WHERE run_id = ?", [run_id]).fetchone()[0] >= 4
        simulations = [p for p in psutil.Process(controller.pid).children(recursive=True)
                       if SIM_MODULE in " ".join(p.cmdline())]
    finally:
        controller.send_signal(signal.SIGKILL)
        controller.wait()
    # Its simulation VMs live in sessions of their own (a Ctrl-C reaches the controller only),
    # yet they do not outlive a controller killed with SIGKILL: they notice and exit.
    assert simulations
    _, alive = psutil.wait_procs(simulations, timeout=30)
    assert not alive, f"simulations outlived their killed controller: {[p.pid for p in alive]}"
    controller.stderr.close()

    # The killed controller left its concurrency limit behind with every slot taken; the rerun
    # must not wait for those slots forever.
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        leftover = client.read_global_concurrency_limit_by_name(f"waa-pool-{run_id}")
    assert leftover.active_slots == 3

    before = _attempts(db, run_id)
    run = _rows(db, "SELECT status, finished_at, task_count FROM runs WHERE run_id = ?", [run_id])[0]
    assert run == ("running", None, 30)  # an interrupted run is visibly unfinished
    final_before = {t for t, a in before.items() if a[-1][1] != "infrastructure_error"}
    assert 4 <= len(final_before) < 30

    outcome = run_suite(
        SuiteRunConfig(suite_dir=suite_dir, pool_size=3, db_path=db, artifacts_dir=art, run_id=run_id, settle=0.05)
    )
    after = _attempts(db, run_id)
    # Exactly the tasks without a final result ran again, each once; finished ones were untouched.
    assert sorted(r.task_id for r in outcome.results) == sorted(set(ids) - final_before)
    for task_id in ids:
        if task_id in final_before:
            assert after[task_id] == before[task_id]
        else:
            assert len(after[task_id]) == len(before.get(task_id, [])) + 1
            assert after[task_id][-1][0] == len(after[task_id])  # attempt numbers continue
    latest = _rows(db, "SELECT count(*), count_if(success) FROM latest_task_results WHERE run_id = ?", [run_id])[0]
    assert latest == (30, 30)
    assert outcome.status == "completed" and outcome.completeness.missing == 0
    assert _rows(db, "SELECT status FROM runs WHERE run_id = ?", [run_id]) == [("completed",)]


def _artifacts(flow_run_id: str) -> dict[str, Any]:
    """The latest artifact of each key of one flow run."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run_id)]))
        )
    by_key: dict[str, Any] = {}
    for artifact in sorted(found, key=lambda a: a.updated or a.created):
        by_key[artifact.key] = artifact
    return by_key


# --- (d) a throttling model endpoint ------------------------------------------------------------


def test_throttled_model_endpoint_is_retried_as_infrastructure(
    prefect_server: None, no_sim_leak: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    victim = "explorer-rename-file"

    def throttle(vm: Any, step: int) -> None:
        if step == 1:
            raise AgentInfrastructureError("model endpoint answered HTTP 429 Too Many Requests (retries exhausted)")

    _inject_on_first_attempt(monkeypatch, victim, throttle)
    db = tmp_path / "arena.duckdb"
    outcome = run_suite(
        SuiteRunConfig(
            task_ids=[victim, "notepad-append-line", "settings-storage-sense-on"],
            pool_size=2,
            db_path=db,
            artifacts_dir=tmp_path / "art",
            run_id="faults-throttle",
        )
    )
    attempts = _attempts(db, "faults-throttle")
    assert [(a, o) for a, o, _ in attempts[victim]] == [(1, "infrastructure_error"), (2, "success")]
    error = _rows(db, "SELECT error FROM task_results WHERE run_id = 'faults-throttle' AND attempt = 1 AND task_id = ?", [victim])
    assert "backend failed" in error[0][0] and "429" in error[0][0]
    assert all(len(a) == 1 for t, a in attempts.items() if t != victim)
    summary = _rows(db, "SELECT outcome, count(*) FROM latest_task_results WHERE run_id = 'faults-throttle' GROUP BY 1")
    assert summary == [("success", 3)]  # never an agent_failure, and counted once
    # The VM was fine: it was not replaced for the model's fault.
    assert not any(re.fullmatch(r"r\d+", vm.rsplit("-", 1)[-1]) for a in attempts.values() for _, _, vm in a)
    assert outcome.status == "completed"


# --- the run budget -----------------------------------------------------------------------------


def test_budget_stops_taking_tasks_and_says_so(prefect_server: None, no_sim_leak: None, tmp_path: Path) -> None:
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    db = tmp_path / "arena.duckdb"
    # The simulation's "VMs" cost $3600/h = $1/s each here, so a $10 budget ends the run early:
    # a pause of 1 s after every action makes the 16 tasks take longer than 10 s however fast the
    # machine, and a loaded machine still boots the one VM and starts a task well within 10 s
    # (at $1.5 it did not, twice, beside a second test suite).
    outcome = run_suite(
        SuiteRunConfig(
            pool_size=1, max_cost_usd=10, vm_hour_price_usd=3600.0, settle=1.0,
            db_path=db, artifacts_dir=tmp_path / "art", run_id="faults-budget",
        )
    )
    c = outcome.completeness
    assert outcome.status == "budget_exhausted" and c is not None
    assert c.budget_reason and "cost budget of $10 reached" in c.budget_reason
    recorded = _rows(db, "SELECT count(DISTINCT task_id) FROM task_results WHERE run_id = 'faults-budget'")[0][0]
    assert 1 <= recorded < c.selected == 16
    assert c.not_started == c.missing == 16 - recorded
    assert "STOPPED BY BUDGET" in outcome.table and f"{c.not_started} task(s) not started" in outcome.table
    assert _rows(db, "SELECT status FROM runs WHERE run_id = 'faults-budget'") == [("budget_exhausted",)]
