"""The pool engine: lanes that take tasks from one queue, each task attempted on a leased VM
until it ends for a non-infrastructure reason, every attempt recorded as it ends.

    evaluate_on_pool(request, todo)    provision -> lanes -> teardown, for one pool
      run_lane(lane, lanes)            one VM's worth of work: tasks from the shared queue
        attempt_task(task, lanes)      attempts of one task (a Prefect task, "evaluate-task")

Concurrency: one lane per VM of the pool, each taking tasks from a shared queue, so at most
pool-size tasks run at once. The run holds pool-size slots of a strict global concurrency limit
sized to the pool while its lanes work (visible in the UI; a missing limit fails loudly). The
slots are taken in one call, not per task or per lane: on Prefect's SQLite backend, concurrent
slot increments fail with "database is locked" and the client retries them after a fixed 2 s
back-off, which cost about 2 s per task and left lanes idle for up to 10 s on the bundled suite
(measured with prefect 3.8.8).

Retries: only infrastructure errors are retried, on another VM (the pool replaces the failed
one), up to `max_attempts` attempts per invocation. Attempt numbers continue from the ones
already stored, so a resumed run never overwrites an earlier attempt.

Scheduling: tasks start longest first by the durations earlier runs recorded; lanes that run
out of work retire a VM the remaining tasks do not need. Shards (flows/shard.py) run this same
engine on their own hosts.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import ObjectNotFound, TerminationSignal
from prefect.states import Completed, State

from adapters.agents import AgentOptions, build_agent
from adapters.benchmark import BenchmarkResult, BenchmarkTask, OutcomeKind
from adapters.episode import EpisodeLimits
from adapters.store.duckdb_store import ResultStore
from adapters.vms.base import ProviderError, VMHandle, VMProvider
from adapters.vms.janitor import sweep_run
from adapters.vms.pool import VMPool
from adapters.waa.catalog import WAATaskCatalog
from adapters.waa.live import LiveAdapterSettings
from flows.attempt import AttemptContext, run_attempt
from flows.bookkeeping import best_effort, pool_slots, warn
from flows.budget import RunBudget
from flows.progress import RunProgress
from flows.run_config import SuiteRunConfig
from tasks.provision import provision_pool
from tasks.record import record_result


# How long a stopped run waits for its running attempts before tearing the pool down: after
# Ctrl-C, and after a SIGTERM (a Prefect cancellation, `docker stop`, systemd). A Prefect runner
# SIGKILLs a cancelled flow run's process 30 s after its SIGTERM, so that wait leaves time for
# the teardown.
STOP_GRACE_SECONDS = 30.0
TERMINATION_GRACE_SECONDS = 10.0


@dataclass
class PoolRunRequest:
    """One pool's share of a run: what `evaluate_on_pool` needs besides the tasks.

    A shard (flows/shard.py) sets `shard`, which names its pool, concurrency limit and cloud
    resources apart from the other shards of the run (see `resource_id`), plus what only its
    controller knows: the tasks' expected durations and their lowest attempt numbers. VMs that
    never came up or could not be replaced are appended to `problems` (one line each).
    """

    config: SuiteRunConfig
    run_id: str
    catalog: WAATaskCatalog
    provider: VMProvider
    agent_options: AgentOptions
    store: ResultStore
    budget: RunBudget
    progress: RunProgress | None = None
    shard: int | None = None
    expected_seconds: dict[str, float] | None = None
    first_attempts: dict[str, int] | None = None
    problems: list[str] = field(default_factory=list)


@contextmanager
def _pool_concurrency_limit(name: str, size: int) -> Iterator[str]:
    """A global concurrency limit sized to the pool for this run; removed when the run ends.

    A controller killed mid-run (SIGKILL) leaves its limit behind with its slots still taken; a
    resumed run (same run id, same name) would then wait forever for them, so a leftover limit
    of that name is deleted first. The name holds the run id, so no other run uses it.
    """
    with get_client(sync_client=True) as client:
        try:
            client.delete_global_concurrency_limit_by_name(name)
            warn(f"deleted leftover concurrency limit {name!r} (an earlier controller of this run died)")
        except ObjectNotFound:
            pass
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=size))
    try:
        yield name
    finally:
        best_effort(f"removing concurrency limit {name!r}", lambda: _delete_limit(name))


def _delete_limit(name: str) -> None:
    with get_client(sync_client=True) as client:
        try:
            client.delete_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            pass  # a retry after the server did delete it


class WorkQueue:
    """The tasks left to start, and how many are running: lanes share one.

    Taking a task and counting it as running happen together, so once the queue is empty the
    running count only falls; a lane that finds no work can then retire its VM when the tasks
    still running (and their retries) have enough VMs without it.
    """

    def __init__(self, tasks: list[BenchmarkTask], first_attempts: dict[str, int] | None = None) -> None:
        self._todo: deque[BenchmarkTask] = deque(tasks)
        self._closed = False
        self._abandoned = False
        self._running = 0
        self._lock = threading.Lock()
        # Lowest attempt number per task when the attempts so far are stored elsewhere (shards).
        self._first_attempts = dict(first_attempts or {})

    def first_attempt(self, task_id: str) -> int | None:
        """The lowest attempt number `task_id` may use, if one was given."""
        return self._first_attempts.get(task_id)

    def take(self) -> BenchmarkTask | None:
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
    def abandoned(self) -> bool:
        with self._lock:
            return self._abandoned

    def done(self) -> None:
        """A task taken with `take` has ended."""
        with self._lock:
            self._running -= 1

    @property
    def running(self) -> int:
        with self._lock:
            return self._running


# The name each outcome gives the evaluate-task run in the Prefect UI: a person scanning the run
# list sees at once which tasks failed and why (the state stays Completed: the task ran; a red
# Failed state is kept for the controller's own trouble).
OUTCOME_STATE_NAMES: dict[OutcomeKind, str] = {
    OutcomeKind.SUCCESS: "Success",
    OutcomeKind.AGENT_FAILURE: "Agent failure",
    OutcomeKind.SETUP_FAILURE: "Setup failure",
    OutcomeKind.EVALUATION_ERROR: "Evaluation error",
    OutcomeKind.INFRASTRUCTURE_ERROR: "Infrastructure error",
    OutcomeKind.TIMEOUT: "Timeout",
}


def outcome_state(result: BenchmarkResult | None) -> State | None:
    """A task's last result as a Completed state named by its outcome (see OUTCOME_STATE_NAMES)."""
    if result is None:
        return None
    message = f"{result.outcome.value} on {result.vm_id or 'no VM'} (attempt {result.attempt})"
    if result.error or result.reason:
        message += f": {(result.error or result.reason or '')[:300]}"
    return Completed(data=result, name=OUTCOME_STATE_NAMES[result.outcome], message=message)


