"""The main flow: evaluate a task suite with one agent on a pool of VMs.

    provision pool -> per task, concurrently (at most pool-size at once):
        reset -> setup -> episode -> evaluate -> record
    -> summary (terminal table and Prefect table artifact)

This module is the pipeline as the Prefect UI shows it; the pieces live beside it:

* flows/run_config.py    what defines a run (`SuiteRunConfig`) and what it gives back
* flows/pool_engine.py   lanes, scheduling and the attempts of each task on one pool
* flows/attempt.py       one attempt: reset -> setup -> episode -> evaluate, with deadlines
* flows/shard.py         the same engine spread over worker hosts (`shards` > 0)
* flows/provenance.py    the run's `runs` row
* flows/budget.py, flows/progress.py, flows/summary.py   budget, live progress, the summary

Hardening: every attempt is recorded as it ends; only infrastructure errors are retried
(adapters/outcomes.py); a run never looks complete when it is not (`RunCompleteness`); a budget
(`max_wall_seconds`, `max_cost_usd`, `max_tokens`) stops new work and ends the run
"budget_exhausted". Progress goes to a Prefect progress artifact (`waa-run-progress`) and to
`<artifacts_dir>/<run_id>/progress.json`, since the DuckDB file is locked by the running
controller.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, get_client, get_run_logger, tags
from prefect.context import FlowRunContext
from prefect.flow_engine import run_flow
from prefect.states import Failed, State
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.exceptions import TerminationSignal
from prefect.task_runners import ThreadPoolTaskRunner

from adapters.agents import AgentOptions, build_agent
from adapters.results.metrics import compute_run_metrics
from adapters.benchmark import BenchmarkResult, BenchmarkTask
from adapters.store.duckdb_store import ResultStore, configuration_change, selection_change
from adapters.store.errors import StoreError, StoreUnavailable, error_text
from adapters.store.lease import Controller, Heartbeat
from adapters.store.postgres import set_connection_label
from adapters.store.recorder import RecorderClose
from adapters.store.spool import ResultSpool, drain_spool, spool_dir
from adapters.vms.base import VMProvider
from adapters.vms.janitor import sweep_run
from adapters.vms.registry import build_provider
from adapters.vms.warm_pool import WarmPool
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from flows import live_view
from flows.bookkeeping import best_effort, slug
from flows.budget import RunBudget
from flows.cancellation import cancellation_requested, settle_late_cancel, watch_cancellation
from flows.flow_run_heartbeats import flow_run_heartbeats, heartbeats_from_the_flow
from flows.pool_engine import PoolRunRequest, evaluate_on_pool
from flows.progress import RunProgress
from flows.provenance import code_revision, run_info
from flows.run_config import STORE_FAILED, RunOutcome, SuiteRunConfig, new_run_id
from flows.run_states import outcome_of, run_state
from flows.scheduling import TaskTrial, WorkUnit, as_trial
from flows.summary import (
    RunCompleteness,
    format_summary,
    problem_sections,
    run_completeness,
    summary_markdown,
    summary_rows,
    trial_statistics,
    trials_section,
)


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


class RunRefused(StoreError):
    """The store refused to start the run as asked: its run id exists with another configuration
    or selection, or another controller holds it. The message is the store's one line (a
    StoreError still, for callers that catch those)."""


def _start_run(store: ResultStore, info: Any, **options: Any) -> None:
    """`store.start_run`, its refusal of the run as asked a `RunRefused` (a store that cannot be
    reached stays `StoreUnavailable`: the run waits for it, exit 6)."""
    try:
        store.start_run(info, **options)
    except StoreUnavailable:
        raise
    except StoreError as exc:
        raise RunRefused(str(exc)) from None


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
    try:
        return _evaluate_on(config, run_id, catalog, tasks, agent_options, agent_config, provider)
    finally:
        # Also when the run ends before its pool (refused, nothing left to do, the store failing
        # at the start): the provider may hold processes and folders already. Safe to repeat.
        provider.close()


def _evaluate_on(config: SuiteRunConfig, run_id: str, catalog: WAATaskCatalog, tasks: list[BenchmarkTask],
                 agent_options: AgentOptions, agent_config: dict[str, Any], provider: VMProvider) -> RunOutcome:
    """The run of `tasks` on `provider`'s VMs, from recording its start to its summary."""
    logger = get_run_logger()
    environment = provider.environment
    controller = Controller.this_process()
    spool = ResultSpool(spool_dir(config.artifacts_dir, run_id))
    set_connection_label(f"arena run {run_id}")  # on a team store, who holds a lock is named by its run
    with ResultStore(config.store_location) as store:
        stored = store.get_run(run_id)
        info = run_info(config, run_id, catalog, [t.task_id for t in tasks], agent_config, provider)
        if stored is not None and len(spool):
            # Results an earlier controller of this run could not store: written first, so
            # they count as done (it took the lease: no one else writes this run meanwhile).
            _start_run(store, info, resume=True, change_selection=config.change_selection, controller=controller)
            written, left = drain_spool(spool, lambda results: store.record_results(run_id, results))
            logger.warning("run %s: wrote %d result(s) an earlier controller left in its spool %s%s", run_id, written,
                           spool.directory, f"; {left} could not be written" if left else "")
            stored = store.get_run(run_id)
        # The units of work: each wanted trial of each task (a single-trial run: its tasks).
        wanted = [TaskTrial(t, k) for t in tasks for k in range(1, config.trials_of(t.task_id) + 1)]
        finished = store.finished_trials(run_id) & {(u.task_id, u.trial) for u in wanted}
        todo: list[WorkUnit] = [u.task if u.trial == 1 else u for u in wanted if (u.task_id, u.trial) not in finished]
        trials = {t.task_id: config.trials_of(t.task_id) for t in tasks}
        with_trials = any(k > 1 for k in trials.values())
        if finished:
            logger.info("Resuming run %s: %d of %d %s already have final results", run_id, len(finished), len(wanted),
                        "trials" if with_trials else "tasks")
        if (stored is not None and stored.status == "completed" and not todo and not config.change_selection
                and selection_change(run_id, stored.selected_task_ids, info.selected_task_ids or []) is None
                and configuration_change(stored.model_dump(), info) is None):
            # Resuming a finished run: nothing to do, and its record (finish time) stays as it is.
            logger.info("Run %s is already complete; nothing to do", run_id)
            completeness = run_completeness(store, run_id, tasks, RunBudget.for_run(config, store, run_id), trials)
            return _summarize(config, run_id, len(tasks), environment, store, completeness, [], [], [])
        _start_run(store, info, resume=stored is not None, change_selection=config.change_selection,
                   controller=controller)
        budget = RunBudget.for_run(config, store, run_id)
        done_per_task: dict[str, int] = {}
        for task_id, _ in finished:
            done_per_task[task_id] = done_per_task.get(task_id, 0) + 1
        progress = RunProgress(
            run_id, len(wanted), len(wanted) - len(todo), config.artifacts_dir / run_id / "progress.json",
            scoring=config.scoring, cost=budget.cost_usd,
            trials_per_task=trials if with_trials else None, done_per_task=done_per_task,
        )
        _link_live_view(run_id)
        status = "failed"
        shard_errors: list[str] = []
        request = PoolRunRequest(config, run_id, catalog, provider, agent_options, store, budget, progress)
        store_failure: str | None = None
        results: list[BenchmarkResult] = []
        stopped_by: str | None = None
        completeness: RunCompleteness | None = None

        def counted_so_far() -> RunCompleteness | None:
            """The run's results on the way out of a stop (best effort: the store may be why)."""
            return best_effort("counting the run's results",
                               lambda: run_completeness(store, run_id, tasks, budget, trials), retry_for=0)

        stop_seen: tuple[str, str] | None = None

        def stopped(stop: BaseException | None) -> tuple[str, str]:
            """A stopped run's status and who stopped it: "prefect" for a cancellation (also one
            that came with a runner's SIGTERM), else "ctrl-c" or "sigterm". Asked once."""
            nonlocal stop_seen
            if stop_seen is None:
                if request.cancelled.is_set() or cancellation_requested():
                    stop_seen = ("cancelled", "prefect")
                else:
                    stop_seen = ("interrupted", "ctrl-c" if isinstance(stop, KeyboardInterrupt) else "sigterm")
            return stop_seen

        def store_stop(stop: BaseException | None) -> None:
            # Before the pool's teardown (PoolRunRequest.on_stop); stored again with the rest below.
            status = stopped(stop)[0]
            best_effort(f"storing the run's status ({status})", lambda: store.finish_run(run_id, status), retry_for=0)

        request.on_stop = store_stop

        try:
            with watch_cancellation(request.cancelled), Heartbeat(lambda: store.heartbeat(run_id, controller)):
                if config.shards:
                    # Imported here: flows.shard runs this flow's engine on worker hosts and
                    # imports from this package; the shard path is the rarer one.
                    from flows.shard import evaluate_on_shards

                    provider.close()  # each shard brings up its own VMs on its host
                    shard_tasks = [as_trial(u).task for u in todo]  # shards run single-trial runs only (run_config)
                    results, shard_errors = evaluate_on_shards(config, run_id, catalog, shard_tasks, store, budget,
                                                               progress)
                else:
                    results = evaluate_on_pool(request, todo)
            completeness = run_completeness(store, run_id, tasks, budget, trials)
            if request.unstored is not None:
                store_failure = request.unstored.outage or "the store did not take every result"
                status = STORE_FAILED
            elif request.cancelled.is_set():
                status, stopped_by = stopped(None)
            else:
                status = completeness.status
        except StoreUnavailable as exc:
            # The store failed outside the recorder (reading the run back at its end): results
            # the recorder could not store are in the spool; the run ends as a store failure.
            store_failure, status = error_text(exc), STORE_FAILED
        except (KeyboardInterrupt, TerminationSignal) as stop:
            # Ctrl-C, a runner stopping a cancelled run, another SIGTERM: recorded attempts stand
            # and a resume finishes the run. The flow ends in Cancelled, never Crashed.
            status, stopped_by = stopped(stop)
            completeness = counted_so_far()
        except BaseException as error:
            # An error on the way out of a cancelled run (a runner's SIGTERM can land in the
            # middle of the stop and its teardown): the run was cancelled, not failed, so it is
            # stored as such and resumes as such; the error is logged for what it is. Any other
            # error fails the run.
            if not (request.cancelled.is_set() or cancellation_requested()):
                raise
            logger.exception("run %s: an error while the cancelled run was stopping", run_id)
            status, stopped_by = "cancelled", "prefect"
            completeness = counted_so_far()
            if not isinstance(error, Exception):
                raise  # Prefect's own signals, an interpreter exit: they go on, once the status is stored
        finally:
            try:
                store.finish_run(run_id, status)
            except StoreUnavailable as exc:
                # The run's row stays `running`; its controller's heartbeat stops, so reports show
                # it abandoned, and `arena run --run-id` resumes it.
                logger.error("run %s: its final status (%s) could not be stored: %s", run_id, status, error_text(exc))
                store_failure = store_failure or error_text(exc)
                status = STORE_FAILED
            progress.finish(status)
        if status == STORE_FAILED:
            return _store_failed(config, run_id, store, store_failure or "unknown", request.unstored, results)
        if stopped_by is not None:
            return _stopped(run_id, store, status, stopped_by, results, completeness)
        hedging = request.hedging
        return _summarize(
            config, run_id, len(tasks), environment, store, completeness, results, request.problems, shard_errors,
            hedging.stats.describe(hedging.max_extra) if hedging is not None else None,
        )


