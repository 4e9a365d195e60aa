"""The main flow: evaluate a task suite with one agent on a pool of VMs.

    provision pool -> per task, concurrently (at most pool-size at once):
        reset -> setup -> episode -> evaluate -> record
    -> summary (terminal table and Prefect table artifact)

Concurrency: the run has one lane per VM of the pool, each taking tasks from a shared queue, so at
most pool-size tasks run at once. The run holds pool-size slots of a strict global concurrency
limit sized to the pool while its lanes work (visible in the UI; a missing limit fails loudly).
The slots are taken in one call, not per task or per lane: on Prefect's SQLite backend,
concurrent slot increments fail with "database is locked" and the client retries them after a
fixed 2 s back-off, which cost about 2 s per task and left lanes idle for up to 10 s on the
bundled suite (measured with prefect 3.8.8).

Hardening (see also flows/attempt.py for per-stage wall-clock limits):

* Retries: only infrastructure errors are retried, on another VM (the pool replaces the failed
  one), up to `max_attempts` attempts per invocation. Attempt numbers continue from the ones
  already stored, so a resumed run never overwrites an earlier attempt. Every attempt is
  recorded; summaries count the last attempt of each task.
* Budget: `max_wall_seconds`, `max_cost_usd` (model cost from the results' usage plus VM-hours
  times `vm_hour_price_usd`) and `max_tokens`. Once one is reached, lanes take no new task and
  start no retry; tasks already running finish. The run ends with status "budget_exhausted".
* Completeness: the summary (terminal table, table and markdown artifacts, `RunOutcome`) says
  how many selected tasks have no final result. A run with some is "incomplete" (or
  "budget_exhausted"), never "completed".
* Progress: a Prefect progress artifact (key `waa-run-progress`) and a side file
  `<artifacts_dir>/<run_id>/progress.json`, both updated as attempts are recorded. The side file
  is there because the DuckDB file is locked by the running controller (another process cannot
  even open it read-only), so it is how a watcher follows a run from outside.

Shard mode (`shards` > 0, flows/shard.py): instead of one pool in this process, the tasks still to
do are split into shards, each run as a flow run of the `evaluate-shard` deployment on whichever
worker host picks it up, on that host's own pool, through the same lanes and attempts as here
(`evaluate_on_pool`). This flow then records every attempt the shards return, so resume,
summary and progress read one DuckDB file as in the local mode.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
import time
import uuid
from collections import deque
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.context import get_run_context
from prefect.exceptions import ObjectNotFound
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, Field, field_validator, model_validator

from adapters.agents import AgentOptions, build_agent
from adapters.benchmark import BenchmarkResult, BenchmarkTask, OutcomeKind
from adapters.episode import EpisodeLimits
from adapters.store.duckdb_store import ResultStore, RunInfo
from adapters.vms.base import ProviderError, ResetLevel, VMProvider
from adapters.vms.existing import DEFAULT_SERVER_WAIT_SECONDS, ExistingServersProvider
from adapters.vms.janitor import sweep_run
from adapters.vms.settings import build_cloud_provider, load_cloud_settings
from adapters.vms.local import LocalSimulationProvider
from adapters.vms.pool import VMPool
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.live import LiveAdapterSettings
from flows.budget import RunBudget
from flows.progress import RunProgress, warn
from flows.attempt import DEFAULT_STAGE_TIMEOUTS, AttemptContext, run_attempt, validate_stage_timeouts
from flows.summary import RunCompleteness, format_summary, summary_markdown, summary_rows
from tasks.provision import provision_pool
from tasks.record import record_result


class SuiteRunConfig(BaseModel):
    """Everything that defines one evaluation run; stored with the run for provenance."""

    suite_dir: Path = Field(default_factory=bundled_suite_dir)
    difficulty: Literal["normal", "hard"] = "normal"
    domains: list[str] | None = None
    task_ids: list[str] | None = None
    agent: str = "scripted"
    agent_options: AgentOptions = Field(default_factory=AgentOptions)
    # Provenance only: the checkpoint behind `agent_options.model`, when a fine-tuning job
    # announced one (recorded in runs.model_checkpoint).
    model_checkpoint: str | None = None
    pool_size: int = Field(default=4, ge=1, le=64)
    provider: Literal["local", "existing", "aws", "azure"] = "local"
    cloud_config: Path | None = None  # aws/azure: TOML settings file (else $ARENA_CONFIG / ./arena.toml)
    quirks: bool = False  # local provider: reproduce a real WAA server's quirks
    # local provider with quirks: override quirks-mode knobs (adapters/waa/localenv/quirks.py)
    quirk_settings: dict[str, Any] | None = None
    # existing provider: one server per pool slot, the rest spares for servers that stop answering
    waa_urls: list[str] = Field(default_factory=list)
    # existing provider: how long to wait for a server to answer (at start, and again after it
    # failed an attempt) before it is retired
    server_wait_seconds: float = Field(default=DEFAULT_SERVER_WAIT_SECONDS, gt=0)
    reset_level: ResetLevel = ResetLevel.SNAPSHOT
    max_steps: int = Field(default=15, ge=1)
    episode_timeout_seconds: float = Field(default=1200.0, gt=0)
    # Hard wall-clock limit per stage (reset, setup, episode, evaluate), enforced in our code
    # (flows/attempt.py); a stage past its limit ends the attempt as "timeout" and its VM is
    # replaced. "episode" defaults to episode_timeout_seconds + 30 s (the soft limit is checked
    # between steps; the hard one catches a step blocked in a call).
    stage_timeouts: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_STAGE_TIMEOUTS))
    max_attempts: int = Field(default=3, ge=1)
    # Run budget (None = unlimited). When one is reached, lanes take no new task and start no
    # retry; the run ends with status "budget_exhausted". Cost = the results' model cost +
    # VM-hours of the pool * vm_hour_price_usd. Cost and tokens include earlier invocations of a
    # resumed run (their VM cost from recorded vm_seconds); wall seconds count this invocation.
    max_wall_seconds: float | None = Field(default=None, gt=0)
    max_cost_usd: float | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)
    vm_hour_price_usd: float = Field(default=0.0, ge=0)
    # Pause after each action before observing; None = the provider's default (3 s on real VMs,
    # 0 on the simulation). Benchmarks use it to simulate per-step latency.
    settle_seconds: float | None = Field(default=None, ge=0)
    db_path: Path = Path("results/arena.duckdb")
    # Screenshots. In shard mode every shard writes here on its own host: use a path on a
    # filesystem shared by all hosts (mounted at the same path), or the report lacks the
    # screenshots of remote shards.
    artifacts_dir: Path = Path("results/artifacts")
    run_id: str | None = None
    # Shard mode (flows/shard.py, docs/deployments.md): 0 = every task runs in this flow run's
    # process. N > 0 = the tasks still to do are split into N balanced shards, each run as a flow
    # run of `shard_deployment` ("flow/deployment") on whichever worker picks it up, each on its
    # own pool of `pool_size` VMs. A shard run no worker has started after
    # `shard_start_timeout_seconds` is cancelled and its tasks stay missing.
    shards: int = Field(default=0, ge=0, le=64)
    shard_deployment: str = "evaluate-shard/shard"
    shard_start_timeout_seconds: float = Field(default=900.0, gt=0)

    @field_validator("stage_timeouts")
    @classmethod
    def _known_stages(cls, value: dict[str, float]) -> dict[str, float]:
        return validate_stage_timeouts(value)

    @model_validator(mode="after")
    def _provider_fits(self) -> SuiteRunConfig:
        if self.quirk_settings is not None and not (self.provider == "local" and self.quirks):
            raise ValueError("quirk_settings need provider 'local' with quirks=True")
        if self.provider == "existing":
            if not self.waa_urls:
                raise ValueError("provider 'existing' needs at least one WAA server URL (waa_urls)")
            if "pool_size" not in self.model_fields_set:
                self.pool_size = len(self.waa_urls)  # one lane per server unless told otherwise
            if self.pool_size > len(self.waa_urls):
                raise ValueError(
                    f"pool size {self.pool_size} needs at least {self.pool_size} WAA server URLs; "
                    f"got {len(self.waa_urls)} (extra URLs are spares)"
                )
            if self.reset_level is not ResetLevel.SETUP:
                raise ValueError(
                    f"existing WAA servers cannot be reset at level {self.reset_level.value!r}; use 'setup'"
                )
            if self.shards and len(self.waa_urls) < self.shards:
                # Each shard drives its own servers (waa_urls[k::shards]); two shards on one
                # server would reset each other's tasks.
                raise ValueError(
                    f"shards={self.shards} with provider 'existing' needs at least one WAA server per shard; "
                    f"got {len(self.waa_urls)} URL(s)"
                )
        if self.shards and self.shard_deployment.count("/") != 1:
            raise ValueError(
                f"shard_deployment must name a deployment as 'flow/deployment', got {self.shard_deployment!r}"
            )
        return self

    def resolved_agent_options(self) -> AgentOptions:
        """Agent options with the suite's own solution plans filled in for the scripted agent."""
        if self.agent_options.plans_path is not None:
            return self.agent_options
        candidate = self.suite_dir / "solutions.json"
        return self.agent_options.model_copy(update={"plans_path": candidate if candidate.exists() else None})


