"""The result store: one DuckDB file (or one PostgreSQL database, the team store) holds every
run, task result and step.

Query a file with any DuckDB client, e.g. ``duckdb -readonly results.duckdb``, and a PostgreSQL
store with psql: the tables and views are the same (in PostgreSQL, DOUBLE is DOUBLE PRECISION).
All TIMESTAMP columns are UTC (naive timestamps); all durations are in seconds.

Schema (version 10)
-------------------

Version 2 added model usage: ``runs.model_endpoint``, and ``model_calls``, ``input_tokens``,
``output_tokens`` and ``cost_usd`` on ``task_results`` (the attempt's total) and ``steps``, and
``task_results.agent_details`` and ``task_results.vm_seconds``. Version 3 added provenance
(``runs.agent_config_hash``, ``model_checkpoint``, ``vm_image``, ``run_config``) and, on
``steps``, ``reasoning``, ``click_x`` and ``click_y``.
Version 6 added ``task_results.task_fingerprint`` (comparisons pair only the same task version).
Version 7 added ``runs.controller`` and ``runs.heartbeat_at`` (the run's lease: one controller
per run id, and a run whose controller died shown as abandoned; adapters/store/lease.py).
Version 8 added ``runs.scoring`` (how a server failure during evaluation counted:
adapters/outcomes.py R9) and ``steps.delivery`` (how the environment delivered the action).
Version 9 added ``task_results.trial`` (repeated trials of a task in one run; older rows are
trial 1) and made the views per (task, trial). Version 10 added ``shard_tickets`` (who may write a
run besides its controller: adapters/store/writers.py).
Older files are upgraded in place when opened; a newer file is refused.

``schema_version(version INTEGER)``
    One row: the schema version the file was written with. Code refuses a file whose version is
    newer than the one it knows, rather than misreading it.

``runs`` -- one row per evaluation run (its provenance).
    ==================== ========= =========================================================
    run_id               VARCHAR   primary key
    started_at           TIMESTAMP when the run started
    finished_at          TIMESTAMP when it finished; NULL while running or if interrupted
    status               VARCHAR   free text set by the flow, e.g. running/completed/failed
    agent                VARCHAR   agent name
    agent_config         JSON      agent settings, with secret-looking keys removed
    model_id             VARCHAR   model or checkpoint identifier
    suite                VARCHAR   task suite name (e.g. "waa/test_all" or a path)
    suite_hash           VARCHAR   sha256 of the suite files (WAATaskCatalog.content_hash)
    task_count           INTEGER   number of tasks selected for the run
    pool_size            INTEGER   number of VMs / concurrent episodes
    provider             VARCHAR   VM provider: local, azure, aws, ...
    reset_level          VARCHAR   how the VM was reset before each task
    code_revision        VARCHAR   git revision of this code
    prefect_flow_run_id  VARCHAR   the Prefect flow run that produced it
    environment          VARCHAR   e.g. "local-simulation" (simulated desktop) or a VM image
    model_endpoint       VARCHAR   the model API base URL the agent called, if any
    agent_config_hash    VARCHAR   sha256 of agent_config as canonical JSON: runs with the
                                   same hash ran the same agent configuration
    model_checkpoint     VARCHAR   checkpoint path or URI of the model, when announced
    vm_image             VARCHAR   image or snapshot the VMs started from (AMI id, Azure image
                                   id, "local-simulation"); NULL when unknown (existing VMs)
    run_config           JSON      the whole run configuration, secrets removed
    baseline             VARCHAR   the baseline this is a run of (NULL for other runs)
    selected_task_ids    JSON      the tasks the run selected (a resume must select the same)
    controller           VARCHAR   the process running it: "host/pid/start time" (v7)
    heartbeat_at         TIMESTAMP when that controller was last heard from (v7); a `running`
                                   run whose controller died is shown as `abandoned`
    scoring              VARCHAR   v8: "strict" (a server failure during evaluation is an
                                   infrastructure error, never scored) or "waa-compat"
                                   (scored as WAA does); NULL for runs before v8
    ==================== ========= =========================================================

``task_results`` -- one row per task *attempt*; primary key (run_id, task_id, attempt).
    ==================== ========= =========================================================
    run_id, task_id      VARCHAR   the run and the WAA task id
    domain               VARCHAR   WAA domain (chrome, vlc, ...)
    attempt              INTEGER   1 for the first try; infrastructure errors are retried
                                   with a higher attempt number
    outcome              VARCHAR   success, agent_failure, setup_failure, evaluation_error,
                                   infrastructure_error or timeout (OutcomeKind)
    success              BOOLEAN   outcome = 'success'
    score                DOUBLE    evaluator score in [0, 1] (may be fractional)
    infeasible           BOOLEAN   the task is one of WAA's infeasible tasks
    num_steps            INTEGER   agent steps taken
    error                VARCHAR   error message for non-success outcomes
    reason               VARCHAR   short human-readable explanation of the outcome
    total_time_seconds   DOUBLE    wall clock for the whole attempt
    reset_seconds ... env_seconds
                         DOUBLE    time per stage: reset, setup, episode, evaluate, and within
                                   the episode agent (model) vs env (VM) time; NULL if unknown
    vm_seconds           DOUBLE    seconds the attempt held its VM (for cost per task)
    vm_id                VARCHAR   the VM that ran the attempt
    recorded_at          TIMESTAMP when the row was written
    timings              JSON      the full timings dict as reported (including extra keys)
    model_calls          INTEGER   model API calls of the attempt (0 for scripted agents)
    input_tokens         BIGINT    model input tokens of the attempt
    output_tokens        BIGINT    model output tokens of the attempt
    cost_usd             DOUBLE    model cost of the attempt, from the configured prices
    agent_details        JSON      the agent's configuration after the task (e.g. the id of
                                   the demonstration it retrieved), secrets removed
    task_fingerprint     VARCHAR   the hash of the exact task definition attempted (v6;
                                   NULL for older rows): BenchmarkTask.fingerprint
    trial                INTEGER   v9: which of the run's repeated trials of the task (1..K,
                                   `arena run --trials K`), each from a fresh reset; 1 for
                                   single-trial runs and rows before v9. `attempt` keeps
                                   counting per task across trials, so (run_id, task_id,
                                   attempt) still identifies an attempt (and its steps)
    ==================== ========= =========================================================

``steps`` -- one row per agent step; primary key (run_id, task_id, attempt, step_index).
    action_type VARCHAR (click, type, ...), action JSON (the full BenchmarkAction),
    screenshot_path VARCHAR (the screen the agent saw before acting: a PNG file next to the
    database; relative to the database's folder when it lies under it, so the folder can be
    moved or shared whole; ``ResultStore.resolve_path`` makes it absolute), window_title
    VARCHAR, agent_seconds DOUBLE, env_seconds DOUBLE, error VARCHAR, the step's
    model_calls, input_tokens, output_tokens, cost_usd (NULL when the agent has no model),
    reasoning VARCHAR (the agent's stated reasoning), and click_x, click_y DOUBLE (the screen
    point a pointer action aimed at, in pixels of the screenshot: the action's x/y, or the
    centre of its target element's box; NULL for other actions or when unknown), and
    observation_error VARCHAR (schema v4: why the observation after this step lacks a part,
    e.g. the accessibility tree the agent's own typing made unreadable; NULL when complete),
    and delivery VARCHAR (schema v8: how the environment delivered the action, e.g. long text
    typed in pieces; NULL when nothing was sent).

``shard_tickets`` -- v10: one row per shard a controller started (adapters/store/writers.py):
    ticket_hash VARCHAR (primary key: the SHA-256 of the ticket in the shard's parameters), run_id
    VARCHAR, shard INTEGER, controller VARCHAR (who issued it), issued_at, expires_at, spent_at
    TIMESTAMP, flow_run_id VARCHAR (the shard flow run that spent it). A shard may write its
    run's results only with a ticket it spent, while the run is running under that controller.

``latest_task_results`` (view) -- task_results restricted to the last attempt of each
(run_id, task_id, trial). Reports count this view, so a task retried after an infrastructure
error counts once per trial, with its final outcome; a single-trial run has one row per task.

Example::

    SELECT domain, avg(success::INT) AS success_rate
    FROM latest_task_results WHERE run_id = 'nightly-2025-01-01' GROUP BY domain;
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import duckdb
from pydantic import BaseModel, Field

from adapters.benchmark import BenchmarkResult, ModelUsage, OutcomeKind
import adapters.store.connections as connections
import adapters.store.postgres as postgres
from adapters.secrets import scrub_secrets
from adapters.store.errors import (
    RunLeaseHeld,
    SchemaVersionError,
    StoreDamaged,
    StoreError,
    StoreUnavailable,
    is_outage,
)
from adapters.store.lease import Controller, liveness
import adapters.store.writers as writers

SCHEMA_VERSION = 10

# In-place upgrades: MIGRATIONS[v] takes a file from version v to v + 1.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "ALTER TABLE runs ADD COLUMN model_endpoint VARCHAR",
        "ALTER TABLE task_results ADD COLUMN model_calls INTEGER",
        "ALTER TABLE task_results ADD COLUMN input_tokens BIGINT",
        "ALTER TABLE task_results ADD COLUMN output_tokens BIGINT",
        "ALTER TABLE task_results ADD COLUMN cost_usd DOUBLE",
        "ALTER TABLE task_results ADD COLUMN agent_details JSON",
        "ALTER TABLE task_results ADD COLUMN vm_seconds DOUBLE",
        "ALTER TABLE steps ADD COLUMN model_calls INTEGER",
        "ALTER TABLE steps ADD COLUMN input_tokens BIGINT",
        "ALTER TABLE steps ADD COLUMN output_tokens BIGINT",
        "ALTER TABLE steps ADD COLUMN cost_usd DOUBLE",
    ),
    2: (
        "ALTER TABLE runs ADD COLUMN agent_config_hash VARCHAR",
        "ALTER TABLE runs ADD COLUMN model_checkpoint VARCHAR",
        "ALTER TABLE runs ADD COLUMN vm_image VARCHAR",
        "ALTER TABLE runs ADD COLUMN run_config JSON",
        "ALTER TABLE steps ADD COLUMN reasoning VARCHAR",
        "ALTER TABLE steps ADD COLUMN click_x DOUBLE",
        "ALTER TABLE steps ADD COLUMN click_y DOUBLE",
    ),
    3: ("ALTER TABLE steps ADD COLUMN observation_error VARCHAR",),
    4: (
        "ALTER TABLE runs ADD COLUMN baseline VARCHAR",
        "ALTER TABLE runs ADD COLUMN selected_task_ids JSON",
    ),
    5: ("ALTER TABLE task_results ADD COLUMN task_fingerprint VARCHAR",),
    6: (
        "ALTER TABLE runs ADD COLUMN controller VARCHAR",
        "ALTER TABLE runs ADD COLUMN heartbeat_at TIMESTAMP",
    ),
    7: (
        "ALTER TABLE runs ADD COLUMN scoring VARCHAR",
        "ALTER TABLE steps ADD COLUMN delivery VARCHAR",
    ),
    # Every earlier attempt was the one trial of its task.
    8: ("ALTER TABLE task_results ADD COLUMN trial INTEGER NOT NULL DEFAULT 1",),
    9: (),  # shard_tickets is a new table: the DDL creates it
}

# The outcomes after which a task is done for good; resume skips only these. Derived from the
# schema's own rule so the store and the retry logic cannot disagree.
_FINAL_OUTCOMES: tuple[str, ...] = tuple(o.value for o in OutcomeKind if not o.is_retryable)
_INFRA = OutcomeKind.INFRASTRUCTURE_ERROR.value

# The stage timings that have their own column; BenchmarkResult.timings may name them either
# "reset" or "reset_seconds".
_TIMING_STAGES: tuple[str, ...] = ("reset", "setup", "episode", "evaluate", "agent", "env", "vm")

_DDL: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS runs (
        run_id VARCHAR PRIMARY KEY,
        started_at TIMESTAMP,
        finished_at TIMESTAMP,
        status VARCHAR,
        agent VARCHAR,
        agent_config JSON,
        model_id VARCHAR,
        suite VARCHAR,
        suite_hash VARCHAR,
        task_count INTEGER,
        pool_size INTEGER,
        provider VARCHAR,
        reset_level VARCHAR,
        code_revision VARCHAR,
        prefect_flow_run_id VARCHAR,
        environment VARCHAR,
        model_endpoint VARCHAR,
        agent_config_hash VARCHAR,
        model_checkpoint VARCHAR,
        vm_image VARCHAR,
        run_config JSON,
        baseline VARCHAR,
        selected_task_ids JSON,
        controller VARCHAR,
        heartbeat_at TIMESTAMP,
        scoring VARCHAR
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS task_results (
        run_id VARCHAR NOT NULL,
        task_id VARCHAR NOT NULL,
        domain VARCHAR,
        attempt INTEGER NOT NULL,
        outcome VARCHAR NOT NULL,
        success BOOLEAN NOT NULL,
        score DOUBLE,
        infeasible BOOLEAN,
        num_steps INTEGER,
        error VARCHAR,
        reason VARCHAR,
        total_time_seconds DOUBLE,
        reset_seconds DOUBLE,
        setup_seconds DOUBLE,
        episode_seconds DOUBLE,
        evaluate_seconds DOUBLE,
        agent_seconds DOUBLE,
        env_seconds DOUBLE,
        vm_seconds DOUBLE,
        vm_id VARCHAR,
        recorded_at TIMESTAMP,
        timings JSON,
        model_calls INTEGER,
        input_tokens BIGINT,
        output_tokens BIGINT,
        cost_usd DOUBLE,
        agent_details JSON,
        task_fingerprint VARCHAR,
        trial INTEGER NOT NULL DEFAULT 1,
        PRIMARY KEY (run_id, task_id, attempt)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS steps (
        run_id VARCHAR NOT NULL,
        task_id VARCHAR NOT NULL,
        attempt INTEGER NOT NULL,
        step_index INTEGER NOT NULL,
        action_type VARCHAR,
        action JSON,
        screenshot_path VARCHAR,
        window_title VARCHAR,
        agent_seconds DOUBLE,
        env_seconds DOUBLE,
        error VARCHAR,
        model_calls INTEGER,
        input_tokens BIGINT,
        output_tokens BIGINT,
        cost_usd DOUBLE,
        reasoning VARCHAR,
        click_x DOUBLE,
        click_y DOUBLE,
        observation_error VARCHAR,
        delivery VARCHAR,
        PRIMARY KEY (run_id, task_id, attempt, step_index)
    )
    """,
    writers.TICKETS_DDL,
    """
    CREATE OR REPLACE VIEW latest_task_results AS
    SELECT * FROM task_results
    QUALIFY row_number() OVER (PARTITION BY run_id, task_id, trial ORDER BY attempt DESC) = 1
    """,
)

