"""How slow this machine is right now, so the tests' time limits stretch with it.

Run on a machine kept busy by other work (load average 20-30 on two cores), the suite failed
19 tests by their own limits: pytest-timeout's 300 s, waits for servers and flow runs. Those
limits are there to end a test that hangs, not to measure speed (the benchmarks in bench/ do),
so they are written for a quiet machine and stretched by the machine's pace:

    pace()            1 on a quiet machine; N when everything takes about N times as long
    scaled(seconds)   seconds * pace()

The pace is the larger of two readings: how long a fixed piece of pure-Python work takes now
against what it takes on a quiet machine here (measured when the session starts, shared with
its worker processes through ARENA_TEST_PACE), and the load average per CPU now (read at each
call, so load that arrives later stretches later limits too). Never below 1, so a quiet or fast
machine keeps the limits as written; ARENA_TEST_PACE set by hand overrides the first reading.
"""

from __future__ import annotations

import os
import time

PACE_ENV = "ARENA_TEST_PACE"
# The calibration work's time on a quiet machine here (9.0-9.3 ms, 2026-12-07).
QUIET_SECONDS = 0.010
# The suite itself keeps about this many processes busy per CPU (five workers, their servers):
# load up to it is the suite's own, which the limits as written already allow for.
OWN_LOAD_PER_CPU = 3.0


def _calibrate() -> float:
    """The calibration work's time now: the best of three, so one preemption does not count."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        total = 0
        for i in range(200_000):
            total += i * i % 7
        best = min(best, time.perf_counter() - start)
    return best


def measured_pace() -> float:
    """The session's starting pace (see the module docstring), measured once and then kept in
    the environment for the session's processes."""
    given = os.environ.get(PACE_ENV)
    if given:
        try:
            return max(1.0, float(given))
        except ValueError:
            pass
    value = max(1.0, _calibrate() / QUIET_SECONDS)
    os.environ[PACE_ENV] = f"{value:.2f}"
    return value


def pace() -> float:
    """How many times longer than on a quiet machine things take now (at least 1)."""
    cpus = os.cpu_count() or 1
    load = os.getloadavg()[0] / cpus / OWN_LOAD_PER_CPU
    return max(1.0, measured_pace(), load)


def scaled(seconds: float) -> float:
    """`seconds`, a limit written for a quiet machine, stretched by the machine's pace now."""
    return seconds * pace()