class RunOutcome(BaseModel):
    run_id: str
    db_path: Path
    results: list[BenchmarkResult]  # the last attempt of each task run by this invocation
    table: str
    status: str = "completed"
    completeness: RunCompleteness | None = None
    # Shard mode: one line per shard run that returned no results (naming its flow run); the
    # tasks of those shards count as missing in `completeness`.
    shard_errors: list[str] = Field(default_factory=list)
    # VMs that never came up or could not be replaced (e.g. an existing server that died).
    pool_errors: list[str] = Field(default_factory=list)


def build_provider(config: SuiteRunConfig, run_id: str) -> VMProvider:
    """The VM provider the configuration names."""
    if config.provider == "existing":
        return ExistingServersProvider(config.waa_urls, server_wait_seconds=config.server_wait_seconds)
    if config.provider in ("aws", "azure"):
        return build_cloud_provider(config.provider, load_cloud_settings(config.cloud_config), run_id)
    return LocalSimulationProvider(quirks=config.quirks, quirk_settings=config.quirk_settings)


def _environment(config: SuiteRunConfig) -> str:
    """What the run's VMs are, as stored in runs.environment."""
    return "local-simulation" if config.provider == "local" else config.provider


def _flow_run_name() -> str:
    """Runs are named by agent, model and suite in the Prefect UI, e.g. waa-openai-qwen-ft-3-bundled_suite."""
    from prefect.runtime import flow_run

    config = SuiteRunConfig.model_validate(flow_run.parameters["config"])
    model = f"-{config.agent_options.model}" if config.agent_options.model else ""
    return f"waa-{config.agent}{model}-{Path(config.suite_dir).name}-{config.provider}"


