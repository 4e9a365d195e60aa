"""The adaptive design's bridge to stored runs (adapters/results/trials/adaptive.py): a batch as
further trials per run and task, stored rows recorded back (unsound or missing trials spent, not
counted), a run's sound outcomes as the design's start."""

from __future__ import annotations

import pytest

from adapters.results.trials.adaptive import (AdaptiveState, batch_trials, decide, next_batch, record_trial_rows,
                                              sound_outcomes)


def _row(task: str, trial: int, outcome: str) -> dict:
    return {"task_id": task, "trial": trial, "outcome": outcome, "success": outcome == "success"}


def test_sound_outcomes_keep_sound_trials_in_trial_order() -> None:
    rows = [_row("b", 2, "success"), _row("a", 1, "agent_failure"), _row("b", 1, "infrastructure_error"),
            _row("a", 2, "success"), _row("c", 1, "setup_failure")]
    assert sound_outcomes(rows) == {"a": [False, True], "b": [True]}


def test_a_batch_becomes_further_trials_and_its_rows_are_recorded_back() -> None:
    tasks = [f"t{i}" for i in range(6)]
    state = AdaptiveState.start(tasks, budget=40, baseline_trials={t: [i % 2 == 0] for i, t in enumerate(tasks)},
                                candidate_trials={t: [True] for t in tasks})
    assert decide(state).decision == "continue"
    batch = next_batch(state, 10)
    wanted = batch_trials(batch)
    assert sum(n for per_task in wanted.values() for n in per_task.values()) == len(batch) == 10
    spent_before = state.spent_trials
    for model, per_task in wanted.items():
        for task_id, n in per_task.items():
            # Trial numbers continue after the first pass's trial 1; the first is unsound, one is missing.
            rows = [_row(task_id, 2 + k, "infrastructure_error" if k == 0 else "success") for k in range(n - 1)]
            record_trial_rows(state, model, task_id, n, rows)
    assert state.spent_trials == spent_before + 10  # every requested trial is spent, sound or not
    assert state.requested_trials == state.spent_trials  # nothing left awaiting an outcome
    with pytest.raises(ValueError, match="awaiting an outcome"):
        record_trial_rows(state, "baseline", tasks[0], 1, [_row(tasks[0], 9, "success")])
