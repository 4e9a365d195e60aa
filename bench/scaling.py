"""Scaling of the pipeline with the pool size (target: >= 90 % scaling efficiency at pool 16).

Builds, in a temporary directory, a suite of 154 tasks (WAA's size) in WAA's layout by repeating
the 16 bundled tasks under new ids (each task file copied with a new `id` and file name into its
own domain, its scripted plan copied in `solutions.json` under the new id), then runs the
scripted agent on it on local simulation VMs with a simulated per-step latency (the pause after
each action, `settle_seconds`), once per pool size, each run in a fresh process with a fresh
Prefect test server.
All runs write to one DuckDB file, as a nightly rerun does: the flow starts tasks longest first
by the durations earlier runs recorded there, so the first pool size runs in suite order and the
later ones in that order (`--fresh-db` gives each run its own file, i.e. no history).
Per pool size it prints:
- wall time of `run_suite` (flow start, provisioning, every task, teardown, summary);
- throughput: tasks per minute of wall time;
- total work: the sum of `total_time_seconds` over the run's rows in DuckDB `task_results`
  (every attempt; one per task unless an infrastructure error was retried);
- ideal time: total work / pool size, and scaling efficiency: ideal / wall;
- success count (last attempt of each task);
- mean per-task `total_time_seconds`, and the same minus the simulated latency it slept
  (latency x the task's non-final steps): if it grows with the pool, the environments are
  slowed by contention for the CPU, which the efficiency above does not show (it divides by the
  work actually done), but the speedup over pool 1 does;
- time outside the task span (wall - first task start to last task end): provisioning, flow
  start and teardown.
It prints numbers; it asserts nothing.

    python bench/scaling.py [--pools 4,16] [--tasks 154] [--step-latency 3] [--fresh-db]

The default latency is 3 s because WAA itself waits 3 s after every action before it observes
again (`settle_seconds` on real VMs), so no real step is shorter; a model call adds more. With
shorter latencies on a small machine, the local work per task (Prefect's bookkeeping, the
simulations rendering screenshots, this controller) saturates the CPU at pool 16, and the bench
then measures the machine rather than the orchestration: see the CPU note it prints.
Pool 1 is optional (ideal time is computed from the work done, not from pool 1); at 3 s it
takes about half an hour.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.conditions import conditions  # noqa: E402 - after the path is set
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

TARGET_POOL = 16
TARGET_EFFICIENCY = 0.90


@dataclass
class PoolResult:
    pool: int
    tasks: int
    attempts: int
    wall: float
    work: float
    successes: int
    mean_task: float
    mean_task_without_latency: float
    outside_span: float
    unsolved: list[str]  # "task: outcome: reason" of each task whose last attempt failed

    @property
    def ideal(self) -> float:
        return self.work / self.pool

    @property
    def efficiency(self) -> float:
        return self.ideal / self.wall

    @property
    def throughput(self) -> float:
        return self.tasks / self.wall * 60


def build_suite(dest: Path, count: int) -> list[str]:
    """Write a suite of `count` tasks in WAA's layout to `dest` by repeating the bundled ones.

    Task i is a copy of bundled task i mod 16 (in index order), named `<bundled id>-rNN` with
    NN = i div 16, so every bundled task is repeated about equally and the domains keep their
    proportions. Returns the new ids in index order.
    """
    from adapters.waa.catalog import bundled_suite_dir

    src = bundled_suite_dir()
    index: dict[str, list[str]] = json.loads((src / "test_all.json").read_text())
    plans: dict[str, list] = json.loads((src / "solutions.json").read_text())
    bundled = [(domain, task_id) for domain, ids in index.items() for task_id in ids]

    new_index: dict[str, list[str]] = {domain: [] for domain in index}
    new_plans: dict[str, list] = {}
    for i in range(count):
        domain, task_id = bundled[i % len(bundled)]
        new_id = f"{task_id}-r{i // len(bundled):02d}"
        task = json.loads((src / "examples" / domain / f"{task_id}.json").read_text())
        task["id"] = new_id
        out = dest / "examples" / domain / f"{new_id}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(task, indent=2))
        new_plans[new_id] = plans[task_id]
        new_index[domain].append(new_id)
    new_index = {domain: ids for domain, ids in new_index.items() if ids}
    (dest / "test_all.json").write_text(json.dumps(new_index, indent=2))
    (dest / "solutions.json").write_text(json.dumps(new_plans, indent=2))
    return [task_id for ids in new_index.values() for task_id in ids]


def run_pool(suite: Path, tmp: Path, index: int, pool: int, latency: float, fresh_db: bool) -> PoolResult:
    """Run number `index` of the whole suite, on `pool` VMs, in a fresh Prefect test server."""
    import duckdb
    from bench.prefect_server import prefect_test_server

    from flows.evaluate_suite import run_suite

    from flows.run_config import SuiteRunConfig

    run_id = f"scaling-{index}-p{pool}"  # unique: the same pool size may be measured twice
    db = tmp / (f"{run_id}.duckdb" if fresh_db else "scaling.duckdb")
    config = SuiteRunConfig(
        suite_dir=suite,
        pool_size=pool,
        settle=latency,
        db_path=db,
        artifacts_dir=tmp / f"artifacts-{run_id}",
        run_id=run_id,
    )
    with prefect_test_server():
        started = time.monotonic()
        run_suite(config)
        wall = time.monotonic() - started

    with duckdb.connect(str(db), read_only=True) as con:
        # Per attempt: its time, and the latency it slept (one pause after each non-final step).
        rows = con.execute(
            """SELECT r.total_time_seconds,
                      (SELECT count(*) FROM steps s
                       WHERE s.run_id = r.run_id AND s.task_id = r.task_id AND s.attempt = r.attempt
                         AND s.action_type NOT IN ('done', 'fail', 'answer')) AS pauses
               FROM task_results r WHERE r.run_id = ?""",
            [run_id],
        ).fetchall()
        unsolved = [
            f"{task}: {outcome}: {(error or reason or '')[:200]}"
            for task, outcome, reason, error in con.execute(
                "SELECT task_id, outcome, reason, error FROM latest_task_results WHERE run_id = ? AND NOT success "
                "ORDER BY task_id",
                [run_id],
            ).fetchall()
        ]
        tasks, successes = con.execute(
            "SELECT count(*), coalesce(sum(success::INT), 0) FROM latest_task_results WHERE run_id = ?", [run_id]
        ).fetchone()
        # First task start to last task end, from the rows' write times (UTC) and durations.
        span = con.execute(
            """SELECT epoch(max(recorded_at)) - min(epoch(recorded_at) - total_time_seconds)
               FROM task_results WHERE run_id = ?""",
            [run_id],
        ).fetchone()[0]
    work = sum(r[0] for r in rows)
    slept = sum(r[1] for r in rows) * latency
    return PoolResult(
        pool=pool,
        tasks=tasks,
        attempts=len(rows),
        wall=wall,
        work=work,
        successes=successes,
        mean_task=work / len(rows),
        mean_task_without_latency=(work - slept) / len(rows),
        outside_span=wall - span,
        unsolved=unsolved,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", default="4,16", help="comma-separated pool sizes (default 4,16)")
    parser.add_argument("--tasks", type=int, default=154, help="number of tasks in the suite (default 154)")
    parser.add_argument(
        "--step-latency", type=float, default=3.0,
        help="simulated latency after each action, in s (default 3, WAA's own pause after an action)"
    )
    parser.add_argument(
        "--fresh-db", action="store_true", help="a new DuckDB file per run (no duration history to order tasks by)"
    )
    args = parser.parse_args()
    print(conditions(), flush=True)
    pools = [int(p) for p in args.pools.split(",") if p.strip()]
    if not pools or min(pools) < 1 or args.tasks < 1 or args.step_latency < 0:
        parser.error("pool sizes and --tasks must be positive, --step-latency non-negative")

    cores = os.cpu_count() or 1
    results: list[PoolResult] = []
    with tempfile.TemporaryDirectory(prefix="waa-scaling-") as tmp_name:
        tmp = Path(tmp_name)
        suite = tmp / "suite"
        ids = build_suite(suite, args.tasks)
        print(
            f"suite: {len(ids)} tasks (the 16 bundled tasks repeated under new ids), scripted agent, "
            f"local simulation VMs, simulated step latency {args.step_latency:g} s, pools {pools}, "
            f"{cores} CPU cores, "
            + ("a fresh DuckDB per run" if args.fresh_db else "one DuckDB for all runs (later runs order tasks longest first)")
        )
        for index, pool in enumerate(pools):
            # Each run in a fresh interpreter: Prefect's process-wide services (the events
            # worker) would otherwise keep retrying the previous run's stopped test server.
            with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as child:
                result = child.submit(run_pool, suite, tmp, index, pool, args.step_latency, args.fresh_db).result()
            results.append(result)
            print(f"  pool {pool:>2}: done in {result.wall:.1f} s", flush=True)
        shutil.rmtree(suite, ignore_errors=True)

    base = next((r for r in results if r.pool == 1), None)
    header = (
        f"{'pool':>4} {'wall s':>8} {'tasks/min':>9} {'work s':>8} {'ideal s':>8} {'effic.':>7} "
        f"{'success':>9} {'mean task s':>11} {'minus latency':>13} {'outside span s':>14}"
        + (f" {'speedup vs 1':>12}" if base else "")
    )
    print()
    print(header)
    for r in results:
        line = (
            f"{r.pool:>4} {r.wall:>8.1f} {r.throughput:>9.1f} {r.work:>8.1f} {r.ideal:>8.1f} "
            f"{r.efficiency:>7.1%} {f'{r.successes}/{r.tasks}':>9} {r.mean_task:>11.3f} "
            f"{r.mean_task_without_latency:>13.3f} {r.outside_span:>14.1f}"
        )
        if base:
            speedup = base.wall / r.wall
            line += f" {f'{speedup:.2f}x ({speedup / r.pool:.0%})':>12}"
        print(line)
        for line in r.unsolved:
            print(f"      not solved: {line}")
        if r.attempts != r.tasks:
            print(f"      ({r.attempts} attempts for {r.tasks} tasks: infrastructure errors were retried)")
    print()
    print(
        "efficiency = ideal / wall, ideal = total work / pool: the share of the pool's VM time spent "
        "inside tasks (orchestration, provisioning and idle lanes are the rest)."
    )
    print(
        "mean task s = mean total_time_seconds per attempt; 'minus latency' removes the simulated "
        "latency slept; 'outside span' = wall - (first task start to last task end)."
    )
    if base:
        print("speedup vs 1 = wall at pool 1 / wall at this pool (in brackets: speedup / pool).")
    biggest = max(pools)
    print(
        f"note: this machine has {cores} CPU cores; at pool {biggest}, {biggest} simulation processes share them "
        "(with the Prefect server and this process), so CPU contention, not orchestration, may dominate "
        "there. If the mean per-task time grows with the pool, that is contention inside the environments."
    )
    if len(results) > 1:
        first, last = results[0], results[-1]
        growth = last.mean_task / first.mean_task - 1
        print(
            f"mean per-task time from pool {first.pool} to pool {last.pool}: {first.mean_task:.3f} s -> "
            f"{last.mean_task:.3f} s ({growth:+.0%}); without the latency: "
            f"{first.mean_task_without_latency:.3f} s -> {last.mean_task_without_latency:.3f} s."
        )
    at_target = next((r for r in results if r.pool == TARGET_POOL), None)
    if at_target is None:
        print(f"target (>= {TARGET_EFFICIENCY:.0%} scaling efficiency at pool {TARGET_POOL}): not measured (pool {TARGET_POOL} not run)")
    else:
        met = at_target.efficiency >= TARGET_EFFICIENCY
        print(
            f"target (>= {TARGET_EFFICIENCY:.0%} scaling efficiency at pool {TARGET_POOL}, {at_target.tasks} tasks): "
            f"{'MET' if met else 'NOT MET'} ({at_target.efficiency:.1%})"
        )


if __name__ == "__main__":
    main()
