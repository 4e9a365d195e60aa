"""The Prefect states of tasks and runs (flows/run_states.py): their type is what Prefect colours
and counts, their name what its automations match, their message what a person reads."""

from __future__ import annotations

import pytest
from prefect.client.schemas.objects import StateType

from adapters.benchmark import BenchmarkResult, OutcomeKind
from flows.run_config import STORE_FAILED, RunOutcome
from flows.run_states import final_result, outcome_of, outcome_state, run_state
from flows.summary import RunCompleteness


@pytest.mark.parametrize(("kind", "state_type", "name"), [
    (OutcomeKind.SUCCESS, StateType.COMPLETED, "Success"),
    (OutcomeKind.AGENT_FAILURE, StateType.FAILED, "Agent failure"),
    (OutcomeKind.TIMEOUT, StateType.FAILED, "Timeout"),
    (OutcomeKind.INFRASTRUCTURE_ERROR, StateType.CRASHED, "Infrastructure error"),
    (OutcomeKind.SETUP_FAILURE, StateType.CRASHED, "Setup failure"),
    (OutcomeKind.EVALUATION_ERROR, StateType.CRASHED, "Evaluation error"),
])
def test_a_tasks_state_is_coloured_by_whose_outcome_it_is(kind: OutcomeKind, state_type: StateType, name: str) -> None:
    result = BenchmarkResult(task_id="t1", outcome=kind, success=kind is OutcomeKind.SUCCESS, attempt=2, vm_id="vm-a",
                             error="WAA /execute answered 500" if kind is OutcomeKind.INFRASTRUCTURE_ERROR else None)
    state = outcome_state(result)
    assert state is not None and state.type == state_type and state.name == name
    assert state.message.startswith(f"{kind.value} on vm-a (attempt 2)")
    assert final_result(state) == result  # the result rides along, whatever the state's type
    assert repr(state.data) == f"<{kind.value}: t1 attempt 2>"  # what Prefect logs: one line, not every step
    if kind is OutcomeKind.INFRASTRUCTURE_ERROR:
        assert state.message.endswith(": WAA /execute answered 500")


def _outcome(status: str, final: int, selected: int = 16, **extra: object) -> RunOutcome:
    completeness = RunCompleteness(status=status, selected=selected, final=final, retries_exhausted=selected - final)
    return RunOutcome(run_id="r1", store="db", results=[], table="", status=status, completeness=completeness, **extra)


@pytest.mark.parametrize(("status", "extra", "state_type", "headline"), [
    ("incomplete", {}, StateType.FAILED, "Incomplete: "),
    ("budget_exhausted", {}, StateType.FAILED, "Budget exhausted: "),
    (STORE_FAILED, {"store_failure": "PostgreSQL at db:5432 refused the connection"}, StateType.FAILED,
     "Store failed: "),
    ("cancelled", {"stopped_by": "prefect"}, StateType.CANCELLED, "Cancelled: "),
    ("interrupted", {"stopped_by": "ctrl-c"}, StateType.CANCELLED, "Interrupted (Ctrl-C): "),
    ("interrupted", {"stopped_by": "sigterm"}, StateType.CANCELLED, "Interrupted (SIGTERM): "),
])
def test_a_run_that_did_not_finish_is_never_green_and_says_why(
    status: str, extra: dict, state_type: StateType, headline: str
) -> None:
    outcome = _outcome(status, final=2, **extra)
    state = run_state(outcome)
    assert state.type == state_type
    # Prefect's own name: the server names the state event after it, and the UI's "flow run
    # state" automations match those names.
    assert state.name == state_type.value.capitalize()
    assert state.message.startswith(headline)
    assert "2 of 16 selected tasks have a final result (14 missing)" in state.message
    if status == STORE_FAILED:
        assert state.message.endswith("; PostgreSQL at db:5432 refused the connection")
    assert outcome_of(state) == outcome


def test_a_complete_run_is_completed_with_its_counts() -> None:
    state = run_state(_outcome("completed", final=16))
    assert state.type == StateType.COMPLETED and state.name == "Completed"
    assert state.message == "run r1: 16 of 16 selected tasks have a final result (0 missing)"


def test_a_state_without_an_outcome_says_so() -> None:
    from prefect.states import Completed

    with pytest.raises(RuntimeError, match="ended in state 'Completed' without an outcome: odd"):
        outcome_of(Completed(data=42, message="odd"))
