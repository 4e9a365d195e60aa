"""Pool efficiency of the product's scheduler at 16, 40 and 100 VMs (target: >= 95 % of ideal at 40 VMs).

Runs the product's real scheduling code (flows/scheduling.py: `WorkQueue`, `longest_first`,
`lane_loop` with take -> lease -> attempt -> retry -> record -> `retire_spare`, and
adapters/vms/pool.py `VMPool` with VMs that join as they come up and replacement of failed ones),
one thread per lane as in a real run, against a timing-only environment: a `VMProvider` whose VMs
come up after a boot delay and do nothing else, and an attempt that sleeps the task's duration
plus a snapshot reset. No Prefect, no WAA server, no screenshots: what is measured is the
scheduling alone.

Workload: the 154 real WAA task ids and domains (from ../shared/waa-tasks, or a synthetic list
with WAA's domain counts when that directory is missing), each with a duration drawn (seeded)
uniformly from its domain's range, in real minutes:
- LibreOffice (libreoffice_calc, libreoffice_writer, libreoffice_impress): 8-20;
- VS Code, Chrome, Edge, VLC (vs_code, chrome, msedge, vlc): 3-8;
- everything else: 2.5-6;
plus a snapshot reset of 1-2 min before every attempt. An attempt fails with an infrastructure
error with probability `--failure-rate` (default 3 %), at a point drawn uniformly over the whole
attempt, reset included, and is charged up to that point only: nothing says where a snapshot
restore breaks or a VM stops answering, so no point is favoured (about a fifth of failures hit
the reset). The task is then retried (the product: on another VM while the pool replaces the
failed one, which boots again). Durations, resets and failures are fixed per (seed, task,
attempt), so every scheduler below sees exactly the same work.

Per pool size it prints, on the same durations:
- product, with history: the product scheduler given `expected_seconds` from "a previous run",
  modelled as each task's true time (reset + duration) times a seeded factor in [1 - h, 1 + h]
  (`--history-noise`, default 0.2: run-to-run variation; 0 gives the exact durations);
- product, history, hedging: the same with hedge copies of the last tasks (flows/hedging.py,
  on by default for agents that call no model on kvm, aws and azure VMs) within `--hedge-allowance` (default 5 %) of the
  VM time billed; a copy's attempt is drawn as a retry would be (a spare attempt of the task's
  plan), stops when its task ends, and counts only for a failed attempt; what the copies did is
  printed under the table;
- product, no history: the same scheduler with no recorded durations (suite order);
- plain FIFO: N worker threads, each with its own VM, taking tasks in suite order from one
  queue; a failed attempt waits for its VM's replacement and is retried on it; every VM lives
  until the last worker ends (no spare retirement);
- WAA static slices: the suite cut into N contiguous slices in suite order (sizes differing by
  at most one), each worker running its slice alone; computed from the same durations, resets
  and failures, with failed attempts retried in place and no replacement boot (WAA itself
  replaces nothing and retries nothing, so this is optimistic for it);
- three computed references with no overhead at all (no boot, a failed attempt's retry at once
  on the same machine), to tell what an online scheduler loses from what none avoids:
  "LPT, exact durations" orders longest first by the true durations (plus the mean reset) with
  the failures still unforeseen, i.e. perfect history; "clairvoyant LPT" also knows the failures
  (each task's whole time, failed attempts included); "clairvoyant packed" packs that knowledge
  offline (`packed_minutes`), showing how close to the ideal bound any schedule can get. Their
  machines start fresh too: each machine's first task skips its reset.
Columns: wall time in real minutes; the ideal bound max(total work / N, longest task), where
total work is every attempt's reset and run time (failed attempts included, the same for all
rows) less the resets fresh VMs can skip (at most one per VM that starts clean: the N of the
pool plus a replacement per failed attempt, counted as the largest resets of all), and the
longest task is the longest chain of one task's attempts with no reset at all; so no schedule
can end sooner, the product's included (a bound that kept every reset read 112 % at 100 VMs once
the product skipped a fresh VM's reset); efficiency = ideal / wall; "no-overhead" is the wall
time greedy list scheduling of the same order would reach with no VM boot, no thread or lock
cost and failures retried in place at once (it separates the order's own loss from the
implementation's); VM-hours from each VM's ready until it was retired or torn down (replacements
count from when they are up; WAA's VMs until their slice ends); VMs retired early by
`retire_spare`, and VMs replaced.

VM boot: every VM boots in the same `--boot-minutes` (default 5), so the pool comes up at once.
Wall time starts when the first VM is ready (where a real run's lanes start) and ends when the
last lane ends, so the initial boot is not counted; replacement boots are, since they happen
mid-run. VM-hours likewise leave the initial boot out. The bench's own thread start-up is kept
out too: the initial VMs come up at one instant, and the lanes' threads are started beforehand
and released together when the first VM is up (starting 100 threads takes about 12 ms here,
i.e. 0.4 real minutes at the default scale, which a real run does not spend).

Reading the numbers: "no-overhead" close to the measured wall means the implementation (leases,
locks, retries, retirement) costs little and the gap to the ideal is the order's. Longest-first
greedy scheduling leaves about 7 % at 40 VMs even knowing every duration and failure in advance
(clairvoyant LPT, seeds 1-10): with about 4 tasks per VM, the last ones to start (the shortest,
3.5-8 min with their reset) cannot make every VM end at the same time, which the ideal assumes;
"clairvoyant packed" shows the ideal itself is reachable (within about 1 %) by an offline
packing that knows everything. An infrastructure error late in the run puts the failed attempt
and its retry on the critical path, which no online scheduler can foresee, while the ideal and
the clairvoyant rows count them as if it could: the gap between "LPT, exact durations" and
"clairvoyant LPT" is that loss.

Seeds: one seed is a single draw of durations and failures, and at 40 VMs the efficiency moves by
several points from one to the next (mostly with where the failures fall). `--seeds 1,2,3,4,5`
runs each seed in turn and prints only the per-seed and mean efficiencies of every row; the
target is then judged on the mean.

Time scale: 1 real minute is `--scale-ms-per-minute` ms (default 30); a 20-minute task sleeps
0.6 s. The default run (one seed, 3 pool sizes x 3 threaded schedulers) takes about 20 s on 2
cores; larger scales measure more precisely, smaller ones make thread wake-up latency (about
0.1 ms, i.e. 0.2 s of real time at the default) count for more.
It prints numbers; it asserts nothing.

    python bench/pool_efficiency.py [--pools 16,40,100] [--scale-ms-per-minute 30] [--seed 1 | --seeds 1,2,3]
        [--failure-rate 0.03] [--history-noise 0.2] [--boot-minutes 5]
"""

