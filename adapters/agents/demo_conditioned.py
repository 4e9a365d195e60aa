"""An agent wrapper that conditions any prompt-based agent on retrieved demonstrations.

On `reset(task)` it retrieves up to k demos for the task (`adapters.agents.demos`), renders them
with `format_demos_prompt` and hands the text to the wrapped ("base") agent through
`set_prompt_context(text)`. Everything else (`act`, `last_usage`) is the base agent's. The base
agent decides where the text goes in its prompt; this module knows nothing about models.

`config()` carries the base agent's config, the retriever and `chosen_demo_ids`: the ids of the
demos chosen for the current task (empty before the first reset, and when nothing relevant was
found), so that whoever stores a result with the agent's config records which demo it saw.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from adapters.agents.demos import Demo, DemoRetriever, format_demos_prompt
from adapters.benchmark import (
    BenchmarkAction,
    BenchmarkAgent,
    BenchmarkObservation,
    BenchmarkTask,
    ModelUsage,
    ObservationNeeds,
    StepRecord,
)


@runtime_checkable
class SupportsPromptContext(Protocol):
    """A base agent that accepts extra prompt context for the coming episode.

    `set_prompt_context(text)` is called after the base agent's own `reset(task)` and before its
    first `act`; the text replaces any earlier context ("" clears it). The agent should show it to
    its model once per episode (e.g. in the first user message or the system prompt).
    """

    def set_prompt_context(self, text: str) -> None: ...


class DemoConditionedAgent(BenchmarkAgent):
    """Wraps a base agent; gives it the best k demos for each task as prompt context."""

    name = "demo_conditioned"

    def __init__(self, base: BenchmarkAgent, retriever: DemoRetriever, k: int = 1) -> None:
        if not isinstance(base, BenchmarkAgent):
            raise TypeError(f"DemoConditionedAgent needs a BenchmarkAgent as base, got {type(base).__name__}")
        if not callable(getattr(base, "set_prompt_context", None)):
            raise TypeError(
                f"DemoConditionedAgent cannot condition {type(base).__name__} (agent {base.name!r}): it has no "
                "set_prompt_context(text: str) method (the SupportsPromptContext protocol), so it has no way "
                "to put a demonstration in its prompt"
            )
        if not callable(getattr(retriever, "retrieve", None)):
            raise TypeError(f"retriever {type(retriever).__name__} has no retrieve(task, k) method")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.base = base
        self.retriever = retriever
        self.k = k
        self._demos: list[Demo] = []
        self._context = ""

    @property
    def chosen_demos(self) -> list[Demo]:
        """The demos chosen for the current task, best first."""
        return list(self._demos)

    @property
    def prompt_context(self) -> str:
        """The text last handed to the base agent."""
        return self._context

    def reset(self, task: BenchmarkTask) -> None:
        self.base.reset(task)
        self._demos = list(self.retriever.retrieve(task, k=self.k))[: self.k]
        self._context = format_demos_prompt(task.instruction, self._demos) if self._demos else ""
        self.base.set_prompt_context(self._context)  # type: ignore[attr-defined]

    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        return self.base.act(task, observation, history)

    def last_usage(self) -> ModelUsage | None:
        return self.base.last_usage()

    def observation_needs(self) -> ObservationNeeds:
        return self.base.observation_needs()

    def config(self) -> dict[str, Any]:
        retriever_config = getattr(self.retriever, "config", None)
        return {
            "name": self.name,
            "base": self.base.config(),
            "retriever": getattr(self.retriever, "kind", type(self.retriever).__name__),
            "retriever_config": retriever_config() if callable(retriever_config) else {},
            "k": self.k,
            "chosen_demo_ids": [d.demo_id for d in self._demos],
        }
