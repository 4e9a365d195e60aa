"""The scheduling core of the pool engine, in plain Python (no Prefect).

    lane_loop(schedule, run_task, logger, run_copy)   one VM's worth of work: tasks from the shared queue
      attempt_loop(task, schedule, hooks)             attempts of one task, each on a leased VM
      copy_loop(race, schedule, hooks)                a hedge copy of a running task (flows/hedging.py)

flows/pool_engine.py wraps both in Prefect tasks (the UI's "vm-lane" and "evaluate-task" runs)
and hands them Prefect's pieces through `AttemptHooks`: the attempt as its own task run, the run
logger, the recording task. bench/pool_efficiency.py hands them a timing-only attempt instead,
so the benchmark measures this very code rather than a copy of it.

The unit of work is one trial of a task (`TaskTrial`; a plain `BenchmarkTask` is its trial 1): a
run with `trials = K` queues K units per task, each attempted from its own fresh reset with its
own infrastructure retries. Attempt numbers count per task across its trials (`WorkQueue.claim_attempt`),
so two trials of one task running at once never share an attempt number or its stored row.

What the core decides: which task a lane starts next (`WorkQueue`, ordered by `longest_first`),
when a task is attempted again (only after an infrastructure error, from a fresh reset on the
next VM the pool hands out, up to `max_attempts`; an evaluation that fails the same way again is
the task's evaluation error, adapters/outcomes.py R11), that every attempt is recorded before its
VM goes back to the pool, and when a lane that ran out of work retires a VM the remaining tasks
do not need, or (with hedging on) first runs a copy of the task expected to end last.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from adapters.benchmark import BenchmarkResult, BenchmarkTask
from adapters.outcomes import RepeatedFaults
from adapters.vms.base import ProviderError, VMHandle
from adapters.vms.pool import VMPool
from flows.hedging import Hedging, Race


class Logger(Protocol):
    """What the core logs through: a `logging.Logger`, or Prefect's run logger (an adapter)."""

    def warning(self, msg: str, *args: Any) -> None: ...

    def error(self, msg: str, *args: Any) -> None: ...


class Budget(Protocol):
    """The run's budget as the core sees it (flows/budget.py `RunBudget`)."""

    def exhausted(self) -> str | None: ...

    def add(self, result: BenchmarkResult) -> None: ...


@dataclass(frozen=True)
class TaskTrial:
    """One trial of a task: the unit a lane takes from the queue (trial numbers start at 1)."""

    task: BenchmarkTask
    trial: int = 1

    @property
    def task_id(self) -> str:
        """The task's id (so a unit orders and logs like its task)."""
        return self.task.task_id


WorkUnit = BenchmarkTask | TaskTrial


def as_trial(unit: WorkUnit) -> TaskTrial:
    """A queued unit as a `TaskTrial` (a bare task is its first trial)."""
    return unit if isinstance(unit, TaskTrial) else TaskTrial(unit, 1)