from __future__ import annotations

import argparse
import heapq
import logging
import queue
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.conditions import conditions  # noqa: E402 - after the path is set

from adapters.benchmark import BenchmarkResult, BenchmarkTask, OutcomeKind  # noqa: E402
from adapters.vms.base import ResetLevel, VMHandle, VMProvider  # noqa: E402
from adapters.vms.pool import VMPool  # noqa: E402
from adapters.waa.catalog import TaskCatalogError, WAATaskCatalog  # noqa: E402
from flows.hedging import Hedging  # noqa: E402
from flows.scheduling import (AttemptHooks, Schedule, WorkQueue, attempt_loop, copy_loop, lane_loop,  # noqa: E402
                              longest_first)

TARGET_POOL = 40
TARGET_EFFICIENCY = 0.95
WAA_TASKS_DIR = Path(__file__).resolve().parents[2] / "shared" / "waa-tasks"
# The product's default (SuiteRunConfig.max_attempts).
MAX_ATTEMPTS = 3

# Real minutes per task, by domain (uniform ranges); the snapshot reset before every attempt.
LONG_DOMAINS = frozenset({"libreoffice_calc", "libreoffice_writer", "libreoffice_impress"})
MEDIUM_DOMAINS = frozenset({"vs_code", "chrome", "msedge", "vlc"})
LONG_MINUTES, MEDIUM_MINUTES, SHORT_MINUTES = (8.0, 20.0), (3.0, 8.0), (2.5, 6.0)
RESET_MINUTES = (1.0, 2.0)

# WAA's test_all.json, domain by domain, for when the real task files are not there.
WAA_DOMAIN_COUNTS: dict[str, int] = {
    "file_explorer": 19, "libreoffice_calc": 24, "notepad": 2, "chrome": 17, "microsoft_paint": 3,
    "libreoffice_writer": 19, "settings": 5, "vs_code": 24, "msedge": 13, "vlc": 21, "windows_calc": 3,
    "clock": 4,
}

LOG = logging.getLogger("pool_efficiency")


# --- the workload ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptPlan:
    """One attempt of a task: its reset, how long it then runs, and whether it fails."""

    reset_minutes: float
    run_minutes: float
    fails: bool

    @property
    def minutes(self) -> float:
        return self.reset_minutes + self.run_minutes


@dataclass(frozen=True)
class TaskPlan:
    """A task, its duration, and its attempts: the failing ones, then the one that ends it
    (all `MAX_ATTEMPTS` fail in the rare case that none succeeds)."""

    task: BenchmarkTask
    duration_minutes: float
    attempts: tuple[AttemptPlan, ...]
    # Attempts beyond the planned ones, for hedge copies (a copy of a task whose own attempt
    # succeeds takes the next attempt number, which the plan above does not have).
    spares: tuple[AttemptPlan, ...] = ()

    def attempt(self, number: int) -> AttemptPlan:
        """The plan of attempt `number` (1-based), a spare beyond the planned ones."""
        planned = self.attempts + self.spares
        return planned[min(number, len(planned)) - 1]

    @property
    def minutes(self) -> float:
        """All its attempts back to back, each after its reset."""
        return sum(a.minutes for a in self.attempts)

    @property
    def run_minutes(self) -> float:
        """All its attempts back to back, none after a reset (each on a VM fresh from the clean
        state): the shortest time the task can take."""
        return sum(a.run_minutes for a in self.attempts)

    def minutes_on(self, fresh: bool) -> float:
        """All its attempts back to back on one machine, the first without its reset when the
        machine is `fresh` (its first task: the product skips that reset)."""
        return self.minutes - (self.attempts[0].reset_minutes if fresh else 0.0)


