"""What a benchmark ran under, printed first by every bench: numbers from a loaded 2-core machine
mean something else than from an idle 16-core one."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def conditions() -> str:
    """One line: cores, load averages (1, 5, 15 min), Python, machine."""
    one, five, fifteen = os.getloadavg()
    return (f"conditions: {cores()} CPU cores, load {one:.1f} / {five:.1f} / {fifteen:.1f} (1/5/15 min), "
            f"Python {platform.python_version()}, {platform.machine()} {platform.system()}")


def spread(samples: Sequence[float], unit: str = "s", digits: int = 3) -> str:
    """`min X, median Y, max Z (n runs)` of repeated measurements."""
    if not samples:
        return "no samples"
    return (f"min {min(samples):.{digits}f} {unit}, median {statistics.median(samples):.{digits}f} {unit}, "
            f"max {max(samples):.{digits}f} {unit} ({len(samples)} runs)")
