"""The agent episode loop: observe, act, apply, until the agent ends it or a limit is reached.

Prefect task timeouts cannot interrupt blocking calls in worker threads (notes/prefect.md), so the
time limits are enforced here, between steps. Time is charged to whoever spent it: the agent's
(its model thinking) and the environment's (observations, actions, settling) are counted
separately, each against its own limit (adapters/outcomes.py R7). Failures are sorted by whose
fault they are: a VM that stops answering or is too slow is infrastructure (retried elsewhere),
an agent that crashes, runs out of its own time or keeps choosing impossible actions is the
agent's failure (a result).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from adapters.benchmark import (
    AgentInfrastructureError,
    BenchmarkAction,
    BenchmarkAgent,
    BenchmarkObservation,
    BenchmarkTask,
    ModelUsage,
    OutcomeKind,
    StepRecord,
    UnparseableReplyError,
)
from adapters.outcomes import EnvironmentFault, agent_error_outcome, episode_time_outcome
from adapters.waa.actions import ActionTranslationError
from adapters.waa.errors import WAAError
from adapters.waa.live import ActionRejected

log = logging.getLogger(__name__)


class EpisodeEnvironment(Protocol):
    """What the loop needs from an environment (WAALiveAdapter provides it)."""

    def observe(self) -> BenchmarkObservation: ...

    def apply(self, action: BenchmarkAction) -> str | None:
        """Carry out the action; returns how it was delivered (recorded on the step), or None."""
        ...

    def settle(self) -> object: ...


@dataclass
class EpisodeLimits:
    """How long and how far an episode may go. `wall_clock_seconds` is the agent's time (WAA's
    `time_limit`); the environment's own time has `environment_seconds` (None: the same)."""

    max_steps: int = 15
    wall_clock_seconds: float = 1200.0
    # An agent whose actions fail this many times in a row is ended as an agent failure.
    max_consecutive_action_errors: int = 5
    environment_seconds: float | None = None

    @property
    def environment_limit(self) -> float:
        """The environment's time limit in seconds."""
        return self.wall_clock_seconds if self.environment_seconds is None else self.environment_seconds


@dataclass
class EpisodeOutcome:
    """What happened in the episode; `final_outcome` is set only when the episode itself decided.

    The caller may pass one in and read it while the episode runs: `steps` grows as steps are
    played and `phase` says what the loop is waiting on, so a caller that gives up on a blocked
    episode (flows/attempt.py) still knows the steps played and whose turn it was (rule R7).
    """

    steps: list[StepRecord] = field(default_factory=list)
    last_action: BenchmarkAction | None = None
    final_outcome: OutcomeKind | None = None
    error: str | None = None
    agent_seconds: float = 0.0
    env_seconds: float = 0.0
    usage: ModelUsage = field(default_factory=ModelUsage)
    # True when an infrastructure error came from the agent's backend (model endpoint down or
    # throttling), not from the VM: the attempt is retried, but the VM need not be replaced.
    agent_backend_failed: bool = False
    # What the loop is doing now: "observe" (first observation), "agent", "act" (apply, settle
    # and the next observation), or "done"; and since when (time.monotonic()), so a caller that
    # gives up on a blocked episode can charge the blocked time to whoever was blocking.
    phase: str = "observe"
    phase_started: float = field(default_factory=time.monotonic)
    # Set by the caller when the episode's result can no longer count (a hedge copy whose task's
    # own attempt ended, flows/hedging.py): the loop ends before its next step.
    stop: threading.Event | None = None


# Raw model replies are kept in results for diagnosis, up to this many characters.
MAX_RAW_REPLY = 4000


