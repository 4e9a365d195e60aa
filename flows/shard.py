"""Shard mode: one suite run spread over worker hosts, each shard on its own VM pool.

The controller (`evaluate_suite` with `shards` > 0) splits the tasks still to do into balanced
shards and starts each as a flow run of the `evaluate-shard` deployment (`run_deployment(...,
timeout=0)`), so they run at the same time on whatever workers poll the shard work pool:

    controller (evaluate-suite)                      worker host A / B / ... (evaluate-shard)
      split todo longest-first into N shards  ---->   own VM pool, lanes, attempts (the same
      wait for the N flow runs                         `evaluate_on_pool` as the local mode),
      record every returned attempt  <-------------    attempts in a DuckDB file local to the
      into the run's DuckDB file                       run; returns them as its flow result

Why this shape:

* DuckDB allows one writing process per file, so a shard never writes the controller's file: it
  records into a file of its own on its host (`<run_id>-shard<k>-<flow run id>.duckdb` in
  `shard_db_dir()`: by default `results/shards` of the host's checkout) and returns every
  attempt as its flow run's JSON result. The controller records them, so resume,
  summary, progress and comparisons read one file exactly as in the local mode.
* Each shard names its pool, its concurrency limit and its cloud resources with its own id
  (`resource_id(run_id, k)`): a shard's teardown sweeps everything tagged with that id, and the
  first shard to finish must not delete the VMs of the others.
* Attempt numbers of a resumed run live in the controller's file, so the controller passes each
  task's next attempt number down; screenshots and rows then never reuse an earlier attempt's.
* A shard that fails, crashes, is cancelled, never starts, or returns an unreadable result
  contributes nothing: its tasks have no final result, the run is "incomplete" with the usual
  missing count, and `RunOutcome.shard_errors` (plus the summary and the log) names its flow run.
  A resume (same run id) runs exactly those tasks again.

What a shard needs from its host: the project checked out at `ARENA_PROJECT_DIR` (the deployment's
pull step); the same suite content (checked by hash); results storage the controller can read
(the flow result, see docs/deployments.md); and for screenshots in the report, `artifacts_dir` on
a filesystem shared by every host at the same path.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.context import FlowRunContext
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run as runtime_flow_run
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelled, Cancelling
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, Field

from adapters.agents import build_agent
from adapters.benchmark import BenchmarkResult, BenchmarkTask
from adapters.store.duckdb_store import ResultStore
from adapters.store.writers import IssuedTicket, ShardTicket, new_ticket
from adapters.vms.janitor import sweep_run
from adapters.vms.registry import build_provider
from adapters.waa.catalog import WAATaskCatalog
from flows.budget import RunBudget
from flows.pool_engine import PoolRunRequest, evaluate_on_pool, longest_first, resource_id
from flows.progress import RunProgress, progress_line
from flows.provenance import code_revision, run_info
from flows.run_config import SuiteRunConfig
from flows.shard_signing import check_shard_signature, check_shard_ticket, shard_idempotency_key, sign_shard
from flows.summary import run_completeness
from tasks.record import record_result

PROJECT_DIR = Path(__file__).resolve().parents[1]
# Where a worker host keeps its shards' DuckDB files.
SHARD_DB_DIR_ENV = "ARENA_SHARD_DB_DIR"

# How often the controller reads the state of its shard runs; a shard runs for minutes on real
# VMs, so a few seconds of delay in noticing its end costs nothing.
SHARD_POLL_SECONDS = 2.0
# A shard's ticket may be spent until its run's shard start timeout has passed since it was
# issued, plus this margin: the controller cancels a shard still scheduled at the timeout, and a
# worker that took it a moment before needs a little longer to start it.
TICKET_SLACK_SECONDS = 60.0
# SuiteRunConfig.pool_size's upper bound. A shard runs one lane thread per VM; its task runner is
# pinned to this many threads so that a worker host's PREFECT_TASK_RUNNER_THREAD_POOL_MAX_WORKERS
# (Prefect's default is unbounded) cannot leave lanes waiting for a thread.
MAX_POOL_SIZE = 64


class ShardError(RuntimeError):
    """A shard returned no usable results; the message names its flow run."""


class ShardWorker(BaseModel):
    """Where a shard ran: enough to tell hosts and workers apart in the report and the tests."""

    hostname: str
    pid: int
    worker_name: str | None = None  # the Prefect worker that started the run (PREFECT__WORKER_NAME)
    prefect_home: str | None = None
    flow_run_id: str | None = None
    code_revision: str | None = None


class ShardOutcome(BaseModel):
    """What a shard returns (as JSON) to its controller: every attempt it recorded."""

    run_id: str
    shard: int
    shards: int
    task_ids: list[str]
    status: str  # completed / incomplete / budget_exhausted, over the shard's own tasks
    attempts: list[BenchmarkResult] = Field(default_factory=list)  # in the order they were recorded
    budget_reason: str | None = None
    vm_cost_usd: float = 0.0  # the shard pool's VM-hours * vm_hour_price_usd
    store: str  # where the shard recorded its attempts: its own DuckDB file on its host, or the team store
    in_team_store: bool = False  # the attempts are already in the run's store (the controller's too)
    worker: ShardWorker


class ShardProgress(RunProgress):
    """A shard's progress (artifact on its run page, side file next to its screenshots), which
    also keeps every attempt recorded, to return them to the controller.

    `RunProgress.recorded` is called once per recorded attempt by the shared lane code, so this
    collects exactly what went into the shard's file, infrastructure-error attempts included.
    """

    ARTIFACT_PREFIX = "waa-shard-progress"

    def __init__(self, run_id: str, shard: int, selected: int, side_file: Path | None, scoring: str = "strict") -> None:
        self.shard = shard
        self.attempts_recorded: list[BenchmarkResult] = []
        self._attempts_lock = threading.Lock()
        super().__init__(run_id, selected, 0, side_file, scoring=scoring)

    def _description(self) -> str:
        return f"WAA run {self.run_id}, shard {self.shard}: " + progress_line(self.snapshot())

    def recorded(self, result: BenchmarkResult) -> None:
        with self._attempts_lock:
            self.attempts_recorded.append(result)
        super().recorded(result)


# --- the shard: runs on a worker host ------------------------------------------------------


def shard_db_dir() -> Path:
    """The directory of this host's shard files: $ARENA_SHARD_DB_DIR, else `results/shards` in
    the working directory (the host's checkout, set by the pull step).

    Never derived from the controller's `db_path`: that path is the controller host's, and may
    not exist or be writable here.
    """
    return Path(os.environ.get(SHARD_DB_DIR_ENV) or "results/shards")


def _shard_flow_run_name() -> str:
    params = runtime_flow_run.parameters
    config = SuiteRunConfig.model_validate(params["config"])
    return shard_flow_run_name(config.run_id or "no-run-id", params.get("shard", 1), params.get("shards", 1))


def shard_flow_run_name(run_id: str, shard: int, shards: int) -> str:
    return f"{run_id}-shard-{shard}-of-{shards}"


def _delete_shard_resources(flow: Any, flow_run: Any, state: Any) -> None:
    """Flow hook for cancelled or crashed shards: delete every cloud resource tagged with the
    shard's own id (its `finally` may not have run; the controller's hook only knows the run id)."""
    config = SuiteRunConfig.model_validate(flow_run.parameters["config"])
    if not config.run_id:
        return
    resources = resource_id(config.run_id, int(flow_run.parameters.get("shard", 1)))
    provider = build_provider(config.provider, config.provider_settings(resources))
    try:
        if provider.owns_cloud_resources:
            report = sweep_run(provider, resources)
            get_run_logger().warning("shard %s ended early; %s", resources, report.summary())
    finally:
        provider.close()


@flow(
    name="evaluate-shard",
    flow_run_name=_shard_flow_run_name,
    task_runner=ThreadPoolTaskRunner(max_workers=MAX_POOL_SIZE),
    # The result is how the attempts reach the controller: persisted as JSON in the results
    # storage, which the controller must be able to read (docs/deployments.md).
    persist_result=True,
    result_serializer="json",
    on_cancellation=[_delete_shard_resources],
    on_crashed=[_delete_shard_resources],
)
def evaluate_shard(
    config: SuiteRunConfig,
    shard: int = 1,
    shards: int = 1,
    suite_hash: str | None = None,
    first_attempts: dict[str, int] | None = None,
    expected_seconds: dict[str, float] | None = None,
    ticket: str | None = None,
    expires_at: str | None = None,
    signature: str | None = None,
) -> dict[str, Any]:
    """Evaluate `config.task_ids` of run `config.run_id` on this host's own VM pool.

    Started by the controller (`evaluate_suite` with `shards` > 0), which passes the suite's
    content hash, each task's next attempt number and expected duration, the shard's ticket and
    the time by which it must start, and signs them (`signature`, ARENA_SHARD_SECRET): unsigned
    or altered parameters, and a ticket that is late, spent, or not this flow run's, are
    refused before anything starts (flows/shard_signing.py). Returns a ShardOutcome as JSON:
    every attempt recorded, for the controller to store in the run's file.
    """
    check_shard_signature(
        shard_parameters(config, shard, shards, suite_hash, first_attempts or {}, expected_seconds or {}, ticket,
                         expires_at),
        signature,
    )
    context = FlowRunContext.get()
    flow_run = context.flow_run if context is not None else None
    check_shard_ticket(
        ticket, expires_at, flow_run_name=shard_flow_run_name(config.run_id or "no-run-id", shard, shards),
        idempotency_key=flow_run.idempotency_key if flow_run is not None else None,
        spent_dir=shard_db_dir() / "spent-tickets",
    )
    assert ticket is not None  # checked above
    outcome = run_shard(config, shard, shards, suite_hash, first_attempts, expected_seconds, ticket)
    return outcome.model_dump(mode="json")


def shard_parameters(
    config: SuiteRunConfig, shard: int, shards: int, suite_hash: str | None,
    first_attempts: dict[str, int], expected_seconds: dict[str, float], ticket: str | None, expires_at: str | None,
) -> dict[str, Any]:
    """A shard's flow run parameters, as JSON values (what the controller signs and sends)."""
    return {
        "config": config.model_dump(mode="json"),
        "shard": shard,
        "shards": shards,
        "suite_hash": suite_hash,
        "first_attempts": first_attempts,
        "expected_seconds": expected_seconds,
        "ticket": ticket,
        "expires_at": expires_at,
    }


