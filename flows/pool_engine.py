"""The pool engine: lanes that take tasks from one queue, each task attempted on a leased VM
until it ends for a non-infrastructure reason, every attempt recorded as it ends.

    evaluate_on_pool(request, todo)    provision -> lanes -> teardown, for one pool
      run_lane(lane, lanes)            one VM's worth of work: tasks from the shared queue
        attempt_task(task, lanes)      attempts of one task (a Prefect task, "evaluate-task")

The lane and attempt loops themselves are plain Python in flows/scheduling.py (`lane_loop`,
`attempt_loop`, the `WorkQueue` and `longest_first`); `run_lane` and `attempt_task` are the
Prefect tasks that run them with Prefect's pieces: each attempt as its own task run, the run
logger, and the run's background recorder. bench/pool_efficiency.py runs the same loops
without Prefect.

Concurrency: one lane per VM of the pool, each taking tasks from a shared queue, so at most
pool-size tasks run at once. The run holds pool-size slots of a strict global concurrency limit
sized to the pool while its lanes work (visible in the UI; a missing limit fails loudly). The
slots are taken in one call, not per task or per lane: on Prefect's SQLite backend, concurrent
slot increments fail with "database is locked" and the client retries them after a fixed 2 s
back-off, which cost about 2 s per task and left lanes idle for up to 10 s on the bundled suite
(measured with prefect 3.8.8).

Trials: with `trials = K` each task is queued K times, one unit per trial (`TaskTrial`), each
from a fresh reset with its own retries; its "evaluate-task" run is named `<domain>/<task> trial k`.

Retries: only infrastructure errors are retried, from a fresh reset on the first VM that is free
(the pool replaces the failed one in the background; existing servers come back at the same
address, so there the retry runs on the same server), up to `max_attempts` attempts per trial
and invocation; the log says on which VM each retry runs. An evaluation that fails the same way
again is the task's evaluation error and is not retried (adapters/outcomes.py R11). Attempt numbers continue from the ones already stored (and
count on across a task's trials), so a resumed run never overwrites an earlier attempt.

Scheduling: tasks start longest first by the durations earlier runs recorded; lanes that run
out of work retire the VMs the remaining tasks do not need, or first (hedging on) run a copy of
the task expected to end last (`copy_task`, "<domain>/<task> hedge copy"; flows/hedging.py).
Shards (flows/shard.py) run this same engine on their own hosts.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound, TerminationSignal
from prefect.states import Completed, State

from adapters.agents import AgentOptions, build_agent
from adapters.benchmark import BenchmarkResult, BenchmarkTask
from adapters.episode import EpisodeLimits
from adapters.outcomes import RepeatedFaults
from adapters.process_dirs import temporary_process_dir
from adapters.store.duckdb_store import ResultStore
from adapters.store.recorder import RecorderClose, ResultRecorder
from adapters.store.spool import ResultSpool, spool_dir
from adapters.vms.base import ProviderError, VMHandle, VMProvider
from adapters.vms.janitor import sweep_run
from adapters.vms.pool import VMPool
from adapters.vms.warm_pool import pool_resource_id
from adapters.waa.catalog import WAATaskCatalog
from adapters.waa.live import LiveAdapterSettings
from flows.attempt import STOPPED_COPY, AttemptContext, run_attempt
from flows.bookkeeping import in_background, pool_slots, warn
from flows.budget import RunBudget
from flows.progress import RunProgress
from flows.run_config import SuiteRunConfig, store_wait_seconds
from flows.run_states import Carried, final_result, outcome_state
from flows.hedging import Hedging, Race
from flows.scheduling import (AttemptHooks, Schedule, TaskTrial, WorkQueue, WorkUnit, as_trial, attempt_loop,
                              copy_loop, lane_loop, longest_first)
from tasks.provision import provision_pool


# How long a stopped run waits for its running attempts before tearing the pool down: after
# Ctrl-C, and after a SIGTERM (a Prefect cancellation, `docker stop`, systemd). A Prefect runner
# SIGKILLs a cancelled flow run's process 30 s after its SIGTERM, so that wait leaves time for
# the teardown.
STOP_GRACE_SECONDS = 30.0
TERMINATION_GRACE_SECONDS = 10.0
# How long the end of a run waits for results still being stored (a store that is down comes
# back within it: nothing is lost) before it ends the run as a store failure, the results safe
# in the run's spool for the next `arena run --run-id`.


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
    # Results the store had not taken when the pool finished (safe in the spool, or lost), and why.
    unstored: RecorderClose | None = None
    # Set when the run is cancelled from Prefect (flows/cancellation.py): the lanes stop.
    cancelled: threading.Event = field(default_factory=threading.Event)
    # The pool's hedging (flows/hedging.py) once its lanes started, None when off: its `stats`
    # go to the run's summary.
    hedging: Hedging | None = None
    # Called once the lanes have stopped for a Ctrl-C or SIGTERM (with that exception) or a
    # cancellation from Prefect (with None), before the pool is torn down: the caller stores the
    # run's status then, since a runner SIGKILLs a cancelled run 30 s after its SIGTERM and a
    # cloud pool's teardown can take longer (Azure deletes a VM in minutes).
    on_stop: Callable[[BaseException | None], None] | None = None


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
        # Deleting a limit waits for the server's database, which the end of a run keeps busy
        # writing its task runs (seconds on a loaded machine): the summary goes on meanwhile.
        in_background(f"removing concurrency limit {name!r}", lambda: _delete_limit(name))


class WarmPoolBusy(RuntimeError):
    """Another run holds the warm pool this run was told to use."""


def warm_pool_limit_name(pool: str) -> str:
    """The global concurrency limit (one slot) that one run at a time holds on warm pool `pool`."""
    return f"warm-pool-{pool}"


@contextmanager
def warm_pool_lease(pool: str, wait_seconds: float) -> Iterator[None]:
    """Hold the one lease on warm pool `pool` while the block runs (two runs on the same VMs
    would reset each other's tasks); WarmPoolBusy when another run keeps it past `wait_seconds`.

    The lease is a Prefect global concurrency slot (limit 1, made on first use, shown in the UI
    under its name) with a 60 s lease that the holder renews: a controller killed with SIGKILL
    frees the pool within about a minute.
    """
    name = warm_pool_limit_name(pool)
    with get_client(sync_client=True) as client:
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:
            pass
    with ExitStack() as stack:
        try:
            stack.enter_context(pool_slots(name, 1, lease_seconds=60.0, timeout_seconds=max(wait_seconds, 1.0)))
        except TimeoutError:
            raise WarmPoolBusy(
                f"warm pool {pool!r} is in use by another run (concurrency limit {name!r} is taken); wait for it, "
                "raise warm_pool_wait_seconds, or use another pool"
            ) from None
        yield


def _delete_limit(name: str) -> None:
    with get_client(sync_client=True) as client:
        try:
            client.delete_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            pass  # a retry after the server did delete it


@dataclass(frozen=True)
class Lanes:
    """What every lane of one pool shares: the queue, the pool, the recorder and the limits."""

    work: WorkQueue
    pool: VMPool
    attempt: AttemptContext
    recorder: ResultRecorder
    max_attempts: int
    budget: RunBudget | None = None
    hedging: Hedging | None = None
    expected_seconds: dict[str, float] | None = None
    # Evaluation faults of the run, shared by every task (adapters/outcomes.py R11).
    repeats: RepeatedFaults = field(default_factory=RepeatedFaults)

    @property
    def schedule(self) -> Schedule:
        """The part of this the scheduling core (flows/scheduling.py) works with."""
        return Schedule(
            work=self.work, pool=self.pool, max_attempts=self.max_attempts, budget=self.budget,
            may_start=self.store_has_room, hedging=self.hedging, expected_seconds=self.expected_seconds,
            repeats=self.repeats,
        )

    def hooks(self, trial: int) -> AttemptHooks:
        """The scheduling core's hooks for one trial of a task, in the current task run: each
        attempt its own "attempt" task run, results to the run's recorder."""
        return AttemptHooks(
            attempt=lambda t, vm, number, stop=None: _attempt_result(t, vm, self.attempt, number, trial, stop),
            record=self.recorder.record,
            logger=get_run_logger(),
        )

    def store_has_room(self) -> bool:
        """Wait while the store is down and a pool's worth of results wait for it; False (and
        no task starts any more) when it stays down past the outage wait."""
        room = self.recorder.wait_for_room(self.pool.size, stop=lambda: self.work.closed,
                                           max_wait=store_wait_seconds().outage)
        if not room:
            self.work.close()
        return room


@task(name="attempt", task_run_name="attempt {attempt} on {vm.vm_id}", cache_policy=NO_CACHE, persist_result=False)
def attempt_on_vm(task: BenchmarkTask, vm: VMHandle, context: AttemptContext, attempt: int, trial: int = 1,
                  stop: threading.Event | None = None) -> State:
    """One attempt of a task on one VM, as its own run in the Prefect UI: named by the VM, its
    state named by the attempt's outcome (an infrastructure error, then the retry's outcome). A
    hedge copy's attempt stopped because its task's own attempt ended is "Stopped"."""
    result = run_attempt(task, vm, context, attempt, trial=trial, stop=stop)
    if stop is not None and stop.is_set() and result.error == STOPPED_COPY:
        return Completed(data=Carried(result), name="Stopped", message=STOPPED_COPY)
    return outcome_state(result)


def evaluate_task_run_name(task: BenchmarkTask, trial: int = 1) -> str:
    """The "evaluate-task" run's name: `<domain>/<task id>`, plus ` trial k` in a run with trials."""
    return f"{task.domain}/{task.task_id}" + (f" trial {trial}" if trial > 1 else "")


def _evaluate_task_name() -> str:
    from prefect.runtime import task_run

    parameters = task_run.parameters
    return evaluate_task_run_name(parameters["task"], int(parameters.get("trial") or 1))


@task(name="evaluate-task", task_run_name=_evaluate_task_name, cache_policy=NO_CACHE, persist_result=False)
def attempt_task(task: BenchmarkTask, lanes: Lanes, trial: int = 1) -> State | None:
    """Attempt one trial of a task until it ends for a non-infrastructure reason or attempts run
    out (`attempt_loop`), each attempt its own "attempt" task run, its result handed to the run's
    background recorder (adapters/store/recorder.py).

    Every attempt is recorded as it finishes; an infrastructure failure hands the VM back as
    unhealthy (the pool replaces it) and the next attempt runs from a fresh reset on the first VM
    that is free (`attempt_loop` logs which). Attempt numbers continue after those already stored
    for the task (a resumed run), and start no lower than the queue's first attempt for it (a shard:
    the earlier attempts are in its controller's file). No retry starts once the budget is
    exhausted; None only if the budget stopped it before the first attempt. The state is named by
    the last attempt's outcome (`outcome_state`).
    """
    return outcome_state(attempt_loop(TaskTrial(task, trial), lanes.schedule, lanes.hooks(trial)))


def _copy_task_name() -> str:
    from prefect.runtime import task_run

    unit = as_trial(task_run.parameters["race"].unit)
    return evaluate_task_run_name(unit.task, unit.trial) + " hedge copy"


@task(name="evaluate-task", task_run_name=_copy_task_name, cache_policy=NO_CACHE, persist_result=False)
def copy_task(race: Race, lanes: Lanes) -> State | None:
    """A hedge copy of a running task (`copy_loop`), as an "evaluate-task" run named
    `<domain>/<task> hedge copy`: its state is the outcome of what it recorded when it stood in
    for a failed attempt, else "Not counted" (its task's own attempt counts)."""
    result = copy_loop(race, lanes.schedule, lanes.hooks(as_trial(race.unit).trial))
    if result is None:
        return Completed(name="Not counted", message="hedge copy: not recorded; its task's own attempt counts "
                                                     "unless that attempt fails with an infrastructure error")
    return outcome_state(result)


def _attempt_result(task: BenchmarkTask, vm: VMHandle, context: AttemptContext, attempt: int,
                    trial: int = 1, stop: threading.Event | None = None) -> BenchmarkResult:
    """One attempt as its own task run (`attempt_on_vm`), unwrapped to its result."""
    result = final_result(attempt_on_vm(task, vm, context, attempt, trial, stop))
    if result is None:  # outcome_state gives None only for no result, and run_attempt always has one
        raise RuntimeError(f"attempt {attempt} of task {task.task_id} on {vm.vm_id} returned no result")
    return result


@task(name="vm-lane", task_run_name="lane-{lane}", cache_policy=NO_CACHE, persist_result=False)
def run_lane(lane: int, lanes: Lanes) -> list[BenchmarkResult]:
    """Evaluate tasks from the queue, one at a time, until it is empty or the budget runs out
    (`lane_loop`), each task an "evaluate-task" run (`attempt_task`).

    A lane that runs out of work deletes the idle VMs the remaining tasks do not need, so the
    pool shrinks (and stops costing) while the last tasks finish.
    """
    def run_unit(unit: WorkUnit) -> BenchmarkResult | None:
        one = as_trial(unit)
        return final_result(attempt_task(one.task, lanes, one.trial))

    def run_copy(race: Race) -> BenchmarkResult | None:
        return final_result(copy_task(race, lanes))

    return lane_loop(lanes.schedule, run_unit, get_run_logger(), run_copy=run_copy)


def evaluate_on_pool(request: PoolRunRequest, todo: list[WorkUnit]) -> list[BenchmarkResult]:
    """Provision the pool, run every task (or trial of a task: `TaskTrial`) in lanes, and always
    tear the pool down and close the provider (no VM outlives this call). Returns the final
    result of each unit that has one, in `todo`'s order."""
    r, config, provider = request, request.config, request.provider
    if not todo or r.budget.exhausted():
        provider.close()
        return []
    if config.warm_pool:
        return _on_warm_pool(r, todo)
    resources = resource_id(r.run_id, r.shard)
    label = r.run_id[-6:] if r.shard is None else f"{r.run_id[-6:]}-s{r.shard}"
    pool = VMPool(provider, size=min(config.pool_size, len(todo)), run_id=label)
    try:
        with _stop_told_first(r.cancelled, r.on_stop):
            return _evaluate(r, pool, todo, resources)
    finally:
        pool.teardown()
        provider_leftovers(provider, resources, get_run_logger())
        provider.close()


def _on_warm_pool(r: PoolRunRequest, todo: list[WorkUnit]) -> list[BenchmarkResult]:
    """The run on the warm pool's VMs, holding the pool's one lease: VMs are started (or made)
    by name, and stopped, not deleted, at the end. A pool another run holds ends this run
    incomplete with that reason, before any VM is touched."""
    config, provider = r.config, r.provider
    name = str(config.warm_pool)
    pool = VMPool(provider, size=min(config.pool_size, len(todo)), run_id=pool_resource_id(name), keep_vms=True)
    try:
        with warm_pool_lease(name, config.warm_pool_wait_seconds):
            try:
                with _stop_told_first(r.cancelled, r.on_stop):
                    return _evaluate(r, pool, todo, f"{pool_resource_id(name)}-{r.run_id[-6:]}")
            finally:
                pool.teardown()
    except WarmPoolBusy as exc:
        r.problems.append(str(exc))
        get_run_logger().error("%s", exc)
        return []
    finally:
        provider.close()


@contextmanager
def _stop_told_first(cancelled: threading.Event,
                     on_stop: Callable[[BaseException | None], None] | None) -> Iterator[None]:
    """Around the lanes, inside the pool's teardown: a stopped run (Ctrl-C, SIGTERM, or
    `cancelled` set by a cancellation from Prefect) is told to `on_stop` before the teardown
    starts (see `PoolRunRequest.on_stop`)."""
    try:
        yield
    except (KeyboardInterrupt, TerminationSignal) as stop:
        if on_stop is not None:
            on_stop(stop)
        raise
    if cancelled.is_set() and on_stop is not None:
        on_stop(None)


def _evaluate(r: PoolRunRequest, pool: VMPool, todo: list[WorkUnit], resources: str) -> list[BenchmarkResult]:
    """Provision `pool` and run every task in lanes under a concurrency limit named after
    `resources`; the caller tears the pool down."""
    config, provider = r.config, r.provider
    r.budget.pool = pool
    flavor = config.flavor()
    # Removed by this process's folder guard too when the process is killed (adapters/process_dirs.py).
    with temporary_process_dir("cache") as cache_dir:
        ctx = AttemptContext(
            provider=provider,
            catalog=r.catalog,
            agent_factory=lambda: build_agent(config.agent, r.agent_options),
            reset_level=config.reset_level,
            limits=EpisodeLimits(max_steps=config.max_steps, wall_clock_seconds=config.episode_timeout_seconds),
            cache_dir=cache_dir,
            artifacts_dir=config.artifacts_dir / r.run_id,
            adapter_settings=LiveAdapterSettings(settle=config.settle_policy(provider.settle), flavor=flavor,
                                                 setup_waits=not provider.acts_synchronously,
                                                 initial_state_check=flavor == "waa-v2", scoring=config.scoring),
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
            expected = r.store.expected_seconds(sorted({t.task_id for t in todo}), config.agent)
        # Attempt numbers continue after those stored (a resumed run) and after the ones a
        # shard's controller holds: read once here, not once per task.
        first_attempts = r.store.next_attempts(r.run_id)
        for task_id, number in (r.first_attempts or {}).items():
            first_attempts[task_id] = max(number, first_attempts.get(task_id, 1))
        if r.progress is not None:  # a trial whose last attempt fails is done too (out of retries)
            r.progress.expect_attempts(config.max_attempts)
        lanes = Lanes(
            work=WorkQueue(longest_first(todo, expected), first_attempts),
            pool=pool,
            attempt=ctx,
            # Progress counts a result once it is stored, as reports will show it; a result the
            # store cannot take waits in the run's spool (adapters/store/spool.py).
            recorder=ResultRecorder(r.store, r.run_id, spool=ResultSpool(spool_dir(config.artifacts_dir, r.run_id)),
                                    on_stored=r.progress.recorded if r.progress else None),
            max_attempts=config.max_attempts,
            budget=r.budget,
            hedging=Hedging(max_extra=config.hedge_allowance) if config.hedging_on() else None,
            expected_seconds=expected,
        )
        r.hedging = lanes.hedging
        try:
            with _pool_concurrency_limit(f"waa-pool-{resources}", pool.size) as limit_name:
                with pool_slots(limit_name, pool.size):
                    futures: list[Any] = []
                    try:
                        # Submitted inside the stop's reach: a Ctrl-C while later lanes are being
                        # submitted (each a call to the server) found the first lanes already
                        # running, closed the recorder under them and printed their tracebacks.
                        for lane in range(pool.size):
                            futures.append(run_lane.submit(lane, lanes))
                        _wait_for_lanes(lanes, futures, r.cancelled)
                    except (KeyboardInterrupt, TerminationSignal) as stop:
                        _stop_lanes(lanes, futures, "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else "SIGTERM")
                        raise
                    # Every lane, unless a cancellation stopped them (their results are stored anyway).
                    by_unit = {(result.task_id, result.trial): result
                               for f in futures if _done(f) for result in f.result()}
        finally:
            r.unstored = _close_recorder(lanes.recorder, r.problems)
        _report_pool_problems(pool, r.problems)
    keys = [(u.task_id, as_trial(u).trial) for u in todo]
    return [by_unit[key] for key in keys if key in by_unit]


def _close_recorder(recorder: ResultRecorder, problems: list[str]) -> RecorderClose | None:
    """Wait for the attempts still being stored (before the summary reads them back). Results
    the store refused for their content go to the run's problems (their tasks count as
    missing); results an outage kept from the store are returned (the run then ends as a store
    failure), None when everything was stored."""
    closed = recorder.close(store_wait_seconds().flush)
    problems.extend(unstored.describe() for unstored in recorder.failed)
    if recorder.failed:
        get_run_logger().error("the store refused %d result(s); the run counts those tasks as missing",
                               len(recorder.failed))
    return None if closed.complete else closed


def _wait_for_lanes(lanes: Lanes, futures: list[Any], cancelled: threading.Event) -> None:
    """Wait until every lane has ended, or until the run is cancelled from Prefect (the UI's
    Cancel, `prefect flow-run cancel`, on this run or a flow run above it): then stop the lanes
    as SIGTERM does (no new task; running attempts get their grace period)."""
    # Waiting on the lanes' own futures returns as soon as the last one ends (a poll would add
    # up to its period to every run's end); the cancellation is looked at twice a second.
    pending = {f.wrapped_future for f in futures}
    while pending:
        if cancelled.is_set():
            _stop_lanes(lanes, futures, "cancelled from Prefect")
            return
        _, pending = concurrent.futures.wait(pending, timeout=0.5)


def _done(future: Any) -> bool:
    """Whether a lane's future has ended (its thread's own future: the server may learn of the
    task run's end only later, or never, from a server without background services)."""
    return bool(future.wrapped_future.done())


def _stop_lanes(lanes: Lanes, futures: list[Any], why: str) -> None:
    """Ctrl-C, SIGTERM or a cancellation: start nothing new, give running attempts a grace period
    to end and be recorded, then abandon the rest; the caller tears the pool down."""
    lanes.work.close()
    if lanes.hedging is not None:
        lanes.hedging.stop_copies()
    grace = STOP_GRACE_SECONDS if why == "Ctrl-C" else TERMINATION_GRACE_SECONDS
    get_run_logger().warning(
        "stopping (%s): no new task starts; waiting up to %g s for %d running attempt(s)",
        why, grace, lanes.work.running,
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