# How long a PostgreSQL store's reads (and the writes that are the same when repeated: a run's
# final status, its heartbeat) try again through a lost connection (a restart, a dropped or
# terminated backend): each try connects anew. A connection dropped at a run's end cost a
# completed run its exit status 0 when nothing tried again.
RECONNECT_SECONDS = 30.0

T = TypeVar("T")


def _reconnecting(method: Callable[..., T]) -> Callable[..., T]:
    """A `ResultStore` method made again, on a new connection, when a PostgreSQL store's
    connection was lost under it (`ResultStore._retried`)."""

    @functools.wraps(method)
    def call(self: ResultStore, *args: Any, **kwargs: Any) -> T:
        return self._retried(lambda: method(self, *args, **kwargs))

    return call


_RESULT_COLUMNS: tuple[str, ...] = (
    "run_id", "task_id", "domain", "attempt", "outcome", "success", "score", "infeasible",
    "num_steps", "error", "reason", "total_time_seconds", "reset_seconds", "setup_seconds",
    "episode_seconds", "evaluate_seconds", "agent_seconds", "env_seconds", "vm_seconds", "vm_id",
    "recorded_at", "timings", "model_calls", "input_tokens", "output_tokens", "cost_usd",
    "agent_details", "task_fingerprint", "trial",
)
_STEP_COLUMNS: tuple[str, ...] = (
    "run_id", "task_id", "attempt", "step_index", "action_type", "action", "screenshot_path",
    "window_title", "agent_seconds", "env_seconds", "error", "model_calls", "input_tokens",
    "output_tokens", "cost_usd", "reasoning", "click_x", "click_y", "observation_error", "delivery",
)
_JSON_COLUMNS = frozenset({"agent_config", "timings", "action", "agent_details", "run_config", "selected_task_ids"})