class WorkQueue:
    """The tasks (or trials of tasks) left to start, and how many are running: lanes share one.

    Taking a task and counting it as running happen together, so once the queue is empty the
    running count only falls; a lane that finds no work can then retire its VM when the tasks
    still running (and their retries) have enough VMs without it.
    """

    def __init__(self, tasks: list[WorkUnit], first_attempts: dict[str, int] | None = None) -> None:
        self._todo: deque[WorkUnit] = deque(tasks)
        self._closed = False
        self._abandoned = False
        self._running = 0
        self._lock = threading.Lock()
        # Lowest attempt number per task when the attempts so far are stored elsewhere (shards).
        self._first_attempts = dict(first_attempts or {})
        self._next_attempts = dict(self._first_attempts)  # the next number each task hands out

    def first_attempt(self, task_id: str) -> int | None:
        """The lowest attempt number `task_id` may use, if one was given."""
        return self._first_attempts.get(task_id)

    def claim_attempt(self, task_id: str) -> int:
        """A fresh attempt number for `task_id` (from its first attempt on, 1 by default): trials
        of one task running at once each get their own."""
        with self._lock:
            number = self._next_attempts.get(task_id, 1)
            self._next_attempts[task_id] = number + 1
            return number

    def take(self) -> WorkUnit | None:
        """The next task to start (now counted as running), or None when none is left."""
        with self._lock:
            if not self._todo or self._closed:
                return None
            self._running += 1
            return self._todo.popleft()

    def close(self) -> None:
        """Start no more tasks (the run is being stopped); running ones carry on."""
        with self._lock:
            self._closed = True

    def abandon(self) -> None:
        """The stop's grace period is over: attempts still running are cut off by the teardown,
        and what they would report is not their task's outcome, so they record nothing."""
        with self._lock:
            self._closed = True
            self._abandoned = True

    @property
    def closed(self) -> bool:
        """Whether the run is being stopped (no task starts any more)."""
        with self._lock:
            return self._closed

    @property
    def abandoned(self) -> bool:
        """Whether the stop's grace period is over (see `abandon`)."""
        with self._lock:
            return self._abandoned

    def done(self) -> None:
        """A task taken with `take` (or a copy begun with `copy_started`) has ended."""
        with self._lock:
            self._running -= 1

    def copy_started(self) -> None:
        """A lane begins a hedge copy of a running task: it holds a VM as a task does, and may
        become the task's next attempt, so it counts as running until `done`."""
        with self._lock:
            self._running += 1

    @property
    def running(self) -> int:
        """Tasks taken and not yet done."""
        with self._lock:
            return self._running


def longest_first(tasks: list[WorkUnit], expected_seconds: dict[str, float]) -> list[WorkUnit]:
    """Tasks in the order lanes should start them: never-timed tasks, then longest first.

    Starting long tasks early keeps the end of a run from waiting on one long task while the
    other lanes sit idle (longest-processing-time-first scheduling). Tasks with no recorded
    duration go first, in their given order, since they may be long too.

    Why no smarter choice at take time: with recorded durations +-20 % off and 3 % of attempts
    failing (bench/pool_efficiency.py --seeds 1,2,3,4,5, 40 VMs), taking the task that best fits
    the running tasks' expected ends near the end of the run lost about 1 point to this order;
    re-packing the remaining tasks onto the lanes at every take gained under 1 point, for the
    lane count and milliseconds of work under the queue's lock. What is left is mostly failures
    late in the run, which no order foresees.
    """
    unknown = [t for t in tasks if t.task_id not in expected_seconds]
    known = sorted((t for t in tasks if t.task_id in expected_seconds), key=lambda t: -expected_seconds[t.task_id])
    return unknown + known


@dataclass(frozen=True)
class Schedule:
    """What every lane of one pool shares: the queue, the pool, the attempt limit, the budget
    (optional), and `may_start` (optional): called before a lane takes a task, it may wait (the
    store is down and results pile up) and says whether new tasks may start at all. Live
    progress hears of results from the recorder, once stored."""

    work: WorkQueue
    pool: VMPool
    max_attempts: int
    budget: Budget | None = None
    may_start: Callable[[], bool] | None = None
    # Hedge copies of the last tasks (flows/hedging.py); None: off. `expected_seconds` tells it
    # which running task is expected to end last.
    hedging: Hedging | None = None
    expected_seconds: Mapping[str, float] | None = None
    # Evaluation faults seen in the run, to tell one that repeats with a task from the VM's (R11).
    repeats: RepeatedFaults = field(default_factory=RepeatedFaults)


class AttemptFn(Protocol):
    """One attempt of a task on a leased VM, with its attempt number: never raises for the
    task's own trouble, and marks the VM unhealthy (`VMHandle.healthy`) when the pool must
    replace it. A hedge copy's attempt is given `stop`, set when its result can no longer count:
    it should then end soon (its result is dropped)."""

    def __call__(self, task: BenchmarkTask, vm: VMHandle, attempt: int, /,
                 stop: threading.Event | None = None) -> BenchmarkResult: ...


@dataclass(frozen=True)
class AttemptHooks:
    """What `attempt_loop` needs from its surroundings.

    `attempt` runs one attempt; `record` stores its result (called before the VM goes back to
    the pool); `logger` gets the warnings.
    """

    attempt: AttemptFn
    record: Callable[[BenchmarkResult], None]
    logger: Logger


