"""Hedge copies of a run's last tasks (flows/hedging.py) through the real scheduling core and VM
pool: a copy stands in only for an attempt that failed with an infrastructure error, the task's
own final result always counts, a copy that can no longer count stops at once, and copies stay
within their VM-time allowance."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from adapters.benchmark import BenchmarkResult, BenchmarkTask, ModelUsage, OutcomeKind
from adapters.vms.base import VMHandle
from adapters.vms.local import LocalSimulationProvider
from adapters.vms.pool import VMPool
from flows.attempt import STOPPED_COPY, run_attempt
from flows.hedging import Hedging
from flows.scheduling import AttemptHooks, Schedule, WorkQueue, attempt_loop, copy_loop, lane_loop
from tests.flows.test_pool_and_attempts import CATALOG, _ctx, _InstantProvider, _task

LOG = logging.getLogger("test")


class Plan:
    """Attempts by (task, attempt number): how long each takes and whether it is an
    infrastructure error; every attempt run is logged, and one told to stop returns at once."""

    def __init__(self, seconds: dict[tuple[str, int], float], fail: set[tuple[str, int]] = frozenset()) -> None:
        self.seconds, self.fail = seconds, fail
        self.ran: list[tuple[str, int, bool]] = []  # task, attempt, whether it was stopped
        self.recorded: list[BenchmarkResult] = []
        self._lock = threading.Lock()

    def attempt(self, task: BenchmarkTask, vm: VMHandle, number: int,
                stop: threading.Event | None = None) -> BenchmarkResult:
        seconds = self.seconds[(task.task_id, number)]
        stopped = stop.wait(seconds) if stop is not None else bool(time.sleep(seconds))
        with self._lock:
            self.ran.append((task.task_id, number, stopped))
        usage = ModelUsage(model_calls=1, input_tokens=100, output_tokens=10, cost_usd=0.01)
        if (task.task_id, number) in self.fail:
            vm.healthy = False
            return BenchmarkResult(task_id=task.task_id, outcome=OutcomeKind.INFRASTRUCTURE_ERROR, attempt=number,
                                   vm_id=vm.vm_id, usage=usage)
        return BenchmarkResult(task_id=task.task_id, outcome=OutcomeKind.SUCCESS, success=True, attempt=number,
                               vm_id=vm.vm_id, usage=usage)

    def record(self, result: BenchmarkResult) -> None:
        with self._lock:
            self.recorded.append(result)


def _run(plan: Plan, tasks: list[str], vms: int, expected: dict[str, float], hedging: Hedging | None,
         replace_seconds: float = 3.0) -> None:
    """The tasks on `vms` lanes, as a run does."""
    pool = VMPool(_InstantProvider(replace_seconds=replace_seconds), size=vms, run_id="hedge")
    pool.provision()
    schedule = Schedule(work=WorkQueue([_task(t) for t in tasks]), pool=pool, max_attempts=3, hedging=hedging,
                        expected_seconds=expected)
    hooks = AttemptHooks(attempt=plan.attempt, record=plan.record, logger=LOG)
    with ThreadPoolExecutor(max_workers=vms) as lanes:
        for future in [lanes.submit(lane_loop, schedule, lambda t: attempt_loop(t, schedule, hooks), LOG,
                                    lambda race: copy_loop(race, schedule, hooks)) for _ in range(vms)]:
            future.result()
    pool.teardown()
    assert schedule.work.running == 0


def _recorded(plan: Plan) -> list[tuple[str, int, str]]:
    return sorted((r.task_id, r.attempt, r.outcome.value) for r in plan.recorded)


# Generous: the allowance is not what these tests are about (billed VM time is tiny here).
OPEN = 1000.0


def test_a_copy_stands_in_for_an_attempt_that_fails_late() -> None:
    """The long task fails near its end; its copy, started when the other lane ran out of work,
    is recorded as attempt 2 instead of a retry that waits for a replacement VM (3 s)."""
    plan = Plan({("long", 1): 1.0, ("long", 2): 1.0, ("short", 1): 0.2}, fail={("long", 1)})
    hedging = Hedging(max_extra=OPEN)
    _run(plan, ["long", "short"], 2, {"long": 1.0, "short": 0.2}, hedging)
    assert _recorded(plan) == [("long", 1, "infrastructure_error"), ("long", 2, "success"), ("short", 1, "success")]
    by_task = {(r.task_id, r.attempt): r.vm_id for r in plan.recorded}
    assert by_task[("long", 2)] == by_task[("short", 1)]  # the copy ran on the VM "short" freed, no replacement
    assert (hedging.stats.started, hedging.stats.used, hedging.stats.dropped) == (1, 1, 0)


def test_the_tasks_own_final_result_counts_even_when_its_copy_finishes_first() -> None:
    """No bias toward short episodes: the copy ends first (a quicker success), yet the owner's
    own result is recorded and the copy's dropped, its tokens counted as hedging's price."""
    plan = Plan({("long", 1): 1.0, ("long", 2): 0.3, ("short", 1): 0.2})
    hedging = Hedging(max_extra=OPEN)
    _run(plan, ["long", "short"], 2, {"long": 1.0, "short": 0.2}, hedging)
    assert _recorded(plan) == [("long", 1, "success"), ("short", 1, "success")]
    stats = hedging.stats
    assert (stats.started, stats.used, stats.dropped, stats.extra_tokens) == (1, 0, 1, 110)
    assert 0.2 < stats.extra_vm_seconds < 5.0  # the copy's own 0.3 s counted, not the run's
    assert "1 copy" in stats.describe(hedging.max_extra) and "1 dropped" in stats.describe(hedging.max_extra)


def test_a_copy_stops_as_soon_as_its_task_ends() -> None:
    """The copy would run 5 s; its task ends at 0.8 s, and the run ends then too."""
    plan = Plan({("long", 1): 0.8, ("long", 2): 5.0, ("short", 1): 0.1})
    hedging = Hedging(max_extra=OPEN)
    _run(plan, ["long", "short"], 2, {"long": 0.8, "short": 0.1}, hedging)
    assert ("long", 2, True) in plan.ran  # told to stop, not run its 5 s out
    assert _recorded(plan) == [("long", 1, "success"), ("short", 1, "success")]
    assert hedging.stats.dropped == 1 and hedging.stats.extra_vm_seconds < 5.0


def test_a_copy_that_fails_is_dropped_and_the_owner_retries_as_usual() -> None:
    plan = Plan({("long", 1): 0.6, ("long", 2): 0.1, ("long", 3): 0.1, ("short", 1): 0.1},
                fail={("long", 1), ("long", 2)})
    hedging = Hedging(max_extra=OPEN)
    _run(plan, ["long", "short"], 2, {"long": 0.6, "short": 0.1}, hedging, replace_seconds=0.0)
    # Attempt 2 (the copy) is not recorded: a task's attempt numbers may skip a dropped copy.
    assert _recorded(plan) == [("long", 1, "infrastructure_error"), ("long", 3, "success"), ("short", 1, "success")]
    assert (hedging.stats.used, hedging.stats.dropped) == (0, 1)


def test_a_held_copy_result_is_recorded_when_the_owner_fails_after_it() -> None:
    """The copy succeeds first and waits; the owner then fails: the copy's result is recorded as
    the next attempt, with no retry run at all."""
    plan = Plan({("long", 1): 1.0, ("long", 2): 0.3, ("short", 1): 0.1}, fail={("long", 1)})
    hedging = Hedging(max_extra=OPEN)
    _run(plan, ["long", "short"], 2, {"long": 1.0, "short": 0.1}, hedging)
    assert _recorded(plan) == [("long", 1, "infrastructure_error"), ("long", 2, "success"), ("short", 1, "success")]
    assert ("long", 3) not in {(t, n) for t, n, _ in plan.ran}
    assert (hedging.stats.used, hedging.stats.dropped) == (1, 0)


def test_copies_go_to_the_task_expected_to_end_last_within_the_allowance() -> None:
    """Four lanes, one long and three short tasks: the long one is copied; with an allowance too
    small for its remaining time, nothing is."""
    seconds = {("long", 1): 1.0, ("long", 2): 1.0, **{(f"s{i}", n): 0.2 for i in range(3) for n in (1, 2)}}
    expected = {"long": 1.0, "s0": 0.2, "s1": 0.2, "s2": 0.2}
    plan = Plan(seconds)
    hedging = Hedging(max_extra=OPEN)
    _run(plan, ["long", "s0", "s1", "s2"], 4, expected, hedging)
    copied = [(t, n) for t, n, _ in plan.ran if n == 2]
    assert copied == [("long", 2)] and hedging.stats.started == 1  # one copy per task at most

    plan = Plan(seconds)
    tight = Hedging(max_extra=0.01)
    _run(plan, ["long", "s0", "s1", "s2"], 4, expected, tight)
    assert tight.stats.started == 0 and all(n == 1 for _, n, _ in plan.ran)
    # The summary still says hedging was on, and why nothing was copied.
    assert tight.stats.describe(tight.max_extra).startswith("hedging: on, no copy started (none fit within 1% of")
    assert hedging.stats.describe(hedging.max_extra).startswith("hedging: 1 copy of the run's last tasks; ")


def test_a_stopping_run_stops_its_copies_at_once() -> None:
    """Ctrl-C or a cancellation closes the queue and stops the copies (pool_engine._stop_lanes):
    a copy that would run 5 s ends at once, the task's own attempt runs on and is recorded."""
    plan = Plan({("long", 1): 1.0, ("long", 2): 5.0, ("short", 1): 0.1})
    hedging = Hedging(max_extra=OPEN)
    pool = VMPool(_InstantProvider(), size=2, run_id="stop")
    pool.provision()
    work = WorkQueue([_task("long"), _task("short")])
    schedule = Schedule(work=work, pool=pool, max_attempts=3, hedging=hedging,
                        expected_seconds={"long": 1.0, "short": 0.1})
    hooks = AttemptHooks(attempt=plan.attempt, record=plan.record, logger=LOG)

    def stop_when_copied() -> None:
        while hedging.stats.started == 0:
            time.sleep(0.01)
        work.close()
        hedging.stop_copies()

    stopper = threading.Thread(target=stop_when_copied)
    stopper.start()
    with ThreadPoolExecutor(max_workers=2) as lanes:
        for future in [lanes.submit(lane_loop, schedule, lambda t: attempt_loop(t, schedule, hooks), LOG,
                                    lambda race: copy_loop(race, schedule, hooks)) for _ in range(2)]:
            future.result()
    stopper.join()
    pool.teardown()
    assert ("long", 2, True) in plan.ran  # told to stop, not run its 5 s out
    assert _recorded(plan) == [("long", 1, "success"), ("short", 1, "success")]