def _link_live_view(run_id: str) -> None:
    """The run's live view (flows/live_view.py), when this process serves one, linked from the
    run's Prefect page: a local address, for whoever watches on this machine."""
    url = live_view.current_url()
    if url is not None:
        best_effort("linking the live view", lambda: create_link_artifact(
            key=f"waa-live-{slug(run_id)}", link=url, link_text="what the agents see now (this machine only)",
            description=f"WAA run {run_id}: each VM's latest screen, task, step and action, while the run goes"))


def _stopped(run_id: str, store: ResultStore, status: str, stopped_by: str, results: list[BenchmarkResult],
             completeness: RunCompleteness | None) -> RunOutcome:
    """The end of a run someone stopped (Ctrl-C, SIGTERM, Prefect's Cancel): the attempts recorded
    so far stand, and a resume (`--run-id`) finishes the run."""
    how = {"prefect": "cancelled from Prefect", "ctrl-c": "interrupted (Ctrl-C)", "sigterm": "stopped (SIGTERM)"}
    line = f"run {run_id} was {how[stopped_by]}; attempts recorded so far are kept"
    get_run_logger().warning("%s", line)
    return RunOutcome(run_id=run_id, store=store.location, results=results, table=line, status=status,
                      completeness=completeness, stopped_by=stopped_by)


