"""Orchestration overhead of the pipeline on the bundled suite (target: < 0.5 s per task, pool 4).

Runs the bundled suite with the scripted agent on 4 local simulation VMs, then splits the time:
- inside: per task, the time spent in the environment (reset, setup, observation and actions,
  evaluation) and in the agent, as recorded in DuckDB;
- per-task overhead: the duration of the task's `evaluate-task` Prefect task run (read back from
  the Prefect API) minus its inside time: Prefect's task-run bookkeeping for the task and its
  stage tasks, the VM lease and the DuckDB write;
- fixed run costs: flow start to the first task, last task to the flow's end (provisioning,
  concurrency limit, teardown, summary);
- amortised overhead: (flow wall time x pool size - sum of inside times) / tasks, i.e. every
  second a VM slot was not doing environment or agent work, fixed costs included.
It prints numbers; it asserts nothing.

    python bench/orchestration_overhead.py [--pool-size 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.conditions import conditions  # noqa: E402 - after the path is set
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-size", type=int, default=4)
    args = parser.parse_args()
    print(conditions(), flush=True)

    import duckdb
    from prefect.testing.utilities import prefect_test_harness

    from flows.evaluate_suite import run_suite

    from flows.run_config import SuiteRunConfig

    with tempfile.TemporaryDirectory() as tmp, prefect_test_harness(server_startup_timeout=90):
        # The Prefect test server must still be up when its task runs are read back.
        db = Path(tmp) / "bench.duckdb"
        config = SuiteRunConfig(pool_size=args.pool_size, db_path=db, artifacts_dir=Path(tmp) / "a", run_id="bench")
        started = time.monotonic()
        outcome = run_suite(config)
        wall = time.monotonic() - started
        # Task-run states reach the server as events, recorded a moment later: wait until every
        # task's run has ended there (and no event is left to flush when the server stops).
        deadline = time.monotonic() + 30
        while True:
            flow_run_id, task_runs = _task_runs(db)
            ended = {tr.name.split("/")[-1] for tr in task_runs}
            if len(ended) >= len(outcome.results) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        with duckdb.connect(str(db), read_only=True) as con:
            rows = con.execute(
                """SELECT task_id, total_time_seconds,
                          coalesce(reset_seconds, 0) + coalesce(setup_seconds, 0)
                          + coalesce(agent_seconds, 0) + coalesce(env_seconds, 0)
                          + coalesce(evaluate_seconds, 0) AS inside,
                          episode_seconds - coalesce(agent_seconds, 0) - coalesce(env_seconds, 0) AS episode_gap
                   FROM task_results WHERE run_id = 'bench'"""
            ).fetchall()
    inside_by_task = {r[0]: r[2] for r in rows}
    evaluate_runs = [tr for tr in task_runs if tr.name.split("/")[-1] in inside_by_task]
    wrapper = [
        (tr.end_time - tr.start_time).total_seconds() - inside_by_task[tr.name.split("/")[-1]] for tr in evaluate_runs
    ]
    starts = [tr.start_time for tr in evaluate_runs]
    ends = [tr.end_time for tr in evaluate_runs]
    n = len(rows)
    inside_total = sum(r[2] for r in rows)
    per_task = [r[1] - r[2] for r in rows]
    solved = sum(r.success for r in outcome.results)
    print(f"bundled suite: {n} tasks, {solved} solved, pool {args.pool_size}, flow wall time {wall:.2f} s")
    print(f"time inside environment + agent: {inside_total:.2f} s in total, {inside_total / n:.3f} s per task")
    print(f"our bookkeeping inside an attempt (attempt time - inside): mean {sum(per_task) / n:.3f} s, max {max(per_task):.3f} s")
    per_task_overhead = sum(wrapper) / len(wrapper)
    print(
        f"per-task orchestration overhead (evaluate-task run - inside): mean {per_task_overhead:.3f} s, "
        f"max {max(wrapper):.3f} s over {len(wrapper)} task runs"
    )
    span = (max(ends) - min(starts)).total_seconds()
    print(f"fixed run costs: {wall - span:.2f} s outside the task span of {span:.2f} s")
    amortised = (wall * args.pool_size - inside_total) / n
    print(f"amortised overhead incl. flow start and provisioning ((wall x pool - inside) / tasks): {amortised:.3f} s per task")
    print(f"target: < 0.5 s per task -> per-task {'MET' if per_task_overhead < 0.5 else 'NOT MET'}, "
          f"amortised {'MET' if amortised < 0.5 else 'NOT MET'}")


def _task_runs(db: Path) -> tuple[str, list]:
    """The flow run id stored with the run, and its task runs as the Prefect API reports them."""
    import duckdb
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterName

    with duckdb.connect(str(db), read_only=True) as con:
        flow_run_id = con.execute("SELECT prefect_flow_run_id FROM runs WHERE run_id = 'bench'").fetchone()[0]
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="/")),
            limit=200,
        )
    return flow_run_id, [r for r in runs if r.start_time and r.end_time]


if __name__ == "__main__":
    main()