def run_shard(
    config: SuiteRunConfig,
    shard: int,
    shards: int,
    suite_hash: str | None,
    first_attempts: dict[str, int] | None,
    expected_seconds: dict[str, float] | None,
    ticket: str,
) -> ShardOutcome:
    """The shard's work: the local mode's pool and lanes over its tasks, into a local file (or
    the team store, where it first spends its `ticket`)."""
    logger = get_run_logger()
    if not config.run_id:
        raise ValueError("evaluate-shard needs config.run_id: the id of the run the shard belongs to")
    if not config.task_ids:
        raise ValueError(f"evaluate-shard (run {config.run_id}, shard {shard}) needs config.task_ids: its tasks")
    run_id = config.run_id
    # Relative paths are resolved here, on the worker host, in its checkout (the pull step's
    # working directory); absolute screenshot paths then mean the same file to the controller
    # when the artifacts directory is shared at the same path.
    config = config.model_copy(update={"artifacts_dir": config.artifacts_dir.resolve(), "shards": 0})
    catalog = WAATaskCatalog(
        config.suite_dir, difficulty=config.difficulty, max_steps=config.max_steps, require_supported=True
    )
    if suite_hash is not None and catalog.content_hash() != suite_hash:
        raise ShardError(
            f"suite {config.suite_dir.resolve()} on host {socket.gethostname()} has content hash "
            f"{catalog.content_hash()}, the controller's has {suite_hash}: this host's checkout differs "
            "from the controller's; update it"
        )
    tasks = catalog.tasks(domains=config.domains, ids=config.task_ids)
    agent_options = config.resolved_agent_options()
    agent_config = build_agent(config.agent, agent_options).config()
    flow_run_id = str(runtime_flow_run.id or uuid.uuid4())
    team = config.store_url is not None
    location: Path | str
    if team:
        location = str(config.store_url)
    else:
        location = (shard_db_dir() / f"{run_id}-shard{shard}-{flow_run_id[:8]}.duckdb").resolve()
        location.parent.mkdir(parents=True, exist_ok=True)
    provider = build_provider(config.provider, config.provider_settings(resource_id(run_id, shard)))
    with ResultStore(location) as store:
        if team:
            # The controller owns the run's record in the team store; the shard adds attempts.
            if store.get_run(run_id) is None:
                raise ShardError(f"run {run_id!r} is not in the team store {store.location}; "
                                 "shards are started by their controller")
            store.spend_shard_ticket(ShardTicket(run_id, ticket, flow_run_id))
            budget = RunBudget(config)  # this shard's share of the run's budget (shard_budget_limits)
        else:
            store.start_run(run_info(config, run_id, catalog, [t.task_id for t in tasks], agent_config, provider))
            budget = RunBudget.for_run(config, store, run_id)
        progress = ShardProgress(
            run_id, shard, len(tasks), config.artifacts_dir / run_id / f"shard-{shard}-progress.json",
            scoring=config.scoring,
        )
        status = "failed"
        try:
            request = PoolRunRequest(
                config, run_id, catalog, provider, agent_options, store, budget, progress,
                shard=shard, expected_seconds=expected_seconds, first_attempts=first_attempts,
            )
            evaluate_on_pool(request, tasks)
            status = run_completeness(store, run_id, tasks, budget).status
        finally:
            if not team:
                store.finish_run(run_id, status)
            progress.finish(status)
        where = store.location
    logger.info(
        "shard %d/%d of run %s: %s, %d attempt(s) recorded in %s",
        shard, shards, run_id, status, len(progress.attempts_recorded), where,
    )
    return ShardOutcome(
        run_id=run_id,
        shard=shard,
        shards=shards,
        task_ids=[t.task_id for t in tasks],
        status=status,
        attempts=progress.attempts_recorded,
        budget_reason=budget.reason,
        vm_cost_usd=round(budget.cost_usd() - budget.model_cost_usd, 6),
        store=where,
        in_team_store=team,
        worker=ShardWorker(
            hostname=socket.gethostname(),
            pid=os.getpid(),
            worker_name=os.environ.get("PREFECT__WORKER_NAME"),
            prefect_home=os.environ.get("PREFECT_HOME"),
            flow_run_id=flow_run_id,
            code_revision=code_revision(),
        ),
    )