def _delete_run_resources(flow: Any, flow_run: Any, state: Any) -> None:
    """Flow hook for cancelled or crashed runs: delete every cloud resource tagged with the run.

    A crash or cancellation can end the process before the flow's own `finally` tears the pool
    down; the tags make the leftovers findable from here (and by the janitor later).
    """
    config = SuiteRunConfig.model_validate(flow_run.parameters["config"])
    if config.provider not in ("aws", "azure") or not config.run_id:
        return
    provider = build_cloud_provider(config.provider, load_cloud_settings(config.cloud_config), config.run_id)
    report = sweep_run(provider, config.run_id)
    get_run_logger().warning("run %s ended early; %s", config.run_id, report.summary())


def provider_leftovers(provider: VMProvider, run_id: str, logger: Any) -> None:
    """After teardown, delete (and report) anything of this run the provider still lists."""
    report = sweep_run(provider, run_id)
    if report.deleted or report.failed:
        logger.warning("teardown left resources of run %s behind; %s", run_id, report.summary())


def code_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@contextmanager
def _pool_concurrency_limit(name: str, size: int) -> Iterator[str]:
    """A global concurrency limit sized to the pool for this run; removed when the run ends.

    A controller killed mid-run (SIGKILL) leaves its limit behind with its slots still taken; a
    resumed run (same run id, same name) would then wait forever for them, so a leftover limit
    of that name is deleted first. The name holds the run id, so no other run uses it.
    """
    with get_client(sync_client=True) as client:
        try:
            client.delete_global_concurrency_limit_by_name(name)
            warn(f"deleted leftover concurrency limit {name!r} (an earlier controller of this run died)")
        except ObjectNotFound:
            pass
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=size))
    try:
        yield name
    finally:
        with get_client(sync_client=True) as client:
            client.delete_global_concurrency_limit_by_name(name)


