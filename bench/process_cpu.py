"""The CPU a command and the processes it starts use, by role, while it runs.

On a small machine a whole run is CPU-bound (its controller, the Prefect server and the
simulated VMs together keep every core busy), so its CPU seconds divided by the cores are a
floor of their own: no scheduling makes the run shorter than that on this machine.

The command's own total is exact (the kernel's account of it and the children it waited for);
the split by role comes from sampling its process tree every `SAMPLE_SECONDS` (a process's last
few milliseconds before it exits can be missed). Processes that are not its children but work
for it (the shared local Prefect server) are watched by pid.
"""

from __future__ import annotations

import resource
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SAMPLE_SECONDS = 0.1


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds (user + system) by role."""

    seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def describe(self, cores: int | None = None) -> str:
        """`12.2 s of CPU (controller 5.4 s, ...)`, and what that is spread over `cores`."""
        parts = ", ".join(f"{role} {value:.1f} s" for role, value in
                          sorted(self.seconds.items(), key=lambda item: -item[1]) if value >= 0.05)
        text = f"{self.total:.1f} s of CPU ({parts})"
        if cores:
            text += f", at least {self.total / cores:.1f} s of wall on {cores} cores"
        return text


def _cpu(process: psutil.Process) -> float | None:
    try:
        times = process.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return times.user + times.system


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_measured(command: Sequence[str], *, role: str, role_of: Callable[[Sequence[str]], str],
                 watched: Mapping[str, int], cwd: Path, env: Mapping[str, str],
                 timeout: float) -> tuple[float, int, CpuUse]:
    """Run `command` to its end: its wall seconds, exit status and CPU by role.

    `role` names the command's own process, `role_of(cmdline)` the role of each process it
    starts; `watched` maps a role to the pid of a process outside the tree whose CPU during the
    run counts too (a server the command uses). The CPU of a child the samples missed (one that
    lived less than a sample) counts as the command's own."""
    watched_processes = {}
    for watched_role, pid in watched.items():
        try:
            process = psutil.Process(pid)
            watched_processes[watched_role] = (process, _cpu(process) or 0.0)
        except psutil.NoSuchProcess:
            continue
    children_before = _children_cpu()
    started = time.monotonic()
    proc = subprocess.Popen(list(command), cwd=cwd, env=dict(env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    root = psutil.Process(proc.pid)
    last: dict[int, tuple[str, float]] = {}  # pid -> (role, CPU when last seen)
    while proc.poll() is None:
        if time.monotonic() - started > timeout:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"{' '.join(command)} ran longer than {timeout:.0f} s")
        try:
            descendants = root.children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        for child in descendants:
            seconds = _cpu(child)
            if seconds is None:
                continue
            known = last.get(child.pid)
            # Named again while "other": between its fork and its exec a child shows its parent's command line.
            child_role = known[0] if known and known[0] != "other" else _role(child, role_of)
            last[child.pid] = (child_role, seconds)
        time.sleep(SAMPLE_SECONDS)
    wall = time.monotonic() - started
    tree = _children_cpu() - children_before  # the command and every child it waited for: exact
    by_role: dict[str, float] = {}
    for child_role, seconds in last.values():
        by_role[child_role] = by_role.get(child_role, 0.0) + seconds
    # What the samples did not give to another role is the command's own.
    by_role[role] = by_role.get(role, 0.0) + max(tree - sum(by_role.values()), 0.0)
    for watched_role, (process, before) in watched_processes.items():
        after = _cpu(process)
        if after is not None:
            by_role[watched_role] = by_role.get(watched_role, 0.0) + after - before
    return wall, proc.returncode, CpuUse(by_role)


def _role(process: psutil.Process, role_of: Callable[[Sequence[str]], str]) -> str:
    try:
        return role_of(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "other"