def _store_failed(
    config: SuiteRunConfig, run_id: str, store: ResultStore, cause: str, unstored: RecorderClose | None,
    results: list[BenchmarkResult],
) -> RunOutcome:
    """The end of a run whose store failed: no summary (the store cannot be read back), one line
    saying why and what waits where, and how to finish the run."""
    spooled = len(unstored.spooled) if unstored else 0
    lost = len(unstored.lost) if unstored else 0
    where = spool_dir(config.artifacts_dir, run_id)
    line = (f"the results store failed ({cause})" + (f"; {spooled} finished result(s) wait in {where}" if spooled else "")
            + (f"; {lost} result(s) could not be written anywhere (their tasks run again)" if lost else ""))
    get_run_logger().error("run %s: %s", run_id, line)
    return RunOutcome(run_id=run_id, store=store.location, results=results, table=line, status=STORE_FAILED,
                      store_failure=cause, spooled=spooled, lost=lost)


def _summarize(
    config: SuiteRunConfig, run_id: str, selected: int, environment: str, store: ResultStore,
    completeness: RunCompleteness, results: list[BenchmarkResult], pool_errors: list[str], shard_errors: list[str],
    hedging: str | None = None,
) -> RunOutcome:
    """The run's summary: in the log, as the summary artifacts, and as the flow's return value.
    `hedging`: what hedge copies did and cost (flows/hedging.py), when any ran."""
    logger = get_run_logger()
    summary = compute_run_metrics(store, run_id)
    extra_text, extra_markdown = problem_sections(pool_errors, shard_errors)
    if hedging is not None:
        extra_text, extra_markdown = f"\n{hedging}" + extra_text, f"\n\n{hedging}" + extra_markdown
    # pass@k is for the K this run asked for of every task (not the most trials one task got).
    trials = trial_statistics(store.latest_attempts(run_id), config.trials)
    trials_text, trials_markdown = trials_section(trials)
    extra_text, extra_markdown = trials_text + extra_text, trials_markdown + extra_markdown
    table = format_summary(run_id, summary, environment, completeness, trials) + extra_text
    markdown = summary_markdown(run_id, summary, environment, completeness, trials) + extra_markdown
    logger.info("Run summary\n%s", table)
    if completeness.missing:
        logger.warning(
            "run %s is %s: %d of %d selected tasks have no final result",
            run_id, completeness.status, completeness.missing, completeness.selected,
        )
    description = f"WAA run {run_id}: {config.agent} agent on {selected} tasks ({environment}), {completeness.status}"
    rows = summary_rows(summary, completeness, config.vm_hour_price_usd, trials)
    # One series per baseline (its nights side by side in the UI's artifact history), else per run.
    series = slug(config.baseline or run_id)
    best_effort("publishing the summary table artifact",
                lambda: create_table_artifact(key=f"waa-summary-{series}", table=rows, description=description))
    best_effort("publishing the summary report artifact",
                lambda: create_markdown_artifact(key=f"waa-report-{series}", markdown=markdown, description=description))
    return RunOutcome(
        run_id=run_id,
        store=store.location,
        results=results,
        table=table,
        status=completeness.status,
        completeness=completeness,
        shard_errors=shard_errors,
        pool_errors=pool_errors,
    )


