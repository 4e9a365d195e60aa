"""Agents that choose actions from observations; see `build_agent` for the CLI's names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.agents.random_agent import RandomAgent
from adapters.agents.scripted import ScriptedAgent, load_plans
from adapters.benchmark import BenchmarkAgent

AGENT_NAMES = ("scripted", "random")


def build_agent(name: str, *, plans_path: Path | None = None, seed: int = 0, **_: Any) -> BenchmarkAgent:
    """An agent by its CLI name; unknown names raise ValueError listing the known ones."""
    if name == "scripted":
        if plans_path is None:
            raise ValueError("the scripted agent needs a plans file (solutions.json)")
        return ScriptedAgent(load_plans(plans_path))
    if name == "random":
        return RandomAgent(seed=seed)
    raise ValueError(f"unknown agent {name!r}; known agents: {', '.join(AGENT_NAMES)}")
