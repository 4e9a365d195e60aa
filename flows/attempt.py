"""One attempt at one task on one leased VM: reset -> setup -> episode -> evaluate.

This is orchestration: it orders the stage tasks, times them and turns whatever goes wrong into
exactly one BenchmarkResult whose outcome says whose fault it was. It never raises for a task's
trouble, so one bad task cannot lose another's result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from typing import Any, TypeVar

from adapters.benchmark import BenchmarkAgent, BenchmarkResult, BenchmarkTask, ModelUsage, OutcomeKind, StepRecord
from adapters.episode import EpisodeLimits
from adapters.vms.base import ProviderError, ResetLevel, VMHandle, VMProvider
from adapters.waa.catalog import WAATaskCatalog
from adapters.waa.client import WAAClient
from adapters.waa.errors import WAAConnectionError, WAAError
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter
from adapters.waa.setup_steps import SetupStepError
from tasks.episode import play_episode
from tasks.evaluate import evaluate_state
from tasks.reset import reset_vm
from tasks.setup import setup_task


T = TypeVar("T")


@dataclass(frozen=True)
class AttemptContext:
    """Everything an attempt needs besides the task and the VM."""

    provider: VMProvider
    catalog: WAATaskCatalog
    agent_factory: Callable[[], BenchmarkAgent]  # a fresh agent per attempt: no state shared across threads
    reset_level: ResetLevel
    limits: EpisodeLimits
    cache_dir: Path
    artifacts_dir: Path
    adapter_settings: LiveAdapterSettings


def run_attempt(task: BenchmarkTask, vm: VMHandle, ctx: AttemptContext, attempt: int) -> BenchmarkResult:
    """Run every stage once on `vm`; marks the VM unhealthy on infrastructure trouble."""
    timings: dict[str, float] = {}
    started = time.monotonic()

    def finish(
        outcome: OutcomeKind,
        *,
        error: str | None = None,
        base: BenchmarkResult | None = None,
        steps: Sequence[StepRecord] | None = None,
        usage: ModelUsage | None = None,
        agent: dict[str, Any] | None = None,
    ) -> BenchmarkResult:
        if outcome is OutcomeKind.INFRASTRUCTURE_ERROR:
            vm.healthy = False
        data = base.model_dump() if base is not None else {}
        data.update(
            task_id=task.task_id,
            domain=task.domain,
            infeasible=task.infeasible,
            attempt=attempt,
            vm_id=vm.vm_id,
            timings=timings,
            total_time_seconds=time.monotonic() - started,
        )
        if base is None:
            data.update(outcome=outcome, success=False, score=0.0, error=error, reason=error)
        if steps is not None:
            data.update(steps=[s.model_dump() for s in steps], num_steps=len(steps))
        if usage is not None:
            data.update(usage=usage.model_dump())
        if agent is not None:
            data.update(agent_details=agent)
        return BenchmarkResult.model_validate(data)

    def timed(stage: str, fn: Callable[..., T], *args: Any) -> T:
        t0 = time.monotonic()
        try:
            return fn(*args)
        finally:
            timings[stage] = time.monotonic() - t0

    try:
        timed("reset", reset_vm, ctx.provider, vm, ctx.reset_level, task)
    except (ProviderError, WAAError) as exc:
        return finish(OutcomeKind.INFRASTRUCTURE_ERROR, error=f"reset ({ctx.reset_level.value}) failed: {exc}")

    adapter = WAALiveAdapter(
        WAAClient(vm.base_url), ctx.catalog, ctx.cache_dir, ctx.adapter_settings, devtools_url=vm.devtools_url
    )
    try:
        try:
            timed("setup", setup_task, adapter, task)
        except SetupStepError as exc:
            return finish(OutcomeKind.SETUP_FAILURE, error=str(exc))
        except WAAConnectionError as exc:
            return finish(OutcomeKind.INFRASTRUCTURE_ERROR, error=f"setup: {exc}")

        screenshot_dir = ctx.artifacts_dir / task.task_id / f"attempt-{attempt}"
        agent = ctx.agent_factory()
        episode = timed("episode", play_episode, adapter, agent, task, ctx.limits, screenshot_dir)
        agent_details = agent.config()
        timings["agent"] = episode.agent_seconds
        timings["env"] = episode.env_seconds
        if episode.final_outcome is not None:
            return finish(
                episode.final_outcome, error=episode.error, steps=episode.steps, usage=episode.usage, agent=agent_details
            )

        evaluation = timed("evaluate", evaluate_state, adapter, task)
        return finish(evaluation.outcome, base=evaluation, steps=episode.steps, usage=episode.usage, agent=agent_details)
    except Exception as exc:  # noqa: BLE001 - an unforeseen failure still yields one result
        return finish(OutcomeKind.INFRASTRUCTURE_ERROR, error=f"unexpected {type(exc).__name__}: {exc}")
    finally:
        adapter.close()
