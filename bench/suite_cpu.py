"""Where the test suite's CPU goes: the README's test command (or a part of it), timed, with the
CPU of every process it starts by kind, and how busy the machine's cores were meanwhile.

On this project's 2-core machine the whole suite is CPU-bound (its tests start some hundreds of
Python processes: Prefect servers, simulated VMs, `arena` commands), so its wall time is about
its CPU over the cores: only less CPU, or more cores, makes CI shorter. This shows which kinds of
process that CPU went to, so a cut can be aimed; the numbers of 2026-11-29 are in
docs/benchmarks.md. It runs the tests once (the whole suite: about 10-11 minutes here), so
`bench/run_all.py` leaves it out; run it by hand:

    python bench/suite_cpu.py                          # the whole suite, as .ci/run runs it
    python bench/suite_cpu.py -- -m "not scenario and not servers"   # pytest's own arguments

Processes that detach themselves (the local Prefect server `arena run` starts) count too; so
would anything else started on the machine meanwhile, which is why the machine's busy time is
printed beside them.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.conditions import conditions, cores  # noqa: E402 - after the path is set
from bench.process_cpu import run_measured  # noqa: E402

from adapters.waa.localenv.forkserver import TITLE as FORK_SERVER_TITLE  # noqa: E402

# Kinds of process, by a part of their command line, first match wins.
KINDS: tuple[tuple[str, str], ...] = (
    ("flows.local_server_app", "Prefect server (the local server's app)"),
    ("flows.local_server", "local server supervisor"),
    ("adapters.waa.localenv", "simulated VMs (WAA simulation)"),
    (FORK_SERVER_TITLE, "simulated VMs (WAA simulation)"),  # what they are forked from
    ("adapters.waa.evaluate_server", "evaluate server"),
    ("flows.cli run", "arena run"),
    ("flows.cli", "other arena commands"),
    ("prefect server start", "Prefect server (prefect server start)"),
    ("prefect worker", "Prefect workers and their flow runs"),
    ("prefect.engine", "Prefect workers and their flow runs"),
    ("prefect.runner", "served flow runs (deployments)"),
    ("deployments.serve", "served flow runs (deployments)"),
    ("qemu-system", "QEMU VMs"),
    ("postgres", "PostgreSQL"),
    ("chromium", "Chromium"),
    ("exec(eval(", "pytest workers (tests run in-process)"),
    ("[pytest-xdist ", "pytest workers (tests run in-process)"),  # as xdist names them (setproctitle)
)


def kind_of(cmdline: Sequence[str]) -> str:
    """The kind of a process, from its command line."""
    text = " ".join(cmdline)
    for part, kind in KINDS:
        if part in text:
            return kind
    if any(Path(word).name.startswith("python") for word in cmdline[:1]):
        return "other Python processes"
    return "other programs"


def _busy_seconds() -> float:
    """CPU seconds all cores of the machine have spent busy since boot (anything but idle)."""
    times = psutil.cpu_times()
    # Linux counts a guest's time in user and nice as well: left out here so it counts once.
    not_busy = ("idle", "iowait", "guest", "guest_nice")
    return sum(times) - sum(getattr(times, name, 0.0) for name in not_busy)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pytest_args", nargs="*", metavar="PYTEST_ARG",
                        help="pytest's own arguments, after `--` (default: the whole suite, as configured)")
    args = parser.parse_args(argv)
    print(conditions(), flush=True)
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as .ci/run: the tests' processes use bytecode caches
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args.pytest_args]
    log = Path(tempfile.mkdtemp(prefix="arena-suite-cpu-")) / "pytest.log"
    print(f"running: {' '.join(command[1:])} (its output: {log})", flush=True)
    busy_before = _busy_seconds()
    try:
        wall, status, cpu = run_measured(command, role="pytest", role_of=kind_of, watched={}, cwd=ROOT, env=env,
                                         timeout=3600, detached=True, sample_seconds=0.25, output=log)
    except KeyboardInterrupt:
        print(f"interrupted: pytest has stopped, nothing was measured; its output so far: {log}")
        return 130
    busy = _busy_seconds() - busy_before
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    print(f"pytest: exit {status}, {wall:.0f} s; {lines[-1].strip('= ') if lines else 'no output'}")
    count = cores()
    capacity = wall * count  # CPU seconds the cores could give over the run
    print(f"CPU of its processes: {cpu.total:.0f} s, {cpu.total / capacity:.0%} of {count} cores "
          f"over {wall:.0f} s (so at least {cpu.total / count:.0f} s of wall on them)")
    print(f"the machine's cores were busy {busy:.0f} s of {capacity:.0f} s ({busy / capacity:.0%}); "
          f"{max(busy - cpu.total, 0):.0f} s of that was not the suite's (other work, the kernel)")
    print(f"{'CPU s':>7} {'share':>6} {'processes':>9}  kind")
    for kind, seconds in sorted(cpu.seconds.items(), key=lambda item: -item[1]):
        print(f"{seconds:7.1f} {seconds / cpu.total if cpu.total else 0:6.1%} {cpu.processes.get(kind, 0):9d}  {kind}")
    print("(the pytest row: the pytest process itself, and processes too short-lived for a 0.25 s sample)")
    own = resource.getrusage(resource.RUSAGE_SELF)
    print(f"this benchmark's own sampling: {own.ru_utime + own.ru_stime:.0f} s of CPU, not counted above")
    return status


if __name__ == "__main__":
    sys.exit(main())
