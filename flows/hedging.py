"""Hedging the end of a run: a copy of a task that may end last, on a VM nothing else needs.

Once the queue is empty, lanes retire their VMs while the last tasks run alone; an
infrastructure error late in one of them puts its retry (and often a replacement VM's boot)
after everything else. With hedging on, a lane that finds no work first starts a copy of the
running task expected to end last (`Hedging.pick`), within a VM-time allowance, and retires
only when there is nothing worth copying.

Which result counts, so that hedging cannot favour short episodes (an agent that succeeds
quickly and fails slowly would otherwise gain from "first to finish wins"):

- the task's own attempt (its *owner*) whenever it ends with a final outcome: the copy is then
  told to stop (`Race.stop`) and its result is dropped, whichever finished first;
- the copy's result only when the owner's attempt ends with an infrastructure error: the copy
  then stands for the retry, already under way (`Race.owner_failed` hands it over) or already
  done (its result was held until then).

A copy that itself ends with an infrastructure error is dropped (the owner retries as usual).
A dropped copy is not recorded; its attempt number stays unused, so a task's attempt numbers
may skip one. Its VM time, tokens and cost are the price of hedging (`HedgeStats`), shown in
the run's summary.

Plain Python, no Prefect: flows/scheduling.py drives it, bench/pool_efficiency.py measures it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from adapters.benchmark import BenchmarkResult

# A task is copied only while at least this share of its expected time is left: a copy insures
# against a failure in what remains, which near the end is little.
MIN_REMAINING = 0.25

# What the copy's lane does with the copy's result (`Race.copy_ended`).
CopyVerdict = Literal["drop", "held", "own"]


@dataclass
class HedgeStats:
    """What hedging did in a run: copies started, used (their result counted) and dropped, and
    the extra VM-seconds, tokens and model cost of the dropped ones."""

    started: int = 0
    used: int = 0
    dropped: int = 0
    extra_vm_seconds: float = 0.0
    extra_tokens: int = 0
    extra_cost_usd: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_started(self) -> None:
        with self._lock:
            self.started += 1

    def count_not_started(self) -> None:
        with self._lock:
            self.started -= 1

    def count_used(self) -> None:
        with self._lock:
            self.used += 1

    def drop(self, result: BenchmarkResult | None, vm_seconds: float) -> None:
        """Count a dropped copy's price."""
        usage = result.usage if result is not None else None
        with self._lock:
            self.dropped += 1
            self.extra_vm_seconds += vm_seconds
            if usage is not None:
                self.extra_tokens += usage.input_tokens + usage.output_tokens
                self.extra_cost_usd += usage.cost_usd

    def describe(self, allowance: float) -> str:
        """One line for the run's summary; `allowance` is the copies' share of the VM time billed."""
        if not self.started:
            # Said anyway: with hedging on, a summary silent about it reads as hedging off.
            return (f"hedging: on, no copy started (none fit within {allowance:.0%} of the VM time billed, "
                    "--hedge-allowance, or no VM was idle while a task was left to copy)")
        seconds = self.extra_vm_seconds
        extra = f"+{seconds / 3600:.2f} VM-hours" if seconds >= 36 else f"+{seconds:.0f} VM-seconds"
        if self.extra_tokens:
            extra += f", +{self.extra_tokens} tokens (${self.extra_cost_usd:.4f})"
        return (f"hedging: {self.started} cop{'y' if self.started == 1 else 'ies'} of the run's last tasks; "
                f"{self.used} stood in for a failed attempt, {self.dropped} dropped ({extra})")


