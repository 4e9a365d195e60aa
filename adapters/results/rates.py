"""The headline success rate's denominator, defined once for every summary, report and comparison.

A score measures the agent only when the environment was sound (adapters/outcomes.py, "Rates"):
tasks whose final outcome is an infrastructure error (the server failed) or a setup failure (the
task's own data could not be set up) are left out of the headline rate's denominator and counted
beside it. The raw rate (successes over every task with a final result) is shown too.
"""

from __future__ import annotations

from pydantic import BaseModel

from adapters.benchmark import UNSOUND_OUTCOMES, OutcomeKind
from adapters.outcomes import scoring_text

UNSOUND_VALUES: tuple[str, ...] = tuple(o.value for o in UNSOUND_OUTCOMES)


def is_sound(outcome: str) -> bool:
    """Whether a stored outcome counts in the headline ("sound environment") rate."""
    return outcome not in UNSOUND_VALUES


def sound_sql(column: str = "outcome") -> str:
    """A SQL boolean expression over `column`: true when the outcome counts in the headline rate.

    The values are the enum's own literals (never user input), so they are inlined.
    """
    return f"({column} NOT IN ({', '.join(repr(v) for v in UNSOUND_VALUES)}))"


def rate(successes: int, total: int) -> float | None:
    """successes / total, or None when there is nothing to divide by."""
    return successes / total if total else None


def is_final(outcome: str) -> bool:
    """Whether a task's latest outcome ends it for good (an infrastructure error is retried)."""
    try:
        return not OutcomeKind(outcome).is_retryable
    except ValueError:
        return False


class RunStatus(BaseModel):
    """A run's status, how many of its selected tasks still have no final result, and how it
    scored server failures during evaluation.

    Shown wherever a rate is shown, so an incomplete run never passes for a complete one and a
    rate scored as WAA scores server failures never passes for a strict one.
    """

    run_id: str
    status: str | None  # runs.status: completed, incomplete, budget_exhausted, failed, running...
    selected: int | None  # runs.task_count
    final: int  # tasks whose latest outcome is final
    scoring: str | None = None  # runs.scoring (adapters/outcomes.py R9); None before schema 7

    def scoring_line(self) -> str:
        """E.g. "scoring: strict (a server failure during evaluation is ... never scored)"."""
        return scoring_text(self.scoring)

    @property
    def missing(self) -> int:
        return max(0, (self.selected or 0) - self.final)

    def warning(self) -> str | None:
        """One line when the run is not complete, else None."""
        if self.status == "completed" and self.missing == 0:
            return None
        detail = f": {self.missing} of {self.selected} selected tasks have no final result" if self.selected else ""
        return f"run {self.run_id} is {self.status or 'of unknown status'}{detail}"