def final_result(value: State | BenchmarkResult | None) -> BenchmarkResult | None:
    """The result inside what `attempt_task` returned (a state, or the result when called bare)."""
    return value.result() if isinstance(value, State) else value


@dataclass(frozen=True)
class Lanes:
    """What every lane of one pool shares: the queue, the pool, the store and the limits."""

    work: WorkQueue
    pool: VMPool
    attempt: AttemptContext
    store: ResultStore
    run_id: str
    max_attempts: int
    budget: RunBudget | None = None
    progress: RunProgress | None = None


@task(name="attempt", task_run_name="attempt {attempt} on {vm.vm_id}", cache_policy=NO_CACHE, persist_result=False)
def attempt_on_vm(task: BenchmarkTask, vm: VMHandle, context: AttemptContext, attempt: int) -> State:
    """One attempt of a task on one VM, as its own run in the Prefect UI: named by the VM, its
    state named by the attempt's outcome (an infrastructure error, then the retry's outcome)."""
    return outcome_state(run_attempt(task, vm, context, attempt))


@task(name="evaluate-task", task_run_name="{task.domain}/{task.task_id}", cache_policy=NO_CACHE, persist_result=False)
def attempt_task(task: BenchmarkTask, lanes: Lanes) -> State | None:
    """Attempt a task until it ends for a non-infrastructure reason or attempts run out.

    Every attempt is recorded as it finishes; an infrastructure failure hands the VM back as
    unhealthy (the pool replaces it) and the next attempt runs on another VM. Attempt numbers
    continue after those already stored for the task (a resumed run), and start no lower than the
    queue's first attempt for it (a shard: the earlier attempts are in its controller's file).
    No retry starts once the budget is exhausted; None only if the budget stopped it before the
    first attempt.
    """
    pool, store, run_id, budget, progress = lanes.pool, lanes.store, lanes.run_id, lanes.budget, lanes.progress
    result: BenchmarkResult | None = None
    first = max(store.next_attempt(run_id, task.task_id), lanes.work.first_attempt(task.task_id) or 1)
    for attempt in range(first, first + lanes.max_attempts):
        if budget is not None and budget.exhausted():
            break
        try:
            lease = pool.lease()
            vm = lease.__enter__()
        except ProviderError as exc:
            # No VM is left (every server retired): the task stays without a final result and
            # the run ends incomplete. Nothing was started, so nothing is recorded.
            get_run_logger().warning("task %s not attempted: %s", task.task_id, exc)
            break
        leased = time.monotonic()
        try:
            result = final_result(attempt_on_vm(task, vm, lanes.attempt, attempt))
            vm_seconds = time.monotonic() - leased
            result = result.model_copy(update={"timings": {**result.timings, "vm": vm_seconds}})
            if lanes.work.abandoned:
                get_run_logger().warning("task %s: attempt %d abandoned by the stop, not recorded", task.task_id, attempt)
                return None
            # Recorded before the VM goes back: replacing a failed VM can take minutes.
            record_result(store, run_id, result)
        finally:
            lease.__exit__(None, None, None)
        if budget is not None:
            budget.add(result)
        if progress is not None:
            progress.recorded(result)
        if not result.outcome.is_retryable:
            break
    return outcome_state(result)


