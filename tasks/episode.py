"""Stage: let the agent play the task."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from adapters.benchmark import BenchmarkAgent, BenchmarkTask
from adapters.episode import EpisodeLimits, EpisodeOutcome, run_episode
from adapters.waa.live import WAALiveAdapter


@task(name="episode", task_run_name="episode [{task.task_id}]", cache_policy=NO_CACHE, persist_result=False)
def play_episode(
    adapter: WAALiveAdapter,
    agent: BenchmarkAgent,
    task: BenchmarkTask,
    limits: EpisodeLimits,
    screenshot_dir: Path | None,
    outcome: EpisodeOutcome | None = None,
) -> EpisodeOutcome:
    """Run the agent until it ends the episode or a step or wall-clock limit is reached.

    `outcome`, when given, is filled in as the episode goes, so the caller can read the steps
    played so far even if it stops waiting for a blocked episode.
    """
    return run_episode(adapter, agent, task, limits, screenshot_dir=screenshot_dir, outcome=outcome)