# --- the controller: splits, starts, waits, records ---------------------------------------


def split_into_shards(
    tasks: list[BenchmarkTask], expected_seconds: dict[str, float], shards: int
) -> list[list[BenchmarkTask]]:
    """At most `shards` non-empty shards of about equal expected duration.

    Tasks are dealt longest first (the local mode's order, `longest_first`) to the shard with
    the least expected work so far (longest-processing-time-first). A task never timed counts as
    the mean of the known durations (1 s if none is known), so with no history the shards get
    equal numbers of tasks. Within a shard the tasks keep this order.
    """
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    ordered = longest_first(tasks, expected_seconds)
    known = [expected_seconds[t.task_id] for t in tasks if t.task_id in expected_seconds]
    default = sum(known) / len(known) if known else 1.0
    count = min(shards, len(ordered))
    groups: list[list[BenchmarkTask]] = [[] for _ in range(count)]
    loads = [0.0] * count
    for t in ordered:
        k = min(range(count), key=lambda i: (loads[i], len(groups[i]), i))
        groups[k].append(t)
        loads[k] += expected_seconds.get(t.task_id, default)
    return groups


def shard_budget_limits(config: SuiteRunConfig, budget: RunBudget, shards: int) -> dict[str, Any]:
    """Each shard's share of what is left of the run budget, as SuiteRunConfig limits.

    Wall time runs on every host at once, so each shard gets all that is left (counted from
    now: the wait for a worker to start the shard is not counted). Cost and tokens are spent by
    all shards together, so each gets an equal share of what is left: the run cannot go over,
    but a shard stops at its share even while another leaves some of its own unspent.
    """
    limits: dict[str, Any] = {}
    if config.max_wall_seconds is not None:
        left = config.max_wall_seconds - (time.monotonic() - budget.started)
        limits["max_wall_seconds"] = max(left, 0.001)
    if config.max_cost_usd is not None:
        limits["max_cost_usd"] = max(config.max_cost_usd - budget.cost_usd(), 0.0) / shards
    if config.max_tokens is not None:
        limits["max_tokens"] = max(config.max_tokens - budget.tokens, 0) // shards
    return limits


