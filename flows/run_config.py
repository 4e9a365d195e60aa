"""What defines one evaluation run (`SuiteRunConfig`, stored with the run for provenance) and
what a run gives back (`RunOutcome`).

Flows, the CLI, deployments and benchmarks build a run from this one model; nothing here runs
anything.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from adapters.agents import MODEL_AGENTS, AgentOptions
from adapters.benchmark import BenchmarkResult
from adapters.results.source import stored_selection
from adapters.secrets import redact_url, refuse_url_secret
from adapters.store.duckdb_store import ResultStore, selection_change
from adapters.store.errors import StoreError
from adapters.store_location import check_store_url, default_store_url
from adapters.vms.base import ResetLevel
from adapters.vms.defaults import DEFAULT_POOL_TTL_HOURS, DEFAULT_SERVER_WAIT_SECONDS
from adapters.vms.registry import PROVIDERS, ProviderSettings, build_provider
from adapters.vms.warm_pool import pool_resource_id
from adapters.waa.suite_settings import suite_flavor
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.settle import SettleChoice, SettlePolicy, choose_policy
from flows.stage_limits import DEFAULT_STAGE_TIMEOUTS, validate_stage_timeouts
from flows.shard_signing import shard_secret
from flows.summary import RunCompleteness

# Run ids name folders (artifacts, progress files): a safe character set, no path parts.
SAFE_RUN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")

# Providers where "auto" hedging stays off: the simulation's VMs do not fail by themselves, and
# existing servers are a fixed set the operator runs.
NO_AUTO_HEDGING_PROVIDERS = frozenset({"local", "existing"})


def writable_folder(folder: Path, option: str, named: Path | None = None) -> None:
    """Make sure this process can create `folder` (when missing) and write files in it, by doing
    so and undoing it (the run makes them itself once every check has passed); ValueError naming
    `option` and the path (`named`, else the folder) when it cannot."""
    folder = folder.expanduser().absolute()
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        for tries_left in range(4, -1, -1):
            try:
                folder.mkdir(parents=True, exist_ok=True)
                with tempfile.NamedTemporaryFile(dir=folder, prefix=".arena-write-check-"):
                    pass
                break
            except FileNotFoundError:
                # Another run's check, started at the same moment, undid the folder both had just
                # made (three `arena run` at once into a new results/ folder): make it again.
                if not tries_left:
                    raise
    except OSError as exc:
        raise ValueError(f"{option} {(named or folder).expanduser()}: cannot write there ({exc.strerror or exc}); "
                         "give a folder this user can write") from None
    finally:
        for made in missing:  # deepest first
            with contextlib.suppress(OSError):
                made.rmdir()


class SuiteRunConfig(BaseModel):
    """Everything that defines one evaluation run; stored with the run for provenance."""

    suite_dir: Path = Field(default_factory=bundled_suite_dir)
    # Whose evaluator semantics score the suite ("waa", "waa-v2"); None: what the suite says
    # (arena-suite.toml flavor, or a WAA-V2 checkout recognised), else WAA's.
    suite_flavor: Literal["waa", "waa-v2"] | None = None
    # How a server failure during evaluation counts (adapters/outcomes.py R9): "strict" (the
    # default) makes it an infrastructure error, retried and never scored; "waa-compat" scores it
    # as WAA's evaluator does (mostly None, so 0), for reproducing WAA's own numbers. Recorded on
    # the run (runs.scoring) and shown beside every rate.
    scoring: Literal["strict", "waa-compat"] = "strict"
    difficulty: Literal["normal", "hard"] = "normal"
    domains: list[str] | None = None
    task_ids: list[str] | None = None
    agent: str = "scripted"
    agent_options: AgentOptions = Field(default_factory=AgentOptions)
    # Provenance only: the checkpoint behind `agent_options.model`, when a fine-tuning job
    # announced one (recorded in runs.model_checkpoint).
    model_checkpoint: str | None = None
    pool_size: int = Field(default=4, ge=1, le=64)
    provider: str = "local"  # a name in adapters/vms/registry.py PROVIDERS
    cloud_config: Path | None = None  # aws/azure: TOML settings file (else $ARENA_CONFIG / ./arena.toml)
    # aws/azure: run on this warm pool's VMs (adapters/vms/warm_pool.py), started if stopped and
    # stopped, not deleted, at the end; one run at a time holds a warm pool.
    warm_pool: str | None = None
    # How long to wait for another run to release the warm pool before giving up.
    warm_pool_wait_seconds: float = Field(default=0.0, ge=0)
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
    # replaced. "episode" defaults to the episode's two soft limits (the agent's time and the
    # environment's, each episode_timeout_seconds) + 30 s: the soft ones are checked between
    # steps, the hard one catches a step blocked in a call (flows/stage_limits.py).
    stage_timeouts: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_STAGE_TIMEOUTS))
    max_attempts: int = Field(default=3, ge=1)
    # Hedge copies of the run's last tasks on VMs with nothing left to do (flows/hedging.py): the
    # task's own attempt counts whenever it ends; the copy only stands in when that attempt
    # fails with an infrastructure error. "auto": on where the cost is VM time only (an agent
    # that calls no model) and VMs can fail (kvm, aws, azure); off for model agents (a copy
    # spends tokens) and on the local simulation and existing servers. `hedge_allowance` bounds
    # the copies' VM time as a fraction of the VM time billed.
    hedging: Literal["auto", "on", "off"] = "auto"
    hedge_allowance: float = Field(default=0.05, gt=0, le=1)
    # Repeated trials: each task runs `trials` times, each trial from a fresh reset with its own
    # `max_attempts` (docs/statistics.md). A resume with more trials runs only the new ones.
    trials: int = Field(default=1, ge=1, le=100)
    # Per task, a number of trials other than `trials` (the adaptive model-update design asks
    # for more trials of some tasks only); tasks not named get `trials`.
    task_trials: dict[str, int] = Field(default_factory=dict)
    # Run budget (None = unlimited). When one is reached, lanes take no new task and start no
    # retry; the run ends with status "budget_exhausted". Cost = the results' model cost +
    # VM-hours of the pool * vm_hour_price_usd. Cost and tokens include earlier invocations of a
    # resumed run (their VM cost from recorded vm_seconds); wall seconds count this invocation.
    max_wall_seconds: float | None = Field(default=None, gt=0)
    max_cost_usd: float | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)
    vm_hour_price_usd: float = Field(default=0.0, ge=0)
    # How to wait after each action before observing: "adaptive" (until the screen is still,
    # adapters/waa/settle.py), a fixed pause in seconds (WAA's runner: 3), or None for the
    # provider's default (adaptive on real VMs, none on the simulation, which acts at once).
    # Benchmarks use a fixed pause to simulate per-step latency.
    settle: SettleChoice | None = None
    db_path: Path = Path("results/arena.duckdb")
    # The team store (a PostgreSQL URL without its password; default $ARENA_STORE_URL): when set,
    # results go there instead of `db_path`, from this controller and from every shard host.
    store_url: str | None = Field(default_factory=default_store_url, validate_default=True)
    # Screenshots. In shard mode every shard writes here on its own host: use a path on a
    # filesystem shared by all hosts (mounted at the same path), or the report lacks the
    # screenshots of remote shards.
    artifacts_dir: Path = Path("results/artifacts")
    # Names folders under artifacts_dir, so only a safe character set (SAFE_RUN_ID).
    run_id: str | None = None
    # A resume must select the tasks the run selected; True makes this selection the run's own.
    change_selection: bool = False
    # The baseline (deployments/baselines.toml) this is a run of, stored as runs.baseline so a
    # model update finds exactly its baseline's runs; None for every other run.
    baseline: str | None = None
    # How the run was started: names its flow run and tags it in the Prefect UI; not part of
    # what a resume must match.
    trigger: Literal["ad-hoc", "on-demand", "nightly", "model-update"] = "ad-hoc"
    # Shard mode (flows/shard.py, docs/deployments.md): 0 = every task runs in this flow run's
    # process. N > 0 = the tasks still to do are split into N balanced shards, each run as a flow
    # run of `shard_deployment` ("flow/deployment") on whichever worker picks it up, each on its
    # own pool of `pool_size` VMs. A shard run no worker has started after
    # `shard_start_timeout_seconds` is cancelled and its tasks stay missing.
    shards: int = Field(default=0, ge=0, le=64)
    shard_deployment: str = "evaluate-shard/shard"
    shard_start_timeout_seconds: float = Field(default=900.0, gt=0)

    def hedging_on(self) -> bool:
        """Whether the run hedges its last tasks ("auto": agents that call no model, on VMs
        a provider creates)."""
        if self.hedging != "auto":
            return self.hedging == "on"
        return self.agent not in MODEL_AGENTS and self.provider not in NO_AUTO_HEDGING_PROVIDERS

    def trials_of(self, task_id: str) -> int:
        """How many trials of `task_id` the run wants."""
        return self.task_trials.get(task_id, self.trials)

    def settle_policy(self, provider_default: SettlePolicy) -> SettlePolicy:
        """The wait after each action this run uses, given its provider's default."""
        return choose_policy(self.settle, provider_default)

    @field_validator("store_url")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        return None if value is None else check_store_url(value)

    @property
    def store_location(self) -> Path | str:
        """Where the run's results go: the team store's URL when set, else the DuckDB file."""
        return self.store_url or self.db_path

    @field_validator("waa_urls")
    @classmethod
    def _no_secret_in_urls(cls, value: list[str]) -> list[str]:
        # The refusal shows the URL redacted: its secret is what it must not repeat.
        return [refuse_url_secret(url, f"--waa-url {redact_url(url)!r}", "leave it out") for url in value]

    @field_validator("stage_timeouts")
    @classmethod
    def _known_stages(cls, value: dict[str, float]) -> dict[str, float]:
        return validate_stage_timeouts(value)

    @field_validator("run_id")
    @classmethod
    def _safe_run_id(cls, value: str | None) -> str | None:
        if value is not None and not SAFE_RUN_ID.fullmatch(value):
            raise ValueError(
                f"run id {value!r} may hold only letters, digits, '.', '_' and '-' (at most 128, not starting "
                "with '.' or '-'): it names folders under the results directory"
            )
        return value

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, value: str) -> str:
        PROVIDERS.lookup(value)  # UnknownName (a ValueError) lists the known providers
        return value

    @field_validator("warm_pool")
    @classmethod
    def _pool_name(cls, value: str | None) -> str | None:
        if value is not None:
            pool_resource_id(value)  # ValueError naming the rule
        return value

    @model_validator(mode="after")
    def _provider_fits(self) -> SuiteRunConfig:
        if self.warm_pool is not None:
            if self.provider not in ("aws", "azure"):
                raise ValueError(f"warm_pool {self.warm_pool!r} needs provider 'aws' or 'azure', not {self.provider!r}")
            if self.shards:
                raise ValueError("a warm pool serves one controller: run without shards, or give each its own pool")
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
        if self.shards and (self.trials > 1 or self.task_trials):
            raise ValueError("trials > 1 with shards is not built yet: run the trials on one controller (shards=0)")
        if any(k < 1 for k in self.task_trials.values()):
            raise ValueError(f"task_trials must give each task at least 1 trial, got {self.task_trials}")
        if self.shards and self.shard_deployment.count("/") != 1:
            raise ValueError(
                f"shard_deployment must name a deployment as 'flow/deployment', got {self.shard_deployment!r}"
            )
        if self.agent not in MODEL_AGENTS:
            # A model name on an agent that calls none would be stored with the run as if it had.
            given = [option for option, value in (("--model", self.agent_options.model),
                                                  ("--base-url", self.agent_options.base_url)) if value]
            if given:
                raise ValueError(f"{' and '.join(given)} given, but the {self.agent!r} agent calls no model; use one of "
                                 f"{', '.join(sorted(MODEL_AGENTS))}")
        return self

    def flavor(self) -> str:
        """The suite's flavour as it will be scored (adapters/waa/suite_settings.py)."""
        return suite_flavor(self.suite_dir, self.suite_flavor)

    def provider_settings(self, run_id: str) -> ProviderSettings:
        """What the configured provider is built from (`run_id` tags its cloud resources; on a
        warm pool the pool's id does, and the pool's TTL sets their expiry)."""
        return ProviderSettings(
            run_id=pool_resource_id(self.warm_pool) if self.warm_pool else run_id,
            ttl_hours=DEFAULT_POOL_TTL_HOURS if self.warm_pool else None,
            cloud_config=self.cloud_config,
            waa_urls=list(self.waa_urls),
            server_wait_seconds=self.server_wait_seconds,
            quirks=self.quirks,
            quirk_settings=self.quirk_settings,
            pool_size=self.pool_size,
        )

    def preflight(self) -> None:
        """Check what the flow would only find out after Prefect started: the suite and the
        selected tasks load, and the result paths are usable. ValueError naming the input."""
        catalog = WAATaskCatalog(
            self.suite_dir, difficulty=self.difficulty, max_steps=self.max_steps, require_supported=True
        )
        selected = catalog.tasks(domains=self.domains, ids=self.task_ids)
        self.flavor()  # a broken arena-suite.toml is named before anything starts
        if not selected:
            raise ValueError(f"no task of {self.suite_dir} matches the selection (domains {self.domains})")
        provider = build_provider(self.provider, self.provider_settings(self.run_id or "preflight"))
        try:
            if self.reset_level not in provider.supported_reset_levels():
                levels = ", ".join(sorted(level.value for level in provider.supported_reset_levels()))
                raise ValueError(
                    f"reset level {self.reset_level.value!r} is not available with provider {self.provider!r} "
                    f"(available: {levels})"
                )
        finally:
            provider.close()
        if self.shards:
            shard_secret()  # shards are signed: a controller without the secret cannot start them
        store_wait_seconds()  # the operator's store-outage settings are numbers
        if self.store_url is None and self.db_path.is_dir():
            raise ValueError(f"--db {self.db_path} is a directory; give the path of a DuckDB file")
        if self.artifacts_dir.exists() and not self.artifacts_dir.is_dir():
            raise ValueError(f"--artifacts {self.artifacts_dir} is a file; give a directory for screenshots")
        # Found only at the end before: a store file nobody can create failed the run after every
        # task had run (exit 6, a resume that failed the same way); screenshots nobody can write
        # were dropped while the run said where they were.
        writable_folder(self.artifacts_dir, "--artifacts")
        if self.store_url is None and not self.db_path.is_file():
            writable_folder(self.db_path.parent, "--db", self.db_path)
        if self.store_url is not None or self.db_path.is_file():
            # Reached, logged in, undamaged and of a schema this code knows (created when new)
            # before any VM; a run id another live controller is running is refused here too.
            try:
                with ResultStore(self.store_location, wait_seconds=30) as store:
                    holder = store.lease_holder(self.run_id) if self.run_id else None
            except StoreError as exc:
                raise ValueError(str(exc)) from exc
            if holder is not None:
                raise ValueError(holder)
        if self.run_id and not self.change_selection and (self.store_url or self.db_path.is_file()):
            problem = selection_change(self.run_id, stored_selection(self.store_location, self.run_id),
                                       [t.task_id for t in selected])
            if problem:
                raise ValueError(problem)

    def resolved_agent_options(self) -> AgentOptions:
        """Agent options with the suite's own solution plans filled in for the scripted agent."""
        if self.agent_options.plans_path is not None:
            return self.agent_options
        candidate = self.suite_dir / "solutions.json"
        return self.agent_options.model_copy(update={"plans_path": candidate if candidate.exists() else None})


