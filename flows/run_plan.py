"""The first step of a run: what is left to do, with the run recorded and its lease taken.

    plan = plan_run(config, run_id, tasks, store, info, controller, spool, logger)

A run id seen before is a resume: results an earlier controller left in its spool are written
first (they count as done), every (task, trial) with a final result is skipped, and a finished run
asked for again with the same configuration has nothing to do (`RunPlan.already_complete`). A run
id the store refuses as asked (another configuration or selection, a live controller elsewhere)
is `RunRefused`: the caller's input, one line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from adapters.benchmark import BenchmarkTask
from adapters.store.duckdb_store import ResultStore, RunInfo, configuration_change, selection_change
from adapters.store.errors import StoreError, StoreUnavailable
from adapters.store.lease import Controller
from adapters.store.spool import ResultSpool, drain_spool
from flows.run_config import SuiteRunConfig
from flows.scheduling import TaskTrial, WorkUnit


class RunRefused(StoreError):
    """The store refused to start the run as asked: its run id exists with another configuration
    or selection, or another controller holds it. The message is the store's one line (a
    StoreError still, for callers that catch those)."""


@dataclass
class RunPlan:
    """The units of work of a run: each wanted trial of each task, and those still to do."""

    wanted: list[TaskTrial]
    finished: set[tuple[str, int]]
    todo: list[WorkUnit]
    trials: dict[str, int]  # trials wanted per task
    already_complete: bool = False  # a finished run asked for again: nothing to do
    done_per_task: dict[str, int] = field(default_factory=dict)

    @property
    def with_trials(self) -> bool:
        return any(k > 1 for k in self.trials.values())


def start_run(store: ResultStore, info: RunInfo, **options: Any) -> None:
    """`store.start_run`, its refusal of the run as asked a `RunRefused` (a store that cannot be
    reached stays `StoreUnavailable`: the run waits for it, exit 6)."""
    try:
        store.start_run(info, **options)
    except StoreUnavailable:
        raise
    except StoreError as exc:
        raise RunRefused(str(exc)) from None


def plan_run(config: SuiteRunConfig, run_id: str, tasks: list[BenchmarkTask], store: ResultStore, info: RunInfo,
             controller: Controller, spool: ResultSpool, logger: logging.Logger | logging.LoggerAdapter[Any]) -> RunPlan:
    """The run's work (see the module docstring); unless it is already complete, the run is
    recorded as started (or resumed) by `controller`."""
    stored = store.get_run(run_id)
    if stored is not None and len(spool):
        # Results an earlier controller of this run could not store: written first, so they count
        # as done (it took the lease: no one else writes this run meanwhile).
        start_run(store, info, resume=True, change_selection=config.change_selection, controller=controller)
        written, left = drain_spool(spool, lambda results: store.record_results(run_id, results))
        logger.warning("run %s: wrote %d result(s) an earlier controller left in its spool %s%s", run_id, written,
                       spool.directory, f"; {left} could not be written" if left else "")
        stored = store.get_run(run_id)
    wanted = [TaskTrial(t, k) for t in tasks for k in range(1, config.trials_of(t.task_id) + 1)]
    finished = store.finished_trials(run_id) & {(u.task_id, u.trial) for u in wanted}
    plan = RunPlan(
        wanted=wanted, finished=finished,
        todo=[u.task if u.trial == 1 else u for u in wanted if (u.task_id, u.trial) not in finished],
        trials={t.task_id: config.trials_of(t.task_id) for t in tasks},
    )
    for task_id, _ in finished:
        plan.done_per_task[task_id] = plan.done_per_task.get(task_id, 0) + 1
    if finished:
        logger.info("Resuming run %s: %d of %d %s already have final results", run_id, len(finished), len(wanted),
                    "trials" if plan.with_trials else "tasks")
    if (stored is not None and stored.status == "completed" and not plan.todo and not config.change_selection
            and selection_change(run_id, stored.selected_task_ids, info.selected_task_ids or []) is None
            and configuration_change(stored.model_dump(), info) is None):
        # Resuming a finished run: nothing to do, and its record (finish time) stays as it is.
        logger.info("Run %s is already complete; nothing to do", run_id)
        plan.already_complete = True
        return plan
    start_run(store, info, resume=stored is not None, change_selection=config.change_selection, controller=controller)
    return plan