@dataclass(frozen=True)
class Workload:
    """The suite (in suite order) with every task's planned attempts."""

    tasks: tuple[TaskPlan, ...]
    source: str

    @property
    def total_minutes(self) -> float:
        return sum(t.minutes for t in self.tasks)

    @property
    def longest_minutes(self) -> float:
        """The longest task with every attempt on a fresh VM (no reset): no schedule ends sooner."""
        return max(t.run_minutes for t in self.tasks)

    @property
    def failed_attempts(self) -> int:
        return sum(a.fails for t in self.tasks for a in t.attempts)

    def work_minutes(self, vms: int) -> float:
        """The total work less the most resets any schedule on `vms` VMs can skip: one per VM
        fresh from the clean state (the pool's `vms`, plus a replacement per failed attempt),
        taken as the largest resets of all."""
        fresh_starts = vms + self.failed_attempts
        resets = sorted((a.reset_minutes for t in self.tasks for a in t.attempts), reverse=True)
        return self.total_minutes - sum(resets[:fresh_starts])

    def ideal_minutes(self, vms: int) -> float:
        """The lower bound on any schedule's wall time on `vms` VMs."""
        return max(self.work_minutes(vms) / vms, self.longest_minutes)

    def plan_of(self, task_id: str) -> TaskPlan:
        return self._by_id[task_id]

    @cached_property
    def _by_id(self) -> dict[str, TaskPlan]:
        return {t.task.task_id: t for t in self.tasks}


def suite_tasks(waa_dir: Path) -> tuple[list[BenchmarkTask], str]:
    """The WAA task ids and domains in suite order, and where they came from."""
    try:
        catalog = WAATaskCatalog(waa_dir)
    except TaskCatalogError:
        synthetic = [(domain, f"{domain}-{i:02d}") for domain, n in WAA_DOMAIN_COUNTS.items() for i in range(n)]
        tasks = [BenchmarkTask(task_id=task_id, instruction="", domain=domain) for domain, task_id in synthetic]
        return tasks, f"{len(tasks)} synthetic tasks with WAA's domain counts ({waa_dir} not found)"
    # Ids and domains are all the bench needs; loading (validating) every task file is not.
    tasks = [BenchmarkTask(task_id=i, instruction="", domain=catalog.domain_of(i)) for i in catalog.task_ids()]
    return tasks, f"the {len(tasks)} WAA tasks of {waa_dir}"


def duration_range(domain: str) -> tuple[float, float]:
    """The range of a task's duration in real minutes, by its domain."""
    if domain in LONG_DOMAINS:
        return LONG_MINUTES
    if domain in MEDIUM_DOMAINS:
        return MEDIUM_MINUTES
    return SHORT_MINUTES


def plan_task(task: BenchmarkTask, seed: int, failure_rate: float) -> TaskPlan:
    """A task's duration and attempts, fixed by the seed and the task id alone."""
    rng = random.Random(f"{seed}:{task.task_id}")
    duration = rng.uniform(*duration_range(task.domain))
    attempts: list[AttemptPlan] = []
    for _ in range(MAX_ATTEMPTS):
        reset = rng.uniform(*RESET_MINUTES)
        if rng.random() >= failure_rate:
            attempts.append(AttemptPlan(reset, duration, fails=False))
            break
        # An infrastructure error strikes at a uniformly random point of the attempt, reset
        # included (a snapshot restore that fails, a VM that stops answering mid-task): the
        # attempt is charged up to that point only.
        failed_at = rng.uniform(0.0, reset + duration)
        attempts.append(AttemptPlan(min(reset, failed_at), max(0.0, failed_at - reset), fails=True))
    # Drawn after the planned ones, so they change nothing the other schedulers see.
    spares = []
    for _ in range(MAX_ATTEMPTS):
        reset = rng.uniform(*RESET_MINUTES)
        failed_at = rng.uniform(0.0, reset + duration) if rng.random() < failure_rate else None
        spares.append(AttemptPlan(reset, duration, fails=False) if failed_at is None else
                      AttemptPlan(min(reset, failed_at), max(0.0, failed_at - reset), fails=True))
    return TaskPlan(task, duration, tuple(attempts), tuple(spares))


