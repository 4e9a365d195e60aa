"""Wall time of the default `arena run` (the bundled suite on the local simulation), cold and warm.

Cold: a fresh Prefect home, so the run starts the local Prefect server (and migrates its
database) before anything else. Warm: the same home again while that server is still up (it
stays `ARENA_LOCAL_SERVER_IDLE_SECONDS` after a run, default 300 s), as when a user runs again
or several runs follow each other. Each run is the real CLI in its own process, in a temporary
working directory; the time includes Python start-up, the run, the summary and the HTML report.
It prints numbers; it asserts nothing (target: warm under 15 s).

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
    finally:
        stop_server(home)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