def portable_path(path: Path | None) -> Path | None:
    """`path` relative to the project checkout when it lies inside it (e.g. the bundled suite),
    so each worker host resolves it in its own checkout; any other path is passed unchanged."""
    if path is None or not path.is_absolute():
        return path
    try:
        return path.resolve().relative_to(PROJECT_DIR)
    except ValueError:
        return path


def shard_config(
    config: SuiteRunConfig, run_id: str, shard: int, shards: int, tasks: list[BenchmarkTask], limits: dict[str, Any]
) -> SuiteRunConfig:
    """The configuration one shard runs with: its tasks, its budget share, portable paths."""
    options = config.agent_options
    options = options.model_copy(
        update={
            "plans_path": portable_path(options.plans_path),
            "prices_path": portable_path(options.prices_path),
            "demo_library": portable_path(options.demo_library),
        }
    )
    update: dict[str, Any] = {
        **limits,
        "run_id": run_id,
        "task_ids": [t.task_id for t in tasks],
        "domains": None,  # the controller's selection is already in task_ids
        "shards": 0,
        "suite_dir": portable_path(config.suite_dir),
        "cloud_config": portable_path(config.cloud_config),
        "agent_options": options,
    }
    if config.provider == "existing":
        # Every shard gets servers of its own (the validator ensures one per shard at least).
        update["waa_urls"] = config.waa_urls[shard - 1 :: shards]
        update["pool_size"] = min(config.pool_size, len(update["waa_urls"]))  # the rest are spares
    return SuiteRunConfig.model_validate({**config.model_dump(), **update})


