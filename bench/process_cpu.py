"""The CPU a command and the processes it starts use, by role, while it runs.

On a small machine a whole run is CPU-bound (its controller, the Prefect server and the
simulated VMs together keep every core busy), so its CPU seconds divided by the cores are a
floor of their own: no scheduling makes the run shorter than that on this machine.

The command's own total is exact (the kernel's account of it and the children it waited for);
the split by role comes from sampling its process tree every `SAMPLE_SECONDS` (a process's last
few milliseconds before it exits can be missed). Processes that are not its children but work
for it (the shared local Prefect server) are watched by pid. With `detached`, processes that left
the tree while it ran (a server that detaches itself with a double fork, as the local Prefect
server does) count too: every process started after the command and outside its tree when last
seen, so on a shared machine also whatever others started meanwhile.
"""

from __future__ import annotations

import os
import resource
import signal
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
    processes: Mapping[str, int] = field(default_factory=dict)  # how many were seen, by role

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
                 watched: Mapping[str, int], cwd: Path, env: Mapping[str, str], timeout: float,
                 detached: bool = False, sample_seconds: float = SAMPLE_SECONDS,
                 output: Path | None = None) -> tuple[float, int, CpuUse]:
    """Run `command` to its end: its wall seconds, exit status and CPU by role.

    `role` names the command's own process, `role_of(cmdline)` the role of each process it
    starts; `watched` maps a role to the pid of a process outside the tree whose CPU during the
    run counts too (a server the command uses). The CPU of a child the samples missed (one that
    lived less than a sample) counts as the command's own. `detached`: processes that left the
    tree count too (module docstring). The command's output goes to `output` (else nowhere)."""
    watched_processes = {}
    for watched_role, pid in watched.items():
        try:
            process = psutil.Process(pid)
            watched_processes[watched_role] = (process, _cpu(process) or 0.0)
        except psutil.NoSuchProcess:
            continue
    children_before = _children_cpu()
    started = time.monotonic()
    since = time.time() - 1  # process start times have a clock tick's resolution
    with open(output, "wb") if output is not None else open(os.devnull, "wb") as out:
        proc = subprocess.Popen(list(command), cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT)
    root = psutil.Process(proc.pid)
    ignored = {os.getpid(), *(process.pid for process, _ in watched_processes.values())}
    try:
        last = _follow(proc, root, deadline=started + timeout, since=since if detached else None,
                       ignored=ignored, role_of=role_of, sample_seconds=sample_seconds)
    except BaseException:  # Ctrl-C or the timeout: the command ends too, as it would on its own
        _interrupt(proc)
        raise
    wall = time.monotonic() - started
    tree = _children_cpu() - children_before  # the command and every child it waited for: exact
    by_role: dict[str, float] = {}
    counts: dict[str, int] = {role: 1}
    for process_role, seconds, _ in last.values():
        by_role[process_role] = by_role.get(process_role, 0.0) + seconds
        counts[process_role] = counts.get(process_role, 0) + 1
    # What the samples did not give another process of the tree is the command's own.
    sampled_in_tree = sum(seconds for _, seconds, in_tree in last.values() if in_tree)
    by_role[role] = by_role.get(role, 0.0) + max(tree - sampled_in_tree, 0.0)
    for watched_role, (process, before) in watched_processes.items():
        after = _cpu(process)
        if after is not None:
            by_role[watched_role] = by_role.get(watched_role, 0.0) + after - before
            counts[watched_role] = counts.get(watched_role, 0) + 1
    return wall, proc.returncode, CpuUse(by_role, counts)


def _follow(proc: subprocess.Popen[bytes], root: psutil.Process, *, deadline: float, since: float | None,
            ignored: set[int], role_of: Callable[[Sequence[str]], str],
            sample_seconds: float) -> dict[tuple[int, float], tuple[str, float, bool]]:
    """Sample the processes (`_sample`) until `proc` ends: for each (pid, start time), its role,
    its CPU and whether it was in `root`'s tree when last seen. TimeoutError past `deadline`."""
    last: dict[tuple[int, float], tuple[str, float, bool]] = {}
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{' '.join(map(str, proc.args))} ran past its timeout")
        for process, in_tree in _sample(root, since, ignored):
            try:
                key = (process.pid, process.create_time())  # a pid can be reused within a run
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            seconds = _cpu(process)
            if seconds is None:
                continue
            known = last.get(key)
            # Named again while "other": between its fork and its exec a child shows its parent's command line.
            process_role = known[0] if known and known[0] != "other" else _role(process, role_of)
            last[key] = (process_role, seconds, in_tree)
        time.sleep(sample_seconds)
    return last


def _interrupt(proc: subprocess.Popen[bytes], grace: float = 60) -> None:
    """End `proc` as Ctrl-C would (SIGINT: pytest stops its workers and reports), killing it if
    it has not ended within `grace` seconds. A Ctrl-C at the terminal reached it already: it gets
    a few seconds to end on that one before a second SIGINT, which cuts pytest's own ending short."""
    for signum, seconds in ((None, 5.0), (signal.SIGINT, grace), (signal.SIGKILL, None)):
        if proc.poll() is not None:
            return
        if signum is not None:
            proc.send_signal(signum)
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            continue


def _sample(root: psutil.Process, since: float | None, ignored: set[int]) -> list[tuple[psutil.Process, bool]]:
    """The processes to sample, each with whether it is in `root`'s tree: `root`'s descendants,
    and with `since` every other process started after it (but `ignored`)."""
    try:
        tree = root.children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    found = [(process, True) for process in tree]
    if since is not None:
        in_tree = {process.pid for process in tree} | {root.pid}
        for process in psutil.process_iter():
            try:
                if process.pid not in in_tree and process.pid not in ignored and process.create_time() >= since:
                    found.append((process, False))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
    return found


def _role(process: psutil.Process, role_of: Callable[[Sequence[str]], str]) -> str:
    try:
        return role_of(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "other"
