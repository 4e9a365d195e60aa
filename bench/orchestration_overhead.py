"""Orchestration overhead of the pipeline on the bundled suite (target: < 0.5 s per task, pool 4).

Runs the bundled suite with the scripted agent on 4 local simulation VMs (`--repeats` times, each
a new run on the same Prefect server), then splits the time, from the task runs the Prefect API
reports and the timings stored in DuckDB:
- environment and agent work of an attempt: the reset, setup and evaluate stage task runs' own
  durations (start to end of their Running state, so their creation and state changes are not
  counted as work) plus the episode's agent and environment time measured at the adapter;
- overhead inside an attempt: the `attempt N on <VM>` task run's duration minus that work: the
  stage task runs' bookkeeping, our own code between the calls, the DuckDB hand-off;
- the gap between attempts on a VM: from one attempt run's end to the next one's start on the
  same VM (recording, taking the next task, its `evaluate-task` run, the lease);
- per task: the two together; amortised: (flow wall time x pool size - work) / tasks, i.e. every
  second a VM slot was not doing environment or agent work, fixed run costs included.
It prints numbers (min / median / max over the repeats); it asserts nothing.

    python bench/orchestration_overhead.py [--pool-size 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.conditions import conditions, spread  # noqa: E402 - after the path is set
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="runs of the suite (default 3)")
    args = parser.parse_args()
    print(conditions(), flush=True)

    from bench.prefect_server import prefect_test_server
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    per_task: list[float] = []
    inside_attempt: list[float] = []
    gaps: list[float] = []
    amortised: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, prefect_test_server():
        for repeat in range(args.repeats):
            # The Prefect test server must still be up when its task runs are read back.
            db, run_id = Path(tmp) / "bench.duckdb", f"bench-{repeat}"
            config = SuiteRunConfig(pool_size=args.pool_size, db_path=db, artifacts_dir=Path(tmp) / "a", run_id=run_id)
            started = time.monotonic()
            outcome = run_suite(config)
            wall = time.monotonic() - started
            split = _split(db, run_id, len(outcome.results))
            n = len(outcome.results)
            inside_attempt.append(split.inside_attempt / n)
            gaps.append(split.gaps / n)
            per_task.append((split.inside_attempt + split.gaps) / n)
            amortised.append((wall * args.pool_size - split.work) / n)
            print(f"run {repeat + 1}: {n} tasks, {sum(r.success for r in outcome.results)} solved, pool "
                  f"{args.pool_size}, flow wall {wall:.2f} s, environment + agent work {split.work:.2f} s "
                  f"({split.attempts} attempt runs, {split.stage_runs} stage runs)", flush=True)
    print(f"overhead inside an attempt (attempt run - work), per task: {spread(inside_attempt)}")
    print(f"gap between attempts on a VM, per task:                   {spread(gaps)}")
    print(f"per-task orchestration overhead (the two):                {spread(per_task)}")
    print(f"amortised overhead ((wall x pool - work) / tasks):         {spread(amortised)}")
    best = min(per_task)
    print(f"target: < 0.5 s per task -> per-task {'MET' if best < 0.5 else 'NOT MET'} (best run), "
          f"amortised {'MET' if min(amortised) < 0.5 else 'NOT MET'} (best run)")


@dataclass(frozen=True)
class _Split:
    work: float  # environment and agent work, summed over attempts
    inside_attempt: float  # attempt runs' time that is not work, summed
    gaps: float  # time between consecutive attempt runs on a VM, summed
    attempts: int
    stage_runs: int


_WORK_STAGES = ("reset [", "setup [", "evaluate [")


def _split(db: Path, run_id: str, tasks: int) -> _Split:
    """The run's time split into work, overhead inside attempts and gaps between them."""
    import duckdb

    from flows.local_server import RECORDER_FLUSH_SECONDS

    with duckdb.connect(str(db), read_only=True) as con:
        flow_run_id = con.execute("SELECT prefect_flow_run_id FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
        episode_work = {(task, attempt): agent + env for task, attempt, agent, env in con.execute(
            "SELECT task_id, attempt, coalesce(agent_seconds, 0), coalesce(env_seconds, 0) FROM task_results "
            "WHERE run_id = ?", [run_id]).fetchall()}
    # Task-run states reach the server as events, recorded in batches a moment later: wait
    # until every attempt's run has ended there and a read a flush interval later finds no
    # further stage run ended.
    deadline = time.monotonic() + 60
    seen = -1
    while True:
        runs = _task_runs(flow_run_id)
        attempts = [r for r in runs if r.name.startswith("attempt ")]
        stages = [r for r in runs if r.name.startswith(_WORK_STAGES)]
        if (len(attempts) >= len(episode_work) and len(stages) == seen) or time.monotonic() > deadline:
            break
        seen = len(stages)
        time.sleep(RECORDER_FLUSH_SECONDS + 0.5)
    stage_seconds = sum(r.total_run_time.total_seconds() for r in stages)
    attempt_seconds = sum((r.end_time - r.start_time).total_seconds() for r in attempts)
    work = stage_seconds + sum(episode_work.values())
    by_vm: dict[str, list] = {}
    for r in attempts:
        by_vm.setdefault(r.name.rsplit(" on ", 1)[-1], []).append(r)
    gaps = 0.0
    for runs_on_vm in by_vm.values():
        runs_on_vm.sort(key=lambda r: r.start_time)
        gaps += sum(max(0.0, (b.start_time - a.end_time).total_seconds()) for a, b in zip(runs_on_vm, runs_on_vm[1:]))
    return _Split(work=work, inside_attempt=attempt_seconds - work, gaps=gaps, attempts=len(attempts),
                  stage_runs=len(stages))


def _task_runs(flow_run_id: str) -> list:
    """Every ended task run of a flow run, as the Prefect API reports them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    found: list = []
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                                         limit=200, offset=len(found))
            found += page
            if len(page) < 200:
                break
    return [r for r in found if r.start_time and r.end_time]


if __name__ == "__main__":
    main()