def attempt_loop(unit: WorkUnit, schedule: Schedule, hooks: AttemptHooks) -> BenchmarkResult | None:
    """Attempt one trial of a task (a bare task: its trial 1) until it ends for a
    non-infrastructure reason or its `max_attempts` attempts run out.

    Every attempt is recorded as it finishes, carrying its trial number; an infrastructure failure
    hands the VM back as unhealthy (the pool replaces it) and the next attempt runs from a fresh
    reset on the first VM that is free (the log says which: another VM, or the same one when the
    provider has no other). An evaluation that fails the same way again is the task's
    (`RepeatedFaults`, R11): not retried. Attempt numbers come from the queue
    (`WorkQueue.claim_attempt`: from the task's first attempt, after those a resumed run or a
    shard's controller already stored, counting on across the task's trials). No retry starts once
    the budget is exhausted. With hedging on, a hedge copy running when an attempt fails becomes the
    next attempt (`copy_loop` carries the task on; this returns the failed attempt's result).
    Returns the last attempt's result; None if the budget or an empty pool stopped the trial before
    its first attempt, or if the stop abandoned the attempt (then nothing is recorded).
    """
    hedging = schedule.hedging
    key = (unit.task_id, as_trial(unit).trial)
    race = hedging.open(key, unit, schedule.max_attempts) if hedging is not None else None
    handed = False
    try:
        result, handed = _own(unit, schedule, hooks, race, first_try=1)
        return result
    finally:
        if hedging is not None and not handed:
            hedging.close(key)


def copy_loop(race: Race, schedule: Schedule, hooks: AttemptHooks) -> BenchmarkResult | None:
    """A hedge copy of a running task (`Hedging.pick` chose it), on a VM of its own; the caller
    counted it as running (`WorkQueue.copy_started`). The copy's result is dropped unless the
    task's own attempt fails with an infrastructure error (flows/hedging.py): then it is
    recorded as the task's next attempt, and if it too failed, this lane retries the task as
    its owner would. Returns the result this lane recorded last, or None."""
    assert schedule.hedging is not None, "copy_loop needs the schedule's hedging"
    hedging, work = schedule.hedging, schedule.work
    task, trial = as_trial(race.unit).task, as_trial(race.unit).trial
    try:
        lease = schedule.pool.lease()
        vm = lease.__enter__()
    except ProviderError as exc:
        _copy_gone(race, hedging, hooks.logger, f"no VM for it: {exc}")
        return None
    try:
        if race.stop.is_set() or work.closed:
            _copy_gone(race, hedging, hooks.logger, "the run is stopping")
            return None
        attempt = work.claim_attempt(task.task_id)
        result = _timed_attempt(hooks, task, vm, attempt, trial, race.stop)
        vm_seconds = result.timings["vm"]
    finally:
        lease.__exit__(None, None, None)
    if work.abandoned:
        _copy_gone(race, hedging, hooks.logger, "abandoned by the stop")
        return None
    verdict = race.copy_ended(result, vm_seconds, hedging.stats)
    if verdict == "drop":
        if schedule.budget is not None:
            schedule.budget.add(result)  # its tokens were spent all the same
        return None
    if verdict == "held":
        return None  # its owner records it if its own attempt fails
    # The owner's attempt failed while this copy ran: the copy is the task's next attempt.
    hooks.logger.warning("task %s%s: hedge copy (attempt %d) stands in for the failed attempt", task.task_id,
                         f" trial {trial}" if trial > 1 else "", attempt)
    key = (task.task_id, trial)
    handed = False
    try:
        last, handed = _own(race.unit, schedule, hooks, race, first_try=race.owner_tries + 1, in_hand=result)
        return last
    finally:
        if not handed:
            hedging.close(key)


def _timed_attempt(hooks: AttemptHooks, task: BenchmarkTask, vm: VMHandle, attempt: int, trial: int,
                   stop: threading.Event | None = None) -> BenchmarkResult:
    """One attempt on a leased VM, its result carrying the trial and the seconds it held the VM
    (`timings["vm"]`); `stop` only for a hedge copy."""
    leased = time.monotonic()
    result = hooks.attempt(task, vm, attempt) if stop is None else hooks.attempt(task, vm, attempt, stop=stop)
    return result.model_copy(update={"timings": {**result.timings, "vm": time.monotonic() - leased}, "trial": trial})


