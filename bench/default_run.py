"""Wall time of the default `arena run` (the bundled suite on the local simulation), cold and warm.

Cold: a fresh Prefect home, so the run starts the local Prefect server (and migrates its
database) before anything else. Warm: the same home again while that server is still up (it
stays `ARENA_LOCAL_SERVER_IDLE_SECONDS` after a run, default 300 s), as when a user runs again
or several runs follow each other. Restarted: once more after that server stopped, as a
session's first run usually is (the server starts, its database already migrated). Each run is
the real CLI in its own process, in a temporary working directory; the time includes Python
start-up, the run, the summary and the HTML report.
Its floor, what no orchestration can go below: starting Python with the modules a run imports
(and exiting as `arena` does, without Python's final garbage collection),
plus the environment and agent work of the last warm run (reset, setup, episode and evaluation
times stored per attempt) spread perfectly over the 4 VMs. It prints numbers; it asserts nothing
(targets: warm under 15 s, and within 1.5x the floor).

Each warm run's CPU is printed by process (bench/process_cpu.py): the controller (`arena run`
itself), the local Prefect server and the simulated VMs. Divided by the cores, it is a second
floor, this machine's: where a run keeps every core busy, only less CPU makes it shorter.

    python bench/default_run.py [--warm-runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.conditions import conditions, cores, spread  # noqa: E402 - after the path is set
from bench.process_cpu import CpuUse, run_measured  # noqa: E402

from adapters.waa.localenv.forkserver import TITLE as FORK_SERVER_TITLE  # noqa: E402
from flows.local_server import server_pid, stop_server  # noqa: E402

ARENA = Path(sys.executable).with_name("arena")


def timed_run(workdir: Path, prefect_home: Path) -> tuple[float, int, CpuUse]:
    """Seconds, exit status and CPU by process of one default `arena run` in `workdir`."""
    env = {**os.environ, "PREFECT_HOME": str(prefect_home)}
    env.pop("PREFECT_API_URL", None)  # the local server, as a user without configuration has
    pid = server_pid(prefect_home)  # a warm run's server, outside the run's own processes
    return run_measured([str(ARENA), "run"], role="controller", role_of=_role,
                        watched={"Prefect server": pid} if pid is not None else {}, cwd=workdir, env=env, timeout=900)


def _role(cmdline: Sequence[str]) -> str:
    if "adapters.waa.localenv" in cmdline or " ".join(cmdline).startswith(FORK_SERVER_TITLE):
        return "simulated VMs"  # the simulations and the fork server they are forked from
    if any("local_server" in part for part in cmdline):
        return "Prefect server"  # a cold run's: it starts the shared server itself
    return "other"


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
    parser.add_argument("--warm-runs", type=int, default=3)
    args = parser.parse_args()
    print(conditions(), flush=True)
    root = Path(tempfile.mkdtemp(prefix="arena-bench-run-"))
    home = root / "prefect-home"
    try:
        cold, rc, _ = timed_run(root, home)
        print(f"cold default run (fresh Prefect home, server start included): {cold:.1f} s (exit {rc})", flush=True)
        warm: list[tuple[float, CpuUse]] = []
        for _ in range(args.warm_runs):
            seconds, rc, cpu = timed_run(root, home)
            warm.append((seconds, cpu))
            print(f"warm default run (local server already up): {seconds:.1f} s (exit {rc}); "
                  f"{cpu.describe(cores())}", flush=True)
        # The usual first run of a session: the server stopped once idle, its home is migrated.
        stop_server(home)
        restarted, rc, _ = timed_run(root, home)
        print(f"restarted default run (the server had stopped, its database migrated): {restarted:.1f} s "
              f"(exit {rc})", flush=True)
        walls = [seconds for seconds, _ in warm]
        best = min(walls) if walls else float("nan")
        middle = statistics.median(walls) if walls else float("nan")
        if walls:
            print(f"warm runs: {spread(walls, digits=1)}")
        print(f"target: warm run under 15 s -> {'MET' if best < 15 else 'NOT MET'} (best warm {best:.1f} s)")
        imports, work = _import_seconds(), _work_per_vm(root / "results" / "arena.duckdb", pool=4)
        floor = imports + work
        print(f"floor: {floor:.1f} s (Python with a run's imports {imports:.1f} s + environment and agent work "
              f"per VM {work:.1f} s, of the last warm run); best warm / floor = {best / floor:.2f} -> "
              f"{'MET' if best <= 1.5 * floor else 'NOT MET'} (target 1.5); median warm / floor = {middle / floor:.2f}")
        if warm:
            cpu_floors = [cpu.total / cores() for _, cpu in warm]
            lowest = min(cpu_floors)
            print(f"this machine's floor (a warm run's CPU / {cores()} cores): {spread(cpu_floors, digits=1)}; the "
                  f"lowest is {lowest / floor:.2f}x the floor above, so a warm run within 1.5x of it is "
                  f"{'possible' if lowest < 1.5 * floor else 'impossible here'} with this much CPU")
    finally:
        stop_server(home)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
