"""Every benchmark in turn, each in its own process, with the seconds each took.

By default at smaller sizes than each bench's own defaults (fewer steps, resets, repaint delays,
runs; the target pool size alone): 3-4 minutes on this project's 2-core machine.
`--full` runs each at its own defaults, as docs/benchmarks.md's figures were measured. The
benchmarks print numbers and assert nothing; this exits 1 when one of them failed to run.

They are run by hand, not by `.ci/run`: CI keeps its output only when it fails, and the
benchmarks never fail it, so there they cost minutes of every CI run and showed nobody anything.

    python bench/run_all.py [--full] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.conditions import conditions  # noqa: E402 - after the path is set

BENCH = Path(__file__).resolve().parent

# Each benchmark with its smaller sizes. By themselves only: scaling.py runs for long at any size,
# suite_cpu.py runs the whole test suite.
QUICK_ARGS: dict[str, list[str]] = {
    "orchestration_overhead": ["--repeats", "2"],
    "results_queries": [],
    "pool_efficiency": ["--pools", "40"],
    "step_latency": ["--steps", "2", "--typing-steps", "2", "--repaint-delays", "3"],
    "default_run": ["--warm-runs", "2"],
    "export_stream": ["--sizes", "1000", "3000"],
    "vm_reset": ["--keep-ready", "--resets", "5", "--reboots", "1"],
    "cli_startup": ["--runs", "3"],
    "adaptive_trials": ["--runs", "20"],
    "sim_render": ["--frames", "20"],
    "prefect_workarounds": ["--runs", "2"],
}


def build_parser() -> argparse.ArgumentParser:
    """The runner's options (the docs' option check reads them too: tests/test_readme_cli.py)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="each benchmark at its own default sizes")
    parser.add_argument("--only", nargs="+", choices=sorted(QUICK_ARGS), metavar="NAME",
                        help=f"these benchmarks only (of: {', '.join(QUICK_ARGS)})")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    print(conditions(), flush=True)
    failed: list[str] = []
    started = time.monotonic()
    for name, quick in QUICK_ARGS.items():
        if args.only and name not in args.only:
            continue
        command = [sys.executable, str(BENCH / f"{name}.py"), *([] if args.full else quick)]
        print(f"\n--- {name} ({' '.join(command[1:])})", flush=True)
        begun = time.monotonic()
        try:
            code = subprocess.run(command, check=False).returncode
        except KeyboardInterrupt:  # Ctrl-C reached the benchmark too, which has stopped
            print(f"\n--- {name}: interrupted; the benchmarks after it did not run", flush=True)
            return 130
        print(f"--- {name}: {time.monotonic() - begun:.0f} s" + (f", FAILED (exit {code})" if code else ""), flush=True)
        if code:
            failed.append(name)
    print(f"\nbenchmarks: {time.monotonic() - started:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