@task(name="vm-lane", task_run_name="lane-{lane}", cache_policy=NO_CACHE, persist_result=False)
def run_lane(lane: int, lanes: Lanes) -> list[BenchmarkResult]:
    """Evaluate tasks from the queue, one at a time, until it is empty or the budget runs out.

    A lane that runs out of work deletes one idle VM the remaining tasks do not need, so the
    pool shrinks (and stops costing) while the last tasks finish.
    """
    work, pool, budget = lanes.work, lanes.pool, lanes.budget
    results: list[BenchmarkResult] = []
    while (budget is None or not budget.exhausted()) and not pool.exhausted:
        next_task = work.take()
        if next_task is None:
            break
        try:
            result = final_result(attempt_task(next_task, lanes))
        except Exception as exc:  # noqa: BLE001 - one task's controller trouble must not end the lane
            # Attempts are recorded inside attempt_task as they end; whatever broke here left
            # this task without a final result, which the run's completeness counts.
            get_run_logger().error("task %s: controller error %s: %s", next_task.task_id, type(exc).__name__, exc)
            result = None
        finally:
            work.done()
        if result is not None:
            results.append(result)
    try:
        pool.retire_spare(still_needed=work.running)
    except Exception as exc:  # noqa: BLE001 - teardown deletes it later; the lane's results stand
        get_run_logger().warning("could not retire a spare VM: %s", exc)
    return results


