"""Waiting for a process the test does not own (no Popen handle) to end."""

from __future__ import annotations

import time

import psutil
from machine_pace import scaled


def ended_within(pid: int, seconds: float) -> bool:
    """Whether process `pid` has ended (gone, or a zombie nobody reaped yet) within `seconds`
    (written for a quiet machine: stretched by its pace, tests/machine_pace.py)."""
    deadline = time.monotonic() + scaled(seconds)
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False
