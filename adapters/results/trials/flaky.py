"""Flaky tasks: the same agent, model and settings on the same task version, with outcomes that
differ from trial to trial or from run to run.

    task_stability(rows)      every (agent, model, settings, task version) group with its trials
    flaky_tasks(rows)         the groups whose sound trials both succeeded and failed

Rows are per-trial result rows across runs: run_id, task_id, outcome, success, agent, and
(when known) trial, task_fingerprint, domain, model_id and the settings hash (`settings_hash`, or
the runs table's `agent_config_hash`). A row without `trial` is its run's only trial (a
single-trial run). Only trials whose environment was sound decide flakiness (rates.py); the
others are listed with the group's trials.

When the agent is deterministic (its actions are fixed by its configuration: the scripted agent
replays plans, the random agent's stream is seeded per task; adapters.agents.DETERMINISTIC_AGENTS),
different outcomes cannot come from the agent: the task is flagged as pointing at the environment
(state leaking between tasks, timing, a setup that does not always take).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from adapters.agents import DETERMINISTIC_AGENTS
from adapters.results.rates import is_sound

_REQUIRED = ("run_id", "task_id", "outcome", "success", "agent")


class TrialOutcome(BaseModel):
    """One trial of a task in one run."""

    run_id: str
    trial: int
    outcome: str
    success: bool


class TaskStability(BaseModel):
    """One task version under one agent, model and settings, across every given trial."""

    task_id: str
    fingerprint: str | None
    domain: str
    agent: str
    model_id: str | None
    settings_hash: str | None
    trials: list[TrialOutcome]  # by run, then trial
    sound_trials: int
    successes: int  # over sound trials
    deterministic_agent: bool

    @property
    def runs(self) -> int:
        return len({t.run_id for t in self.trials})

    @property
    def success_fraction(self) -> float | None:
        return self.successes / self.sound_trials if self.sound_trials else None

    @property
    def flaky(self) -> bool:
        """Some sound trials succeeded and some did not."""
        return 0 < self.successes < self.sound_trials

    @property
    def points_at_environment(self) -> bool:
        """Flaky although the agent is deterministic: the environment varied."""
        return self.flaky and self.deterministic_agent

    def outcomes_text(self) -> str:
        """The trials as a report shows them: "run-a#1 success, run-a#2 agent_failure, ..."."""
        return ", ".join(f"{t.run_id}#{t.trial} {t.outcome}" for t in self.trials)


def task_stability(
    rows: Iterable[Mapping[str, Any]],
    deterministic_agents: Collection[str] = DETERMINISTIC_AGENTS,
) -> list[TaskStability]:
    """Every task version's trials per agent, model and settings (module docstring), sorted by
    task id, then agent."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for index, row in enumerate(rows):
        missing = [key for key in _REQUIRED if key not in row]
        if missing:
            raise ValueError(f"result row #{index + 1} lacks {', '.join(missing)}; rows need {', '.join(_REQUIRED)}")
        settings = row.get("settings_hash", row.get("agent_config_hash"))
        key = (str(row["task_id"]), row.get("task_fingerprint") or None, str(row["agent"]),
               row.get("model_id"), settings)
        group = groups.setdefault(key, {"domain": str(row.get("domain") or ""), "trials": []})
        trial = row.get("trial")
        group["trials"].append(TrialOutcome(run_id=str(row["run_id"]), trial=1 if trial is None else int(trial),
                                            outcome=str(row["outcome"]), success=bool(row["success"])))
    result = []
    for (task_id, fingerprint, agent, model_id, settings), group in sorted(
        groups.items(), key=lambda kv: tuple("" if v is None else str(v) for v in kv[0])
    ):
        trials = sorted(group["trials"], key=lambda t: (t.run_id, t.trial))
        sound = [t for t in trials if is_sound(t.outcome)]
        result.append(TaskStability(
            task_id=task_id, fingerprint=fingerprint, domain=group["domain"], agent=agent,
            model_id=None if model_id is None else str(model_id),
            settings_hash=None if settings is None else str(settings), trials=trials, sound_trials=len(sound),
            successes=sum(t.success for t in sound), deterministic_agent=agent in deterministic_agents,
        ))
    return result


def flaky_tasks(
    rows: Iterable[Mapping[str, Any]],
    deterministic_agents: Collection[str] = DETERMINISTIC_AGENTS,
) -> list[TaskStability]:
    """The task versions whose sound trials both succeeded and failed (module docstring)."""
    return [s for s in task_stability(rows, deterministic_agents) if s.flaky]