@task(name="evaluate-task", task_run_name="{task.domain}/{task.task_id}", cache_policy=NO_CACHE, persist_result=False)
def evaluate_task(
    task: BenchmarkTask,
    pool: VMPool,
    ctx: AttemptContext,
    store: ResultStore,
    run_id: str,
    max_attempts: int,
    budget: RunBudget | None = None,
    progress: RunProgress | None = None,
    first_attempt: int | None = None,
) -> BenchmarkResult | None:
    """Attempt a task until it ends for a non-infrastructure reason or attempts run out.

    Every attempt is recorded as it finishes; an infrastructure failure hands the VM back as
    unhealthy (the pool replaces it) and the next attempt runs on another VM. Attempt numbers
    continue after those already stored for the task (a resumed run), and start no lower than
    `first_attempt` (a shard: the earlier attempts are in its controller's file, not in `store`).
    No retry starts once the budget is exhausted; None only if the budget stopped it before the
    first attempt.
    """
    result: BenchmarkResult | None = None
    first = max(store.next_attempt(run_id, task.task_id), first_attempt or 1)
    for attempt in range(first, first + max_attempts):
        if budget is not None and budget.exhausted():
            break
        try:
            lease = pool.lease()
            vm = lease.__enter__()
        except ProviderError as exc:
            # No VM is left (every server retired): the task stays without a final result and
            # the run ends incomplete. Nothing was started, so nothing is recorded.
            get_run_logger().warning("task %s not attempted: %s", task.task_id, exc)
            break
        leased = time.monotonic()
        try:
            result = run_attempt(task, vm, ctx, attempt)
            vm_seconds = time.monotonic() - leased
            result = result.model_copy(update={"timings": {**result.timings, "vm": vm_seconds}})
            # Recorded before the VM goes back: replacing a failed VM can take minutes.
            record_result(store, run_id, result)
        finally:
            lease.__exit__(None, None, None)
        if budget is not None:
            budget.add(result)
        if progress is not None:
            progress.recorded(result)
        if not result.outcome.is_retryable:
            break
    return result


class WorkQueue:
    """The tasks left to start, and how many are running: lanes share one.

    Taking a task and counting it as running happen together, so once the queue is empty the
    running count only falls; a lane that finds no work can then retire its VM when the tasks
    still running (and their retries) have enough VMs without it.
    """

    def __init__(self, tasks: list[BenchmarkTask], first_attempts: dict[str, int] | None = None) -> None:
        self._todo: deque[BenchmarkTask] = deque(tasks)
        self._running = 0
        self._lock = threading.Lock()
        # Lowest attempt number per task when the attempts so far are stored elsewhere (shards).
        self._first_attempts = dict(first_attempts or {})

    def first_attempt(self, task_id: str) -> int | None:
        """The lowest attempt number `task_id` may use, if one was given."""
        return self._first_attempts.get(task_id)

    def take(self) -> BenchmarkTask | None:
        """The next task to start (now counted as running), or None when none is left."""
        with self._lock:
            if not self._todo:
                return None
            self._running += 1
            return self._todo.popleft()

    def done(self) -> None:
        """A task taken with `take` has ended."""
        with self._lock:
            self._running -= 1

    @property
    def running(self) -> int:
        with self._lock:
            return self._running


