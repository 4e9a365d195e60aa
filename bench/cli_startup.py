"""Start-up of the `arena` command: `arena --help` and every sub-command's `--help`, wall time
of the whole process (Python's start-up included) and the number of modules it loads.

Each figure is the median of `--runs` processes, next to a bare `python -c pass` for the
floor. It prints numbers; it asserts nothing (target: under 0.4 s for `arena --help` and for
every command that runs no flow; the import set itself is guarded by
tests/flows/test_cli_startup.py).

    python bench/cli_startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARENA = Path(sys.executable).with_name("arena")
# Prints how many modules the command loaded, then exits as the command would.
_COUNT = ("import atexit, sys; atexit.register(lambda: print('MODULES', len(sys.modules), file=sys.stderr)); "
          "sys.argv = ['arena', *sys.argv[1:]]; from flows.cli import main; sys.exit(main())")


def _median_seconds(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, cwd=ROOT, capture_output=True, timeout=120)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _modules(args: list[str]) -> int:
    done = subprocess.run([sys.executable, "-c", _COUNT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    line = next(line for line in done.stderr.splitlines() if line.startswith("MODULES "))
    return int(line.split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="processes per figure (the median is printed)")
    args = parser.parse_args()

    from flows.cli import build_parser
    from flows.cli.common import subcommands

    def leaves(p: argparse.ArgumentParser, path: list[str]) -> list[list[str]]:
        nested = subcommands(p)
        return [leaf for name, sub in nested.items() for leaf in leaves(sub, [*path, name])] if nested else [path]

    print(f"python -c pass: {_median_seconds([sys.executable, '-c', 'pass'], args.runs):.3f} s (the floor)")
    print(f"{'command':<34} {'wall s':>7} {'modules':>8}")
    for path in [[], *leaves(build_parser(), [])]:
        argv = [*path, "--help"]
        seconds = _median_seconds([str(ARENA), *argv], args.runs)
        print(f"{'arena ' + ' '.join(argv):<34} {seconds:>7.3f} {_modules(argv):>8}")


if __name__ == "__main__":
    main()
