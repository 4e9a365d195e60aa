"""The tests' time limits stretch with the machine's pace (tests/machine_pace.py): a quiet machine
keeps them as written, a busy one (its calibration slower, its load higher) stretches them."""

from __future__ import annotations

import multiprocessing
import os

import pytest

import machine_pace


def _spin(seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_busy_machine_stretches_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(machine_pace.PACE_ENV, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # the reading of load alone below
    busy = [multiprocessing.Process(target=_spin, args=(8.0,)) for _ in range(4 * (os.cpu_count() or 1))]
    for process in busy:
        process.start()
    try:
        slow = machine_pace._calibrate()
    finally:
        for process in busy:
            process.terminate()
    assert slow > machine_pace.QUIET_SECONDS * 1.5, slow  # the calibration sees a busy machine


def test_the_pace_is_shared_never_below_1_and_takes_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(machine_pace.PACE_ENV, "0.5")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert machine_pace.pace() == 1.0 and machine_pace.scaled(300) == 300
    monkeypatch.setenv(machine_pace.PACE_ENV, "2.5")
    assert machine_pace.scaled(300) == 750
    cpus = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (cpus * machine_pace.OWN_LOAD_PER_CPU * 4, 0.0, 0.0))
    assert machine_pace.pace() == 4.0