@dataclass
class ShardRun:
    """A shard's flow run, as the controller tracks it."""

    shard: int
    shards: int
    task_ids: list[str]
    flow_run_id: Any
    name: str
    first_attempts: dict[str, int]
    submitted: float  # time.monotonic() when it was created

    def describe(self) -> str:
        return f"shard {self.shard}/{self.shards} (flow run {self.name!r}, id {self.flow_run_id})"


def issue_tickets(config: SuiteRunConfig, shards: int) -> list[IssuedTicket]:
    """A new ticket for each of `shards` shards, to be spent by the time its start may take."""
    expires = dt.datetime.now(dt.timezone.utc) + dt.timedelta(
        seconds=config.shard_start_timeout_seconds + TICKET_SLACK_SECONDS)
    return [IssuedTicket(new_ticket(), shard, expires.replace(tzinfo=None)) for shard in range(1, shards + 1)]


def start_shards(
    config: SuiteRunConfig,
    run_id: str,
    groups: list[list[BenchmarkTask]],
    suite_hash: str,
    expected_seconds: dict[str, float],
    first_attempts: dict[str, int],
    limits: dict[str, Any],
    tickets: list[IssuedTicket],
) -> Iterator[ShardRun]:
    """Create one flow run of the shard deployment per group (with its ticket, recorded in the
    run's store before), without waiting for any; yields each as it is created (so a caller
    that fails half-way knows which ones to cancel).

    Each creation carries an idempotency key (the shard's name and its ticket): Prefect's client
    sends a request again when its answer does not arrive (a server busy past the client's 60 s
    timeout), and without the key the server made a second flow run of the same shard, which a
    worker then ran too: its tasks twice, one of the two untracked. The shard checks that its
    own flow run carries that key (flows/shard_signing.py): a copy of its parameters in another
    flow run is refused."""
    for shard, (group, ticket) in enumerate(zip(groups, tickets, strict=True), start=1):
        ids = [t.task_id for t in group]
        cfg = shard_config(config, run_id, shard, len(groups), group, limits)
        name = shard_flow_run_name(run_id, shard, len(groups))
        firsts = {i: first_attempts[i] for i in ids}
        parameters = shard_parameters(cfg, shard, len(groups), suite_hash, firsts,
                                      {i: expected_seconds[i] for i in ids if i in expected_seconds},
                                      ticket.ticket, ticket.expires_at.replace(tzinfo=dt.timezone.utc).isoformat())
        try:
            created = run_deployment(
                config.shard_deployment,
                parameters={**parameters, "signature": sign_shard(parameters)},
                flow_run_name=name,
                idempotency_key=shard_idempotency_key(name, ticket.ticket),
                timeout=0,  # return at once: the shards run at the same time, on whatever workers poll
                tags=["waa", "shard", f"run:{run_id}"],
            )
        except ObjectNotFound:
            raise ValueError(
                f"shard deployment {config.shard_deployment!r} does not exist on the Prefect server at "
                f"{PREFECT_API_URL.value() or '(ephemeral: PREFECT_API_URL is not set)'}; register it with "
                "`prefect deploy --name shard` from the project directory (docs/deployments.md, shard mode)"
            ) from None
        yield ShardRun(shard, len(groups), ids, created.id, name, firsts, time.monotonic())


