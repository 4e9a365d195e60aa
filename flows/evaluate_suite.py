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
"""

from __future__ import annotations

import queue
import subprocess
import time
import tempfile
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.context import get_run_context
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, Field, model_validator

from adapters.agents import AgentOptions, build_agent
from adapters.benchmark import BenchmarkResult, BenchmarkTask, OutcomeKind
from adapters.episode import EpisodeLimits
from adapters.store.duckdb_store import ResultStore, RunInfo
from adapters.vms.base import ResetLevel, VMProvider
from adapters.vms.existing import ExistingServersProvider
from adapters.vms.janitor import sweep_run
from adapters.vms.settings import build_cloud_provider, load_cloud_settings
from adapters.vms.local import LocalSimulationProvider
from adapters.vms.pool import VMPool
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.live import LiveAdapterSettings
from flows.attempt import AttemptContext, run_attempt
from flows.summary import format_summary, summary_rows
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
    pool_size: int = Field(default=4, ge=1, le=64)
    provider: Literal["local", "existing", "aws", "azure"] = "local"
    cloud_config: Path | None = None  # aws/azure: TOML settings file (else $ARENA_CONFIG / ./arena.toml)
    quirks: bool = False  # local provider: reproduce a real WAA server's quirks
    waa_urls: list[str] = Field(default_factory=list)  # existing provider: one server per pool slot
    reset_level: ResetLevel = ResetLevel.SNAPSHOT
    max_steps: int = Field(default=15, ge=1)
    episode_timeout_seconds: float = Field(default=1200.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    # Pause after each action before observing; None = the provider's default (3 s on real VMs,
    # 0 on the simulation). Benchmarks use it to simulate per-step latency.
    settle_seconds: float | None = Field(default=None, ge=0)
    db_path: Path = Path("results/arena.duckdb")
    artifacts_dir: Path = Path("results/artifacts")
    run_id: str | None = None

    @model_validator(mode="after")
    def _provider_fits(self) -> SuiteRunConfig:
        if self.provider == "existing":
            if not self.waa_urls:
                raise ValueError("provider 'existing' needs at least one WAA server URL (waa_urls)")
            if self.reset_level is not ResetLevel.SETUP:
                raise ValueError(
                    f"existing WAA servers cannot be reset at level {self.reset_level.value!r}; use 'setup'"
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
    results: list[BenchmarkResult]
    table: str


def _provider(config: SuiteRunConfig, run_id: str) -> VMProvider:
    """The VM provider the configuration names."""
    if config.provider == "existing":
        return ExistingServersProvider(config.waa_urls)
    if config.provider in ("aws", "azure"):
        return build_cloud_provider(config.provider, load_cloud_settings(config.cloud_config), run_id)
    return LocalSimulationProvider(quirks=config.quirks)


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


def _code_revision() -> str | None:
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
    """A global concurrency limit sized to the pool for this run; removed when the run ends."""
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=size))
    try:
        yield name
    finally:
        with get_client(sync_client=True) as client:
            client.delete_global_concurrency_limit_by_name(name)


@task(name="evaluate-task", task_run_name="{task.domain}/{task.task_id}", cache_policy=NO_CACHE, persist_result=False)
def evaluate_task(
    task: BenchmarkTask, pool: VMPool, ctx: AttemptContext, store: ResultStore, run_id: str, max_attempts: int
) -> BenchmarkResult:
    """Attempt a task until it ends for a non-infrastructure reason or attempts run out.

    Every attempt is recorded as it finishes; an infrastructure failure hands the VM back as
    unhealthy (the pool replaces it) and the next attempt runs on another VM.
    """
    result: BenchmarkResult | None = None
    for attempt in range(1, max_attempts + 1):
        with pool.lease() as vm:
            leased = time.monotonic()
            result = run_attempt(task, vm, ctx, attempt)
            vm_seconds = time.monotonic() - leased
        result = result.model_copy(update={"timings": {**result.timings, "vm": vm_seconds}})
        record_result(store, run_id, result)
        if not result.outcome.is_retryable:
            break
    assert result is not None
    return result


@task(name="vm-lane", task_run_name="lane-{lane}", cache_policy=NO_CACHE, persist_result=False)
def run_lane(
    lane: int,
    todo: "queue.Queue[BenchmarkTask]",
    pool: VMPool,
    ctx: AttemptContext,
    store: ResultStore,
    run_id: str,
    max_attempts: int,
) -> list[BenchmarkResult]:
    """Evaluate tasks from the queue, one at a time, until it is empty."""
    results: list[BenchmarkResult] = []
    while True:
        try:
            next_task = todo.get_nowait()
        except queue.Empty:
            return results
        results.append(evaluate_task(next_task, pool, ctx, store, run_id, max_attempts))


@flow(
    name="evaluate-suite",
    flow_run_name="waa-{config.agent}-{config.provider}",
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
    provider = _provider(config, run_id)
    environment = "local-simulation" if config.provider == "local" else config.provider

    with ResultStore(config.db_path) as store:
        finished = store.finished_task_ids(run_id)
        todo = [t for t in tasks if t.task_id not in finished]
        if finished:
            logger.info("Resuming run %s: %d of %d tasks already have final results", run_id, len(finished), len(tasks))
        flow_run = get_run_context().flow_run
        store.start_run(
            RunInfo(
                run_id=run_id,
                started_at=datetime.now(timezone.utc),
                status="running",
                agent=config.agent,
                agent_config=agent_config,
                model_id=agent_config.get("model"),
                model_endpoint=agent_config.get("base_url"),
                suite=str(config.suite_dir),
                suite_hash=catalog.content_hash(),
                task_count=len(tasks),
                pool_size=config.pool_size,
                provider=config.provider,
                reset_level=config.reset_level.value,
                code_revision=_code_revision(),
                prefect_flow_run_id=str(flow_run.id) if flow_run else None,
                environment=environment,
            ),
            resume=store.get_run(run_id) is not None,
        )
        status = "failed"
        try:
            results = _evaluate_on_pool(config, run_id, catalog, todo, provider, agent_options, store)
            status = "completed"
        finally:
            store.finish_run(run_id, status)
        summary = store.summary(run_id)

    table = format_summary(run_id, summary, environment)
    logger.info("Run summary\n%s", table)
    create_table_artifact(
        key="waa-run-summary",
        table=summary_rows(summary),
        description=f"WAA run {run_id}: {config.agent} agent on {len(tasks)} tasks ({environment})",
    )
    return RunOutcome(run_id=run_id, db_path=config.db_path, results=results, table=table)


def _evaluate_on_pool(
    config: SuiteRunConfig,
    run_id: str,
    catalog: WAATaskCatalog,
    todo: list[BenchmarkTask],
    provider: VMProvider,
    agent_options: AgentOptions,
    store: ResultStore,
) -> list[BenchmarkResult]:
    """Provision the pool, run every task in lanes, and always tear the pool down."""
    if not todo:
        return []
    pool = VMPool(provider, size=min(config.pool_size, len(todo)), run_id=run_id[-6:])
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
            )
            provision_pool(pool)
            work: queue.Queue[BenchmarkTask] = queue.Queue()
            for t in todo:
                work.put(t)
            with _pool_concurrency_limit(f"waa-pool-{run_id}", pool.size) as limit_name:
                with concurrency(limit_name, occupy=pool.size, strict=True):
                    futures = [
                        run_lane.submit(lane, work, pool, ctx, store, run_id, config.max_attempts)
                        for lane in range(pool.size)
                    ]
                    by_id = {r.task_id: r for f in futures for r in f.result()}
        return [by_id[t.task_id] for t in todo]
    finally:
        pool.teardown()
        if isinstance(provider, LocalSimulationProvider):
            provider.close()
        else:
            provider_leftovers(provider, run_id, get_run_logger())


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def run_suite(config: SuiteRunConfig) -> RunOutcome:
    """Run the flow with a task runner sized to the pool (the run id is fixed up front, so the
    cancellation hook can find the run's cloud resources by tag)."""
    if config.run_id is None:
        config = config.model_copy(update={"run_id": new_run_id()})
    runner = ThreadPoolTaskRunner(max_workers=config.pool_size)
    return evaluate_suite.with_options(task_runner=runner)(config)
