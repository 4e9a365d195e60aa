"""The main flow: evaluate a task suite with one agent on a pool of VMs.

    plan the work -> provision pool -> per task, concurrently (at most pool-size at once):
        reset -> setup -> episode -> evaluate -> record
    -> summary (terminal table and Prefect table artifact)

This module is the pipeline as the Prefect UI shows it, read top to bottom (`_run`); the pieces
live beside it:

* flows/run_config.py    what defines a run (`SuiteRunConfig`) and what it gives back
* flows/run_plan.py      what is left to do: resume, the spool an earlier controller left, the lease
* flows/pool_engine.py   lanes, scheduling and the attempts of each task on one pool
* flows/attempt.py       one attempt: reset -> setup -> episode -> evaluate, with deadlines
* flows/shard.py         the same engine spread over worker hosts (`shards` > 0)
* flows/run_life.py      the run's states and how each end is stored and shown (the table)
* flows/run_summary.py   the summary of a finished run; flows/summary.py formats it
* flows/arena_run_deployment.py   `arena run`'s own flow run, which the Prefect UI can cancel
* flows/provenance.py, flows/budget.py, flows/progress.py   the `runs` row, budget, live progress

Every attempt is recorded as it ends; only infrastructure errors are retried
(adapters/outcomes.py); a run never looks complete when it is not (`RunCompleteness`); a budget
(`max_wall_seconds`, `max_cost_usd`, `max_tokens`) stops new work and ends the run
"budget_exhausted". Progress goes to a Prefect progress artifact (`waa-run-progress`) and to
`<artifacts_dir>/<run_id>/progress.json`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, tags
from prefect.context import FlowRunContext
from prefect.exceptions import TerminationSignal
from prefect.flow_engine import run_flow
from prefect.states import Failed, State
from prefect.task_runners import ThreadPoolTaskRunner

from adapters.agents import AgentOptions, build_agent
from adapters.benchmark import BenchmarkResult, BenchmarkTask
from adapters.store.duckdb_store import ResultStore
from adapters.store.errors import StoreUnavailable
from adapters.store.lease import Controller, Heartbeat
from adapters.store.postgres import set_connection_label
from adapters.store.spool import ResultSpool, spool_dir
from adapters.vms.base import VMProvider
from adapters.vms.janitor import sweep_run
from adapters.vms.registry import build_provider
from adapters.vms.warm_pool import WarmPool
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from flows import live_view
from flows.arena_run_deployment import create_arena_flow_run, flow_run_url, stopped_while_starting
from flows.budget import RunBudget
from flows.cancellation import settle_late_cancel, watch_cancellation
from flows.flow_run_heartbeats import flow_run_heartbeats, heartbeats_from_the_flow
from flows.pool_engine import PoolRunRequest, evaluate_on_pool
from flows.progress import RunProgress
from flows.provenance import run_info
from flows.run_config import STORE_FAILED, RunOutcome, SuiteRunConfig, new_run_id
from flows.run_life import RunLife, stopped_outcome, store_failed_outcome
from flows.run_plan import RunPlan, RunRefused, plan_run
from flows.run_states import outcome_of, run_state
from flows.run_summary import summarize
from flows.scheduling import WorkUnit, as_trial
from flows.summary import run_completeness

__all__ = ["RunRefused", "evaluate_suite", "flow_run_url", "run_name", "run_suite", "run_tags"]


def _flow_run_name() -> str:
    """Runs are named by how they started and their run id, which tells them apart, e.g.
    `ad-hoc-20261125-141345-a84240` or `nightly-scripted-bundled-local-20261125-020000-1f2e3d`."""
    from prefect.runtime import flow_run

    return run_name(SuiteRunConfig.model_validate(flow_run.parameters["config"]))


def run_name(config: SuiteRunConfig) -> str:
    """The flow run name of an evaluation: its trigger, its baseline when it is one, its run id."""
    baseline = f"{config.baseline}-" if config.baseline else ""
    return f"{config.trigger}-{baseline}{config.run_id or 'new'}"


def run_tags(config: SuiteRunConfig) -> list[str]:
    """The tags every flow run of an evaluation carries, to find it in the UI and the API."""
    suite = "bundled" if Path(config.suite_dir) == bundled_suite_dir() else Path(config.suite_dir).name
    tags = ["waa", f"trigger:{config.trigger}", f"agent:{config.agent}", f"suite:{suite}", f"provider:{config.provider}"]
    if config.baseline:
        tags.append(f"baseline:{config.baseline}")
    if config.agent_options.model:
        tags.append(f"model:{config.agent_options.model}")
    return tags


def _delete_run_resources(flow: Any, run: Any, state: Any) -> None:
    """Flow hook for cancelled or crashed runs: delete every cloud resource tagged with the run.

    A crash or cancellation can end the process before the flow's own `finally` tears the pool
    down; the tags make the leftovers findable from here (and by the janitor later).
    """
    config = SuiteRunConfig.model_validate(run.parameters["config"])
    if not config.run_id:
        return
    provider = build_provider(config.provider, config.provider_settings(config.run_id))
    try:
        if config.warm_pool:
            # The pool's VMs are kept for the next run, but must not go on billing.
            states = WarmPool(provider, config.warm_pool).down()
            get_run_logger().warning("run %s ended early; warm pool %s stopped (%d VM(s))", config.run_id,
                                     config.warm_pool, len(states))
        elif provider.owns_cloud_resources:
            report = sweep_run(provider, config.run_id)
            get_run_logger().warning("run %s ended early; %s", config.run_id, report.summary())
    finally:
        provider.close()


@flow(
    name="evaluate-suite",
    flow_run_name=_flow_run_name,
    on_cancellation=[_delete_run_resources],
    on_crashed=[_delete_run_resources],
)
def evaluate_suite(config: SuiteRunConfig) -> State:
    """Evaluate the configured suite and agent; results land in the store as each task finishes.
    Ends in the state that says what happened (flows/run_states.py), the RunOutcome as its data."""
    with flow_run_heartbeats():
        try:
            outcome = _evaluate(config)
        except RunRefused as refused:
            # The caller's input, not a crash: the message alone, no traceback in the run's logs;
            # `run_suite` raises it again for its caller (`arena run` prints it as one line).
            return Failed(message=f"Refused: {refused}", data=refused)
    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None:
        outcome.flow_run_id = str(context.flow_run.id)
    awaited = _outcomes.get(outcome.run_id)
    if awaited is not None:  # `run_suite` in this process waits for it
        awaited.outcome = outcome
        if awaited.on_outcome is not None:
            awaited.on_outcome(outcome)
    return run_state(outcome)


def _evaluate(config: SuiteRunConfig) -> RunOutcome:
    """The configured run, its provider closed at the end however the run ends."""
    run_id = config.run_id or new_run_id()
    catalog = WAATaskCatalog(
        config.suite_dir, difficulty=config.difficulty, max_steps=config.max_steps, require_supported=True
    )
    tasks = catalog.tasks(domains=config.domains, ids=config.task_ids)
    agent_options = config.resolved_agent_options()
    # Build the agent and the provider up front: a bad configuration fails before anything runs.
    agent_config = build_agent(config.agent, agent_options).config()
    provider = build_provider(config.provider, config.provider_settings(run_id))
    set_connection_label(f"arena run {run_id}")  # on a team store, who holds a lock is named by its run
    try:
        with ResultStore(config.store_location) as store:
            info = run_info(config, run_id, catalog, [t.task_id for t in tasks], agent_config, provider)
            spool = ResultSpool(spool_dir(config.artifacts_dir, run_id))
            plan = plan_run(config, run_id, tasks, store, info, Controller.this_process(), spool, get_run_logger())
            if plan.already_complete:
                budget = RunBudget.for_run(config, store, run_id)
                completeness = run_completeness(store, run_id, tasks, budget, plan.trials)
                return summarize(config, run_id, len(tasks), provider.environment, store, completeness, [], [], [])
            return _run(config, run_id, catalog, tasks, agent_options, provider, store, plan)
    finally:
        # Also when the run ends before its pool (refused, nothing left to do, the store failing
        # at the start): the provider may hold processes and folders already. Safe to repeat.
        provider.close()


def _run(config: SuiteRunConfig, run_id: str, catalog: WAATaskCatalog, tasks: list[BenchmarkTask],
         agent_options: AgentOptions, provider: VMProvider, store: ResultStore, plan: RunPlan) -> RunOutcome:
    """The run's work on `provider`'s VMs (or its shards), from its budget to its end."""
    logger = get_run_logger()
    budget = RunBudget.for_run(config, store, run_id)
    progress = RunProgress(
        run_id, len(plan.wanted), len(plan.wanted) - len(plan.todo), config.artifacts_dir / run_id / "progress.json",
        scoring=config.scoring, cost=budget.cost_usd, trials_per_task=plan.trials if plan.with_trials else None,
        done_per_task=plan.done_per_task,
    )
    live_view.link_run_page(run_id)
    request = PoolRunRequest(config, run_id, catalog, provider, agent_options, store, budget, progress)
    life = RunLife(run_id, request.cancelled, lambda: run_completeness(store, run_id, tasks, budget, plan.trials))
    request.on_stop = life.on_stop(store)
    results: list[BenchmarkResult] = []
    shard_errors: list[str] = []
    try:
        with watch_cancellation(request.cancelled), Heartbeat(lambda: store.heartbeat(run_id, Controller.this_process())):
            results, shard_errors = _work(config, run_id, catalog, provider, store, budget, progress, request, plan.todo)
        life.finished(run_completeness(store, run_id, tasks, budget, plan.trials), request.unstored)
    except StoreUnavailable as exc:
        life.store_failed(exc)
    except (KeyboardInterrupt, TerminationSignal) as stop:
        life.stopped(stop)  # the flow ends in Cancelled, never Crashed
    except BaseException as error:
        if not life.failed_while_cancelled(error):
            raise
        logger.exception("run %s: an error while the cancelled run was stopping", run_id)
        if not isinstance(error, Exception):
            raise  # Prefect's own signals, an interpreter exit: they go on, once the status is stored
    finally:
        life.record_end(store, logger)
        progress.finish(life.status)
    if life.status == STORE_FAILED:
        return store_failed_outcome(config, run_id, store, life, request.unstored, results, logger)
    if life.stopped_by is not None:
        return stopped_outcome(run_id, store, life, results, logger)
    assert life.completeness is not None
    hedging = request.hedging
    return summarize(
        config, run_id, len(tasks), provider.environment, store, life.completeness, results, request.problems,
        shard_errors, hedging.stats.describe(hedging.max_extra) if hedging is not None else None,
    )


def _work(config: SuiteRunConfig, run_id: str, catalog: WAATaskCatalog, provider: VMProvider, store: ResultStore,
          budget: RunBudget, progress: RunProgress, request: PoolRunRequest,
          todo: list[WorkUnit]) -> tuple[list[BenchmarkResult], list[str]]:
    """Run `todo` on this pool, or as shards on worker hosts: the last attempt of each task, and
    one error line per shard that returned nothing."""
    if not config.shards:
        return evaluate_on_pool(request, todo), []
    # Imported here: flows.shard runs this flow's engine on worker hosts and imports from this
    # package; the shard path is the rarer one.
    from flows.shard import evaluate_on_shards

    provider.close()  # each shard brings up its own VMs on its host
    shard_tasks = [as_trial(u).task for u in todo]  # shards run single-trial runs only (run_config)
    return evaluate_on_shards(config, run_id, catalog, shard_tasks, store, budget, progress)


@dataclass
class _Awaited:
    """An evaluation `run_suite` started in this process: its outcome once the flow has it, and
    who hears of it before Prefect has finished the flow run."""

    on_outcome: Callable[[RunOutcome], None] | None = None
    outcome: RunOutcome | None = None


# The evaluations `run_suite` started in this process, by run id. The flow's final state carries
# the outcome too, but when the server had already taken that state (the client resent it after
# losing the server's answer: a loaded server, a proxy blip), Prefect rejects the copy as a
# duplicate and hands back the server's own state, without the data: a run that completed would
# end in a MissingResult traceback (seen with three `arena run`s at once).
_outcomes: dict[str, _Awaited] = {}


def run_suite(config: SuiteRunConfig, announce: Callable[[str], None] | None = None,
              on_outcome: Callable[[RunOutcome], None] | None = None) -> RunOutcome:
    """Run the evaluation with a task runner sized to the pool and return its outcome (the run
    id is fixed up front, so the cancellation hook can find the run's cloud resources by tag).

    Inside another flow (a baseline, the nightly) it is that flow's subflow. On its own (`arena
    run`) it is a run of the `evaluate-suite/arena-run` deployment executed in this process, so
    the Prefect UI can cancel it (flows/arena_run_deployment.py); `announce` is then given its
    page's URL before it starts.

    `on_outcome(outcome)` is called as soon as the flow has its outcome (its results stored, the
    store closed), while Prefect still finishes the flow run (its final state, its last events):
    for work on the stored results that may overlap that, such as the HTML report.
    It runs inside the flow, so it must return at once and not raise (start a thread)."""
    run_id = config.run_id or new_run_id()
    if config.run_id is None:
        config = config.model_copy(update={"run_id": run_id})
    flow = evaluate_suite.with_options(task_runner=ThreadPoolTaskRunner(max_workers=config.pool_size))
    _outcomes[run_id] = _Awaited(on_outcome)
    try:
        if FlowRunContext.get() is not None:
            with tags(*run_tags(config)):
                state = flow(config, return_state=True)
        else:
            flow_run = create_arena_flow_run(evaluate_suite, config, run_name(config), run_tags(config))
            try:
                if announce is not None and (url := flow_run_url(flow_run.id)):
                    announce(url)
                with heartbeats_from_the_flow():
                    state = run_flow(flow, flow_run=flow_run, parameters={"config": config}, return_type="state")
            except (KeyboardInterrupt, TerminationSignal) as stop:
                stopped_while_starting(flow_run.id, stop)
                raise
            if (kept := _outcomes[run_id].outcome) is not None:
                settle_late_cancel(flow_run.id, run_state(kept))
        # The outcome as the flow produced it in this process; only when it did not get that far
        # (it crashed) is the final state read, which raises the crash.
        kept = _outcomes[run_id].outcome
        return kept if kept is not None else outcome_of(state)
    finally:
        _outcomes.pop(run_id, None)