def wait_for_shards(
    client: SyncPrefectClient, runs: list[ShardRun], start_timeout: float, poll: float = SHARD_POLL_SECONDS
) -> Iterator[tuple[ShardRun, FlowRun | None]]:
    """Yield each shard's flow run as soon as it reaches a final state, in the order they end.

    A run still scheduled (no worker has started it) `start_timeout` seconds after it was
    created is cancelled, and yielded once the cancellation is recorded. A run deleted from the
    server (how an operator gives up on a shard whose host died while it ran) is yielded as None.
    """
    pending = {r.flow_run_id: r for r in runs}
    while pending:
        for flow_run_id, shard_run in list(pending.items()):
            try:
                flow_run = client.read_flow_run(flow_run_id)
            except ObjectNotFound:
                del pending[flow_run_id]
                yield shard_run, None
                continue
            state = flow_run.state
            if state is not None and state.is_final():
                del pending[flow_run_id]
                yield shard_run, flow_run
            elif (
                state is not None
                and state.type == StateType.SCHEDULED
                and time.monotonic() - shard_run.submitted > start_timeout
            ):
                client.set_flow_run_state(
                    flow_run_id,
                    Cancelled(message=f"no worker started this shard within {start_timeout:g} s"),
                    force=True,
                )
        if pending:
            time.sleep(poll)


def shard_outcome(shard_run: ShardRun, flow_run: FlowRun | None, run_id: str) -> ShardOutcome:
    """The shard's returned outcome, checked; ShardError naming the flow run otherwise."""
    if flow_run is None:
        raise ShardError(f"{shard_run.describe()} was deleted from the Prefect server before it ended")
    state = flow_run.state
    if state is None or not state.is_completed():
        name = state.name if state is not None else "without a state"
        message = f": {state.message}" if state is not None and state.message else ""
        raise ShardError(f"{shard_run.describe()} ended {name}{message}")
    try:
        value = state.result(raise_on_failure=True, retry_result_failure=False)
        outcome = ShardOutcome.model_validate(value)
    except Exception as exc:  # noqa: BLE001 - any unreadable result is this shard's failure
        raise ShardError(
            f"{shard_run.describe()} completed but its result could not be read ({type(exc).__name__}: {exc}); "
            "the workers' results storage must be readable by the controller (docs/deployments.md)"
        ) from exc
    wrong = [
        f"{r.task_id}#{r.attempt}"
        for r in outcome.attempts
        if r.task_id not in shard_run.first_attempts or r.attempt < shard_run.first_attempts[r.task_id]
    ]
    if outcome.run_id != run_id or wrong:
        raise ShardError(
            f"{shard_run.describe()} returned attempts that are not its own "
            f"(run {outcome.run_id!r}, unexpected task#attempt: {', '.join(wrong) or 'none'})"
        )
    return outcome


