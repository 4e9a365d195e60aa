"""What `arena` prints in the terminal while a run goes on.

Prefect logs every failed task run with its traceback. For failures the pipeline expects and
turns into a stored outcome (a WAA server that failed or vanished, a VM the provider could not
give, a setup step the task's data broke, a stage past its deadline) the traceback says nothing
the one-line message does not, and reads like a crash. The terminal shows those as one line;
the Prefect UI keeps the full record (its log handler runs before the console's).
"""

from __future__ import annotations

import logging

from adapters.outcomes import EnvironmentFault
from adapters.vms.base import ProviderError
from adapters.waa.errors import WAAError
from adapters.waa.setup_steps import SetupStepError
from flows.attempt import StageTimeout

EXPECTED_FAILURES: tuple[type[BaseException], ...] = (
    WAAError,
    EnvironmentFault,
    ProviderError,
    SetupStepError,
    StageTimeout,
)


class _OneLineForExpectedFailures(logging.Filter):
    """Drops the traceback of a log record whose exception is an expected failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], EXPECTED_FAILURES):
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_expected_tracebacks() -> None:
    """Make Prefect's console handler print expected failures as one line (idempotent)."""
    from prefect.logging.configuration import setup_logging
    from prefect.logging.handlers import PrefectConsoleHandler

    root = logging.getLogger()
    if not any(isinstance(h, PrefectConsoleHandler) for h in root.handlers):
        setup_logging()
    for handler in root.handlers:
        if isinstance(handler, PrefectConsoleHandler) and not any(
            isinstance(f, _OneLineForExpectedFailures) for f in handler.filters
        ):
            handler.addFilter(_OneLineForExpectedFailures())
