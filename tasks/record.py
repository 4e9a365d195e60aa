"""Stage: store a task's result in DuckDB as soon as it is known."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from adapters.benchmark import BenchmarkResult
from adapters.store.duckdb_store import ResultStore


@task(
    name="record",
    task_run_name="record [{result.task_id}]",
    cache_policy=NO_CACHE,
    persist_result=False,
    retries=2,
    retry_delay_seconds=1,
)
def record_result(store: ResultStore, run_id: str, result: BenchmarkResult) -> None:
    """Write the result row and its steps in one transaction."""
    store.record_result(run_id, result)