@task(name="vm-lane", task_run_name="lane-{lane}", cache_policy=NO_CACHE, persist_result=False)
def run_lane(
    lane: int,
    work: WorkQueue,
    pool: VMPool,
    ctx: AttemptContext,
    store: ResultStore,
    run_id: str,
    max_attempts: int,
    budget: RunBudget | None = None,
    progress: RunProgress | None = None,
) -> list[BenchmarkResult]:
    """Evaluate tasks from the queue, one at a time, until it is empty or the budget runs out.

    A lane that runs out of work deletes one idle VM the remaining tasks do not need, so the
    pool shrinks (and stops costing) while the last tasks finish.
    """
    results: list[BenchmarkResult] = []
    while (budget is None or not budget.exhausted()) and not pool.exhausted:
        next_task = work.take()
        if next_task is None:
            break
        try:
            result = evaluate_task(
                next_task, pool, ctx, store, run_id, max_attempts, budget, progress,
                first_attempt=work.first_attempt(next_task.task_id),
            )
        except Exception as exc:  # noqa: BLE001 - one task's controller trouble must not end the lane
            # Attempts are recorded inside evaluate_task as they end; whatever broke here left
            # this task without a final result, which the run's completeness counts.
            get_run_logger().error("task %s: controller error %s: %s", next_task.task_id, type(exc).__name__, exc)
            result = None
        finally:
            work.done()
        if result is not None:
            results.append(result)
    try:
        pool.retire_spare(still_needed=work.running)
    except Exception as exc:  # noqa: BLE001 - teardown deletes it later; the lane's results stand
        get_run_logger().warning("could not retire a spare VM: %s", exc)
    return results


@flow(
    name="evaluate-suite",
    flow_run_name=_flow_run_name,
    on_cancellation=[_delete_run_resources],
    on_crashed=[_delete_run_resources],
)
def evaluate_suite(config: SuiteRunConfig) -> RunOutcome:
    """Evaluate the configured suite and agent; results land in DuckDB as each task finishes."""
    logger = get_run_logger()
    run_id = config.run_id or new_run_id()
    catalog = WAATaskCatalog(
        config.suite_dir, difficulty=config.difficulty, max_steps=config.max_steps, require_supported=True
    )
    tasks = catalog.tasks(domains=config.domains, ids=config.task_ids)
    agent_options = config.resolved_agent_options()
    # Build the agent and the provider up front: a bad configuration fails before anything runs.
    agent_config = build_agent(config.agent, agent_options).config()
    provider = build_provider(config, run_id)
    environment = _environment(config)

    with ResultStore(config.db_path) as store:
        finished = store.finished_task_ids(run_id)
        todo = [t for t in tasks if t.task_id not in finished]
        if finished:
            logger.info("Resuming run %s: %d of %d tasks already have final results", run_id, len(finished), len(tasks))
        store.start_run(
            run_info(config, run_id, catalog, len(tasks), agent_config, provider),
            resume=store.get_run(run_id) is not None,
        )
        budget = RunBudget.for_run(config, store, run_id)
        progress = RunProgress(
            run_id, len(tasks), len(tasks) - len(todo), config.artifacts_dir / run_id / "progress.json"
        )
        status = "failed"
        shard_errors: list[str] = []
        pool_errors: list[str] = []
        try:
            if config.shards:
                # Imported here: flows.shard builds on this module (one implementation of lanes,
                # pool and attempts), so a top-level import would be circular.
                from flows.shard import evaluate_on_shards

                if isinstance(provider, LocalSimulationProvider):
                    provider.close()  # each shard starts its own simulations on its host
                results, shard_errors = evaluate_on_shards(config, run_id, catalog, todo, store, budget, progress)
            else:
                results = evaluate_on_pool(
                    config, run_id, catalog, todo, provider, agent_options, store, budget, progress,
                    problems=pool_errors,
                )
            completeness = run_completeness(store, run_id, tasks, budget)
            status = completeness.status
        finally:
            store.finish_run(run_id, status)
            progress.finish(status)
        summary = store.summary(run_id)

    table = format_summary(run_id, summary, environment, completeness)
    markdown = summary_markdown(run_id, summary, environment, completeness)
    if pool_errors:
        # Say why tasks are missing wherever the summary is shown, not only in the log.
        table += "\nVMs lost during the run:\n" + "\n".join(f"  {e}" for e in pool_errors)
        markdown += "\n\n**VMs lost during the run**\n\n" + "\n".join(f"- {e}" for e in pool_errors)
    if shard_errors:
        table += "\nshards without results:\n" + "\n".join(f"  {e}" for e in shard_errors)
        markdown += "\n\n**Shards without results**\n\n" + "\n".join(f"- {e}" for e in shard_errors)
    logger.info("Run summary\n%s", table)
    if completeness.missing:
        logger.warning(
            "run %s is %s: %d of %d selected tasks have no final result",
            run_id, status, completeness.missing, completeness.selected,
        )
    description = f"WAA run {run_id}: {config.agent} agent on {len(tasks)} tasks ({environment}), {status}"
    create_table_artifact(key="waa-run-summary", table=summary_rows(summary, completeness), description=description)
    create_markdown_artifact(key="waa-run-summary-report", markdown=markdown, description=description)
    return RunOutcome(
        run_id=run_id,
        db_path=config.db_path,
        results=results,
        table=table,
        status=status,
        completeness=completeness,
        shard_errors=shard_errors,
        pool_errors=pool_errors,
    )