def _cancel_unfinished(client: SyncPrefectClient, runs: list[ShardRun]) -> None:
    """Best effort, when the controller stops early: no shard should run on for nobody.

    A scheduled run is cancelled outright; a running one is set Cancelling, so its worker stops
    the process (and the shard's cancellation hook deletes its cloud resources).
    """
    for shard_run in runs:
        try:
            state = client.read_flow_run(shard_run.flow_run_id).state
            if state is None or state.is_final():
                continue
            new = Cancelled if state.type == StateType.SCHEDULED else Cancelling
            client.set_flow_run_state(
                shard_run.flow_run_id, new(message="the controller of this run stopped"), force=True
            )
        except Exception:  # noqa: BLE001 - best effort; the original error matters more
            pass


def evaluate_on_shards(
    config: SuiteRunConfig,
    run_id: str,
    catalog: WAATaskCatalog,
    todo: list[BenchmarkTask],
    store: ResultStore,
    budget: RunBudget,
    progress: RunProgress | None = None,
) -> tuple[list[BenchmarkResult], list[str]]:
    """Run `todo` as shards and record every attempt they return in `store`.

    Returns the last attempt of each task that got one (in `todo` order), and one error line per
    shard that returned nothing (its tasks then count as missing). Shards are recorded as each
    one ends, so progress advances shard by shard.
    """
    logger = get_run_logger()
    if not todo or budget.exhausted():
        return [], []
    ids = [t.task_id for t in todo]
    expected = store.expected_seconds(ids, config.agent)
    groups = split_into_shards(todo, expected, config.shards)
    stored = store.next_attempts(run_id)
    first_attempts = {i: stored.get(i, 1) for i in ids}
    limits = shard_budget_limits(config, budget, len(groups))
    if not config.artifacts_dir.is_absolute():
        logger.warning(
            "artifacts_dir %s is relative: each shard writes screenshots under its own host's checkout; "
            "use an absolute path on a filesystem shared by every host to see them all in the report",
            config.artifacts_dir,
        )
    revision = code_revision()
    runs: list[ShardRun] = []
    last: dict[str, BenchmarkResult] = {}
    errors: list[str] = []
    with get_client(sync_client=True) as client:
        finished = False
        try:
            tickets = issue_tickets(config, len(groups))
            store.issue_shard_tickets(run_id, tickets)
            for r in start_shards(config, run_id, groups, catalog.content_hash(), expected, first_attempts, limits,
                                  tickets):
                runs.append(r)
                logger.info("%s: %d task(s)", r.describe(), len(r.task_ids))
            for shard_run, flow_run in wait_for_shards(client, runs, config.shard_start_timeout_seconds):
                try:
                    outcome = shard_outcome(shard_run, flow_run, run_id)
                except ShardError as exc:
                    errors.append(f"{exc}; none of its {len(shard_run.task_ids)} task(s) got a result")
                    logger.error("%s", errors[-1])
                    continue
                _record_shard(outcome, store, run_id, budget, progress, last)
                logger.info(
                    "%s ran on %s (worker %s, pid %d): %s, %d attempt(s), recorded in %s",
                    shard_run.describe(), outcome.worker.hostname, outcome.worker.worker_name,
                    outcome.worker.pid, outcome.status, len(outcome.attempts), outcome.store,
                )
                if outcome.worker.code_revision != revision:
                    logger.warning(
                        "%s ran code revision %s, this controller runs %s: results may not be comparable",
                        shard_run.describe(), outcome.worker.code_revision, revision,
                    )
            finished = True
        finally:
            if not finished:
                _cancel_unfinished(client, runs)
    return [last[i] for i in ids if i in last], errors


def _record_shard(
    outcome: ShardOutcome,
    store: ResultStore,
    run_id: str,
    budget: RunBudget,
    progress: RunProgress | None,
    last: dict[str, BenchmarkResult],
) -> None:
    """Store a shard's attempts in the run's store (unless the shard wrote them to the team
    store itself) and count them in the run's budget."""
    for result in outcome.attempts:
        if not outcome.in_team_store:
            record_result(store, run_id, result)
        budget.add(result)
        if progress is not None:
            progress.recorded(result)
        last[result.task_id] = result
    # Like RunBudget.for_run does for earlier invocations, VM cost joins the model cost (this
    # controller has no pool of its own whose billed time would count it).
    budget.model_cost_usd += outcome.vm_cost_usd
    if outcome.budget_reason is not None and budget.reason is None:
        budget.reason = f"shard {outcome.shard}: {outcome.budget_reason}"