def build_workload(waa_dir: Path, seed: int, failure_rate: float) -> Workload:
    tasks, source = suite_tasks(waa_dir)
    return Workload(tuple(plan_task(t, seed, failure_rate) for t in tasks), source)


def history(workload: Workload, seed: int, noise: float) -> dict[str, float]:
    """`expected_seconds` as a previous run would have recorded them: each task's reset and
    duration, off by a seeded factor in [1 - noise, 1 + noise] (run-to-run variation)."""
    rng = random.Random(f"history:{seed}")
    mean_reset = sum(RESET_MINUTES) / 2
    return {
        t.task.task_id: (mean_reset + t.duration_minutes) * 60 * rng.uniform(1 - noise, 1 + noise)
        for t in workload.tasks
    }


# --- the timing-only environment ---------------------------------------------------------------


@dataclass(frozen=True)
class Clock:
    """Real minutes to sleeping seconds and back."""

    ms_per_minute: float

    def seconds(self, minutes: float) -> float:
        return minutes * self.ms_per_minute / 1000

    def sleep(self, minutes: float) -> None:
        time.sleep(self.seconds(minutes))

    def minutes(self, seconds: float) -> float:
        return seconds * 1000 / self.ms_per_minute


class TimingProvider(VMProvider):
    """VMs that come up after a boot delay and do nothing else.

    The VMs a pool starts together come up together, at one instant `boot_minutes` after the
    first was asked for: otherwise the time this bench takes to start a hundred threads (about
    12 ms, i.e. 0.4 real minutes at the default scale) would spread them out. A replacement
    boots for `boot_minutes` from when it is asked for.
    """

    name = "timing"

    def __init__(self, clock: Clock, boot_minutes: float, fresh_vms: bool = True) -> None:
        self.clock = clock
        self.boot_minutes = boot_minutes
        self.fresh_vms = fresh_vms
        self._lock = threading.Lock()
        self._pool_up_at: float | None = None

    def create(self, vm_id: str) -> VMHandle:
        with self._lock:
            if self._pool_up_at is None:
                self._pool_up_at = time.monotonic() + self.clock.seconds(self.boot_minutes)
            up_at = self._pool_up_at
        time.sleep(max(0.0, up_at - time.monotonic()))
        return self._handle(vm_id)

    def replace(self, vm: VMHandle, new_vm_id: str) -> VMHandle:
        self.delete(vm)
        self.clock.sleep(self.boot_minutes)
        return self._handle(new_vm_id)

    def _handle(self, vm_id: str) -> VMHandle:
        # Comes up in the clean state, as the kvm and local providers' VMs do (VMHandle.fresh).
        return VMHandle(vm_id=vm_id, base_url=f"timing://{vm_id}", provider=self.name, fresh=self.fresh_vms)

    def reset(self, vm: VMHandle, level: ResetLevel) -> None:
        """The reset's time is part of the attempt (`timed_attempt`)."""

    def delete(self, vm: VMHandle) -> None:
        """Nothing to delete."""


def timed_attempt(workload: Workload, clock: Clock) -> Callable[[BenchmarkTask, VMHandle, int], BenchmarkResult]:
    """An attempt function that sleeps the planned reset and run, and fails as planned (marking
    the VM unhealthy, as the real attempt does for a VM that broke)."""

    def attempt(task: BenchmarkTask, vm: VMHandle, number: int, stop: threading.Event | None = None) -> BenchmarkResult:
        plan = workload.plan_of(task.task_id).attempt(number)
        # As flows/attempt.py: a VM fresh from the clean state skips the reset (a planned failure
        # still happens, after the run part only).
        minutes = plan.run_minutes if vm.take_fresh() else plan.minutes
        if stop is not None and stop.wait(clock.seconds(minutes)):
            # A hedge copy told to stop: its result is dropped, so what it says does not matter.
            return BenchmarkResult(task_id=task.task_id, domain=task.domain, outcome=OutcomeKind.INFRASTRUCTURE_ERROR,
                                   error="stopped", attempt=number, vm_id=vm.vm_id)
        if stop is None:
            clock.sleep(minutes)
        if plan.fails:
            vm.healthy = False
            return BenchmarkResult(
                task_id=task.task_id, domain=task.domain, outcome=OutcomeKind.INFRASTRUCTURE_ERROR,
                error="simulated infrastructure error", attempt=number, vm_id=vm.vm_id,
                total_time_seconds=plan.minutes * 60,
            )
        return BenchmarkResult(
            task_id=task.task_id, domain=task.domain, outcome=OutcomeKind.SUCCESS, success=True, score=1.0,
            attempt=number, vm_id=vm.vm_id, total_time_seconds=plan.minutes * 60,
        )

    return attempt


# --- the schedulers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One scheduler's run of the workload on one pool size (times in real minutes)."""

    name: str
    wall_minutes: float
    vm_hours: float
    finished: int  # tasks that ended with a final (non-infrastructure) result
    retired: int | None  # None: the scheduler cannot retire VMs
    replaced: int
    no_overhead_minutes: float
    hedging: str = ""  # what hedging did, when on