def run_info(
    config: SuiteRunConfig,
    run_id: str,
    catalog: WAATaskCatalog,
    task_count: int,
    agent_config: dict[str, Any],
    provider: VMProvider,
) -> RunInfo:
    """The `runs` row of a run (or of one shard's local file): its provenance."""
    flow_run = get_run_context().flow_run
    return RunInfo(
        run_id=run_id,
        started_at=datetime.now(timezone.utc),
        status="running",
        agent=config.agent,
        agent_config=agent_config,
        model_id=agent_config.get("model"),
        model_endpoint=agent_config.get("base_url"),
        suite=str(config.suite_dir),
        suite_hash=catalog.content_hash(),
        task_count=task_count,
        pool_size=config.pool_size,
        provider=config.provider,
        reset_level=config.reset_level.value,
        code_revision=code_revision(),
        prefect_flow_run_id=str(flow_run.id) if flow_run else None,
        environment=_environment(config),
        model_checkpoint=config.model_checkpoint,
        vm_image=provider.image_id,
        run_config=config.model_dump(mode="json"),
    )


def run_completeness(store: ResultStore, run_id: str, tasks: list[BenchmarkTask], budget: RunBudget) -> RunCompleteness:
    """What share of the selected tasks has a final result, and why the rest has none."""
    final = store.finished_task_ids(run_id)
    latest = {r["task_id"]: r["outcome"] for r in store.latest_attempts(run_id)}
    selected = {t.task_id for t in tasks}
    missing_by_domain: dict[str, int] = {}
    for t in tasks:
        if t.task_id not in final:
            missing_by_domain[t.domain] = missing_by_domain.get(t.domain, 0) + 1
    run = store.get_run(run_id)
    task_count = run.task_count if run is not None and run.task_count is not None else len(tasks)
    n_final = len(final & selected)
    if budget.reason is not None and n_final < task_count:
        status = "budget_exhausted"
    elif n_final < task_count:
        status = "incomplete"
    else:
        status = "completed"
    return RunCompleteness(
        status=status,
        selected=task_count,
        final=n_final,
        not_started=len(selected - set(latest)),
        retries_exhausted=sum(1 for t in selected if latest.get(t) == OutcomeKind.INFRASTRUCTURE_ERROR.value),
        budget_reason=budget.reason,
        missing_by_domain=missing_by_domain,
        cost_usd=round(budget.cost_usd(), 6),
        tokens=budget.tokens,
    )


