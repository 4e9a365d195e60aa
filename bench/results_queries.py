"""Result queries on a large results database (target: each < 200 ms).

Builds, in a temporary directory, a DuckDB file with the real schema (created by `ResultStore`)
and fills it with synthetic data through DuckDB's own generators (`range()` and `hash()`;
row-by-row inserts would take hours):
- 625 runs of 25 models (agents scripted, random, openai, anthropic, claude, demo, ...) on a
  150-task suite in 12 WAA domains, started an hour apart;
- 100,000 task results: every (run, task) has attempt 1, and one in 15 of them failed on
  infrastructure and has attempt 2. Final outcomes follow each model's skill and each domain's
  difficulty: success, agent_failure, timeout, setup_failure, evaluation_error and a few
  infrastructure errors left after the retry;
- 2,000,000 steps (5 to 35 per attempt, 20 on average) with JSON actions and screenshot paths.
It then times, 5 times after one warm-up run, through the code the product uses:
  (a) success rate by model and domain over latest_task_results (SQL as in the README),
  (b) a two-run comparison, `compare_stored_runs` (per-domain deltas with intervals, flips,
      the McNemar verdict), from an open `ResultStore` and from the file's path,
  (c) the steps of one task, `ResultStore.steps`,
and prints each one's best and median time, the best against the 200 ms target (MET / NOT MET),
and the generation time. With --postgres it copies the same data into a PostgreSQL team store
(`arena store migrate`) and prints its times beside the embedded store's.
It prints numbers; it asserts nothing.

    python bench/results_queries.py [--keep DIR] [--postgres URL|local]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.conditions import conditions  # noqa: E402 - after the path is set

TARGET_MS = 200.0
REPEATS = 5
RUNS = 625
MODELS = 25
TASKS = 150
RETRY_EVERY = 15  # one (run, task) pair in 15 is retried after an infrastructure error
DOMAINS = [
    "chrome", "clock", "file_explorer", "libreoffice_calc", "libreoffice_writer", "microsoft_paint",
    "msedge", "notepad", "settings", "vlc", "vs_code", "windows_calc",
]
AGENTS = ["openai", "anthropic", "claude", "demo", "http", "scripted", "random"]

# A uniform number in [0, 1) from a hash of the given SQL expressions: deterministic, unlike
# random() under DuckDB's parallel execution, so every build of the file is the same.
_UNIFORM = "(hash({}) % 1000003) / 1000003.0"

SUCCESS_BY_MODEL_AND_DOMAIN = """
SELECT coalesce(r.model_id, r.agent) AS model, t.domain,
       count(*) AS tasks, round(100 * avg(t.success::INT), 1) AS success_pct
