"""A TEST AGENT for checking the statistics of repeated trials: the scripted agent, made to fail
each task with a known probability.

Each episode draws once, at its start, whether to follow the task's solution plan: with the
task's probability p it plays the plan exactly as `scripted` does; otherwise it stops at once with
DONE (never FAIL, which WAA scores as success on infeasible tasks). So on a suite whose plans all
succeed (the bundled suite) a task's true success probability is p, which lets the trial
statistics (adapters/results/trials/) be checked against a known truth end to end. It measures
nothing about any model: never use it for results.

Probabilities come from a file mapping task ids to p (JSON, or TOML with a [probabilities]
table) and a default for tasks the file does not name. The draw is seeded: it is a hash of
(seed, task id, trial), so the same trial of the same task always draws the same way, and
trials of one task draw independently. The trial number is set by the caller (`trial=`, or the
`trial` attribute before the episode); without one, each episode of a task in this process takes
the next trial number of that task, so runs in one process are repeatable but a resumed run or
another process starts the count again.
"""

from __future__ import annotations

import hashlib
import json
import threading
import tomllib
from pathlib import Path
from typing import Any

from adapters.agents.scripted import ScriptedAgent
from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkObservation, BenchmarkTask, StepRecord

DEFAULT_SUCCESS_PROBABILITY = 0.5


class ProbabilityFileError(ValueError):
    """The probabilities file is unreadable or malformed; the message names the file and entry."""


def _probability(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ProbabilityFileError(f"{where}: a success probability must be a number from 0 to 1, got {value!r}")
    return float(value)


def load_probabilities(path: Path) -> dict[str, float]:
    """task id -> success probability from a JSON object or a TOML file's [probabilities] table
    (a TOML file may also list them at its top level)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProbabilityFileError(f"{path}: cannot read the probabilities file: {exc}") from exc
    try:
        data: Any = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ProbabilityFileError(f"{path}: not valid {'TOML' if path.suffix.lower() == '.toml' else 'JSON'}: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("probabilities"), dict):
        data = data["probabilities"]
    if not isinstance(data, dict):
        raise ProbabilityFileError(f"{path}: expected an object mapping task ids to probabilities")
    return {str(task): _probability(p, f"{path}: task {task!r}") for task, p in data.items()}


def trial_draw(seed: int, task_id: str, trial: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, task id, trial)."""
    digest = hashlib.sha256(f"noisy-scripted:{seed}:{task_id}:{trial}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class NoisyScriptedAgent(ScriptedAgent):
    """TEST AGENT: the scripted agent that follows a task's plan with probability p_task, else
    stops at once with DONE (module docstring). For testing the statistics of repeated trials."""

    name = "noisy-scripted"

    # Episodes started per (seed, task) in this process, for episodes given no trial number.
    _episodes: dict[tuple[int, str], int] = {}
    _episodes_lock = threading.Lock()

    def __init__(
        self,
        plans: dict[str, list[dict[str, Any]]],
        probabilities: dict[str, float] | None = None,
        default_probability: float = DEFAULT_SUCCESS_PROBABILITY,
        seed: int = 0,
        trial: int | None = None,
        max_element_waits: int = 3,
    ) -> None:
        super().__init__(plans, max_element_waits=max_element_waits)
        self.probabilities = {t: _probability(p, f"task {t!r}") for t, p in (probabilities or {}).items()}
        self.default_probability = _probability(default_probability, "the default success probability")
        self.seed = seed
        self.trial = trial
        self._follow = True
        self._drawn: tuple[int, float, float] | None = None  # (trial, draw, p) of this episode

    def probability(self, task_id: str) -> float:
        """The task's success probability (its plan succeeding, as on the bundled suite)."""
        return self.probabilities.get(task_id, self.default_probability)

    def config(self) -> dict[str, Any]:
        # The trial number is not configuration: every trial of a run shares one agent config.
        return {
            "name": self.name,
            "test_agent": True,
            "plans": len(self.plans),
            "seed": self.seed,
            "default_probability": self.default_probability,
            "probabilities": dict(sorted(self.probabilities.items())),
        }

    def reset(self, task: BenchmarkTask) -> None:
        super().reset(task)
        trial = self.trial
        if trial is None:
            with self._episodes_lock:
                key = (self.seed, task.task_id)
                trial = self._episodes.get(key, 0) + 1
                self._episodes[key] = trial
        p = self.probability(task.task_id)
        draw = trial_draw(self.seed, task.task_id, trial)
        self._follow = draw < p
        self._drawn = (trial, draw, p)

    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        if self._follow:
            return super().act(task, observation, history)
        trial, draw, p = self._drawn or (0, 1.0, self.probability(task.task_id))
        return BenchmarkAction(
            type=ActionType.DONE,
            reasoning=f"noisy-scripted TEST AGENT: trial {trial} drew {draw:.3f} >= p = {p:g}, so it stops without "
                      "following the plan",
        )