def evaluate_on_pool(
    config: SuiteRunConfig,
    run_id: str,
    catalog: WAATaskCatalog,
    todo: list[BenchmarkTask],
    provider: VMProvider,
    agent_options: AgentOptions,
    store: ResultStore,
    budget: RunBudget,
    progress: RunProgress | None = None,
    *,
    shard: int | None = None,
    expected_seconds: dict[str, float] | None = None,
    first_attempts: dict[str, int] | None = None,
    problems: list[str] | None = None,
) -> list[BenchmarkResult]:
    """Provision the pool, run every task in lanes, and always tear the pool down.

    A shard (flows/shard.py) passes its number, which names its pool, concurrency limit and
    cloud resources apart from the other shards of the run (see `resource_id`), plus what only
    its controller knows: the tasks' expected durations and their lowest attempt numbers.
    VMs that never came up or could not be replaced are appended to `problems` (one line each).
    """
    if not todo or budget.exhausted():
        if isinstance(provider, LocalSimulationProvider):
            provider.close()
        return []
    resources = resource_id(run_id, shard)
    label = run_id[-6:] if shard is None else f"{run_id[-6:]}-s{shard}"
    pool = VMPool(provider, size=min(config.pool_size, len(todo)), run_id=label)
    budget.pool = pool
    try:
        with tempfile.TemporaryDirectory(prefix="waa-cache-") as cache_dir:
            ctx = AttemptContext(
                provider=provider,
                catalog=catalog,
                agent_factory=lambda: build_agent(config.agent, agent_options),
                reset_level=config.reset_level,
                limits=EpisodeLimits(max_steps=config.max_steps, wall_clock_seconds=config.episode_timeout_seconds),
                cache_dir=Path(cache_dir),
                artifacts_dir=config.artifacts_dir / run_id,
                adapter_settings=LiveAdapterSettings(
                    settle_seconds=provider.settle_seconds if config.settle_seconds is None else config.settle_seconds
                ),
                stage_timeouts=config.stage_timeouts,
            )
            try:
                provision_pool(pool)
            except ProviderError as exc:
                # No VM came up: the run ends incomplete with every task missing, not a crash.
                _report_pool_problems(pool, problems, f"no VM of the pool came up: {exc}")
                return []
            if expected_seconds is None:
                expected_seconds = store.expected_seconds([t.task_id for t in todo], config.agent)
            work = WorkQueue(longest_first(todo, expected_seconds), first_attempts)
            with _pool_concurrency_limit(f"waa-pool-{resources}", pool.size) as limit_name:
                with concurrency(limit_name, occupy=pool.size, strict=True):
                    futures = [
                        run_lane.submit(lane, work, pool, ctx, store, run_id, config.max_attempts, budget, progress)
                        for lane in range(pool.size)
                    ]
                    by_id = {r.task_id: r for f in futures for r in f.result()}
            _report_pool_problems(pool, problems)
        return [by_id[t.task_id] for t in todo if t.task_id in by_id]
    finally:
        pool.teardown()
        if isinstance(provider, LocalSimulationProvider):
            provider.close()
        else:
            provider_leftovers(provider, resources, get_run_logger())


def _report_pool_problems(pool: VMPool, problems: list[str] | None, headline: str | None = None) -> None:
    """Log VMs that never came up or could not be replaced, and hand them to the run summary."""
    lines = ([headline] if headline else []) + [f"VM not available: {e}" for e in pool.creation_errors]
    if not lines:
        return
    get_run_logger().warning("the pool lost VMs; the run went on with the others: %s", "; ".join(lines))
    if problems is not None:
        problems.extend(lines)


def resource_id(run_id: str, shard: int | None = None) -> str:
    """The id that tags a pool's cloud resources and names its concurrency limit.

    Each shard of a run gets its own (`<run_id>-shard<k>`): shards end at different times on
    different hosts, and a shard's teardown sweeps everything tagged with its id, so a shared id
    would let the first shard to finish delete the VMs of the others.
    """
    return run_id if shard is None else f"{run_id}-shard{shard}"


def longest_first(tasks: list[BenchmarkTask], expected_seconds: dict[str, float]) -> list[BenchmarkTask]:
    """Tasks in the order lanes should start them: never-timed tasks, then longest first.

    Starting long tasks early keeps the end of a run from waiting on one long task while the
    other lanes sit idle (longest-processing-time-first scheduling). Tasks with no recorded
    duration go first, in their given order, since they may be long too.
    """
    unknown = [t for t in tasks if t.task_id not in expected_seconds]
    known = sorted((t for t in tasks if t.task_id in expected_seconds), key=lambda t: -expected_seconds[t.task_id])
    return unknown + known


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def run_suite(config: SuiteRunConfig) -> RunOutcome:
    """Run the flow with a task runner sized to the pool (the run id is fixed up front, so the
    cancellation hook can find the run's cloud resources by tag)."""
    if config.run_id is None:
        config = config.model_copy(update={"run_id": new_run_id()})
    runner = ThreadPoolTaskRunner(max_workers=config.pool_size)
    return evaluate_suite.with_options(task_runner=runner)(config)