class Race:
    """One unit of work while it runs: its owner's attempt and, at most once, a copy of it.

    Every method takes the race's lock; `stop` is set once the owner's final result counts.
    """

    def __init__(self, unit: Any, max_attempts: int) -> None:
        self.unit = unit
        self.max_attempts = max_attempts
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._tries = 0  # the owner's current try (1 for the first attempt)
        self._started = 0.0  # when the owner's current attempt started
        self._expected_end: float | None = None  # of the owner's current attempt; None: unknown
        self._attempting = False
        self._copied = False
        self._copy: Literal["none", "running", "handed"] = "none"  # a copy's attempt under way, and for whom
        self._held: tuple[BenchmarkResult, float] | None = None  # a copy's final result and its VM-seconds

    # --- the owner's side --------------------------------------------------------------------

    def owner_attempting(self, tries: int, expected_seconds: float | None) -> None:
        """The owner starts its `tries`-th attempt, expected to take `expected_seconds`."""
        with self._lock:
            self._tries = tries
            self._attempting = True
            self._started = time.monotonic()
            self._expected_end = None if expected_seconds is None else self._started + expected_seconds

    def owner_final(self, stats: HedgeStats) -> BenchmarkResult | None:
        """The owner's attempt ended with a final outcome: it counts; a running copy is told to
        stop and will be dropped. Returns a copy's result held until now, dropped here (its
        tokens were spent: the caller charges them to the budget)."""
        with self._lock:
            self._attempting = False
            self.stop.set()
            held, self._held = self._held, None
        if held is None:
            return None
        stats.drop(*held)
        return held[0]

    def owner_failed(self, stats: HedgeStats) -> tuple[Literal["retry", "handed", "held"], BenchmarkResult | None]:
        """The owner's attempt ended with an infrastructure error (already recorded). "retry": no
        copy, retry as usual; "handed": a copy is running and is now the task's next attempt
        (the owner's lane is done with the task); "held": the copy already ended with a final
        result, returned here to be recorded as the next attempt."""
        with self._lock:
            self._attempting = False
            if self._copy == "running":
                self._copy = "handed"
                return "handed", None
            if self._held is not None:
                result, _ = self._held
                self._held = None
                stats.count_used()
                return "held", result
            return "retry", None

    @property
    def owner_tries(self) -> int:
        """The owner's tries so far (a copy handed over continues from the next one)."""
        with self._lock:
            return self._tries

    # --- the copy's side ---------------------------------------------------------------------

    def copy_ended(self, result: BenchmarkResult, vm_seconds: float, stats: HedgeStats) -> CopyVerdict:
        """The copy's attempt ended: "own" when the owner handed the task over (record the
        result; the copy's lane carries on as owner), "held" when the owner is still running and
        the result is final (kept until the owner ends), else "drop" (counted in `stats`)."""
        with self._lock:
            handed, self._copy = self._copy == "handed", "none"
            if handed:
                stats.count_used()
                return "own"
            if self.stop.is_set() or result.outcome.is_retryable:
                stats.drop(result, vm_seconds)
                return "drop"
            self._held = (result, vm_seconds)
            return "held"

    def copy_gone(self, stats: HedgeStats) -> bool:
        """The copy's lane ended without a result (no VM, the owner ended first, the run stopped,
        a controller error): it does not count as a copy. True when the owner had already handed
        the task over to it: the task then ends without a final result, as an owner's would."""
        with self._lock:
            began, handed = self._copy in ("running", "handed"), self._copy == "handed"
            if began:
                self._copy = "none"
        if began:
            stats.count_not_started()
        return handed

    # --- choosing a copy ---------------------------------------------------------------------

    def _may_copy(self) -> bool:
        """Whether a copy may start now (call under the lock): the owner is attempting, has
        tries left and was not copied yet, and its result does not count yet."""
        return self._attempting and not self._copied and not self.stop.is_set() and self._tries < self.max_attempts

    def _start_copy(self) -> bool:
        """Mark the copy as running, if the unit may still be copied."""
        with self._lock:
            if not self._may_copy():
                return False
            self._copied = True
            self._copy = "running"
            return True

    def _copyable_end(self, now: float) -> tuple[float, float] | None:
        """When the owner is expected to end (inf when unknown) and how long a copy started now
        is expected to run until then (unknown: as long as the owner has run so far); None when
        it may not be copied."""
        with self._lock:
            if not self._may_copy():
                return None
            if self._expected_end is None:
                return float("inf"), now - self._started
            remaining = self._expected_end - now
            if remaining < MIN_REMAINING * (self._expected_end - self._started):
                return None  # about to end: a copy would only insure its last moments
            return self._expected_end, remaining


class Hedging:
    """The run's hedging: its races, the VM-time allowance, and what copies did (`stats`).

    `max_extra` bounds the copies' VM time: a copy starts only while the VM-seconds copies may
    cost (each counted at its owner's expected remaining time; with no recorded duration, the
    time the owner has run so far) stay within `max_extra` of the VM-seconds billed so far.
    Among tasks with no recorded duration, the one that has run longest is copied first.
    """

    def __init__(self, max_extra: float = 0.05) -> None:
        self.max_extra = max_extra
        self.stats = HedgeStats()
        self._lock = threading.Lock()
        self._races: dict[tuple[str, int], Race] = {}
        self._committed = 0.0  # VM-seconds the copies started so far were expected to cost

    def open(self, key: tuple[str, int], unit: Any, max_attempts: int) -> Race:
        """The race of a unit a lane starts (its owner)."""
        race = Race(unit, max_attempts)
        with self._lock:
            self._races[key] = race
        return race

    def close(self, key: tuple[str, int]) -> None:
        """The unit has ended (its final result, no attempt left, the budget, no VM): a copy
        still running is told to stop, and a result it holds is dropped."""
        with self._lock:
            race = self._races.pop(key, None)
        if race is not None:
            race.owner_final(self.stats)

    def stop_copies(self) -> None:
        """The run is stopping (Ctrl-C, SIGTERM, a cancellation): every running copy ends at its
        next stage or step, instead of using the grace period the tasks' own attempts get."""
        with self._lock:
            races = list(self._races.values())
        for race in races:
            race.stop.set()

    def pick(self, billed_seconds: float) -> Race | None:
        """The running unit to copy now: the one expected to end last (unknown durations count as
        latest) among those not copied yet, with attempts left, within the allowance; or None."""
        now = time.monotonic()
        with self._lock:
            ends = [(end, race) for race in self._races.values() if (end := race._copyable_end(now)) is not None]
            if not ends:
                return None
            (_, cost), race = max(ends, key=lambda pair: pair[0])
            if self._committed + cost > self.max_extra * billed_seconds or not race._start_copy():
                return None
            self._committed += cost
        self.stats.count_started()
        return race
