"""Wall time of the default `arena run` (the bundled suite on the local simulation), cold and warm.

Cold: a fresh Prefect home, so the run starts the local Prefect server (and migrates its
database) before anything else. Warm: the same home again while that server is still up (it
stays `ARENA_LOCAL_SERVER_IDLE_SECONDS` after a run, default 300 s), as when a user runs again
or several runs follow each other. Each run is the real CLI in its own process, in a temporary
working directory; the time includes Python start-up, the run, the summary and the HTML report.
Its floor, what no orchestration can go below: starting Python with the modules a run imports
(and exiting as `arena` does, without Python's final garbage collection),
plus the environment and agent work of the last warm run (reset, setup, episode and evaluation
times stored per attempt) spread perfectly over the 4 VMs. It prints numbers; it asserts nothing
(targets: warm under 15 s, and within 1.5x the floor).

    python bench/default_run.py [--warm-runs 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.conditions import conditions  # noqa: E402 - after the path is set

from flows.local_server import stop_server  # noqa: E402

ARENA = Path(sys.executable).with_name("arena")


def timed_run(workdir: Path, prefect_home: Path) -> tuple[float, int]:
    """Seconds and exit status of one default `arena run` in `workdir`."""
    env = {**os.environ, "PREFECT_HOME": str(prefect_home)}
    env.pop("PREFECT_API_URL", None)  # the local server, as a user without configuration has
    started = time.monotonic()
    done = subprocess.run([str(ARENA), "run"], cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    return time.monotonic() - started, done.returncode


def _import_seconds() -> float:
    """Starting Python and importing what `arena run` imports (the best of three)."""
    times = []
    for _ in range(3):
        started = time.monotonic()
        # Exiting as `arena` does (flows/cli/__init__.py: no final garbage collection).
        subprocess.run([sys.executable, "-c", "import flows.cli.run, flows.evaluate_suite, adapters.results.report_html; "
                        "import atexit, gc; atexit.register(gc.freeze)"],
                       cwd=Path(__file__).resolve().parents[1], check=True)
        times.append(time.monotonic() - started)
    return min(times)


def _work_per_vm(db: Path, pool: int) -> float:
    """The last run's environment and agent work, spread evenly over `pool` VMs."""
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        (work,) = con.execute(
            "SELECT sum(coalesce(reset_seconds, 0) + coalesce(setup_seconds, 0) + coalesce(agent_seconds, 0) "
            "+ coalesce(env_seconds, 0) + coalesce(evaluate_seconds, 0)) FROM task_results "
            "WHERE run_id = (SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1)").fetchone()
    return float(work or 0.0) / pool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-runs", type=int, default=2)
    args = parser.parse_args()
    print(conditions(), flush=True)
    root = Path(tempfile.mkdtemp(prefix="arena-bench-run-"))
    home = root / "prefect-home"
    try:
        cold, rc = timed_run(root, home)
        print(f"cold default run (fresh Prefect home, server start included): {cold:.1f} s (exit {rc})", flush=True)
        warm = []
        for _ in range(args.warm_runs):
            seconds, rc = timed_run(root, home)
            warm.append(seconds)
            print(f"warm default run (local server already up): {seconds:.1f} s (exit {rc})", flush=True)
        best = min(warm) if warm else float("nan")
        print(f"target: warm run under 15 s -> {'MET' if best < 15 else 'NOT MET'} (best warm {best:.1f} s)")
        imports, work = _import_seconds(), _work_per_vm(root / "results" / "arena.duckdb", pool=4)
        floor = imports + work
        print(f"floor: {floor:.1f} s (Python with a run's imports {imports:.1f} s + environment and agent work "
              f"per VM {work:.1f} s); best warm / floor = {best / floor:.2f} -> "
              f"{'MET' if best <= 1.5 * floor else 'NOT MET'} (target 1.5)")
    finally:
        stop_server(home)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