class _Recorder:
    """The bench's `record`: counts final results (the product writes them to its store)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.final: set[str] = set()

    def record(self, result: BenchmarkResult) -> None:
        if not result.outcome.is_retryable:
            with self._lock:
                self.final.add(result.task_id)


def run_product(name: str, workload: Workload, order: list[BenchmarkTask], vms: int, clock: Clock,
                boot_minutes: float, fresh_vms: bool = True, expected: dict[str, float] | None = None,
                hedging: Hedging | None = None) -> Measured:
    """The product's scheduler: VMPool + one thread per lane running `lane_loop`, exactly as
    flows/pool_engine.py `evaluate_on_pool` arranges them, minus Prefect. `fresh_vms`: the
    provider vouches that new VMs are clean, so their first task skips its reset. `hedging`:
    copies of the last tasks (flows/hedging.py), told which ends last by `expected` (seconds of
    real time, converted to the bench's clock)."""
    pool = VMPool(TimingProvider(clock, boot_minutes, fresh_vms), size=min(vms, len(order)), run_id=f"bench-{vms}")
    recorder = _Recorder()
    scaled = {k: clock.seconds(v / 60) for k, v in (expected or {}).items()}
    schedule = Schedule(work=WorkQueue(order), pool=pool, max_attempts=MAX_ATTEMPTS, hedging=hedging,
                        expected_seconds=scaled)
    hooks = AttemptHooks(attempt=timed_attempt(workload, clock), record=recorder.record, logger=LOG)
    # The lanes start when the first VM is up, as in a real run; their threads are started
    # beforehand and released together, since starting them one by one would take about 0.4
    # real minutes at the default scale, which a real run does not spend.
    go = threading.Event()

    def lane() -> None:
        go.wait()
        lane_loop(schedule, lambda t: attempt_loop(t, schedule, hooks), LOG,
                  run_copy=lambda race: copy_loop(race, schedule, hooks))

    lanes = [threading.Thread(target=lane, name=f"lane-{i}", daemon=True) for i in range(pool.size)]
    for thread in lanes:
        thread.start()
    try:
        pool.start()
        pool.wait_until_ready(1)  # tasks/provision.py provision_pool: lanes start with the first VM
        started = time.monotonic()
        go.set()
        for thread in lanes:
            thread.join()
        ended = time.monotonic()
        vm_seconds = pool.usage.billed_seconds(now=ended)
    finally:
        go.set()
        pool.teardown()
    return Measured(
        name=name, wall_minutes=clock.minutes(ended - started), vm_hours=clock.minutes(vm_seconds) / 60,
        finished=len(recorder.final), retired=pool.retired, replaced=pool.replacements,
        no_overhead_minutes=list_schedule_minutes(workload, order, pool.size, fresh=fresh_vms),
        hedging="" if hedging is None else (
            f"{hedging.stats.started} copies, {hedging.stats.used} stood in for a failed attempt, "
            f"{hedging.stats.dropped} dropped (+{clock.minutes(hedging.stats.extra_vm_seconds) / 60:.2f} VM-hours)"),
    )


def run_fifo(workload: Workload, vms: int, clock: Clock, boot_minutes: float) -> Measured:
    """A plain FIFO pool: one thread per VM taking tasks in suite order from one queue; a failed
    attempt waits for its own VM's replacement and is retried on it; no VM retires early."""
    todo: queue.SimpleQueue[BenchmarkTask] = queue.SimpleQueue()
    for plan in workload.tasks:
        todo.put(plan.task)
    size = min(vms, len(workload.tasks))
    provider, attempt = TimingProvider(clock, boot_minutes), timed_attempt(workload, clock)
    workers = [_FifoWorker(i, todo, provider, attempt) for i in range(size)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ended = time.monotonic()
    # Every worker's last VM lives until the run ends: a plain pool tears down at the end.
    billed = sum(w.billed_seconds + ended - w.since for w in workers)
    return Measured(
        name="plain FIFO (suite order)", wall_minutes=clock.minutes(ended - min(w.first_ready for w in workers)),
        vm_hours=clock.minutes(billed) / 60, finished=sum(w.finished for w in workers), retired=None,
        replaced=sum(w.replaced for w in workers),
        no_overhead_minutes=list_schedule_minutes(workload, [t.task for t in workload.tasks], size),
    )


class _FifoWorker:
    """One worker of the plain FIFO pool, with its own VM."""

    def __init__(self, index: int, todo: queue.SimpleQueue[BenchmarkTask], provider: TimingProvider,
                 attempt: Callable[[BenchmarkTask, VMHandle, int], BenchmarkResult]) -> None:
        self.index, self.todo, self.provider, self.attempt = index, todo, provider, attempt
        self.first_ready = self.since = 0.0  # when its first and its current VM came up
        self.billed_seconds = 0.0  # of its VMs that were replaced
        self.finished = self.replaced = 0

    def run(self) -> None:
        vm = self.provider.create(f"fifo-{self.index}")
        self.first_ready = self.since = time.monotonic()
        while True:
            try:
                task = self.todo.get_nowait()
            except queue.Empty:
                return
            for number in range(1, MAX_ATTEMPTS + 1):
                if not self.attempt(task, vm, number).outcome.is_retryable:
                    self.finished += 1
                    break
                self.billed_seconds += time.monotonic() - self.since
                self.replaced += 1
                vm = self.provider.replace(vm, f"fifo-{self.index}-r{self.replaced}")
                self.since = time.monotonic()


def waa_static_slices(workload: Workload, vms: int) -> Measured:
    """WAA's own scheme, computed: N contiguous slices in suite order, each worker alone."""
    plans = list(workload.tasks)
    size = min(vms, len(plans))
    base, extra = divmod(len(plans), size)
    spans, start = [], 0
    for worker in range(size):
        count = base + (1 if worker < extra else 0)
        spans.append(sum(p.minutes for p in plans[start:start + count]))
        start += count
    wall = max(spans)
    return Measured(
        name="WAA static slices (computed)", wall_minutes=wall, vm_hours=sum(spans) / 60, finished=len(plans),
        retired=None, replaced=0, no_overhead_minutes=wall,
    )


def list_schedule_minutes(workload: Workload, order: list[BenchmarkTask], vms: int, fresh: bool = True) -> float:
    """Wall time of greedy list scheduling of `order` on `vms` machines with no overhead: each
    task, in order, starts on the first free machine and runs all its attempts there; a
    machine's first task skips its reset when the machines start `fresh`, as the product's do."""
    free_at = [(0.0, machine) for machine in range(vms)]
    used: set[int] = set()
    for task in order:
        start, machine = heapq.heappop(free_at)
        plan = workload.plan_of(task.task_id)
        heapq.heappush(free_at, (start + plan.minutes_on(fresh and machine not in used), machine))
        used.add(machine)
    return max(end for end, _ in free_at)


@dataclass(frozen=True)
class Job:
    """A task for the offline packing: its time after a reset, and the reset a fresh machine skips."""

    minutes: float
    skipped_reset: float


def machine_load(jobs: list[Job]) -> float:
    """A machine's busy time: its jobs back to back, the one with the largest reset run first on
    the fresh machine, without that reset."""
    return sum(j.minutes for j in jobs) - max((j.skipped_reset for j in jobs), default=0.0)


def packed_minutes(jobs: list[Job], vms: int, rounds: int = 10_000) -> float:
    """Wall time of an offline packing of `jobs` on `vms` fresh machines: longest first, then
    improved by moving one job, or swapping two, between the machine that ends last and another
    while that makes the later of the two end earlier (a local search: no optimum is claimed, but
    it ends within about a percent of the ideal bound on this workload)."""
    machines: list[list[Job]] = [[] for _ in range(vms)]
    for job in sorted(jobs, key=lambda j: j.minutes, reverse=True):
        min(machines, key=machine_load).append(job)
    loads = [machine_load(m) for m in machines]
    for _ in range(rounds):
        top = max(range(vms), key=loads.__getitem__)
        # The best move: the later end of the pair after it, the other machine, job out, job back.
        best: tuple[float, int, Job, Job | None] | None = None
        for other in range(vms):
            if other == top:
                continue
            for out in machines[top]:
                for back in [None, *machines[other]]:
                    kept = [j for j in machines[top] if j is not out] + ([back] if back else [])
                    taken = [j for j in machines[other] if j is not back] + [out]
                    later = max(machine_load(kept), machine_load(taken))
                    if later < loads[top] - 1e-9 and (best is None or later < best[0]):
                        best = (later, other, out, back)
        if best is None:
            break
        _, other, out, back = best
        machines[top].remove(out)
        machines[other].append(out)
        if back is not None:
            machines[other].remove(back)
            machines[top].append(back)
        loads[top], loads[other] = machine_load(machines[top]), machine_load(machines[other])
    return max(loads)


def reference_rows(workload: Workload, vms: int) -> list[Measured]:
    """Computed schedules with no overhead at all (no VM boot; a failed attempt's retry runs at
    once on the same machine), to tell the online scheduler's loss from what no scheduler avoids:
    - LPT, exact durations: longest first by each task's true time, the failures still unforeseen
      (what perfect history would give: the rest of the gap is the failures');
    - clairvoyant LPT: longest first by each task's whole time, its failed attempts included
      (failures known in advance);
    - clairvoyant packed: the same knowledge, packed offline (`packed_minutes`): how close to the
      ideal bound a schedule can get at all."""
    suite_order = [t.task for t in workload.tasks]
    exact = history(workload, seed=0, noise=0.0)  # noise 0: the true mean reset + duration
    whole = {t.task.task_id: t.minutes for t in workload.tasks}
    machines = min(vms, len(suite_order))
    # VM-hours: the work less one reset per machine (its first task's), as on fresh VMs.
    work = workload.total_minutes - sum(sorted((t.attempts[0].reset_minutes for t in workload.tasks),
                                               reverse=True)[:machines])

    def row(name: str, wall: float) -> Measured:
        return Measured(name=name, wall_minutes=wall, vm_hours=work / 60, finished=len(suite_order),
                        retired=None, replaced=0, no_overhead_minutes=wall)

    jobs = [Job(t.minutes, t.attempts[0].reset_minutes) for t in workload.tasks]
    return [
        row("LPT, exact durations (computed)", list_schedule_minutes(workload, longest_first(suite_order, exact), vms)),
        row("clairvoyant LPT (computed)", list_schedule_minutes(workload, longest_first(suite_order, whole), vms)),
        row("clairvoyant packed (computed)", packed_minutes(jobs, machines)),
    ]


# --- output ------------------------------------------------------------------------------------


def measure_pool(workload: Workload, vms: int, clock: Clock, args: argparse.Namespace, seed: int) -> list[Measured]:
    """Every scheduler on `vms` VMs, one after the other (never two at once: they would compete
    for the CPU), then the computed references."""
    suite_order = [t.task for t in workload.tasks]
    expected = history(workload, seed, args.history_noise)
    return [
        run_product("product, with history", workload, longest_first(suite_order, expected), vms, clock,
                    args.boot_minutes, expected=expected),
        run_product("product, history, hedging", workload, longest_first(suite_order, expected), vms, clock,
                    args.boot_minutes, expected=expected, hedging=Hedging(max_extra=args.hedge_allowance)),
        run_product("product, no history", workload, longest_first(suite_order, {}), vms, clock, args.boot_minutes),
        run_product("product, history, reset always", workload, longest_first(suite_order, expected), vms, clock,
                    args.boot_minutes, fresh_vms=False),
        run_fifo(workload, vms, clock, args.boot_minutes),
        waa_static_slices(workload, vms),
        *reference_rows(workload, vms),
    ]


def print_pool(workload: Workload, vms: int, rows: list[Measured]) -> None:
    ideal, work = workload.ideal_minutes(vms), workload.work_minutes(vms)
    bound = "total work / N" if work / vms >= workload.longest_minutes else "the longest task"
    print(f"\n{vms} VMs: ideal {ideal:.1f} min ({bound}: work {work:.0f} min / {vms} = {work / vms:.1f}, "
          f"longest task {workload.longest_minutes:.1f}; both without the resets fresh VMs can skip)")
    print(f"  {'scheduler':<32} {'wall min':>8} {'efficiency':>10} {'no-overhead':>11} {'VM-hours':>8} "
          f"{'retired':>7} {'replaced':>8} {'finished':>8}")
    for r in rows:
        retired = "-" if r.retired is None else str(r.retired)
        print(f"  {r.name:<32} {r.wall_minutes:>8.1f} {ideal / r.wall_minutes:>9.1%} {r.no_overhead_minutes:>11.1f} "
              f"{r.vm_hours:>8.1f} {retired:>7} {r.replaced:>8} {r.finished:>5}/{len(workload.tasks)}")
    for r in rows:
        if r.hedging:
            print(f"  {r.name}: {r.hedging}")


# Efficiencies (ideal / wall) by pool size, then scheduler, one per seed in the order run; and
# the VM-hours each scheduler billed, likewise.
Efficiencies = dict[int, dict[str, list[float]]]


def print_seeds(seeds: list[int], efficiencies: Efficiencies, vm_hours: Efficiencies) -> None:
    """Per-seed and mean efficiency of every scheduler at every pool size, with its mean VM-hours."""
    print("\nefficiency (ideal / wall) by seed")
    for vms, by_name in efficiencies.items():
        print(f"\n{vms} VMs  {'scheduler':<32}" + "".join(f"{f'seed {s}':>8}" for s in seeds)
              + f"{'mean':>8}{'VM-hours':>10}")
        for name, values in by_name.items():
            hours = vm_hours[vms][name]
            billed = f"{sum(hours) / len(hours):>10.1f}" if all(h > 0 for h in hours) else f"{'-':>10}"
            print(f"         {name:<32}" + "".join(f"{v:>8.1%}" for v in values)
                  + f"{sum(values) / len(values):>8.1%}{billed}")


def print_target(seeds: list[int], efficiencies: Efficiencies, vm_hours: Efficiencies) -> None:
    over = f"seed {seeds[0]}" if len(seeds) == 1 else f"the mean of seeds {','.join(map(str, seeds))}"
    line = f"target: >= {TARGET_EFFICIENCY:.0%} of ideal at {TARGET_POOL} VMs (product, with history, {over})"
    if TARGET_POOL not in efficiencies:
        print(f"\n{line}: not measured ({TARGET_POOL} is not in --pools)")
        return
    values = efficiencies[TARGET_POOL]["product, with history"]
    efficiency = sum(values) / len(values)
    print(f"\n{line}: {'met' if efficiency >= TARGET_EFFICIENCY else 'NOT met'} ({efficiency:.1%})")
    hedged = efficiencies[TARGET_POOL]["product, history, hedging"]
    hours, hedged_hours = (sum(vm_hours[TARGET_POOL][name]) for name in ("product, with history",
                                                                        "product, history, hedging"))
    with_hedging = sum(hedged) / len(hedged)
    print(f"with hedging (on by default for agents that call no model on kvm, aws and azure VMs): "
          f"{'met' if with_hedging >= TARGET_EFFICIENCY else 'NOT met'} ({with_hedging:.1%}) "
          f"for {hedged_hours / hours - 1:+.1%} VM-hours (target: within +5 %)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", default="16,40,100", help="comma-separated pool sizes (default 16,40,100)")
    parser.add_argument("--scale-ms-per-minute", type=float, default=30.0,
                        help="milliseconds of sleep per real minute (default 30)")
    parser.add_argument("--seed", type=int, default=1, help="seed of durations, resets and failures (default 1)")
    parser.add_argument("--seeds", default="",
                        help="comma-separated seeds, e.g. 1,2,3,4,5: run each (instead of --seed) and print "
                             "per-seed and mean efficiencies; about 20 s per seed")
    parser.add_argument("--failure-rate", type=float, default=0.03,
                        help="probability of an infrastructure error per attempt (default 0.03)")
    parser.add_argument("--history-noise", type=float, default=0.2,
                        help="relative error of the recorded durations the scheduler orders by (default 0.2)")
    parser.add_argument("--boot-minutes", type=float, default=5.0, help="real minutes a VM takes to boot (default 5)")
    parser.add_argument("--hedge-allowance", type=float, default=0.05,
                        help="hedging's extra VM time, as a fraction of the VM time billed (default 0.05)")
    parser.add_argument("--waa-dir", type=Path, default=WAA_TASKS_DIR, help=f"WAA task suite (default {WAA_TASKS_DIR})")
    args = parser.parse_args()
    print(conditions(), flush=True)
    try:
        pools = [int(p) for p in args.pools.split(",") if p.strip()]
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()] or [args.seed]
    except ValueError:
        parser.error("--pools and --seeds take comma-separated integers")
    if not pools or min(pools) < 1 or args.scale_ms_per_minute <= 0 or args.boot_minutes < 0:
        parser.error("pool sizes and --scale-ms-per-minute must be positive, --boot-minutes non-negative")
    if not 0 <= args.failure_rate < 1 or not 0 <= args.history_noise < 1:
        parser.error("--failure-rate and --history-noise must be in [0, 1)")
    # The scheduler warns at every simulated infrastructure error (20 lines a seed); the tables
    # count them (the "replaced" column), so only errors are shown.
    logging.basicConfig(level=logging.ERROR, format="%(name)s: %(message)s")

    clock = Clock(args.scale_ms_per_minute)
    several = len(seeds) > 1
    started = time.monotonic()
    efficiencies: Efficiencies = {}
    vm_hours: Efficiencies = {}
    for seed in seeds:
        workload = build_workload(args.waa_dir, seed, args.failure_rate)
        if seed == seeds[0]:
            print(f"workload: {workload.source}: LibreOffice 8-20 min, VS Code/Chrome/Edge/VLC 3-8, others 2.5-6, "
                  f"plus a 1-2 min reset per attempt (the product skips it on a VM fresh from the clean state; "
                  f"'reset always' does not)")
            print(f"failures: rate {args.failure_rate:g} per attempt, at a random point of it, retried; a replacement "
                  f"VM boots in {args.boot_minutes:g} min")
            print(f"history: a previous run's durations = true times +-{args.history_noise:.0%}; wall time from the "
                  f"first VM ready (all boot together); 1 min = {args.scale_ms_per_minute:g} ms")
        print(f"seed {seed}: {workload.failed_attempts} attempt(s) end in an infrastructure error", flush=True)
        for vms in pools:
            rows = measure_pool(workload, vms, clock, args, seed)
            if not several:  # with several seeds only the summary is printed
                print_pool(workload, vms, rows)
            by_name, hours = efficiencies.setdefault(vms, {}), vm_hours.setdefault(vms, {})
            for r in rows:
                by_name.setdefault(r.name, []).append(workload.ideal_minutes(vms) / r.wall_minutes)
                hours.setdefault(r.name, []).append(r.vm_hours)
    if several:
        print_seeds(seeds, efficiencies, vm_hours)
    print_target(seeds, efficiencies, vm_hours)
    print(f"(bench took {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
