"""One attempt at one task on one leased VM: reset -> setup -> episode -> evaluate.

This is orchestration: it orders the stage tasks, times them and turns whatever goes wrong into
exactly one BenchmarkResult whose outcome says whose fault it was. It never raises for a task's
trouble, so one bad task cannot lose another's result.

Stage wall-clock limits. Prefect task timeouts cannot interrupt a thread blocked in a network call
(notes/prefect.md), so every stage's blocking call runs in a daemon worker thread joined with the
stage's limit (`AttemptContext.stage_timeouts`, defaults in flows/stage_limits.py). When the limit
passes, the attempt ends at once naming the stage and the limit, and the VM is marked unhealthy
so the pool replaces it: as an infrastructure error when the stage was waiting on the WAA server
(reset, setup, evaluate, or an episode blocked in an observation or action), as a timeout when
the episode was waiting on the agent. The stuck thread is *abandoned*, not
killed (Python cannot kill a thread): deleting the VM normally breaks its connection so it ends
soon after; until then it may still hold the adapter's HTTP session, and its Prefect stage task
run stays "Running" in the UI. An abandoned reset at level "reboot" could still start a process
after the pool replaced the VM (it would be a leak on a provider without per-VM cleanup).

The episode keeps its soft limits (EpisodeLimits: the agent's time and the environment's time, each
checked between steps against its own limit, which keeps the steps played so far); the hard limit of
the episode stage defaults to the two limits plus EPISODE_HARD_LIMIT_GRACE seconds and only fires
when a step blocks; its reason says how much time the agent and the environment took. The episode
fills in an outcome this module owns, so a hard-limit stop keeps the steps played so far and knows
what the episode was blocked on: the environment (an observation or action the server never
answered: infrastructure, adapters/outcomes.py R7) or the agent (a timeout).

Whose fault each failure is is decided by adapters/outcomes.py; this module only maps the
stage a failure came from to the outcome those rules give.
"""

from __future__ import annotations

import contextvars
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from typing import Any, ParamSpec, TypeVar

from adapters.benchmark import BenchmarkAgent, BenchmarkResult, BenchmarkTask, ModelUsage, OutcomeKind, StepRecord
from adapters.episode import EpisodeLimits, EpisodeOutcome, blocked_times
from adapters.outcomes import EnvironmentFault, stage_timeout_outcome
from adapters.vms.base import ProviderError, ResetLevel, VMHandle, VMProvider
from adapters.waa.catalog import WAATaskCatalog
from adapters.waa.client import WAAClient
from adapters.waa.errors import WAAConnectionError, WAAError
from adapters.waa.initial_state import StartStateError, StartStates, read_state
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter
from adapters.waa.setup_steps import SetupStepError
from flows import live_view
from flows.stage_limits import DEFAULT_STAGE_TIMEOUTS, EPISODE_HARD_LIMIT_GRACE, StageTimeout
from tasks.episode import play_episode
from tasks.evaluate import evaluate_state
from tasks.reset import reset_vm
from tasks.setup import setup_task


T = TypeVar("T")
P = ParamSpec("P")

# What a hedge copy's attempt says when it was stopped because its task's own attempt ended.
STOPPED_COPY = "hedge copy stopped: the task's own attempt ended first (this result is not recorded)"