def _usage_values(usage: ModelUsage | None) -> list[Any]:
    """model_calls, input_tokens, output_tokens, cost_usd; NULLs for agents without a model."""
    if usage is None:
        return [None, None, None, None]
    # A model without a known price: the cost is not known (NULL), not $0.
    return [usage.calls, usage.input_tokens, usage.output_tokens, None if usage.unpriced else usage.cost_usd]


# --- models ----------------------------------------------------------------------------------


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def _to_utc_naive(value: dt.datetime | None) -> dt.datetime | None:
    # DuckDB TIMESTAMP has no zone; store UTC so runs from different machines compare.
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(dt.timezone.utc).replace(tzinfo=None)


class RunInfo(BaseModel):
    """Provenance of one evaluation run, stored in the `runs` table."""

    run_id: str = Field(min_length=1)
    agent: str
    suite: str
    started_at: dt.datetime = Field(default_factory=_utcnow)
    finished_at: dt.datetime | None = None
    status: str = "running"
    agent_config: dict[str, Any] = Field(default_factory=dict)
    model_id: str | None = None
    suite_hash: str | None = None
    task_count: int | None = None
    pool_size: int | None = None
    provider: str | None = None
    reset_level: str | None = None
    code_revision: str | None = None
    prefect_flow_run_id: str | None = None
    environment: str | None = None
    model_endpoint: str | None = None
    model_checkpoint: str | None = None
    vm_image: str | None = None
    run_config: dict[str, Any] = Field(default_factory=dict)
    agent_config_hash: str | None = None
    """Computed by the store from agent_config when the run is recorded; any value given is ignored."""
    baseline: str | None = None
    """The baseline (deployments/baselines.toml) this run is a run of; None for other runs."""
    selected_task_ids: list[str] | None = None
    """The tasks the run selected (sorted); a resume must select the same ones."""
    controller: str | None = None
    """The process running the run ("host/pid/start time"), set by `start_run`."""
    heartbeat_at: dt.datetime | None = None
    """When that controller was last heard from (naive UTC)."""
    scoring: str | None = None
    """How a server failure during evaluation counted (adapters/outcomes.py R9): "strict" or
    "waa-compat"; None for runs recorded before schema 8."""


def agent_config_hash(agent_config: Mapping[str, Any]) -> str:
    """The hash stored as runs.agent_config_hash: SHA-256 of the scrubbed configuration's JSON."""
    config_json = json.dumps(scrub_secrets(dict(agent_config)), sort_keys=True, default=str)
    return hashlib.sha256(config_json.encode()).hexdigest()


# What a resumed run must share with the stored one, so one run never mixes two configurations.
_RESUMED_FIELDS = ("agent", "model_id", "suite", "suite_hash", "agent_config_hash", "scoring")


def configuration_change(stored: Mapping[str, Any], run: RunInfo) -> str | None:
    """Why `run` cannot continue the stored run whose `_RESUMED_FIELDS` are `stored` (agent,
    model, suite, suite hash, agent configuration hash, scoring), in one line; None when it can."""
    wanted = (run.agent, run.model_id, run.suite, run.suite_hash, agent_config_hash(run.agent_config), run.scoring)
    changed = [
        f"{name}: stored {stored.get(name)!r}, now {new!r}"
        for name, new in zip(_RESUMED_FIELDS, wanted)
        # Runs recorded before version 3 (8) have no configuration hash (scoring) to compare.
        if stored.get(name) != new and not (name in ("agent_config_hash", "scoring") and stored.get(name) is None)
    ]
    if not changed:
        return None
    return (f"cannot resume run {run.run_id!r} with a different configuration ({'; '.join(changed)}); "
            "give another --run-id for a new run")


