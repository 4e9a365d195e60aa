"""A random agent: the floor every real agent must beat. Seeded, so its runs are repeatable."""

from __future__ import annotations

import hashlib
import random
import string
from typing import Any

from adapters.benchmark import (
    ActionType,
    BenchmarkAction,
    BenchmarkAgent,
    BenchmarkObservation,
    BenchmarkTask,
    ObservationNeeds,
    StepRecord,
)

_KEYS = ["enter", "tab", "esc", "backspace", "delete", "up", "down", "left", "right", "f2"]


class RandomAgent(BenchmarkAgent):
    """Clicks, types, presses keys and scrolls at random; ends with DONE with small probability."""

    name = "random"

    def __init__(self, seed: int = 0, done_probability: float = 0.05) -> None:
        self.seed = seed
        self.done_probability = done_probability
        self._rng = random.Random(seed)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "done_probability": self.done_probability}

    def observation_needs(self) -> ObservationNeeds:
        """Random actions read nothing but the screen size."""
        return ObservationNeeds(accessibility_tree=False, window=False)

    def reset(self, task: BenchmarkTask) -> None:
        # One stream per (seed, task): the same task gets the same actions on every run.
        digest = hashlib.sha256(f"{self.seed}:{task.task_id}".encode()).digest()
        self._rng = random.Random(int.from_bytes(digest[:8], "big"))

    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        rng = self._rng
        if rng.random() < self.done_probability:
            return BenchmarkAction(type=ActionType.DONE)
        choice = rng.choice(["click", "double_click", "type", "key", "scroll"])
        if choice in ("click", "double_click"):
            return BenchmarkAction(type=ActionType(choice), x=rng.random(), y=rng.random(), normalized=True)
        if choice == "type":
            text = "".join(rng.choice(string.ascii_letters + " ") for _ in range(rng.randint(1, 12)))
            return BenchmarkAction(type=ActionType.TYPE, text=text)
        if choice == "key":
            return BenchmarkAction(type=ActionType.KEY, key=rng.choice(_KEYS))
        return BenchmarkAction(type=ActionType.SCROLL, scroll_direction=rng.choice(["up", "down"]), scroll_amount=rng.randint(1, 5))