def run_with_deadline(stage: str, limit: float | None, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Call fn(*args, **kwargs) in a daemon worker thread; raise StageTimeout if it has not
    returned in time.

    The thread runs in a copy of the caller's context, so Prefect sees a stage task called inside
    the current flow/task run as its child. On a timeout the thread keeps running, abandoned.
    """
    if limit is None:
        return fn(*args, **kwargs)
    context = contextvars.copy_context()
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name=f"stage-{stage}", daemon=True).start()
    if not done.wait(limit):
        raise StageTimeout(stage, limit)
    if "error" in box:
        raise box["error"]
    return box["value"]


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
    # Hard wall-clock limit per stage (reset, setup, episode, evaluate); missing stages use
    # DEFAULT_STAGE_TIMEOUTS, and the episode its two soft limits + EPISODE_HARD_LIMIT_GRACE.
    stage_timeouts: Mapping[str, float] = field(default_factory=dict)
    # What each VM's evaluator-read state was when first read, for the start-state check at
    # reset levels that restore nothing (adapters/waa/initial_state.py; one per pool).
    start_states: StartStates = field(default_factory=StartStates)

    def stage_limit(self, stage: str) -> float:
        if stage in self.stage_timeouts:
            return float(self.stage_timeouts[stage])
        if stage == "episode":  # the agent's time and the environment's are limited apart
            return self.limits.wall_clock_seconds + self.limits.environment_limit + EPISODE_HARD_LIMIT_GRACE
        return DEFAULT_STAGE_TIMEOUTS[stage]


def attempt_cache_dir(cache_root: Path, task_id: str, attempt: int) -> Path:
    """The folder for files copied from the VM during one attempt.

    One per attempt because concurrent tasks name the same files (two copies of a task, or two
    tasks both checking "Book1.xlsx") and would otherwise read each other's copies. The task id
    comes from a task file, so it is reduced to a safe folder name.
    """
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", task_id).strip(".") or "task"
    return cache_root / "attempts" / f"{safe}-{attempt}"


def _set_up_isolated(adapter: WAALiveAdapter, task: BenchmarkTask, vm: VMHandle, ctx: AttemptContext) -> str | None:
    """Run the task's setup, then check that what its evaluator reads is in its initial state
    (at reset levels that restore nothing: adapters/waa/initial_state.py `StartStates`); why the
    task cannot start isolated, or None."""
    setup_task(adapter, task)
    return ctx.start_states.check(vm.base_url, task, ctx.reset_level.value, lambda: read_state(adapter.client, task))


def run_attempt(task: BenchmarkTask, vm: VMHandle, ctx: AttemptContext, attempt: int, *,
                trial: int = 1, stop: threading.Event | None = None) -> BenchmarkResult:
    """Run every stage once on `vm`, each within its wall-clock limit; marks the VM unhealthy on
    infrastructure trouble of the VM (not of the agent's model endpoint) and on a stage timeout.
    `trial` is which of the run's repeated trials of the task this is (stored with the result;
    an agent with a `trial` attribute, the seeded `noisy-scripted` test agent, is told it).
    `stop` (a hedge copy's, flows/hedging.py): once set, the attempt ends at the next stage or
    step with an infrastructure error saying so (`STOPPED_COPY`), its VM sound; the caller drops
    that result."""
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
        unhealthy: bool = False,
        vm_ok: bool = False,
    ) -> BenchmarkResult:
        if (outcome is OutcomeKind.INFRASTRUCTURE_ERROR and not vm_ok) or unhealthy:
            vm.healthy = False
            # The server's symptom ("cannot connect") with its cause when the provider knows it.
            if error is not None and (down := ctx.provider.vm_down(vm)) is not None and down not in error:
                error = f"{error} ({down})"
        data = base.model_dump() if base is not None else {}
        data.update(
            task_id=task.task_id,
            domain=task.domain,
            task_fingerprint=task.fingerprint,
            infeasible=task.infeasible,
            attempt=attempt,
            trial=trial,
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

    def timed(stage: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        t0 = time.monotonic()
        try:
            return run_with_deadline(stage, ctx.stage_limit(stage), fn, *args, **kwargs)
        finally:
            timings[stage] = time.monotonic() - t0

    def stopped(steps: Sequence[StepRecord] | None = None, usage: ModelUsage | None = None) -> BenchmarkResult | None:
        if stop is None or not stop.is_set():
            return None
        return finish(OutcomeKind.INFRASTRUCTURE_ERROR, error=STOPPED_COPY, steps=steps, usage=usage, vm_ok=True)

    if (ended := stopped()) is not None:
        return ended
    try:
        if vm.take_fresh():
            timings["reset"] = 0.0  # the VM just came up in the clean state a reset restores
            ctx.start_states.fresh(vm.base_url)
        else:
            timed("reset", reset_vm, ctx.provider, vm, ctx.reset_level, task)
    except (ProviderError, WAAError) as exc:
        return finish(OutcomeKind.INFRASTRUCTURE_ERROR, error=f"reset ({ctx.reset_level.value}) failed: {exc}")
    except StartStateError as exc:  # the reset could not make a start state (R12)
        return finish(OutcomeKind.INFRASTRUCTURE_ERROR, error=f"reset ({ctx.reset_level.value}): {exc}")
    except StageTimeout as exc:  # only the environment works in this stage
        return finish(stage_timeout_outcome("reset", waiting_on_agent=False), error=str(exc))

    adapter = WAALiveAdapter(
        WAAClient(vm.base_url),
        ctx.catalog,
        attempt_cache_dir(ctx.cache_dir, task.task_id, attempt),
        ctx.adapter_settings,
        devtools_url=vm.devtools_url,
        download_dir=ctx.cache_dir / "downloads",
    )
    try:
        try:
            isolated = timed("setup", _set_up_isolated, adapter, task, vm, ctx)
        except SetupStepError as exc:
            return finish(OutcomeKind.SETUP_FAILURE, error=str(exc))
        except (EnvironmentFault, WAAConnectionError) as exc:
            return finish(OutcomeKind.INFRASTRUCTURE_ERROR, error=f"setup: {exc}")
        finally:
            ctx.start_states.ran(vm.base_url, task.task_id)  # setup may have changed what later tasks read
        if isolated is not None:  # cannot start isolated at this reset level: not the agent's (R12)
            return finish(OutcomeKind.SETUP_FAILURE, error=isolated)

        if (ended := stopped()) is not None:
            return ended
        screenshot_dir = ctx.artifacts_dir / task.task_id / f"attempt-{attempt}"
        agent = ctx.agent_factory()
        if hasattr(agent, "trial"):  # seeded per (task, trial): each trial of a task draws on its own
            agent.trial = trial
        adapter.needs = agent.observation_needs()  # fetch only what this agent reads
        episode = EpisodeOutcome(stop=stop)
        live_view.BOARD.attempt_started(vm.vm_id, task.task_id, trial, attempt, episode, screenshot_dir, vm.details)
        try:
            timed("episode", play_episode, adapter, agent, task, ctx.limits, screenshot_dir, episode)
        except StageTimeout as exc:
            # Blocked in the environment = the server did not answer; in the agent = timeout (R7).
            on_agent = episode.phase == "agent"
            waiting = "the first observation" if episode.phase == "observe" else "an action or observation"
            agent_took, env_took = blocked_times(episode)
            spent = f"the agent took {agent_took:.1f} s, the environment {env_took:.1f} s"
            return finish(
                stage_timeout_outcome("episode", waiting_on_agent=on_agent),
                error=f"{exc}; {spent}" if on_agent
                else f"{exc}; the WAA server did not answer {waiting} ({spent}; attempt not scored)",
                steps=list(episode.steps),
                usage=episode.usage,
                unhealthy=True,
            )
        agent_details = agent.config()
        timings["agent"] = episode.agent_seconds
        timings["env"] = episode.env_seconds
        if (ended := stopped(episode.steps, episode.usage)) is not None:
            return ended
        if episode.final_outcome is not None:
            return finish(
                episode.final_outcome,
                error=episode.error,
                steps=episode.steps,
                usage=episode.usage,
                agent=agent_details,
                vm_ok=episode.agent_backend_failed,  # the model endpoint failed, not the VM
            )

        evaluation = timed("evaluate", evaluate_state, adapter, task)
        return finish(evaluation.outcome, base=evaluation, steps=episode.steps, usage=episode.usage, agent=agent_details)
    except StageTimeout as exc:  # setup or evaluate blocked: the server did not answer
        return finish(stage_timeout_outcome(exc.stage, waiting_on_agent=False), error=f"{exc}; the WAA server did not answer")
    except Exception as exc:  # noqa: BLE001 - an unforeseen failure still yields one result
        return finish(OutcomeKind.INFRASTRUCTURE_ERROR, error=f"unexpected {type(exc).__name__}: {exc}")
    finally:
        live_view.BOARD.attempt_ended(vm.vm_id)
        adapter.close()
