"""bench/run_all.py, the by-hand runner of the benchmarks: each in its own process with the sizes
it was told, its time, and an exit status that says whether one of them failed to run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_ALL = ROOT / "bench" / "run_all.py"


def _run_all(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(RUN_ALL), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_the_chosen_benchmark_runs_at_the_smaller_sizes_and_prints_its_time() -> None:
    done = _run_all("--only", "sim_render")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.startswith("conditions: ")
    assert "--- sim_render (" in done.stdout and "sim_render.py --frames 20)" in done.stdout
    assert "--- sim_render: " in done.stdout and "FAILED" not in done.stdout
    # Only the one asked for ran.
    assert "--- cli_startup" not in done.stdout and "--- default_run" not in done.stdout


def test_every_quick_size_is_an_option_its_benchmark_accepts() -> None:
    from bench.run_all import QUICK_ARGS

    for name, quick in QUICK_ARGS.items():
        shown = subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), "--help"], cwd=ROOT,
                               capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, (name, shown.stderr[-2000:])
        for option in (arg for arg in quick if arg.startswith("--")):
            assert option in shown.stdout, f"bench/{name}.py has no option {option}"


def test_an_unknown_benchmark_is_refused_with_the_names() -> None:
    done = _run_all("--only", "nosuch")
    assert done.returncode == 2
    assert "invalid choice: 'nosuch'" in done.stderr and "default_run" in done.stderr
    assert "---" not in done.stdout
