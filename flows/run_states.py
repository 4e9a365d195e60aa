"""The Prefect states that say what happened, so the UI, its dashboard and Prefect's own
notifications and automations tell the truth at a glance.

Prefect colours a run by its state's type; the name says what happened. For one task (the
`evaluate-task` run and each `attempt` run inside it):

    green   Completed  "Success"                 the agent solved it (a measurement)
    red     Failed     "Agent failure", "Timeout" the agent did not (a measurement, not a crash)
    orange  Crashed    "Infrastructure error", "Setup failure", "Evaluation error"
                                                 nothing was measured: the environment, the task's
                                                 own data or the evaluator failed

Why an agent failure is red: it is what a person looks for on a run page (which tasks the agent
missed), and Failed is the one type Prefect draws red. It is still a result, recorded and scored
like a success; what is *not* a measurement is drawn orange (Prefect's Crashed: "the
infrastructure failed"), so the dashboard's Completed / Failed / Crashed counts read as solved /
missed / not measured.

For a whole evaluation run (`run_state`): Completed only when every selected task has a final
result; Failed named for what happened ("Incomplete", "Budget exhausted", "Store failed") with the
counts in its message, so Prefect's failure notifications and automations fire; Cancelled
("Cancelled" from Prefect, "Interrupted" by Ctrl-C or SIGTERM). The run's own outcome travels
as the state's data (`outcome_of`).
"""

from __future__ import annotations

import logging
from typing import Any

from prefect.states import Cancelled, Completed, Crashed, Failed, State

from adapters.benchmark import BenchmarkResult, OutcomeKind
from flows.run_config import STORE_FAILED, RunOutcome

# A task's (and an attempt's) state: its type by whose outcome it is, its name by the outcome.
OUTCOME_STATES: dict[OutcomeKind, tuple[Any, str]] = {
    OutcomeKind.SUCCESS: (Completed, "Success"),
    OutcomeKind.AGENT_FAILURE: (Failed, "Agent failure"),
    OutcomeKind.TIMEOUT: (Failed, "Timeout"),
    OutcomeKind.INFRASTRUCTURE_ERROR: (Crashed, "Infrastructure error"),
    OutcomeKind.SETUP_FAILURE: (Crashed, "Setup failure"),
    OutcomeKind.EVALUATION_ERROR: (Crashed, "Evaluation error"),
}
OUTCOME_STATE_NAMES: dict[OutcomeKind, str] = {kind: name for kind, (_, name) in OUTCOME_STATES.items()}

# A run's failed-type states, by run status.
_FAILED_NAMES = {"incomplete": "Incomplete", "budget_exhausted": "Budget exhausted", STORE_FAILED: "Store failed",
                 "failed": "Failed"}


class Carried:
    """A task's result as a state's data: Prefect logs a failed state with its data's repr, which
    for a whole result (every step) ran to pages; this one says which attempt it is."""

    def __init__(self, result: BenchmarkResult) -> None:
        self.result = result

    def __repr__(self) -> str:
        return f"<{self.result.outcome.value}: {self.result.task_id} attempt {self.result.attempt}>"


def outcome_state(result: BenchmarkResult | None) -> State | None:
    """A task's last result as the state named by its outcome (see OUTCOME_STATES)."""
    if result is None:
        return None
    make, name = OUTCOME_STATES[result.outcome]
    message = f"{result.outcome.value} on {result.vm_id or 'no VM'} (attempt {result.attempt})"
    if result.error or result.reason:
        message += f": {(result.error or result.reason or '')[:300]}"
    return make(data=Carried(result), name=name, message=message)


def final_result(value: State | BenchmarkResult | None) -> BenchmarkResult | None:
    """The result inside what `attempt_task` returned (a state of any type, or the bare result)."""
    if isinstance(value, State):
        data = value.result(raise_on_failure=False)
        if isinstance(data, BaseException):
            raise data
        return data.result if isinstance(data, Carried) else data  # type: ignore[no-any-return]
    return value


class _WithoutRetryNotice(logging.Filter):
    """Drops the notice Prefect logs when a task ends in a Failed state it has no retries for
    ("Task run failed with state: ... " and a stray "NoneType: None"): our Failed states are
    agents' failures, recorded results, and "Finished in state Agent failure(...)" says so."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Task run failed with state:")


logging.getLogger("prefect.task_runs").addFilter(_WithoutRetryNotice())


def run_state(outcome: RunOutcome) -> State:
    """An evaluation run's end as Prefect shows it: Completed, a Failed named for what happened,
    or Cancelled, with the counts in the message and the outcome as data."""
    counts = _counts(outcome)
    if outcome.status == "completed":
        return Completed(data=outcome, name="Completed", message=counts)
    if outcome.status in ("cancelled", "interrupted"):
        return Cancelled(data=outcome, name=outcome.status.capitalize(), message=counts)
    name = _FAILED_NAMES.get(outcome.status, outcome.status.replace("_", " ").capitalize())
    detail = outcome.store_failure if outcome.status == STORE_FAILED else None
    return Failed(data=outcome, name=name, message=f"{counts}" + (f"; {detail}" if detail else ""))


def outcome_of(state: State) -> RunOutcome:
    """The run's outcome a `run_state` carries; the run's own exception when it crashed."""
    data = state.result(raise_on_failure=False)
    if isinstance(data, BaseException):
        raise data
    if not isinstance(data, RunOutcome):
        raise RuntimeError(f"the evaluation ended in state {state.name!r} without an outcome: {state.message}")
    return data


def _counts(outcome: RunOutcome) -> str:
    completeness = outcome.completeness
    if completeness is None:
        return f"run {outcome.run_id} {outcome.status}"
    solved = sum(1 for r in outcome.results if r.success)
    text = (f"run {outcome.run_id}: {completeness.final} of {completeness.selected} selected tasks have a final "
            f"result ({completeness.missing} missing)")
    return text + (f"; {solved} solved in this invocation" if outcome.results else "")
