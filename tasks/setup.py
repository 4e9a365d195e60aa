"""Stage: run a task's setup steps."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from adapters.benchmark import BenchmarkTask
from adapters.waa.live import WAALiveAdapter


@task(name="setup", task_run_name="setup [{task.task_id}]", cache_policy=NO_CACHE, persist_result=False)
def setup_task(adapter: WAALiveAdapter, task: BenchmarkTask) -> None:
    """Run the task's `config` steps; a failed step raises SetupStepError naming it."""
    adapter.run_setup(task)