def _copy_gone(race: Race, hedging: Hedging, logger: Logger, why: str) -> None:
    """A hedge copy ended without a result; if its task had been handed to it, the task ends
    here without a final result (as an owner's controller error would leave it)."""
    if race.copy_gone(hedging.stats):
        hedging.close((race.unit.task_id, as_trial(race.unit).trial))
        logger.error("task %s: its hedge copy, which stood in for a failed attempt, ended without a result (%s); "
                     "the task has no final result", race.unit.task_id, why)


def _own(unit: WorkUnit, schedule: Schedule, hooks: AttemptHooks, race: Race | None, first_try: int,
         in_hand: BenchmarkResult | None = None) -> tuple[BenchmarkResult | None, bool]:
    """The attempts of a task by its owner, from try `first_try` on (`in_hand`: that try's
    result, already run by a hedge copy, to record). Returns the last result and whether a
    running hedge copy took the task over."""
    work, pool, budget = schedule.work, schedule.pool, schedule.budget
    task, trial = as_trial(unit).task, as_trial(unit).trial
    expected = (schedule.expected_seconds or {}).get(task.task_id)
    result: BenchmarkResult | None = None
    failed_on: _FailedOn | None = None  # the VM the attempt before a retry ran on
    for tries in range(first_try, schedule.max_attempts + 1):
        previous = result
        if in_hand is not None:
            result, in_hand = schedule.repeats.judge(previous, in_hand), None
            hooks.record(result)
            vm_id = result.vm_id
            failed_on = _FailedOn(vm_id or "", None, False)
        else:
            if budget is not None and budget.exhausted():
                if failed_on is not None:
                    hooks.logger.warning("task %s: not retried: %s", task.task_id, budget.exhausted())
                break
            try:
                lease = pool.lease(retry=tries > 1)  # a retry is served before new tasks
                vm = lease.__enter__()
            except ProviderError as exc:
                # No VM is left (every server retired): the task stays without a final result and
                # the run ends incomplete. Nothing was started, so nothing is recorded.
                hooks.logger.warning("task %s not attempted: %s", task.task_id, exc)
                break
            attempt = work.claim_attempt(task.task_id)
            if failed_on is not None:
                hooks.logger.warning("task %s%s: attempt %d (a retry) runs on %s", task.task_id,
                                     f" trial {trial}" if trial > 1 else "", attempt, _where_retry_runs(failed_on, vm))
            if race is not None:
                race.owner_attempting(tries, expected)
            try:
                result = _timed_attempt(hooks, task, vm, attempt, trial)
                if work.abandoned:
                    hooks.logger.warning("task %s: attempt %d abandoned by the stop, not recorded",
                                         task.task_id, attempt)
                    return None, False
                judged = schedule.repeats.judge(previous, result)
                if judged is not result:
                    vm.healthy = True  # the fault is the task's (R11): the VM need not be replaced
                    result = judged
                # Recorded before the VM goes back: replacing a failed VM can take minutes.
                hooks.record(result)
                failed_on = _FailedOn(vm.vm_id, vm.base_url, vm.healthy)
            finally:
                lease.__exit__(None, None, None)
            vm_id = vm.vm_id
        if budget is not None:
            budget.add(result)
        if not result.outcome.is_retryable:
            if race is not None and schedule.hedging is not None:
                dropped = race.owner_final(schedule.hedging.stats)
                if dropped is not None and budget is not None:
                    budget.add(dropped)  # a held copy's tokens were spent all the same
            break
        # A problem of the environment: said at WARNING, so a filter on problems finds it.
        handover, held = ("retry", None) if race is None or schedule.hedging is None else \
            race.owner_failed(schedule.hedging.stats)
        last = tries == schedule.max_attempts and handover == "retry"
        then = {"retry": f"retrying from a fresh reset (try {tries + 1} of {schedule.max_attempts}; "
                         "the next line says on which VM)",
                "handed": "its hedge copy, running, is the next attempt",
                "held": "its hedge copy already ended: recorded as the next attempt"}[handover]
        hooks.logger.warning("task %s%s attempt %d on %s: infrastructure error (%s); %s", task.task_id,
                             f" trial {trial}" if trial > 1 else "", result.attempt,
                             vm_id, (result.error or result.reason or "")[:200],
                             "no attempt left: the task has no final result" if last else then)
        if handover == "handed":
            return result, True
        in_hand = held
        if handover != "retry":
            failed_on = None
    return result, False