def selection_change(run_id: str, stored: list[str] | None, selected: list[str]) -> str | None:
    """Why resuming run `run_id` (which selected `stored`) with `selected` is refused, or None
    when the selections agree (or the run predates stored selections)."""
    if stored is None or set(stored) == set(selected):
        return None
    kept, dropped, added = set(stored) & set(selected), set(stored) - set(selected), set(selected) - set(stored)
    return (
        f"run {run_id!r} selected {len(stored)} task(s); this resume selects {len(selected)} "
        f"({len(kept)} in common, {len(dropped)} left out, {len(added)} new). Resume with the run's own "
        "selection (the same --suite, --difficulty, --domain and --task), or add --change-selection "
        "to make this the run's selection"
    )


# --- the store -------------------------------------------------------------------------------


class ResultStore:
    """Runs, task results and steps in one DuckDB file or one PostgreSQL database; safe to share
    between threads and between processes.

    A DuckDB file is never held open: each call opens it, does its work and closes it, waiting
    its turn when another process (another run, a report) has it open
    (adapters/store/connections.py). So any number of runs on one machine can write one file
    while reports read it. A PostgreSQL store (a ``postgresql://`` location, the team store:
    adapters/store/postgres.py) keeps one server connection and lets PostgreSQL order the
    writers of every controller and shard host. Calls of one store are serialised by a lock.
    """

    def __init__(
        self, location: Path | str, *, read_only: bool = False, wait_seconds: float | None = None,
        reconnect_seconds: float = RECONNECT_SECONDS,
    ) -> None:
        """Open (or create) the store at `location` and make sure the schema exists.

        `location` is a DuckDB file's path or a PostgreSQL URL (``postgresql://user@host/db``;
        the password may come from the URL, PGPASSWORD or ~/.pgpass, and never appears in
        messages). `read_only=True` is for readers (reports, comparisons): the store must exist,
        nothing is written (a store of an older schema is upgraded first, which needs write
        access), and a read-only copy of a database works. `wait_seconds` bounds how long a call
        waits for another process's lock on a DuckDB file (None: as long as it takes);
        `reconnect_seconds` how long a PostgreSQL store's reads try again through a lost
        connection (`RECONNECT_SECONDS`). Raises
        `SchemaVersionError` if the store has a newer schema version, `StoreError` if it cannot
        be opened or reached.
        """
        self._server_url: str | None = location if postgres.is_server_location(location) else None
        self._path: Path | None = None if self._server_url else Path(location).expanduser().resolve()
        self._where = postgres.redact(self._server_url) if self._server_url else str(self._path)
        self._read_only = read_only
        self._wait_seconds = wait_seconds
        self._reconnect_seconds = reconnect_seconds
        self._lock = threading.RLock()
        self._closed = False
        self._checked = False  # the DuckDB file's integrity was checked when first opened
        self._held: Any = None  # a read-only DuckDB connection every read uses (`held_open`)
        self._server: postgres.PgConnection | None = None
        self._connected_once = False  # a lost connection is made again; a first one that fails is not
        # Who this store writes runs as: the controller that started or resumed the run here,
        # or a shard with its spent ticket (adapters/store/writers.py); None for neither.
        self._writer: writers.Writer = None
        if self._path is not None:
            if self._path.is_dir():
                raise StoreError(f"{self._where}: is a directory, not a DuckDB file")
            if read_only and not self._path.is_file():
                raise StoreError(f"{self._where}: results database not found")
        found: int | None = None
        if self._path is None or self._path.is_file():
            found = self._retried(self._stored_version)
        if found == SCHEMA_VERSION:
            return
        if read_only and found is None:
            raise StoreError(f"{self._where}: not a results database (no schema_version table)")
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        with self._session(write=True, upgrade=True) as conn:
            self._ensure_schema(conn)

    def _stored_version(self) -> int | None:
        with self._session(write=False) as conn:
            return _stored_version(conn, self._where)

    @property
    def location(self) -> str:
        """Where the store is, for messages: the DuckDB file's path or the PostgreSQL URL
        without its password."""
        return self._where

    @property
    def is_server(self) -> bool:
        """True for a PostgreSQL store, which every host of a team can write at once."""
        return self._server_url is not None

    @property
    def path(self) -> Path:
        """The DuckDB file (absolute); `StoreError` for a PostgreSQL store, which has none."""
        if self._path is None:
            raise StoreError(f"{self._where}: a PostgreSQL store has no file path")
        return self._path

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """End the store's use; further calls raise `StoreError`. Idempotent."""
        with self._lock:
            self._closed = True
            if self._server is not None:
                self._server.close()
                self._server = None

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextlib.contextmanager
    def _session(self, *, write: bool, upgrade: bool = False) -> Iterator[Any]:
        """A connection for one operation, holding the store's lock. A DuckDB connection is
        closed on exit; the PostgreSQL connection is kept (and replaced once it breaks)."""
        with self._lock:
            if self._closed:
                raise StoreError(f"{self._where}: the store is closed")
            if write and self._read_only and not upgrade:
                raise StoreError(f"{self._where}: opened read-only; cannot write")
            if self._server_url is not None:
                yield from self._server_session()
                return
            if self._held is not None:
                yield self._held
                return
            with contextlib.ExitStack() as stack:
                try:
                    conn = stack.enter_context(
                        connections.connect(self.path, read_only=not write, wait_seconds=self._wait_seconds)
                    )
                except connections.StoreBusyError as exc:
                    raise StoreUnavailable(str(exc)) from exc
                except duckdb.Error as exc:
                    raise open_error(self._where, exc) from exc
                if not self._checked:
                    check_file_intact(conn, self.path, self._where)
                    self._checked = True
                yield conn

    @contextlib.contextmanager
    def held_open(self) -> Iterator[None]:
        """Every read in the block shares one connection (a report's dozen queries open the file
        once, not a dozen times). Only for a read-only DuckDB store: a writer keeps opening and
        closing the file so other processes can write between its operations; a PostgreSQL
        store keeps its one connection anyway."""
        if self._server_url is not None or not self._read_only or self._held is not None:
            yield
            return
        with self._session(write=False) as conn:
            self._held = conn
            try:
                yield
            finally:
                self._held = None

    def _server_session(self) -> Iterator[postgres.PgConnection]:
        """The PostgreSQL connection (opened on first use, or again after it broke); a failed
        statement is a `StoreError` naming the store."""
        assert self._server_url is not None
        if self._server is None or self._server.broken:
            self._server = postgres.connect(self._server_url)
            self._connected_once = True
        try:
            yield self._server
        except Exception as exc:
            if not postgres.is_engine_error(exc):
                raise
            reason = " ".join(str(exc).split()) or type(exc).__name__
            kind = StoreUnavailable if is_outage(exc) else StoreError
            raise kind(f"{self._where}: {reason}") from exc

    def _retried(self, call: Callable[[], T]) -> T:
        """`call()`; on a PostgreSQL store that was reached before, made again (each time on a
        new connection) while it fails for an outage, for up to `reconnect_seconds`. A DuckDB file's outage (a full disk,
        a lock another process holds past `wait_seconds`) is raised at once, as before: its
        writers (the recorder) wait in their own way, and a lost connection is not among its
        failures."""
        if self._server_url is None:
            return call()
        deadline = time.monotonic() + self._reconnect_seconds
        delay = 0.0  # a dropped connection is usually replaced at once
        while True:
            try:
                return call()
            except StoreUnavailable:
                # Never connected (asked after the call: its own first connection counts, then
                # lost): a wrong address or password, said at once.
                if not self._connected_once or self._closed or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(max(delay * 2, 0.5), 5.0)

    @contextlib.contextmanager
    def reading(
        self, run_ids: Iterable[str] = (), *, with_steps: bool = False
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only DuckDB connection for queries (reports, comparisons), closed on exit.

        On a DuckDB file it sees everything committed so far, by any process. On a PostgreSQL
        store it is an in-memory copy holding every `runs` row and the task results of
        `run_ids` only (name the runs the query is about), and their steps when `with_steps`.
        """
        if self._server_url is None:
            with self._session(write=False) as conn:
                yield conn
            return
        wanted = list(run_ids)

        def copy() -> duckdb.DuckDBPyConnection:
            with self._session(write=False) as server:
                return postgres.snapshot(server, _DDL, wanted, with_steps=with_steps)

        local = self._retried(copy)
        try:
            yield local
        finally:
            local.close()

    @contextlib.contextmanager
    def writing(self) -> Iterator[Any]:
        """The store's own write connection, for bulk loads (adapters/store/migrate.py); holds
        the store's lock until exit."""
        with self._session(write=True) as conn:
            yield conn

    def _ensure_schema(self, conn: Any) -> None:
        with _transaction(conn):
            if self._server_url is not None:
                conn.lock_schema()  # two controllers starting at once create the tables once
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            # Checked before touching anything else, so a newer store is never modified.
            found = _stored_version(conn, self._where)
            version = found
            while version is not None and version < SCHEMA_VERSION:
                for statement in MIGRATIONS[version]:
                    conn.execute(self._dialect(statement))
                version += 1
            for statement in self._ddl():
                conn.execute(statement)
            if found is None:
                conn.execute("INSERT INTO schema_version VALUES (?)", [SCHEMA_VERSION])
            elif found < SCHEMA_VERSION:
                conn.execute("UPDATE schema_version SET version = ?", [SCHEMA_VERSION])

    def _dialect(self, statement: str) -> str:
        """A DuckDB DDL statement as this store's engine spells it."""
        return statement if self._server_url is None else postgres.ddl(statement)

    def _ddl(self) -> list[str]:
        """The tables and views, in this store's engine's SQL."""
        if self._server_url is None:
            return list(_DDL)
        return [postgres.ddl(s) for s in _DDL if "VIEW" not in s] + [postgres.VIEW_DDL]

    @_reconnecting
    def schema_version(self) -> int:
        """The schema version recorded in the file."""
        with self._session(write=False) as conn:
            row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0])

    @_reconnecting
    def can_write(self) -> bool:
        """Whether this user may add results: the file is writable, or the server grants INSERT
        on the results tables. Writes nothing."""
        if self._server_url is None:
            assert self._path is not None
            return os.access(self._path, os.W_OK)
        with self._session(write=False) as conn:
            row = conn.execute(
                "SELECT has_table_privilege('task_results', 'INSERT') AND has_table_privilege('steps', 'INSERT')"
            ).fetchone()
        return bool(row[0])

    # --- runs -------------------------------------------------------------------------------

    def start_run(
        self, run: RunInfo, *, resume: bool = False, change_selection: bool = False,
        controller: Controller | None = None,
    ) -> None:
        """Record a new run. Secret-looking keys are dropped from `agent_config`.

        A run id that already exists is an error, unless `resume=True`: then the existing run
        is marked running again (its start time and results kept), provided agent, model,
        suite, suite hash, agent configuration hash and task selection are unchanged, so a
        resumed run cannot mix two configurations. With `change_selection=True` the run's
        selection (and task count) becomes the new one instead.

        `controller` (this process) takes the run's lease: `RunLeaseHeld` when another
        controller that is still alive is running it (adapters/store/lease.py).
        """
        with self._session(write=True) as conn, _transaction(conn):
            self._start_run(conn, run, resume, change_selection, controller)
        self._writer = controller

    def _start_run(self, conn: Any, run: RunInfo, resume: bool, change_selection: bool,
                   controller: Controller | None) -> None:
        config_json = json.dumps(scrub_secrets(run.agent_config), sort_keys=True, default=str)
        run_config_json = json.dumps(scrub_secrets(run.run_config), sort_keys=True, default=str)
        config_hash = agent_config_hash(run.agent_config)
        selection_json = None if run.selected_task_ids is None else json.dumps(sorted(run.selected_task_ids))
        holder = None if controller is None else str(controller)
        # Locked on PostgreSQL, so two controllers starting one run id at once cannot both pass.
        lock = " FOR UPDATE" if self._server_url is not None else ""
        existing = conn.execute(
            "SELECT agent, model_id, suite, suite_hash, agent_config_hash, selected_task_ids, status, "
            f"controller, heartbeat_at, scoring FROM runs WHERE run_id = ?{lock}",
            [run.run_id],
        ).fetchone()
        if existing is not None:
            status, owner, heard = existing[6], existing[7], existing[8]
            if holder is not None and owner not in (None, holder) and status == "running" \
                    and liveness(status, owner, heard).alive:
                raise RunLeaseHeld(f"{self._where}: {_lease_message(run.run_id, owner, heard)}")
            if not resume:
                raise StoreError(
                    f"{self._where}: run {run.run_id!r} already exists; pass resume=True to continue it"
                )
            changed = configuration_change(dict(zip(_RESUMED_FIELDS, (*existing[:5], existing[9]))), run)
            if changed:
                raise StoreError(f"{self._where}: {changed}")
            stored = _json_value(existing[5])
            if not change_selection and run.selected_task_ids is not None:
                problem = selection_change(run.run_id, stored, run.selected_task_ids)
                if problem:
                    raise StoreError(f"{self._where}: {problem}")
            conn.execute(
                "UPDATE runs SET status = ?, finished_at = NULL, prefect_flow_run_id = "
                "coalesce(?, prefect_flow_run_id), controller = ?, heartbeat_at = ? WHERE run_id = ?",
                [run.status, run.prefect_flow_run_id, holder, _utcnow(), run.run_id],
            )
            if run.run_config:  # the latest invocation's configuration: a resume may ask for more trials
                conn.execute("UPDATE runs SET run_config = ? WHERE run_id = ?", [run_config_json, run.run_id])
            if selection_json is not None and (change_selection or stored is None):
                conn.execute(
                    "UPDATE runs SET selected_task_ids = ?, task_count = ? WHERE run_id = ?",
                    [selection_json, len(run.selected_task_ids or []), run.run_id],
                )
            return
        conn.execute(
            "INSERT INTO runs (run_id, started_at, finished_at, status, agent, agent_config, "
            "model_id, suite, suite_hash, task_count, pool_size, provider, reset_level, "
            "code_revision, prefect_flow_run_id, environment, model_endpoint, agent_config_hash, "
            "model_checkpoint, vm_image, run_config, baseline, selected_task_ids, controller, heartbeat_at, scoring) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                run.run_id, _to_utc_naive(run.started_at), _to_utc_naive(run.finished_at),
                run.status, run.agent, config_json, run.model_id, run.suite, run.suite_hash,
                run.task_count, run.pool_size, run.provider, run.reset_level,
                run.code_revision, run.prefect_flow_run_id, run.environment, run.model_endpoint,
                config_hash, run.model_checkpoint, run.vm_image, run_config_json,
                run.baseline, selection_json, holder, _utcnow(), run.scoring,
            ],
        )

    @_reconnecting
    def lease_holder(self, run_id: str) -> str | None:
        """Why `run_id` cannot be started here now (another controller that is alive runs it),
        or None. `start_run` decides for good; this lets a command refuse before any VM."""
        with self._session(write=False) as conn:
            row = conn.execute("SELECT status, controller, heartbeat_at FROM runs WHERE run_id = ?", [run_id]).fetchone()
        if row is None or row[0] != "running" or row[1] is None or not liveness(*row).alive:
            return None
        return _lease_message(run_id, row[1], row[2])

    @_reconnecting
    def heartbeat(self, run_id: str, controller: Controller) -> bool:
        """Say `controller` is still running `run_id` (runs.heartbeat_at = now); False when the
        run has another controller now (this one lost its lease)."""
        with self._session(write=True) as conn:
            row = conn.execute(
                "UPDATE runs SET heartbeat_at = ? WHERE run_id = ? AND controller = ? RETURNING run_id",
                [_utcnow(), run_id, str(controller)],
            ).fetchone()
        return row is not None

    def finish_run(self, run_id: str, status: str) -> None:
        """Set a run's final status and its finish time (now, UTC); its shards' unspent tickets
        can no longer be spent. Only the run's controller may (`ResultRefused` for another).
        Retried through a lost server connection: setting it twice is setting it once."""
        if not status:
            raise StoreError("finish_run needs a non-empty status")

        def finish() -> None:
            with self._session(write=True) as conn, _transaction(conn):
                now = _utcnow()
                if isinstance(self._writer, Controller):
                    writers.check_controller(conn, run_id, self._writer, self._where)
                else:
                    self._require_run(conn, run_id)
                conn.execute("UPDATE runs SET status = ?, finished_at = ? WHERE run_id = ?", [status, now, run_id])
                writers.revoke(conn, run_id, now)

        self._retried(finish)

    # --- shards' tickets (adapters/store/writers.py) -----------------------------------------

    def issue_shard_tickets(self, run_id: str, tickets: list[writers.IssuedTicket]) -> None:
        """Record the tickets of the shards this store's controller is about to start; only the
        run's controller (the one that called `start_run` here) may."""
        if not isinstance(self._writer, Controller):
            raise writers.ResultRefused(f"{self._where}: shards of run {run_id!r} are started by its controller; "
                                        "call start_run with it first")
        controller = self._writer
        with self._session(write=True) as conn, _transaction(conn):
            writers.issue(conn, run_id, controller, tickets, _utcnow())

    def spend_shard_ticket(self, ticket: writers.ShardTicket) -> None:
        """Spend a shard's ticket (`TicketRefused` saying why when it may not run); this store
        then writes the ticket's run as that shard."""
        lock = " FOR UPDATE" if self._server_url is not None else ""
        with self._session(write=True) as conn, _transaction(conn):
            writers.spend(conn, ticket, _utcnow(), lock=lock)
        self._writer = ticket

    @_reconnecting
    def get_run(self, run_id: str) -> RunInfo | None:
        """The stored provenance of a run (agent_config already scrubbed), or None."""
        with self._session(write=False) as conn:
            rows = _query(conn, "SELECT * FROM runs WHERE run_id = ?", [run_id])
        if not rows:
            return None
        # Rows from before version 3 (or written by hand) may have NULL configurations.
        row = {k: v for k, v in rows[0].items() if not (v is None and k in ("agent_config", "run_config"))}
        return RunInfo.model_validate(row)

    def resolve_path(self, stored: str) -> Path:
        """The absolute file a stored path (e.g. ``steps.screenshot_path``) names.

        Paths under a DuckDB file's folder are stored relative to it, so a copied or moved
        results folder keeps its screenshots. A PostgreSQL store keeps absolute paths (each
        host's own; a shared artifacts directory mounted at the same path serves every host).
        """
        path = Path(stored)
        return path if path.is_absolute() or self._path is None else self._path.parent / path

    def _stored_path(self, path: str | None) -> str | None:
        """`path` relative to the DuckDB file's folder when it lies under it, else absolute."""
        if path is None:
            return None
        absolute = Path(path).expanduser().resolve()
        if self._path is None:
            return str(absolute)
        try:
            return absolute.relative_to(self._path.parent).as_posix()
        except ValueError:
            return str(absolute)

    def _require_run(self, conn: Any, run_id: str) -> None:
        if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone() is None:
            raise StoreError(f"{self._where}: unknown run {run_id!r}; call start_run first")

    # --- results ----------------------------------------------------------------------------

    def record_result(self, run_id: str, result: BenchmarkResult) -> None:
        """Store one task attempt and its steps in one transaction.

        Recording the same (run, task, attempt) again replaces the earlier row and all its
        steps. On any error nothing of this result is written and other results are untouched.
        """
        error = self.record_results(run_id, [result])[0]
        if error is not None:
            raise error

    def record_results(self, run_id: str, results: list[BenchmarkResult]) -> list[Exception | None]:
        """Store several attempts in one session (one opening of a DuckDB file, about 15 ms,
        serves them all), each in its own transaction as `record_result` does; returns each
        one's error or None. Failing to open the store is raised."""
        prepared: list[Callable[[Any], None] | StoreError] = []
        for result in results:
            try:
                prepared.append(self._result_write(run_id, result))
            except StoreError as exc:
                prepared.append(exc)
        errors: list[Exception | None] = []
        with self._session(write=True) as conn:
            for write in prepared:
                if isinstance(write, StoreError):
                    errors.append(write)
                    continue
                try:
                    conn.execute("BEGIN TRANSACTION")
                    write(conn)
                    conn.execute("COMMIT")
                    errors.append(None)
                except Exception as exc:  # noqa: BLE001 - returned: the other results still land
                    # A failed COMMIT (a full disk) has already ended the transaction, and a lost
                    # server cannot roll back: the rollback's own error must not hide the cause.
                    with contextlib.suppress(Exception):
                        conn.execute("ROLLBACK")
                    errors.append(exc)
        return errors

    def _result_write(self, run_id: str, result: BenchmarkResult) -> Callable[[Any], None]:
        """The statements that store one attempt (checked and turned into rows first)."""
        indexes = [step.index for step in result.steps]
        if len(set(indexes)) != len(indexes):
            raise StoreError(
                f"{self._where}: result of task {result.task_id!r} (run {run_id!r}, attempt "
                f"{result.attempt}) has duplicate step indexes {sorted(indexes)}"
            )
        timings = dict(result.timings)
        stage_values = [_timing(timings, stage) for stage in _TIMING_STAGES]
        row = [
            run_id, result.task_id, result.domain, result.attempt, result.outcome.value,
            result.success, result.score, result.infeasible, result.num_steps, result.error,
            result.reason, result.total_time_seconds, *stage_values, result.vm_id, _utcnow(),
            json.dumps(timings, sort_keys=True), *_usage_values(result.usage),
            json.dumps(scrub_secrets(result.agent_details), sort_keys=True, default=str),
            result.task_fingerprint, result.trial,
        ]
        step_rows = [
            [
                run_id, result.task_id, result.attempt, step.index, step.action.type.value,
                json.dumps(step.action.model_dump(mode="json"), default=str),
                self._stored_path(step.screenshot_path), step.window_title, step.agent_seconds,
                step.env_seconds, step.error, *_usage_values(step.usage), step.action.reasoning,
                *(step.action.aim_point() or (None, None)), step.observation_error, step.delivery,
            ]
            for step in result.steps
        ]
        key = [run_id, result.task_id, result.attempt]

        def write(conn: Any) -> None:
            writers.check_writer(conn, run_id, self._writer, self._where)
            conn.execute("DELETE FROM steps WHERE run_id = ? AND task_id = ? AND attempt = ?", key)
            conn.execute("DELETE FROM task_results WHERE run_id = ? AND task_id = ? AND attempt = ?", key)
            conn.execute(
                f"INSERT INTO task_results ({', '.join(_RESULT_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(_RESULT_COLUMNS))})",
                row,
            )
            if step_rows:
                conn.executemany(
                    f"INSERT INTO steps ({', '.join(_STEP_COLUMNS)}) "
                    f"VALUES ({', '.join('?' * len(_STEP_COLUMNS))})",
                    step_rows,
                )

        return write

    @_reconnecting
    def results(self, run_id: str) -> list[dict[str, Any]]:
        """Every stored attempt of a run (task_results rows), ordered by task and attempt."""
        with self._session(write=False) as conn:
            return _query(
                conn,
                "SELECT * FROM task_results WHERE run_id = ? ORDER BY task_id, attempt", [run_id]
            )

    @_reconnecting
    def latest_attempts(self, run_id: str) -> list[dict[str, Any]]:
        """The last attempt of each (task, trial) of a run (the `latest_task_results` view), by
        task id and trial: one row per task in a single-trial run."""
        with self._session(write=False) as conn:
            return _query(
                conn,
                "SELECT * FROM latest_task_results WHERE run_id = ? ORDER BY task_id, trial", [run_id]
            )

    @_reconnecting
    def steps(self, run_id: str, task_id: str, attempt: int | None = None) -> list[dict[str, Any]]:
        """The steps of one task attempt (the last attempt when `attempt` is None), in order."""
        with self._session(write=False) as conn:
            if attempt is None:
                row = conn.execute(
                    "SELECT max(attempt) FROM task_results WHERE run_id = ? AND task_id = ?",
                    [run_id, task_id],
                ).fetchone()
                if row is None or row[0] is None:
                    return []
                attempt = int(row[0])
            return _query(
                conn,
                "SELECT * FROM steps WHERE run_id = ? AND task_id = ? AND attempt = ? "
                "ORDER BY step_index",
                [run_id, task_id, attempt],
            )

    @_reconnecting
    def run_steps(self, run_id: str) -> dict[tuple[str, int], list[dict[str, Any]]]:
        """Every step of a run in one read, keyed by (task_id, attempt), each list in order."""
        with self._session(write=False) as conn:
            rows = _query(
                conn, "SELECT * FROM steps WHERE run_id = ? ORDER BY task_id, attempt, step_index", [run_id]
            )
        grouped: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for row in rows:
            grouped.setdefault((row["task_id"], row["attempt"]), []).append(row)
        return grouped

    def finished_task_ids(self, run_id: str) -> set[str]:
        """Tasks whose first trial's last attempt has a final (non-retryable) outcome: in a
        single-trial run, the tasks a resume skips (`finished_trials` for runs with trials)."""
        return {task_id for task_id, trial in self.finished_trials(run_id) if trial == 1}

    @_reconnecting
    def finished_trials(self, run_id: str) -> set[tuple[str, int]]:
        """The (task_id, trial) pairs whose last attempt has a final (non-retryable) outcome:
        a resume runs only the other pairs."""
        placeholders = ", ".join("?" * len(_FINAL_OUTCOMES))
        with self._session(write=False) as conn:
            rows = conn.execute(
                f"SELECT task_id, trial FROM latest_task_results WHERE run_id = ? "
                f"AND outcome IN ({placeholders})",
                [run_id, *_FINAL_OUTCOMES],
            ).fetchall()
        return {(str(r[0]), int(r[1])) for r in rows}

    def next_attempt(self, run_id: str, task_id: str) -> int:
        """The attempt number to use for the next try of a task (1 if never recorded)."""
        return self.next_attempts(run_id).get(task_id, 1)

    @_reconnecting
    def next_attempts(self, run_id: str) -> dict[str, int]:
        """The next attempt number of every task with attempts stored in `run_id`, in one read
        (a run reads them once when its pool starts, not once per task). Steps count too: an
        attempt whose result row was deleted (to run that trial again) keeps its number."""
        with self._session(write=False) as conn:
            rows = conn.execute(
                "SELECT task_id, max(attempt) + 1 FROM (SELECT task_id, attempt FROM task_results WHERE run_id = ? "
                "UNION ALL SELECT task_id, attempt FROM steps WHERE run_id = ?) AS stored GROUP BY task_id",
                [run_id, run_id],
            ).fetchall()
        return {str(task_id): int(number) for task_id, number in rows}

    def expected_seconds(self, task_ids: list[str], agent: str | None = None) -> dict[str, float]:
        """Mean wall time of each task's final attempts in earlier runs, for scheduling.

        Runs of `agent` are preferred; a task only ever run by other agents gets their mean.
        Infrastructure errors are left out (their time says nothing about the task). Tasks
        never run are absent from the result.
        """
        return self._task_means("total_time_seconds", task_ids, agent)

    def expected_cost(self, task_ids: list[str], agent: str | None = None) -> dict[str, float]:
        """Mean model cost (USD) of each task's final attempts in earlier runs, as
        `expected_seconds` (same agent preferred); tasks with no recorded cost are absent."""
        return self._task_means("cost_usd", task_ids, agent)

    @_reconnecting
    def _task_means(self, column: str, task_ids: list[str], agent: str | None) -> dict[str, float]:
        """Per task, the mean of a `latest_task_results` column over earlier runs' final
        attempts (infrastructure errors left out), those of `agent` preferred."""
        if not task_ids:
            return {}
        assert column in _RESULT_COLUMNS, column  # a fixed column name, never user input
        with self._session(write=False) as conn:
            rows = conn.execute(
                f"""
                SELECT l.task_id,
                       avg(l.{column}) FILTER (WHERE r.agent = ?) AS same_agent,
                       avg(l.{column}) AS any_agent
                FROM latest_task_results l JOIN runs r USING (run_id)
                WHERE l.task_id IN (SELECT unnest(?::VARCHAR[])) AND l.outcome <> ?
                GROUP BY l.task_id
                """,
                [agent, list(task_ids), _INFRA],
            ).fetchall()
        return {
            task_id: float(same if same is not None else anyone)
            for task_id, same, anyone in rows
            if (same if same is not None else anyone) is not None
        }


