"""Stage: score the VM's state with the task's WAA evaluator."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from adapters.benchmark import BenchmarkResult, BenchmarkTask
from adapters.waa.live import WAALiveAdapter


@task(name="evaluate", task_run_name="evaluate [{task.task_id}]", cache_policy=NO_CACHE, persist_result=False)
def evaluate_state(adapter: WAALiveAdapter, task: BenchmarkTask) -> BenchmarkResult:
    """Run postconfig, getters and metrics; the result says scored, evaluation or infra error."""
    return adapter.evaluate(task)