def run_episode(
    env: EpisodeEnvironment,
    agent: BenchmarkAgent,
    task: BenchmarkTask,
    limits: EpisodeLimits,
    screenshot_dir: Path | None = None,
    first_observation: BenchmarkObservation | None = None,
    outcome: EpisodeOutcome | None = None,
) -> EpisodeOutcome:
    """Play one episode. Never raises for agent or VM trouble: it is reported in the outcome.

    Whose fault each failure is follows adapters/outcomes.py: a server-side failure of an
    observation or action ends the episode at once as infrastructure with the steps so far
    (R1, R2); a failed step the agent caused is recorded and the agent plays on (R3).
    """
    outcome = outcome if outcome is not None else EpisodeOutcome()
    consecutive_errors = 0
    agent.reset(task)
    try:
        t0 = _enter(outcome, "observe")
        observation = first_observation or env.observe()
        outcome.env_seconds += time.monotonic() - t0
        for index in range(min(limits.max_steps, task.time_limit_steps)):
            if outcome.stop is not None and outcome.stop.is_set():
                return outcome
            ran_out = episode_time_outcome(outcome.agent_seconds, outcome.env_seconds, limits.wall_clock_seconds,
                                           limits.environment_limit)
            if ran_out is not None:
                outcome.final_outcome, outcome.error = ran_out
                return outcome
            screenshot_path = _save_screenshot(observation, screenshot_dir, index)
            t0 = _enter(outcome, "agent")
            try:
                action = agent.act(task, observation, list(outcome.steps))
            except Exception as exc:  # noqa: BLE001 - whose fault it is: adapters/outcomes.py (R3, R8)
                outcome.agent_seconds += time.monotonic() - t0
                outcome.final_outcome = agent_error_outcome(exc)
                outcome.agent_backend_failed = isinstance(exc, AgentInfrastructureError)
                outcome.error = _agent_error_text(agent, exc)
                return outcome
            finally:
                usage = agent.last_usage()
                if usage is not None:
                    outcome.usage = outcome.usage + usage
            agent_seconds = time.monotonic() - t0
            outcome.agent_seconds += agent_seconds
            t0 = _enter(outcome, "act")
            step_error = None
            delivery: str | None = None
            fault: EnvironmentFault | None = None
            try:
                delivery = env.apply(action)
            except EnvironmentFault as exc:
                fault = exc
                step_error = str(exc)
            except WAAError as exc:  # an environment that raises the client's errors directly
                fault = EnvironmentFault.from_error("action", exc)
                step_error = str(fault)
            except (ActionTranslationError, ActionRejected) as exc:
                step_error = str(exc)
            outcome.last_action = action
            if fault is None and step_error is None and not action.type.ends_episode:
                try:
                    env.settle()
                    observation = env.observe()
                except EnvironmentFault as exc:
                    fault = exc
                except WAAError as exc:
                    fault = EnvironmentFault.from_error("observation", exc)
            env_seconds = time.monotonic() - t0
            outcome.env_seconds += env_seconds
            outcome.steps.append(
                StepRecord(
                    index=index,
                    action=action,
                    screenshot_path=screenshot_path,
                    window_title=observation.window_title,
                    agent_seconds=agent_seconds,
                    env_seconds=env_seconds,
                    error=step_error,
                    usage=usage,
                    observation_error=None if fault else observation.raw_observation.get("tree_error"),
                    delivery=delivery,
                )
            )
            if fault is not None:
                return _environment_failed(outcome, fault, index)
            if action.type.ends_episode:
                return outcome
            consecutive_errors = consecutive_errors + 1 if step_error else 0
            if consecutive_errors >= limits.max_consecutive_action_errors:
                outcome.final_outcome = OutcomeKind.AGENT_FAILURE
                outcome.error = f"{consecutive_errors} actions in a row failed; last: {step_error}"
                return outcome
        return outcome
    except EnvironmentFault as exc:  # the first observation (R1, R7)
        return _environment_failed(outcome, exc, None)
    except WAAError as exc:  # an environment that raises the client's errors directly
        return _environment_failed(outcome, EnvironmentFault.from_error(outcome.phase, exc), None)
    finally:
        outcome.phase = "done"


def _enter(outcome: EpisodeOutcome, phase: str) -> float:
    """Start `phase` of the loop; returns its start time (time.monotonic())."""
    now = time.monotonic()
    outcome.phase, outcome.phase_started = phase, now
    return now


def blocked_times(outcome: EpisodeOutcome, now: float | None = None) -> tuple[float, float]:
    """(agent seconds, environment seconds) of an episode, the phase it is blocked in included:
    what a caller that gave up on it (a hard time limit) charges to whom."""
    blocked = max(0.0, (time.monotonic() if now is None else now) - outcome.phase_started)
    if outcome.phase == "agent":
        return outcome.agent_seconds + blocked, outcome.env_seconds
    if outcome.phase in ("observe", "act"):
        return outcome.agent_seconds, outcome.env_seconds + blocked
    return outcome.agent_seconds, outcome.env_seconds


def _agent_error_text(agent: BenchmarkAgent, exc: Exception) -> str:
    """What the stored result says about an exception from the agent."""
    if isinstance(exc, AgentInfrastructureError):
        return f"agent {agent.name} backend failed: {exc}"
    if isinstance(exc, UnparseableReplyError):
        return f"agent {agent.name}: {exc}; raw reply: {exc.raw_reply[:MAX_RAW_REPLY]!r}"
    return f"agent {agent.name} raised {type(exc).__name__}: {exc}"


def _environment_failed(outcome: EpisodeOutcome, fault: EnvironmentFault, step: int | None) -> EpisodeOutcome:
    """R2: the server failed a call; the attempt is not a measurement and is not scored."""
    where = "before the first observation" if step is None else f"at step {step}"
    outcome.final_outcome = OutcomeKind.INFRASTRUCTURE_ERROR
    outcome.error = f"{fault} ({where}; attempt not scored)"
    return outcome


def _save_screenshot(observation: BenchmarkObservation, directory: Path | None, index: int) -> str | None:
    """Screenshots live as files next to the results (DuckDB stores only their paths).

    Written whole or not at all (a temporary name, then a rename): a full disk leaves no empty
    or half PNG behind. A screenshot that cannot be written is not worth the episode (the agent
    saw it in memory): the step keeps no path, and the log says why."""
    if directory is None or observation.screenshot is None:
        return observation.screenshot_path
    global _screenshot_trouble
    path = directory / f"step_{index:03d}.png"
    partial = path.with_suffix(".png.part")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(observation.screenshot)
        partial.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        trouble = str(exc.strerror or exc)
        if trouble != _screenshot_trouble:  # said once, not once per step
            log.warning("screenshots are not being saved (%s, first %s); steps are kept without them", trouble, path)
            _screenshot_trouble = trouble
        return None
    if _screenshot_trouble is not None:
        log.warning("screenshots are saved again")
        _screenshot_trouble = None
    return str(path)


_screenshot_trouble: str | None = None  # why screenshots are not being saved, once said