@contextlib.contextmanager
def _transaction(conn: Any) -> Iterator[None]:
    """One transaction: committed when the block ends normally, rolled back on any exception
    (the rollback's own failure, e.g. on a lost server, never hides the cause)."""
    conn.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _lease_message(run_id: str, owner: str, heard: dt.datetime | None) -> str:
    """Why a run id is refused: its live controller, and when it was last heard from."""
    who = Controller.parse(owner)
    when = f", heard from at {heard:%H:%M:%S} UTC" if heard is not None else ""
    return (f"run {run_id!r} is running elsewhere ({who.describe() if who else owner}{when}); wait for it to end, "
            "or give another --run-id")


def _stored_version(conn: Any, where: str) -> int | None:
    """The store's schema version (None for a new store); `SchemaVersionError` if it is newer
    than this code knows. The same SQL serves DuckDB and PostgreSQL."""
    exists = conn.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version' "
        "AND table_schema = current_schema() AND table_catalog = current_database()"
    ).fetchone()
    if not exists[0]:
        return None
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    found = None if row is None or row[0] is None else int(row[0])
    if found is not None and found > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where}: schema version {found} is newer than this code supports "
            f"(version {SCHEMA_VERSION}); upgrade the package to read this store"
        )
    return found


def _query(conn: Any, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    """Rows as dicts; JSON columns are decoded."""
    cursor = conn.execute(sql, params)
    names = [d[0] for d in cursor.description]
    rows = []
    for values in cursor.fetchall():
        row = dict(zip(names, values))
        for name in _JSON_COLUMNS.intersection(row):
            row[name] = _json_value(row[name])
        rows.append(row)
    return rows


def _json_value(value: Any) -> Any:
    """A JSON column's value decoded: DuckDB returns the text, psycopg the decoded value."""
    return json.loads(value) if isinstance(value, str) else value


def _timing(timings: Mapping[str, float], stage: str) -> float | None:
    """The seconds of one stage, under "<stage>_seconds" or "<stage>"; None when absent."""
    for key in (f"{stage}_seconds", stage):
        if key in timings and timings[key] is not None:
            return float(timings[key])
    return None


# DuckDB's file: three 4 KiB headers, then fixed-size blocks (pragma_database_size's block_size).
_DUCKDB_HEADER_BYTES = 3 * 4096
_DAMAGE_MARKS = ("Could not read enough bytes", "Corrupt database file", "checksum", "Failed to read")


def open_error(where: str, exc: duckdb.Error) -> StoreError:
    """The store error an engine error at opening means: damaged, unavailable for now, or other."""
    text = " ".join(str(exc).split())
    if "not a valid DuckDB database" in text:
        return StoreError(f"{where}: cannot open as a DuckDB database: {text[:300]}")
    if any(mark in text for mark in _DAMAGE_MARKS):
        return StoreDamaged(f"{where}: the results database is damaged ({text[:200]}); nothing was written to it. "
                            "Restore it from a copy, or move it aside to start a new one")
    if is_outage(exc):
        return StoreUnavailable(f"{where}: cannot open the results database: {text[:300]}")
    return StoreError(f"{where}: cannot open as a DuckDB database: {text[:300]}")


# Files found intact, by (path, size, modification time): a file is checked once per change.
_INTACT: set[tuple[str, int, int]] = set()


def check_file_intact(conn: duckdb.DuckDBPyConnection, path: Path, where: str) -> None:
    """A cheap check, when a file is first opened, that every block the tables' data lives in
    is in the file (DuckDB keeps its metadata at the end, so most truncations fail to open at
    all; this catches the rest: a copy cut short, a half-written file). `StoreDamaged` naming
    it; `verify_store` reads everything."""
    if Path(f"{path}.wal").exists():
        return  # blocks the log has not written back are not in the file yet
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key in _INTACT:
        return
    try:
        # Both list every database attached to the process's (connections.py): this file's only.
        block_size = conn.execute(
            "SELECT block_size FROM pragma_database_size() WHERE database_name = current_database()"
        ).fetchone()[0]
        highest = -1
        tables = "SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND database_name = current_database()"
        for (table,) in conn.execute(tables).fetchall():
            row = conn.execute(
                "SELECT max(greatest(block_id, coalesce(list_max(additional_block_ids), -1))) "
                f"FROM pragma_storage_info('{table}')"
            ).fetchone()
            if row is not None and row[0] is not None:
                highest = max(highest, int(row[0]))
    except duckdb.Error:
        return  # reading the metadata failed: the first real read says why
    present = (stat.st_size - _DUCKDB_HEADER_BYTES) // int(block_size)
    if highest < present:
        _INTACT.add(key)
    else:
        raise StoreDamaged(
            f"{where}: the results database is damaged (its data uses block {highest}, the file holds {present} "
            "blocks: it was cut short); nothing was written to it. Restore it from a copy, or move it aside to start "
            "a new one"
        )


def verify_store(location: Path | str) -> int:
    """Read every value of every table of a DuckDB store, so DuckDB checks every block's checksum
    (`arena doctor`); the number of rows read. `StoreDamaged` naming the damage."""
    path = Path(location)
    try:
        with connections.connect(path, read_only=True, wait_seconds=30) as conn:
            check_file_intact(conn, path, str(path))
            rows = 0
            for table in ("runs", "task_results", "steps"):
                columns = [c[0] for c in conn.execute(f"DESCRIBE {table}").fetchall()]
                aggregates = ", ".join(f'max("{c}")' for c in columns)
                conn.execute(f"SELECT {aggregates} FROM {table}").fetchall()
                rows += int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
            return rows
    except duckdb.Error as exc:
        damaged = open_error(str(path), exc)
        if isinstance(damaged, StoreDamaged):
            raise damaged from exc
        raise