def evaluate_on_pool(request: PoolRunRequest, todo: list[BenchmarkTask]) -> list[BenchmarkResult]:
    """Provision the pool, run every task in lanes, and always tear the pool down and close the
    provider (no VM outlives this call)."""
    r, config, provider = request, request.config, request.provider
    if not todo or r.budget.exhausted():
        provider.close()
        return []
    resources = resource_id(r.run_id, r.shard)
    label = r.run_id[-6:] if r.shard is None else f"{r.run_id[-6:]}-s{r.shard}"
    pool = VMPool(provider, size=min(config.pool_size, len(todo)), run_id=label)
    r.budget.pool = pool
    try:
        with tempfile.TemporaryDirectory(prefix="waa-cache-") as cache_dir:
            ctx = AttemptContext(
                provider=provider,
                catalog=r.catalog,
                agent_factory=lambda: build_agent(config.agent, r.agent_options),
                reset_level=config.reset_level,
                limits=EpisodeLimits(max_steps=config.max_steps, wall_clock_seconds=config.episode_timeout_seconds),
                cache_dir=Path(cache_dir),
                artifacts_dir=config.artifacts_dir / r.run_id,
                adapter_settings=LiveAdapterSettings(
                    settle_seconds=provider.settle_seconds if config.settle_seconds is None else config.settle_seconds
                ),
                stage_timeouts=config.stage_timeouts,
            )
            try:
                provision_pool(pool)
            except ProviderError as exc:
                # No VM came up: the run ends incomplete with every task missing, not a crash.
                _report_pool_problems(pool, r.problems, f"no VM of the pool came up: {exc}")
                return []
            expected = r.expected_seconds
            if expected is None:
                expected = r.store.expected_seconds([t.task_id for t in todo], config.agent)
            lanes = Lanes(
                work=WorkQueue(longest_first(todo, expected), r.first_attempts),
                pool=pool,
                attempt=ctx,
                store=r.store,
                run_id=r.run_id,
                max_attempts=config.max_attempts,
                budget=r.budget,
                progress=r.progress,
            )
            with _pool_concurrency_limit(f"waa-pool-{resources}", pool.size) as limit_name:
                with pool_slots(limit_name, pool.size):
                    futures = [run_lane.submit(lane, lanes) for lane in range(pool.size)]
                    try:
                        by_id = {result.task_id: result for f in futures for result in f.result()}
                    except (KeyboardInterrupt, TerminationSignal) as stop:
                        _stop_lanes(lanes, futures, stop)
                        raise
            _report_pool_problems(pool, r.problems)
        return [by_id[t.task_id] for t in todo if t.task_id in by_id]
    finally:
        pool.teardown()
        provider_leftovers(provider, resources, get_run_logger())
        provider.close()


def _stop_lanes(lanes: Lanes, futures: list[Any], stop: BaseException) -> None:
    """Ctrl-C or SIGTERM: start nothing new, give running attempts a grace period to end and be
    recorded, then abandon the rest; the caller tears the pool down and lets the run stop."""
    lanes.work.close()
    grace = STOP_GRACE_SECONDS if isinstance(stop, KeyboardInterrupt) else TERMINATION_GRACE_SECONDS
    get_run_logger().warning(
        "stopping (%s): no new task starts; waiting up to %g s for %d running attempt(s)",
        "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else "SIGTERM", grace, lanes.work.running,
    )
    deadline = time.monotonic() + grace
    for f in futures:
        f.wait(max(0.0, deadline - time.monotonic()))
    lanes.work.abandon()


def provider_leftovers(provider: VMProvider, run_id: str, logger: Any) -> None:
    """After teardown, delete (and report) anything of this run the provider still lists."""
    report = sweep_run(provider, run_id)
    if report.deleted or report.failed:
        logger.warning("teardown left resources of run %s behind; %s", run_id, report.summary())


def _report_pool_problems(pool: VMPool, problems: list[str], headline: str | None = None) -> None:
    """Log VMs that never came up or could not be replaced, and hand them to the run summary."""
    lines = ([headline] if headline else []) + [f"VM not available: {e}" for e in pool.creation_errors]
    if not lines:
        return
    get_run_logger().warning("the pool lost VMs; the run went on with the others: %s", "; ".join(lines))
    problems.extend(lines)


def resource_id(run_id: str, shard: int | None = None) -> str:
    """The id that tags a pool's cloud resources and names its concurrency limit.

    Each shard of a run gets its own (`<run_id>-shard<k>`): shards end at different times on
    different hosts, and a shard's teardown sweeps everything tagged with its id, so a shared id
    would let the first shard to finish delete the VMs of the others.
    """
    return run_id if shard is None else f"{run_id}-shard{shard}"


def longest_first(tasks: list[BenchmarkTask], expected_seconds: dict[str, float]) -> list[BenchmarkTask]:
    """Tasks in the order lanes should start them: never-timed tasks, then longest first.

    Starting long tasks early keeps the end of a run from waiting on one long task while the
    other lanes sit idle (longest-processing-time-first scheduling). Tasks with no recorded
    duration go first, in their given order, since they may be long too.
    """
    unknown = [t for t in tasks if t.task_id not in expected_seconds]
    known = sorted((t for t in tasks if t.task_id in expected_seconds), key=lambda t: -expected_seconds[t.task_id])
    return unknown + known