def test_without_hedging_the_lane_retires_and_no_copy_runs() -> None:
    plan = Plan({("long", 1): 0.5, ("short", 1): 0.1})
    _run(plan, ["long", "short"], 2, {"long": 0.5, "short": 0.1}, None)
    assert sorted((t, n) for t, n, _ in plan.ran) == [("long", 1), ("short", 1)]


def test_a_stopped_copy_on_the_simulation_ends_at_once_with_its_vm_sound(prefect_server: None, tmp_path: Path) -> None:
    """The real attempt: a copy whose stop is set ends before touching the VM, and one stopped
    during its episode ends before the next step; neither marks the VM for replacement."""
    provider = LocalSimulationProvider(tmp_path / "vms")
    try:
        vm = provider.create("copy")
        task = CATALOG.load(CATALOG.task_ids()[0])
        stop = threading.Event()
        stop.set()
        result = run_attempt(task, vm, _ctx(provider, tmp_path), 2, stop=stop)
        assert result.error == STOPPED_COPY and result.num_steps == 0 and vm.healthy

        later = threading.Event()
        threading.Timer(0.3, later.set).start()
        result = run_attempt(task, vm, _ctx(provider, tmp_path), 3, stop=later)
        assert vm.healthy
        if result.error == STOPPED_COPY:  # else the episode was done within 0.3 s: nothing to stop
            assert result.outcome is OutcomeKind.INFRASTRUCTURE_ERROR and "evaluate" not in result.timings
    finally:
        provider.close()