@dataclass(frozen=True)
class _FailedOn:
    """The VM an attempt ran on, as its retry's message compares it (a VMHandle's fields then)."""

    vm_id: str
    base_url: str | None  # None: not known (a hedge copy's VM)
    kept: bool  # the VM was still sound afterwards (not handed back for replacement)


def _where_retry_runs(failed_on: _FailedOn, vm: VMHandle) -> str:
    """Where a retry runs, as its log line says it: the same VM as the failed attempt or another."""
    if vm.vm_id == failed_on.vm_id and failed_on.base_url in (None, vm.base_url):
        if failed_on.kept:
            return f"{vm.vm_id}, the same VM as the failed attempt (its fault was not the VM's), from a fresh reset"
        return (f"{vm.vm_id}, the same VM as the failed attempt, from a fresh reset (the provider had no other: "
                "the server came back at the same address)")
    return f"{vm.vm_id}, another VM than the failed attempt's ({failed_on.vm_id})"


def lane_loop(
    schedule: Schedule, run_task: Callable[[Any], BenchmarkResult | None], logger: Logger,
    run_copy: Callable[[Race], BenchmarkResult | None] | None = None,
) -> list[BenchmarkResult]:
    """Run tasks from the queue with `run_task`, one at a time, until the queue is empty, the
    budget runs out or the pool has no VM left; returns the results `run_task` gave.

    With hedging on (`Schedule.hedging`), a lane that finds the queue empty then runs hedge
    copies with `run_copy` (`copy_loop`, perhaps wrapped) while `Hedging.pick` finds a task
    worth copying. A lane that runs out of work deletes the idle VMs the remaining tasks do not
    need, so the pool shrinks (and stops costing) while the last tasks finish. That is normally
    one VM (the one it just gave back); more when a VM came up that no task was waiting for,
    e.g. the replacement of a failed VM whose task had already retried on a VM another lane
    gave back.
    """
    work, pool, budget = schedule.work, schedule.pool, schedule.budget
    results: list[BenchmarkResult] = []
    while (budget is None or not budget.exhausted()) and not pool.exhausted:
        if schedule.may_start is not None and not schedule.may_start():
            break
        next_task = work.take()
        if next_task is None:
            if not _ran_a_copy(schedule, run_copy, results, logger):
                break
            continue
        try:
            result = run_task(next_task)
        except Exception as exc:  # noqa: BLE001 - one task's controller trouble must not end the lane
            # Attempts are recorded inside run_task as they end; whatever broke here left this
            # task without a final result, which the run's completeness counts.
            logger.error("task %s: controller error %s: %s", next_task.task_id, type(exc).__name__, exc)
            result = None
        finally:
            work.done()
        if result is not None:
            results.append(result)
    try:
        while pool.retire_spare(still_needed=work.running):
            pass
    except Exception as exc:  # noqa: BLE001 - teardown deletes it later; the lane's results stand
        logger.warning("could not retire a spare VM: %s", exc)
    return results


def _ran_a_copy(schedule: Schedule, run_copy: Callable[[Race], BenchmarkResult | None] | None,
                results: list[BenchmarkResult], logger: Logger) -> bool:
    """With hedging on and the queue empty: run a hedge copy of the task expected to end last, if
    one is worth it (`Hedging.pick`); whether one ran."""
    hedging, work = schedule.hedging, schedule.work
    if hedging is None or run_copy is None or work.closed:
        return False
    race = hedging.pick(schedule.pool.usage.billed_seconds())
    if race is None:
        return False
    work.copy_started()
    try:
        result = run_copy(race)
    except Exception as exc:  # noqa: BLE001 - as for a task: the lane goes on
        logger.error("task %s: hedge copy: controller error %s: %s", race.unit.task_id, type(exc).__name__, exc)
        _copy_gone(race, hedging, logger, "controller error")
        result = None
    finally:
        work.done()
    if result is not None:
        results.append(result)
    return True