# The deployment `arena run`'s flow runs belong to. Nothing serves it (its runs execute in the
# `arena run` process that creates them, and it is paused so no one starts one from the UI);
# it is there because Prefect's UI offers Cancel only on runs of a deployment.
ARENA_RUN_DEPLOYMENT = "arena-run"


def run_suite(config: SuiteRunConfig, announce: Callable[[str], None] | None = None,
              on_outcome: Callable[[RunOutcome], None] | None = None) -> RunOutcome:
    """Run the evaluation with a task runner sized to the pool and return its outcome (the run
    id is fixed up front, so the cancellation hook can find the run's cloud resources by tag).

    Inside another flow (a baseline, the nightly) it is that flow's subflow. On its own (`arena
    run`) it is a run of the `evaluate-suite/arena-run` deployment executed in this process, so
    the Prefect UI can cancel it; `announce` is then given its page's URL before it starts.

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
            flow_run = create_arena_flow_run(config)
            try:
                if announce is not None:
                    url = flow_run_url(flow_run.id)
                    if url:
                        announce(url)
                with heartbeats_from_the_flow():
                    state = run_flow(flow, flow_run=flow_run, parameters={"config": config}, return_type="state")
            except (KeyboardInterrupt, TerminationSignal) as stop:
                _stopped_while_starting(flow_run.id, stop)
                raise
            kept = _outcomes[run_id].outcome
            if kept is not None:
                settle_late_cancel(flow_run.id, run_state(kept))
        # The outcome as the flow produced it in this process; only when it did not get that far
        # (it crashed) is the final state read, which raises the crash.
        kept = _outcomes[run_id].outcome
        return kept if kept is not None else outcome_of(state)
    finally:
        _outcomes.pop(run_id, None)


def _stopped_while_starting(flow_run_id: Any, stop: BaseException) -> None:
    """A Ctrl-C or SIGTERM that reached `arena run` before the flow's own stop could handle it:
    while the flow run was announced or its engine started (Prefect leaves the run Scheduled,
    and nothing would ever run it), or in the run's set-up (Prefect's engine calls any interrupt
    a crash). The flow run ends as a run stopped later does: Cancelled, saying by what."""
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled

    how = "Interrupted (Ctrl-C)" if isinstance(stop, KeyboardInterrupt) else "Stopped (SIGTERM)"

    def cancel() -> None:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run_id).state
            if state is None or not state.is_final() or state.type == StateType.CRASHED:
                left = "no state" if state is None else state.name
                client.set_flow_run_state(flow_run_id, Cancelled(message=f"{how} while the run was starting "
                                                                         f"(Prefect had it {left})"), force=True)

    best_effort("marking the stopped flow run Cancelled", cancel, retry_for=0, log_to_api=False)


def create_arena_flow_run(config: SuiteRunConfig) -> Any:
    """A new flow run of the `arena-run` deployment for `config` (its run id set), which the
    calling process then executes.

    The creation carries an idempotency key (the run id and a token of this call): Prefect's
    client sends a request again when its answer does not arrive (a busy server answering after
    the client's timeout, a dropped connection), and without the key the server made a second
    flow run that nobody executes: a ghost run left Scheduled in the UI beside the real one. The
    token makes a resume of the same run id a new flow run, not the earlier one again."""
    with get_client(sync_client=True) as client:
        return client.create_flow_run_from_deployment(
            _arena_run_deployment(client), parameters={"config": config.model_dump(mode="json")},
            tags=run_tags(config), name=run_name(config),
            idempotency_key=f"{ARENA_RUN_DEPLOYMENT}/{config.run_id}/{uuid.uuid4().hex}",
        )


def flow_run_url(flow_run_id: Any) -> str | None:
    """The flow run's page in the Prefect UI of the current server, or None when unknown."""
    from prefect.settings import PREFECT_UI_URL

    base = PREFECT_UI_URL.value()
    return f"{str(base).rstrip('/')}/runs/flow-run/{flow_run_id}" if base else None


_deployments: dict[str, Any] = {}

_ARENA_RUN_TAGS = ["waa"]
_ARENA_RUN_DESCRIPTION = ("Runs started by `arena run` (executed in that process; nothing serves this deployment, "
                          "and it is paused). Start runs with `arena run`, not from here.")


def _arena_run_deployment(client: Any) -> Any:
    """The id of `evaluate-suite/arena-run` on the current Prefect server (read with `client`, a
    sync Prefect client), registered when it is missing or not as this code would register it."""
    from prefect.settings import PREFECT_API_URL

    server = str(PREFECT_API_URL.value())
    if server not in _deployments:
        version = code_revision() or evaluate_suite.version
        _deployments[server] = _current_arena_run_deployment(client, version) or evaluate_suite.to_deployment(
            name=ARENA_RUN_DEPLOYMENT, version=version, paused=True, tags=_ARENA_RUN_TAGS,
            description=_ARENA_RUN_DESCRIPTION,
        ).apply()
    return _deployments[server]


def _current_arena_run_deployment(client: Any, version: str) -> Any:
    """The registered deployment's id when it is what `to_deployment(...).apply()` would make of
    this code (its `version`: the git revision, else Prefect's hash of the flow's source, given
    explicitly because Prefect's own choice depends on the folder it runs in; its parameters'
    schema; paused; tags and description), else None. Reading it takes about 50 ms; registering it
    again, about 0.3 s of every `arena run`'s start (measured here), when it is nearly always there
    already."""
    from prefect.exceptions import ObjectNotFound
    from prefect.utilities.callables import parameter_schema

    try:
        found = client.read_deployment_by_name(f"{evaluate_suite.name}/{ARENA_RUN_DEPLOYMENT}")
    except ObjectNotFound:
        return None
    wanted_schema = parameter_schema(evaluate_suite).model_dump(exclude_unset=True)
    current = (found.version == version and found.paused and sorted(found.tags) == _ARENA_RUN_TAGS
               and found.description == _ARENA_RUN_DESCRIPTION and found.parameter_openapi_schema == wanted_schema)
    return found.id if current else None
