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

For a whole run (`run_state`): Completed only when every selected task has a final result;
otherwise Failed, or Cancelled when someone stopped it, with what happened first in the message
("Incomplete: ...", "Budget exhausted: ...", "Store failed: ...", "Interrupted (Ctrl-C): ...")
and the counts after it. A run's state keeps Prefect's own name (Failed, Cancelled) because the
server names a flow run's state event after the state's name (`prefect.flow-run.<name>`,
prefect/server/models/events.py) and the UI builds a "flow run state" automation from the names
it offers: a run named "Incomplete" would never fire the team's "Failed" alert. The run's own
outcome travels as the state's data (`outcome_of`).
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

# What a run's state message begins with, by run status.
_HEADLINES = {"incomplete": "Incomplete", "budget_exhausted": "Budget exhausted", STORE_FAILED: "Store failed",
              "failed": "Failed", "cancelled": "Cancelled", "interrupted": "Interrupted"}


class RunEnded(Exception):
    """What a Failed or Cancelled run carries as its data, and what a Python caller of the flow
    gets raised (Prefect raises a failed state's data when it is an exception): the state's
    message, and in `data` what the run produced (its RunOutcome, the night's run ids, a model
    update's comparison)."""

    def __init__(self, message: str, data: Any) -> None:
        super().__init__(message)
        self.data = data


def ended(make: Any, message: str, data: Any) -> State:
    """A run's final state: Completed carries `data` as it is; Failed and Cancelled carry it in a
    RunEnded (anything else there makes Prefect's `state.result()` raise a TypeError)."""
    if make is Completed:
        return Completed(data=data, message=message)
    return make(data=RunEnded(message, data), message=message)


def carried(state: State) -> Any:
    """What a run's final state (`ended`) carries; a crash's own exception is raised."""
    data = state.result(raise_on_failure=False)
    if isinstance(data, RunEnded):
        return data.data
    if isinstance(data, BaseException):
        raise data
    return data


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
        data = carried(value)
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
    """An evaluation run's end as Prefect shows it: Completed, Failed or Cancelled (Prefect's own
    names, which its automations match), what happened and the counts in the message, the
    outcome as data."""
    counts = _counts(outcome)
    if outcome.status == "completed":
        return ended(Completed, counts, outcome)
    headline = _HEADLINES.get(outcome.status, outcome.status.replace("_", " ").capitalize())
    if outcome.stopped_by in ("ctrl-c", "sigterm"):
        headline += " (Ctrl-C)" if outcome.stopped_by == "ctrl-c" else " (SIGTERM)"
    if outcome.status in ("cancelled", "interrupted"):
        return ended(Cancelled, f"{headline}: {counts}", outcome)
    detail = f"; {outcome.store_failure}" if outcome.status == STORE_FAILED and outcome.store_failure else ""
    return ended(Failed, f"{headline}: {counts}{detail}", outcome)


def outcome_of(state: State) -> RunOutcome:
    """The run's outcome a `run_state` carries; the run's own exception when it crashed."""
    data = carried(state)
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
