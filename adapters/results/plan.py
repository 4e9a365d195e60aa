"""What a run will take before it starts: wall time and cost from recorded durations.

For each selected task the plan uses the mean duration (and model cost) of its final attempts in
earlier runs, the same agent's preferred (`ResultStore.expected_seconds` / `expected_cost`); a
task never run counts as the median of the known ones, or `DEFAULT_TASK_SECONDS` when nothing is
known, and the plan says how many were guessed. Wall time assumes the pool's own order, longest
first, with each task starting on the first free VM; VM boot and retries are not included.
VM-hours are the pool's size times the wall time, an upper bound (VMs that run out of work are
deleted while the last tasks finish).
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass

DEFAULT_TASK_SECONDS = 360.0
"""A task's duration when no task of the selection was ever run (WAA tasks take 2.5-20 min)."""


@dataclass(frozen=True)
class Plan:
    """The estimate for one selection of tasks on one pool."""

    tasks: int
    pool_size: int
    timed_tasks: int  # tasks with a recorded duration
    priced_tasks: int  # tasks with a recorded model cost
    assumed_task_seconds: float  # what each untimed task counts as
    work_seconds: float
    wall_seconds: float
    vm_hour_price_usd: float
    model_cost_usd: float
    trials: int = 1  # episodes per task (`--trials`): work, wall time and model cost count each

    @property
    def vm_hours(self) -> float:
        return self.pool_size * self.wall_seconds / 3600

    @property
    def vm_cost_usd(self) -> float:
        return self.vm_hours * self.vm_hour_price_usd

    @property
    def cost_usd(self) -> float:
        return self.vm_cost_usd + self.model_cost_usd

    def render(self) -> str:
        """The plan as the terminal shows it."""
        guessed = self.tasks - self.timed_tasks
        episodes = f" x {self.trials} trials = {self.tasks * self.trials} episodes" if self.trials > 1 else ""
        lines = [
            f"plan: {self.tasks} task(s){episodes} on {self.pool_size} VM(s)",
            f"  recorded durations for {self.timed_tasks}/{self.tasks} task(s)"
            + (f"; the other {guessed} counted as {self.assumed_task_seconds / 60:.1f} min each" if guessed else ""),
            f"  work {self.work_seconds / 60:.1f} min; estimated wall time {self.wall_seconds / 60:.1f} min "
            "(longest first; VM boot and retries not included)",
            f"  VMs: at most {self.vm_hours:.2f} VM-hours x ${self.vm_hour_price_usd:.2f} = ${self.vm_cost_usd:.2f}",
            f"  model: ${self.model_cost_usd:.2f} (recorded cost for {self.priced_tasks}/{self.tasks} task(s); "
            "the others count as $0)",
            f"  estimated cost: ${self.cost_usd:.2f}",
        ]
        return "\n".join(lines)


def make_plan(
    task_ids: list[str],
    expected_seconds: dict[str, float],
    expected_cost: dict[str, float],
    pool_size: int,
    vm_hour_price_usd: float = 0.0,
    trials: int = 1,
) -> Plan:
    """Estimate wall time and cost of running `task_ids` on `pool_size` VMs, each `trials` times."""
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    if pool_size < 1:
        raise ValueError(f"pool size must be at least 1, got {pool_size}")
    if vm_hour_price_usd < 0:
        raise ValueError(f"VM-hour price must be >= 0, got {vm_hour_price_usd}")
    known = [expected_seconds[t] for t in task_ids if t in expected_seconds]
    assumed = statistics.median(known) if known else DEFAULT_TASK_SECONDS
    durations = [expected_seconds.get(t, assumed) for t in task_ids]
    return Plan(
        tasks=len(task_ids),
        pool_size=pool_size,
        timed_tasks=len(known),
        priced_tasks=sum(1 for t in task_ids if t in expected_cost),
        assumed_task_seconds=assumed,
        work_seconds=sum(durations) * trials,
        wall_seconds=longest_first_makespan(durations * trials, pool_size),
        vm_hour_price_usd=vm_hour_price_usd,
        model_cost_usd=sum(expected_cost.get(t, 0.0) for t in task_ids) * trials,
        trials=trials,
    )


def longest_first_makespan(durations: list[float], machines: int) -> float:
    """When the last task ends if tasks start longest first, each on the first free machine."""
    free_at = [0.0] * min(machines, max(1, len(durations)))
    for duration in sorted(durations, reverse=True):
        heapq.heapreplace(free_at, free_at[0] + duration)
    return max(free_at)
