"""bench/process_cpu.py: a command's CPU split between itself, the processes it starts and a
process it uses, measured on real processes that burn known amounts of CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.process_cpu import run_measured

# Burn `seconds` of this process's CPU (not wall time: a loaded machine stretches the wall).
BURN = "import time\nstart = time.process_time()\nwhile time.process_time() - start < {seconds}: pass\n"

# The command: starts a child that burns 0.6 s of CPU and then idles long enough to be sampled,
# burns 0.3 s itself, and waits for the child.
COMMAND = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', {child!r}, 'worker'])\n"
    + BURN.format(seconds=0.3)
    + "child.wait()\n"
).format(child=BURN.format(seconds=0.6) + "time.sleep(0.5)\n")


def _named(role: str) -> Callable[[Sequence[str]], str]:
    """The role function that calls a process `role` when its command line has that word."""
    return lambda cmdline: role if role in cmdline else "other"


def test_the_split_follows_the_processes_that_used_the_cpu(tmp_path: Path) -> None:
    server = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=60)])  # busy throughout
    try:
        wall, status, cpu = run_measured([sys.executable, "-c", COMMAND], role="command", role_of=_named("worker"),
                                         watched={"server": server.pid}, cwd=tmp_path, env=dict(os.environ),
                                         timeout=120)
    finally:
        server.kill()
        server.wait()
    assert status == 0
    assert 0.55 <= cpu.seconds["worker"] <= 0.9, cpu
    # The command's own: its 0.3 s plus starting Python, less than the worker's share.
    assert 0.25 <= cpu.seconds["command"] < cpu.seconds["worker"], cpu
    assert 0 < cpu.seconds["server"] <= wall + 0.5, cpu
    assert "at least" in cpu.describe(cores=2) and "worker 0." in cpu.describe()


# A command that starts a process which detaches itself (a double fork, as the local Prefect
# server's supervisor does), and waits until that process has burnt 0.6 s of CPU.
DETACHING = """
import os, sys, time
done = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, '-c', {daemon!r}, 'daemon', done])
    os._exit(0)
os.wait()
while not os.path.exists(done):
    time.sleep(0.05)
time.sleep(0.6)  # the detached process idles meanwhile: a sample sees all it burnt
"""
DAEMON = BURN.format(seconds=0.6) + "import sys, time\nopen(sys.argv[2], 'w').close()\ntime.sleep(3)\n"


def test_detached_processes_count_only_when_asked_and_never_twice(tmp_path: Path) -> None:
    found = {}
    for detached in (False, True):
        done = tmp_path / f"done-{detached}"
        wall, status, cpu = run_measured(
            [sys.executable, "-c", DETACHING.format(daemon=DAEMON), str(done)], role="command",
            role_of=_named("daemon"), watched={}, cwd=tmp_path, env=dict(os.environ), timeout=120,
            detached=detached, output=tmp_path / f"out-{detached}.log")
        assert status == 0, (tmp_path / f"out-{detached}.log").read_text()
        found[detached] = cpu
    assert "daemon" not in found[False].seconds, found[False]
    assert 0.55 <= found[True].seconds["daemon"] <= 0.9, found[True]
    assert found[True].processes["daemon"] == 1, found[True]
    # The daemon's CPU is not also the command's: the command only forked and waited.
    assert found[True].seconds["command"] < 0.5, found[True]


def test_the_suite_bench_splits_a_small_pytest_run_by_kind(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "bench" / "suite_cpu.py"), "--",
         "-n", "0", "-q", "tests/test_longest_first.py"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})  # its log's folder
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "passed" in out.split("pytest: exit 0,")[1].splitlines()[0], out
    assert "the machine's cores were busy" in out and "  pytest\n" in out, out