def test_auto_hedging_is_on_only_for_agents_that_call_no_model_on_created_vms() -> None:
    from flows.run_config import SuiteRunConfig

    assert SuiteRunConfig(agent="scripted", provider="kvm").hedging_on()
    assert SuiteRunConfig(agent="scripted", provider="azure").hedging_on()
    assert not SuiteRunConfig(agent="anthropic", provider="aws").hedging_on()
    assert not SuiteRunConfig(agent="scripted", provider="local").hedging_on()
    assert SuiteRunConfig(agent="anthropic", provider="local", hedging="on").hedging_on()
    assert not SuiteRunConfig(agent="scripted", provider="kvm", hedging="off").hedging_on()
    with pytest.raises(ValueError, match="hedging"):
        SuiteRunConfig(hedging="sometimes")  # type: ignore[arg-type]


def test_a_run_with_hedging_copies_its_last_task_and_records_only_the_tasks_own_attempts(
        prefect_server: None, tmp_path: Path) -> None:
    """A real run on the simulation: a long task (10 steps) and a short one (2) on two VMs. When
    the short one ends, its lane copies the long one; the copy stops when the long one ends,
    nothing of it is stored, the summary prices it, and the UI shows it as "Not counted"."""
    import duckdb

    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig
    from tests.flows.test_flow_e2e import _task_runs

    db = tmp_path / "arena.duckdb"
    outcome = run_suite(SuiteRunConfig(
        agent="scripted", pool_size=2, db_path=db, artifacts_dir=tmp_path / "artifacts", run_id="hedged",
        task_ids=["notepad-shopping-list-desktop", "settings-storage-sense-on"], settle=0.4,
        hedging="on", hedge_allowance=1.0,
    ))
    assert outcome.status == "completed" and all(r.success for r in outcome.results)
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute("SELECT task_id, attempt FROM task_results WHERE run_id = 'hedged' ORDER BY 1").fetchall()
    assert stored == [("notepad-shopping-list-desktop", 1), ("settings-storage-sense-on", 1)]
    assert "hedging: 1 copy of the run's last tasks; 0 stood in for a failed attempt, 1 dropped" in outcome.table
    deadline = time.monotonic() + 30
    while True:
        copies = _task_runs(db, "hedged", "notepad/notepad-shopping-list-desktop hedge copy")
        if (copies and copies[0][1] != "Running") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert [(name, state) for name, state, _ in copies] == [
        ("notepad/notepad-shopping-list-desktop hedge copy", "Not counted")]
    # Its attempt (number 2, which stays unused in the store) says it was stopped.
    assert [state for name, state, _ in _task_runs(db, "hedged", "attempt 2 on ")] == ["Stopped"]