FROM latest_task_results t JOIN runs r USING (run_id)
GROUP BY ALL
ORDER BY ALL
"""


def _generate(db: Path) -> dict[str, float]:
    """Create the schema with ResultStore, then fill it; returns seconds per table."""
    import duckdb

    from adapters.store.duckdb_store import ResultStore

    ResultStore(db).close()
    seconds: dict[str, float] = {}
    domain_list = "[" + ", ".join(f"'{d}'" for d in DOMAINS) + "]"
    with duckdb.connect(str(db)) as con:
        started = time.perf_counter()
        con.execute(
            f"""
            INSERT INTO runs (run_id, started_at, finished_at, status, agent, agent_config, model_id,
                              suite, suite_hash, task_count, pool_size, provider, reset_level,
                              code_revision, environment)
            SELECT printf('run-%04d', i),
                   TIMESTAMP '2025-01-01' + to_hours(i),
                   TIMESTAMP '2025-01-01' + to_hours(i) + to_minutes(40),
                   'completed',
                   {_agents_sql()}[i % {MODELS} % {len(AGENTS)} + 1],
                   json_object('temperature', 0.0, 'max_tokens', 1024),
                   CASE WHEN i % {MODELS} % {len(AGENTS)} + 1 IN (6, 7) THEN NULL
                        ELSE printf('org/model-%02d', i % {MODELS}) END,
                   'waa/test_all', 'suite-hash-1', {TASKS}, 8, 'azure', 'snapshot', 'bench', 'waa-image-1'
            FROM range({RUNS}) AS r(i)
            """
        )
        seconds["runs"] = time.perf_counter() - started

        started = time.perf_counter()
        skill = _UNIFORM.format("m, 'skill'")
        difficulty = _UNIFORM.format("d, 'difficulty'")
        draw = _UNIFORM.format("pair, attempt, 'outcome'")
        kind = _UNIFORM.format("pair, attempt, 'kind'")
        con.execute(
            f"""
            INSERT INTO task_results (run_id, task_id, domain, attempt, outcome, success, score,
                                      infeasible, num_steps, error, reason, total_time_seconds,
                                      reset_seconds, setup_seconds, episode_seconds, evaluate_seconds,
                                      agent_seconds, env_seconds, vm_seconds, vm_id, recorded_at,
                                      timings, model_calls, input_tokens, output_tokens, cost_usd,
                                      agent_details)
            WITH pairs AS (
                SELECT r * {TASKS} + t AS pair, r, t, r % {MODELS} AS m, t % {len(DOMAINS)} AS d
                FROM range({RUNS}) AS runs_(r), range({TASKS}) AS tasks_(t)
            ),
            attempts AS (
                SELECT *, 1 AS attempt FROM pairs
                UNION ALL
                SELECT *, 2 AS attempt FROM pairs WHERE pair % {RETRY_EVERY} = 7
            ),
            drawn AS (
                SELECT *,
                       row_number() OVER (ORDER BY pair, attempt) - 1 AS n,
                       CASE
                           WHEN attempt = 1 AND pair % {RETRY_EVERY} = 7 THEN 'infrastructure_error'
                           -- success probability: model skill (5-75 %) times domain ease (0.4-1.0)
                           WHEN {draw} < (0.05 + 0.7 * {skill}) * (0.4 + 0.6 * {difficulty}) THEN 'success'
                           WHEN {kind} < 0.75 THEN 'agent_failure'
                           WHEN {kind} < 0.85 THEN 'timeout'
                           WHEN {kind} < 0.92 THEN 'setup_failure'
                           WHEN {kind} < 0.96 THEN 'evaluation_error'
                           ELSE 'infrastructure_error'
                       END AS outcome
                FROM attempts
            )
            SELECT printf('run-%04d', r),
                   printf('task-%03d', t),
                   {domain_list}[d + 1],
                   attempt,
                   outcome,
                   outcome = 'success',
                   CASE WHEN outcome = 'success' THEN 1.0 ELSE 0.0 END,
                   t % 13 = 0,
                   -- 20 +/- k steps, alternating, so the total is exactly 20 per attempt
                   CASE WHEN n % 2 = 0 THEN 20 + (n // 2) % 16 ELSE 20 - (n // 2) % 16 END,
                   CASE WHEN outcome NOT IN ('success', 'agent_failure') THEN 'synthetic ' || outcome END,
                   'synthetic result',
                   60 + pair % 240, 5.0, 3.0, 45 + pair % 200, 2.0, 30.0, 15 + pair % 170,
                   90 + pair % 260,
                   printf('vm-%02d', pair % 8),
                   TIMESTAMP '2025-01-01' + to_hours(r) + to_seconds(t * 10 + attempt),
                   json_object('reset_seconds', 5.0, 'setup_seconds', 3.0),
                   20, 20 * 3000, 20 * 150, 0.02,
                   json_object('demo_id', printf('demo-%02d', t % 40))
            FROM drawn
            ORDER BY r, t, attempt
            """
        )
        seconds["task_results"] = time.perf_counter() - started

        started = time.perf_counter()
        con.execute(
            """
            INSERT INTO steps (run_id, task_id, attempt, step_index, action_type, action,
                               screenshot_path, window_title, agent_seconds, env_seconds, error,
                               model_calls, input_tokens, output_tokens, cost_usd)
            SELECT run_id, task_id, attempt, step_index,
                   ['click', 'type', 'key', 'scroll', 'double_click'][step_index % 5 + 1],
                   json_object('type', ['click', 'type', 'key', 'scroll', 'double_click'][step_index % 5 + 1],
                               'x', 100 + step_index, 'y', 200 + step_index, 'text', NULL),
                   printf('artifacts/%s/%s/attempt-%d/step_%03d.png', run_id, task_id, attempt, step_index),
                   'Untitled - Notepad',
                   1.5, 0.8, NULL, 1, 3000, 150, 0.001
            FROM (SELECT run_id, task_id, attempt, unnest(range(num_steps)) AS step_index FROM task_results)
            ORDER BY run_id, task_id, attempt, step_index
            """
        )
        seconds["steps"] = time.perf_counter() - started
        con.execute("CHECKPOINT")
    return seconds


def _agents_sql() -> str:
    return "[" + ", ".join(f"'{a}'" for a in AGENTS) + "]"


@dataclass(frozen=True)
class Timing:
    """REPEATS wall times of one query, in ms."""

    best: float
    median: float

    def text(self) -> str:
        return f"best {self.best:.1f} / med {self.median:.1f}"


def _timed_ms(fn: Callable[[], Any]) -> tuple[Timing, Any]:
    """REPEATS wall times of `fn` in ms after one warm-up call, and the last result."""
    result = fn()
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - started) * 1000)
    return Timing(min(times), statistics.median(times)), result


# The same query in PostgreSQL's dialect (GROUP BY ALL is DuckDB's), for the team store.
SUCCESS_BY_MODEL_AND_DOMAIN_PG = """
SELECT coalesce(r.model_id, r.agent) AS model, t.domain,
       count(*) AS tasks, round(100 * avg(t.success::INT), 1) AS success_pct
FROM latest_task_results t JOIN runs r USING (run_id)
GROUP BY 1, 2
ORDER BY 1, 2
"""

BASE_RUN, NEW_RUN, TASK = "run-0600", "run-0601", "task-042"


def _measure(source: Any, run_sql: Callable[[], list[Any]]) -> list[tuple[str, Timing, str]]:
    """(a), (b) and (c) on one store: `source` is the DuckDB file's path or the team store's URL."""
    from adapters.results.compare import compare_stored_runs
    from adapters.store.duckdb_store import ResultStore

    measurements: list[tuple[str, Timing, str]] = []
    timing, rows = _timed_ms(run_sql)
    measurements.append(("(a) success rate by model and domain (SQL)", timing, f"{len(rows)} rows"))
    timing, comparison = _timed_ms(lambda: compare_stored_runs(source, BASE_RUN, NEW_RUN))
    measurements.append((
        "(b) compare two runs, compare_stored_runs(location)",
        timing,
        f"{comparison.test.paired_tasks} paired, {comparison.test.fixed} fixed, "
        f"{comparison.test.broken} broken, p = {comparison.p_value:.3g}: {comparison.verdict}",
    ))
    with ResultStore(source) as store:
        timing, comparison = _timed_ms(lambda: compare_stored_runs(store, BASE_RUN, NEW_RUN))
        measurements.append(("(b) compare two runs, compare_stored_runs(store)", timing,
                             f"{len(comparison.domains) - 1} domains"))
        timing, steps = _timed_ms(lambda: store.steps(NEW_RUN, TASK))
        measurements.append(("(c) steps of one task, ResultStore.steps", timing, f"{len(steps)} steps"))
    return measurements


def _team_store(url: str, db: Path) -> tuple[list[tuple[str, Timing, str]], float]:
    """The same data copied into the team store (`arena store migrate`), then measured."""
    from adapters.store.duckdb_store import ResultStore
    from adapters.store.migrate import migrate
    from adapters.store.postgres import read_only_query

    started = time.perf_counter()
    with ResultStore(url) as store:
        report = migrate(db, store)
    seconds = time.perf_counter() - started
    print(f"team store: copied {len(report.copied)} runs, {report.results:,} results, {report.steps:,} steps "
          f"in {seconds:.1f} s (arena store migrate)")

    def run_sql() -> list[Any]:
        answer = read_only_query(url, SUCCESS_BY_MODEL_AND_DOMAIN_PG)
        return answer[1] if answer else []

    return _measure(url, run_sql), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build the database in this directory and keep it")
    parser.add_argument(
        "--postgres", metavar="URL",
        help="also measure the team store: an empty PostgreSQL database's URL, or 'local' to start a "
             "throwaway server with this machine's PostgreSQL (tests/pg_server.py)",
    )
    args = parser.parse_args()
    print(conditions(), flush=True)

    import contextlib

    import duckdb

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        directory = args.keep or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        db = directory / "bench.duckdb"
        db.unlink(missing_ok=True)
        started = time.perf_counter()
        parts = _generate(db)
        generation = time.perf_counter() - started
        with duckdb.connect(str(db), read_only=True) as con:
            counts = {
                table: con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
                for table in ("runs", "task_results", "steps", "latest_task_results")
            }
            outcomes = con.execute(
                "SELECT outcome, count(*) FROM latest_task_results GROUP BY ALL ORDER BY 2 DESC"
            ).fetchall()
        size_mb = db.stat().st_size / 1e6
        print(f"generated {db.name} ({size_mb:.0f} MB) in {generation:.1f} s "
              f"(runs {parts['runs']:.2f} s, task_results {parts['task_results']:.2f} s, steps {parts['steps']:.2f} s)")
        print("rows: " + ", ".join(f"{table} {n:,}" for table, n in counts.items()))
        total_final = sum(n for _, n in outcomes)
        print("final outcomes: " + ", ".join(f"{o} {100 * n / total_final:.1f}%" for o, n in outcomes))
        print()

        def run_sql() -> list[Any]:
            with duckdb.connect(str(db), read_only=True) as con:
                return con.execute(SUCCESS_BY_MODEL_AND_DOMAIN).fetchall()

        embedded = _measure(db, run_sql)
        team: list[tuple[str, Timing, str]] | None = None
        if args.postgres:
            url = args.postgres
            if url == "local":
                sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
                from pg_server import running_postgres

                url = stack.enter_context(running_postgres())
            team, _ = _team_store(url, db)

    width = max(len(name) for name, _, _ in embedded)
    column = 22  # "best 123.4 / med 123.4"
    header = f"{'query':<{width}}  {'embedded ms':>{column}}"
    if team is not None:
        header += f"  {'team store ms':>{column}}"
    print(f"{header}  target {TARGET_MS:.0f} ms (best of {REPEATS})")
    for k, (name, timing, detail) in enumerate(embedded):
        line = f"{name:<{width}}  {timing.text():>{column}}"
        worst = timing.best
        if team is not None:
            line += f"  {team[k][1].text():>{column}}"
            worst = max(worst, team[k][1].best)
        print(f"{line}  {'MET' if worst < TARGET_MS else 'NOT MET':<8} ({detail})")
    if args.postgres is None:
        print("(the team store: add --postgres URL, or --postgres local with PostgreSQL installed)")


if __name__ == "__main__":
    main()
