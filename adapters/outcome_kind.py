"""How a task ended: the outcome kinds every stored result has one of.

Apart from the schema (adapters/benchmark.py, which re-exports them) so that a command line can
offer them as choices without loading pydantic.
"""

from __future__ import annotations

import enum


class OutcomeKind(str, enum.Enum):
    """How a task ended. Exactly one per stored result (DESIGN.md, "Errors and results")."""

    SUCCESS = "success"
    AGENT_FAILURE = "agent_failure"
    SETUP_FAILURE = "setup_failure"
    EVALUATION_ERROR = "evaluation_error"
    INFRASTRUCTURE_ERROR = "infrastructure_error"
    TIMEOUT = "timeout"

    @property
    def is_retryable(self) -> bool:
        """Only infrastructure trouble is retried; every other outcome is a final result."""
        return self is OutcomeKind.INFRASTRUCTURE_ERROR

    @property
    def environment_was_sound(self) -> bool:
        """Whether the environment did what was asked, so the outcome measures the agent.

        False for infrastructure errors (the server failed) and setup failures (the task's own
        data could not be set up: a missing file or program). These are left out of the
        headline success rate's denominator (adapters/outcomes.py, "Rates").
        """
        return self not in (OutcomeKind.INFRASTRUCTURE_ERROR, OutcomeKind.SETUP_FAILURE)


# The outcomes whose tasks are left out of the headline ("sound environment") success rate.
UNSOUND_OUTCOMES: tuple[OutcomeKind, ...] = tuple(k for k in OutcomeKind if not k.environment_was_sound)
