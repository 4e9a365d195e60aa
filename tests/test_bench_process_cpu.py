"""bench/process_cpu.py: a command's CPU split between itself, the processes it starts and a
process it uses, measured on real processes that burn known amounts of CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
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


def _role(cmdline: Sequence[str]) -> str:
    return "worker" if "worker" in cmdline else "other"


def test_the_split_follows_the_processes_that_used_the_cpu(tmp_path: Path) -> None:
    server = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=60)])  # busy throughout
    try:
        wall, status, cpu = run_measured([sys.executable, "-c", COMMAND], role="command", role_of=_role,
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