@dataclass(frozen=True)
class StoreWait:
    """How long a run waits for a results store that is down (the operator's settings).

    While the store is down, new tasks wait once as many results wait for it as the pool has VMs
    (no VM time or model money is spent on results that cannot be stored), for at most `outage`
    seconds (ARENA_STORE_OUTAGE_WAIT_SECONDS, default 600); then the run starts nothing more. At
    its end a run waits `flush` seconds (ARENA_STORE_FLUSH_SECONDS, default 120) for results
    still waiting (not after an outage that already outlasted `outage`), then ends as a store
    failure with them safe in its spool."""

    flush: float = 120.0
    outage: float = 600.0


def store_wait_seconds() -> StoreWait:
    """The operator's `StoreWait` from the environment; ValueError naming a bad variable."""
    values: dict[str, float] = {}
    for name, field_name in (("ARENA_STORE_FLUSH_SECONDS", "flush"), ("ARENA_STORE_OUTAGE_WAIT_SECONDS", "outage")):
        text = os.environ.get(name)
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number of seconds, got {text!r}") from None
        if not value > 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {text!r}")
        values[field_name] = value
    return StoreWait(**values)


# The run status of a run whose results store failed (unreachable, disk full) before every
# result was stored; `arena run` exits 6 with the cause and the resume command.
STORE_FAILED = "store_failed"


class RunOutcome(BaseModel):
    run_id: str
    store: str  # where the results are: the DuckDB file, or the team store's URL
    results: list[BenchmarkResult]  # the last attempt of each task run by this invocation
    table: str
    status: str = "completed"
    completeness: RunCompleteness | None = None
    # Shard mode: one line per shard run that returned no results (naming its flow run); the
    # tasks of those shards count as missing in `completeness`.
    shard_errors: list[str] = Field(default_factory=list)
    # VMs that never came up or could not be replaced (e.g. an existing server that died).
    pool_errors: list[str] = Field(default_factory=list)
    # A store failure (status STORE_FAILED): its cause, the results waiting in the run's spool
    # and those that could not be written anywhere.
    store_failure: str | None = None
    spooled: int = 0
    lost: int = 0
    # Who stopped a cancelled or interrupted run: "prefect" (its Cancel), "ctrl-c", "sigterm".
    stopped_by: str | None = None
    # The evaluation's own flow run (its page in the Prefect UI).
    flow_run_id: str | None = None


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
