"""Baselines: the versioned list of reference evaluations, the nightly run of all of them, and the
evaluation of a freshly trained model against one of them.

    deployments/baselines.toml         the baselines (see that file for the format)
    load_baselines(path)               parse and validate it; errors name the file and the entry
    baseline_config(baseline)          the SuiteRunConfig a baseline stands for
    nightly_baselines(baselines_file)  flow: run every baseline (deployment `nightly-baselines`)
    evaluate_model_update(model, ...)  flow: run a baseline's agent and suite on a new model, then
                                       compare it with the latest completed run of the baseline
                                       (deployment `on-model-update`; the comparison itself is
                                       adapters/results/compare.py)

Relative paths inside the baselines file (`suite`, `cloud_config`, `agent_options.plans_path`,
...) are resolved against the directory of the baselines file; `db_path` and `artifacts_dir`,
like in `arena run`, against the working directory of the process running the flow. A baseline
without `store_url` uses $ARENA_STORE_URL (the team store) when set, else `db_path`.

The flows a deployment serves take names, never configurations: anyone who can reach the
Prefect API can start a flow run with any parameters, so a served flow's parameters are a
baseline's name, a run id, and, for a model update, a model id and endpoint that the baseline's
own `[baselines.model_updates]` allow-list admits. Everything else (the baselines file, the
store, suites, folders, the names of secrets' variables) comes from the operator's
configuration: the baselines file itself and the serving process's environment
(`OperatorSettings`).
"""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.states import Cancelled, Completed, Failed, State
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from adapters.agents import AGENT_NAMES, MODEL_AGENTS, AgentOptions, build_agent
from adapters.results.compare import (
    RunComparison,
    compare_runs,
    comparison_markdown,
    final_attempts,
    stored_run_status,
)
from adapters.results.source import latest_completed_run as stored_latest_completed_run
from adapters.results.trials.adaptive_limits import check_batch_size
from adapters.secrets import redact_url, url_secret
from adapters.store.duckdb_store import agent_config_hash
from adapters.vms.base import ResetLevel
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.settle import SettleChoice
from flows.bookkeeping import best_effort, slug
from flows.cancellation import cancellation_requested
from flows.doctor import check_model
from flows.arena_run_deployment import flow_run_url
from flows.evaluate_suite import run_suite
from flows.night_report import NightReport
from flows.run_plan import RunRefused
from flows.run_config import SAFE_RUN_ID, RunOutcome, SuiteRunConfig
from flows.run_states import ended, run_state

BASELINES_FILE_VERSION = 1
DEFAULT_BASELINES_FILE = "deployments/baselines.toml"
DEFAULT_BASELINE = "scripted-bundled-local"
# The baseline a model update is compared with unless the operator names another
# (ARENA_MODEL_BASELINE): the shipped one that calls a model (the plan-replay demo).
DEFAULT_MODEL_BASELINE = "plan-replay-local"
PROJECT_ROOT = Path(__file__).resolve().parents[1]

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class BaselinesFileError(ValueError):
    """The baselines file is missing or invalid; the message names the file and the entry."""


class ModelUpdateRefused(ValueError):
    """A model update names a model or endpoint the baseline does not admit; one line naming
    the baseline and what was refused."""


@dataclass(frozen=True)
class OperatorSettings:
    """What only the operator chooses for served flows, read from the serving process's
    environment when a run starts (never from a flow run's parameters)."""

    baselines_file: str = DEFAULT_BASELINES_FILE  # ARENA_BASELINES_FILE
    export_failures: str | None = None  # ARENA_MODEL_UPDATE_EXPORT_DIR: model updates' failures go here
    export_format: Literal["trajectories", "sft"] = "trajectories"  # ARENA_MODEL_UPDATE_EXPORT_FORMAT

    @classmethod
    def from_env(cls) -> OperatorSettings:
        fmt = os.environ.get("ARENA_MODEL_UPDATE_EXPORT_FORMAT", "trajectories")
        if fmt not in ("trajectories", "sft"):
            raise ValueError(f"ARENA_MODEL_UPDATE_EXPORT_FORMAT must be trajectories or sft, got {fmt!r}")
        return cls(
            baselines_file=os.environ.get("ARENA_BASELINES_FILE") or DEFAULT_BASELINES_FILE,
            export_failures=os.environ.get("ARENA_MODEL_UPDATE_EXPORT_DIR") or None,
            export_format=fmt,  # type: ignore[arg-type]
        )


_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")
_CHECKPOINT = re.compile(r"^[\x21-\x7e]{1,500}$")  # printable, no spaces or control characters


class ModelUpdates(BaseModel):
    """Who may point a baseline's agent at a new model: the model ids (shell-style patterns) and
    the endpoints (exact base URLs) a `model.updated` event or an API caller may name."""

    model_config = ConfigDict(extra="forbid")

    models: list[str] = Field(min_length=1)
    endpoints: list[str] = Field(default_factory=list)
    # The adaptive design (docs/statistics.md): after the first pass (the baseline's trials, and the
    # new model's run with as many), further trials in batches of `batch_size`, each batch a resume
    # of the baseline's and the new model's runs with more trials of the tasks the design picks,
    # until its anytime-valid interval excludes 0, lies within +/- `margin`, or `budget_trials`
    # further trials are spent (default: what a fixed 3-trial design of both models would cost).
    adaptive: bool = False
    margin: float = Field(default=0.05, gt=0, lt=1)
    batch_size: int = Field(default=16, le=1000)  # at least 2: `_batch_size`
    budget_trials: int | None = Field(default=None, ge=1)

    @field_validator("batch_size")
    @classmethod
    def _batch_size(cls, value: int) -> int:
        """A batch of one trial has no variance of its own to estimate: refused, saying why
        (adapters/results/trials/adaptive_limits.py)."""
        return check_batch_size(value, None)

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not re.match(r"^https?://[^\s/@]+(/\S*)?$", url) or url_secret(url):
                raise ValueError(f"endpoint {redact_url(url)!r} must be an http(s) base URL without credentials")
        return [url.rstrip("/") for url in value]


class Baseline(BaseModel):
    """One reference evaluation: an agent (with its model options) on a suite."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    agent: str
    agent_options: AgentOptions = Field(default_factory=AgentOptions)
    suite: Path | Literal["bundled"] = "bundled"
    difficulty: Literal["normal", "hard"] = "normal"
    domains: list[str] | None = None
    task_ids: list[str] | None = None
    pool_size: int = Field(default=4, ge=1, le=64)
    provider: str = "local"  # a name in adapters/vms/registry.py PROVIDERS (checked by SuiteRunConfig)
    reset_level: ResetLevel = ResetLevel.SNAPSHOT
    cloud_config: Path | None = None
    # aws/azure: run on this warm pool (`arena pool up`), stopped after the run: a nightly
    # then begins in minutes instead of a cold pool's 15-40.
    warm_pool: str | None = None
    waa_urls: list[str] = Field(default_factory=list)
    quirks: bool = False
    max_steps: int = Field(default=15, ge=1)
    max_attempts: int = Field(default=3, ge=1)
    # Repeated trials: each task runs `trials` times per run (docs/statistics.md); 1..100.
    trials: int = Field(default=1, ge=1, le=100)
    episode_timeout_seconds: float = Field(default=1200.0, gt=0)
    # The wait after each action ("adaptive" or fixed seconds; None: the provider's default). A
    # baseline pins it so a change of default does not move its numbers.
    settle: SettleChoice | None = None
    db_path: Path = Path("results/arena.duckdb")
    store_url: str | None = None  # the team store (PostgreSQL URL, no password); None: $ARENA_STORE_URL
    artifacts_dir: Path = Path("results/artifacts")
    # Which new models may be evaluated against this baseline (deployment on-model-update); None:
    # none may (the baseline's agent calls no model, or the operator has not opened it).
    model_updates: ModelUpdates | None = None
    # Whether the nightly runs it (a baseline kept only for model updates may say false).
    nightly: bool = True

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be lowercase letters, digits and dashes (it names runs and artifacts)")
        return value

    @field_validator("agent")
    @classmethod
    def _known_agent(cls, value: str) -> str:
        if value not in AGENT_NAMES:
            raise ValueError(f"unknown agent {value!r}; known agents: {', '.join(AGENT_NAMES)}")
        return value

    @field_validator("agent_options", mode="before")
    @classmethod
    def _known_options(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(AgentOptions.model_fields))
            if unknown:
                raise ValueError(
                    f"unknown agent option(s) {', '.join(unknown)}; known: {', '.join(AgentOptions.model_fields)}"
                )
        return value

    def suite_dir(self) -> Path:
        return bundled_suite_dir() if self.suite == "bundled" else Path(self.suite)

    def model_update_refusal(self) -> str | None:
        """Why no model update can be evaluated against this baseline (its agent calls no model,
        or it has no allow-list), or None."""
        where = f"baseline {self.name!r}"
        if self.agent not in MODEL_AGENTS:
            return (f"{where} runs the {self.agent!r} agent, which calls no model: a model update cannot be evaluated "
                    f"with it (use a baseline whose agent is one of {', '.join(sorted(MODEL_AGENTS))})")
        if self.model_updates is None:
            return (f"{where} admits no model updates: the operator lists the model ids and endpoints it may be "
                    "pointed at under [baselines.model_updates] in the baselines file")
        return None

    def check_model_update(self, model: Any, endpoint: Any, checkpoint: Any) -> None:
        """Refuse (`ModelUpdateRefused`, one line naming this baseline) a model update this
        baseline's allow-list does not admit: a model id no pattern matches, an endpoint not
        listed, a malformed checkpoint label."""
        where = f"baseline {self.name!r}"
        closed = self.model_update_refusal()
        if closed is not None:
            raise ModelUpdateRefused(closed)
        assert self.model_updates is not None
        if not isinstance(model, str) or not _MODEL_ID.match(model):
            raise ModelUpdateRefused(f"{where}: model id {model!r:.120} is not a model name")
        if not any(fnmatch.fnmatchcase(model, pattern) for pattern in self.model_updates.models):
            raise ModelUpdateRefused(
                f"{where}: model {model!r} matches none of the admitted models {self.model_updates.models}"
            )
        if endpoint is not None and str(endpoint).rstrip("/") not in self.model_updates.endpoints:
            raise ModelUpdateRefused(
                f"{where}: endpoint {redact_url(str(endpoint))!r:.200} is not one of the admitted endpoints "
                f"{self.model_updates.endpoints or '(none: the baseline keeps its own)'}"
            )
        if checkpoint is not None and (not isinstance(checkpoint, str) or not _CHECKPOINT.match(checkpoint)):
            raise ModelUpdateRefused(f"{where}: checkpoint {checkpoint!r:.120} must be printable text without spaces")


def _resolve(path: Path | None, base: Path) -> Path | None:
    if path is None:
        return None
    path = path.expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def resolve_baselines_file(path: str | Path) -> Path:
    """The baselines file; a relative path that does not exist from the working directory is
    looked up from the project root (so deployments work whatever directory serves them)."""
    candidate = Path(path).expanduser()
    if not candidate.is_absolute() and not candidate.exists() and (PROJECT_ROOT / candidate).exists():
        candidate = PROJECT_ROOT / candidate
    return candidate


def load_baselines(path: str | Path) -> list[Baseline]:
    """Read and validate a baselines file. Every error names the file and the offending entry."""
    file = resolve_baselines_file(path)
    try:
        data = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise BaselinesFileError(f"{file}: baselines file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise BaselinesFileError(f"{file}: not valid TOML: {exc}") from None
    version = data.get("version")
    if version != BASELINES_FILE_VERSION:
        raise BaselinesFileError(
            f"{file}: 'version' must be {BASELINES_FILE_VERSION} (found {version!r}); "
            "this code reads baselines files of that version only"
        )
    unknown = sorted(set(data) - {"version", "baselines"})
    if unknown:
        raise BaselinesFileError(f"{file}: unknown top-level key(s) {', '.join(unknown)}")
    entries = data.get("baselines")
    if not isinstance(entries, list) or not entries:
        raise BaselinesFileError(f"{file}: no baselines; add at least one [[baselines]] table")
    base = file.resolve().parent
    baselines: list[Baseline] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        label = f"baseline #{index + 1}" + (f" ({entry.get('name')!r})" if isinstance(entry, dict) and entry.get("name") else "")
        try:
            baseline = Baseline.model_validate(entry)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(entry)'}: {err['msg']}" for err in exc.errors()
            )
            raise BaselinesFileError(f"{file}: {label}: {problems}") from None
        if baseline.name in seen:
            raise BaselinesFileError(f"{file}: {label}: duplicate name {baseline.name!r}")
        if baseline.model_updates is not None and baseline.agent not in MODEL_AGENTS:
            raise BaselinesFileError(
                f"{file}: {label}: model_updates on the {baseline.agent!r} agent, which calls no model; "
                f"only {', '.join(sorted(MODEL_AGENTS))} can be pointed at a new model"
            )
        seen.add(baseline.name)
        options = baseline.agent_options
        baseline = baseline.model_copy(
            update={
                "suite": baseline.suite if baseline.suite == "bundled" else _resolve(Path(baseline.suite), base),
                "cloud_config": _resolve(baseline.cloud_config, base),
                "agent_options": options.model_copy(
                    update={
                        "plans_path": _resolve(options.plans_path, base),
                        "prices_path": _resolve(options.prices_path, base),
                        "demo_library": _resolve(options.demo_library, base),
                    }
                ),
            }
        )
        if not (baseline.suite_dir() / "test_all.json").exists():
            raise BaselinesFileError(f"{file}: {label}: suite {baseline.suite_dir()} has no test_all.json")
        try:
            baseline_config(baseline)
        except ValidationError as exc:
            problems = "; ".join(err["msg"] for err in exc.errors())
            raise BaselinesFileError(f"{file}: {label}: {problems}") from None
        baselines.append(baseline)
    return baselines


def find_baseline(baselines: Iterable[Baseline], name: str, file: str | Path = "") -> Baseline:
    by_name = {b.name: b for b in baselines}
    if name not in by_name:
        raise BaselinesFileError(f"{file}: no baseline named {name!r}; known: {', '.join(by_name)}")
    return by_name[name]


def baseline_config(baseline: Baseline, run_id: str | None = None, trigger: str = "nightly") -> SuiteRunConfig:
    """The suite run a baseline stands for, started by `trigger` (nightly, on-demand, model-update)."""
    return SuiteRunConfig(
        suite_dir=baseline.suite_dir(),
        difficulty=baseline.difficulty,
        domains=baseline.domains,
        task_ids=baseline.task_ids,
        agent=baseline.agent,
        agent_options=baseline.agent_options,
        pool_size=baseline.pool_size,
        provider=baseline.provider,
        cloud_config=baseline.cloud_config,
        warm_pool=baseline.warm_pool,
        quirks=baseline.quirks,
        waa_urls=baseline.waa_urls,
        reset_level=baseline.reset_level,
        max_steps=baseline.max_steps,
        episode_timeout_seconds=baseline.episode_timeout_seconds,
        max_attempts=baseline.max_attempts,
        trials=baseline.trials,
        settle=baseline.settle,
        db_path=baseline.db_path,
        **({"store_url": baseline.store_url} if baseline.store_url else {}),
        artifacts_dir=baseline.artifacts_dir,
        run_id=run_id,
        baseline=baseline.name,
        trigger=trigger,  # type: ignore[arg-type]
    )


def model_update_config(
    baseline: Baseline,
    model: str,
    endpoint: str | None = None,
    run_id: str | None = None,
    checkpoint: str | None = None,
) -> SuiteRunConfig:
    """The baseline's run with the agent pointed at a new model (and endpoint, when given).

    The checkpoint, when announced, is recorded with the run (runs.model_checkpoint).
    """
    config = baseline_config(baseline, run_id, trigger="model-update")
    update: dict[str, Any] = {"model": model}
    if endpoint:
        update["base_url"] = endpoint
    return config.model_copy(
        update={
            "agent_options": config.agent_options.model_copy(update=update),
            "model_checkpoint": checkpoint,
            "baseline": None,  # a run of the new model, not of the baseline
        }
    )


# --- DuckDB reads ----------------------------------------------------------------------------
# The comparison itself (rates, intervals, flips, the verdict and its markdown) lives in
# adapters/results/compare.py; this module only picks the runs to compare.


def latest_completed_run(
    store: Path | str, config: SuiteRunConfig, exclude_run_id: str | None = None
) -> str | None:
    """The most recently finished completed run of the baseline `config` is a run of
    (`config.baseline`) with the same agent, model, suite (content hash), provider and agent
    configuration (hash), in `store` (a DuckDB file or the team store's URL), or None (also when
    the DuckDB file does not exist yet)."""
    if config.baseline is None:
        raise ValueError("latest_completed_run needs the config of a baseline (config.baseline is None)")
    if isinstance(store, Path):
        store = store.expanduser()
        if not store.exists():
            return None
    agent_config = build_agent(config.agent, config.resolved_agent_options()).config()
    suite_hash = WAATaskCatalog(config.suite_dir, difficulty=config.difficulty).content_hash()
    return stored_latest_completed_run(
        store, baseline=config.baseline, agent=config.agent,
        model=agent_config.get("model") or config.agent_options.model, suite_hash=suite_hash,
        provider=config.provider, agent_config_hash=agent_config_hash(agent_config),
        exclude_run_id=exclude_run_id or "",
    )


# --- flows -----------------------------------------------------------------------------------


def _run_baseline(config: SuiteRunConfig) -> RunOutcome:
    """One baseline's (or one model's) evaluation as a subflow of the calling flow, linked from the
    calling flow's page (its state, counts and a link to the evaluation's own page)."""
    outcome = run_suite(config)
    url = flow_run_url(outcome.flow_run_id) if outcome.flow_run_id else None
    if url:
        best_effort("linking the evaluation from its parent run", lambda: create_link_artifact(
            link=url, link_text=f"{config.baseline or config.agent_options.model or config.agent}: run {outcome.run_id}",
            description=f"{outcome.status}: {run_state(outcome).message}"))
    return outcome


def _nightly_run_name() -> str:
    from datetime import datetime, timezone

    from prefect.runtime import flow_run

    return nightly_run_name(flow_run.scheduled_start_time or datetime.now(timezone.utc))


def nightly_run_name(when: Any) -> str:
    """nightly-<date and time it was scheduled for, UTC>, e.g. `nightly-2026-11-25-0200utc`: the
    name of a night's run, and of one scheduled that has not started (deployments/serve.py)."""
    from datetime import timezone

    return f"nightly-{when.astimezone(timezone.utc):%Y-%m-%d-%H%M}utc"


def _run_id_parameter(run_id: str | None) -> str | None:
    """A run id a caller names (to resume it): the same safe names `arena run --run-id` takes."""
    if run_id is not None and not SAFE_RUN_ID.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r:.80} may hold only letters, digits, '.', '_' and '-'")
    return run_id


def _on_demand_run_name() -> str:
    """on-demand-<baseline>, e.g. `on-demand-scripted-bundled-local`."""
    from prefect.runtime import flow_run

    return f"on-demand-{flow_run.parameters.get('baseline', DEFAULT_BASELINE)}"


@flow(name="evaluate-baseline", flow_run_name=_on_demand_run_name)
def evaluate_baseline(baseline: str = DEFAULT_BASELINE, run_id: str | None = None) -> State:
    """Run one baseline of the operator's baselines file by name (deployment `on-demand`); with
    `run_id`, resume that run of it. Ends in the evaluation's own state (Completed, Failed or
    Cancelled, what happened first in its message), its outcome as data.

    A caller chooses only which configured baseline runs; its configuration, store and folders
    are the operator's (the baselines file named by ARENA_BASELINES_FILE)."""
    settings = OperatorSettings.from_env()
    file = resolve_baselines_file(settings.baselines_file)
    chosen = find_baseline(load_baselines(file), baseline, file)
    try:
        outcome = _run_baseline(baseline_config(chosen, _run_id_parameter(run_id), trigger="on-demand"))
    except RunRefused as refused:  # a run id the store refuses: the caller's input, one line, no traceback
        return Failed(message=f"Refused: {refused}")
    return run_state(outcome)


@flow(name="nightly-baselines", flow_run_name=_nightly_run_name)
def nightly_baselines() -> State:
    """Run every baseline of the operator's baselines file (ARENA_BASELINES_FILE), one after the
    other, each as a subflow linked from this run's page.

    A baseline that fails or ends incomplete does not stop the others; the night then ends
    Failed ("Incomplete night: ..." or "Failed night: ..."), each baseline's status and missing
    tasks in its message and in a table on this run's page, so Prefect's failure notifications
    and automations fire. A
    cancellation (of this run or of a baseline's evaluation) stops the night: Cancelled.
    """
    logger = get_run_logger()
    baselines = [b for b in load_baselines(OperatorSettings.from_env().baselines_file) if b.nightly]
    outcomes: dict[str, RunOutcome] = {}
    errors: dict[str, str] = {}
    report = NightReport([b.name for b in baselines])
    for baseline in baselines:
        report.started(baseline.name)
        try:
            config = baseline_config(baseline, trigger="nightly")
            outcomes[baseline.name] = _run_baseline(config)
            report.finished(baseline.name, config, outcomes[baseline.name])
        except Exception as exc:  # noqa: BLE001 - reported below, the other baselines still run
            logger.error("baseline %s failed: %s", baseline.name, exc)
            errors[baseline.name] = " ".join(str(exc).split())[:300]
            report.failed(baseline.name, errors[baseline.name])
        stopped = outcomes.get(baseline.name)
        if (stopped is not None and stopped.stopped_by is not None) or cancellation_requested():
            break
    lines = [f"{name}: {o.status}" + (f" ({o.completeness.missing} of {o.completeness.selected} missing)"
                                       if o.completeness and o.completeness.missing else "")
             for name, o in outcomes.items()] + [f"{name}: failed ({error})" for name, error in errors.items()]
    not_run = [b.name for b in baselines if b.name not in outcomes and b.name not in errors]
    lines += [f"{name}: not run" for name in not_run]
    report.not_run(not_run)
    run_ids = {name: o.run_id for name, o in outcomes.items()}
    message = "; ".join(lines)
    if any(o.stopped_by is not None for o in outcomes.values()) or (not_run and cancellation_requested()):
        return ended(Cancelled, f"Cancelled night: {message}", run_ids)
    bad = [name for name, o in outcomes.items() if o.status != "completed"] + list(errors)
    logger.info("nightly baselines: %d of %d completed", len(baselines) - len(bad), len(baselines))
    if bad:
        logger.warning("nightly baselines: not completed: %s", message)
        headline = "Failed night" if errors else "Incomplete night"
        return ended(Failed, f"{headline}: {len(bad)} of {len(baselines)} baselines not completed: {message}",
                     run_ids)
    return ended(Completed, message, run_ids)


def _model_update_run_name() -> str:
    from prefect.runtime import flow_run

    params = flow_run.parameters
    return f"model-update-{slug(str(params.get('model')))}-vs-{slug(str(params.get('baseline', DEFAULT_MODEL_BASELINE)))}"


@flow(name="evaluate-model-update", flow_run_name=_model_update_run_name)
def evaluate_model_update(
    model: str,
    endpoint: str | None = None,
    checkpoint: str | None = None,
    baseline: str = DEFAULT_MODEL_BASELINE,
) -> State:
    """Evaluate a new model with a baseline's agent and suite, and compare it with the baseline.

    `model` and `endpoint` must be admitted by the baseline's `[baselines.model_updates]` in the
    operator's baselines file (otherwise the run is refused before any VM starts, naming the
    baseline). The agent options' `model` (and `base_url`, when `endpoint` is given) are
    replaced. The comparison is against the latest completed run of the baseline's own
    configuration in the same store; when there is none, the baseline is run first. The
    comparison (per-domain rates with intervals, flips, and one verdict: the exact McNemar test's,
    with repeated trials the per-task means' test, and when the baseline runs the adaptive design
    the design's decision, `model_update_report`) is published as the markdown artifact
    `model-update-<baseline>` (one version per model).

    With ARENA_MODEL_UPDATE_EXPORT_DIR set where the flow runs, the new run's failed episodes
    (agent failures and timeouts: the model's own) are exported there as `<dir>/<new run id>`
    (ARENA_MODEL_UPDATE_EXPORT_FORMAT: trajectories or sft) for the next training round, and the
    artifact links the export. Held-out tasks are never exported (the artifact says so instead).
    """
    try:
        comparison = run_model_update(model, endpoint, checkpoint, baseline, OperatorSettings.from_env())
    except ModelUpdateRefused as refused:
        # A refusal is the caller's input, not a crash: one line, no traceback, and a Failed
        # state (so failure notifications still fire).
        get_run_logger().error("model update refused: %s", refused)
        return Failed(message=f"Refused: {refused}")
    return model_update_state(comparison)


def run_model_update(
    model: str, endpoint: str | None, checkpoint: str | None, baseline: str, settings: OperatorSettings
) -> RunComparison:
    """The model update's work, with the operator's settings given (see `evaluate_model_update`)."""
    logger = get_run_logger()
    file = resolve_baselines_file(settings.baselines_file)
    chosen = find_baseline(load_baselines(file), baseline, file)
    chosen.check_model_update(model, endpoint, checkpoint)
    reference = baseline_config(chosen, trigger="model-update")
    new_config = model_update_config(chosen, model, endpoint, checkpoint=checkpoint)
    logger.info(
        "model update: %s (endpoint %s, checkpoint %s) against baseline %s", model, endpoint, checkpoint, chosen.name
    )
    # The endpoint must answer and serve the model before any VM starts (arena doctor's check).
    unreachable = [c for c in check_model(new_config.agent, new_config.resolved_agent_options()) if not c.ok]
    if unreachable:
        raise ModelUpdateRefused(f"baseline {chosen.name!r}: {unreachable[0].detail}; nothing was run")

    baseline_run_id = latest_completed_run(reference.store_location, reference)
    if baseline_run_id is None:
        logger.info("no completed run of baseline %s yet; running it first", chosen.name)
        baseline_run_id = _run_baseline(reference).run_id
    else:
        logger.info("comparing with baseline run %s", baseline_run_id)

    new_outcome = _run_baseline(new_config)
    new_run_id = new_outcome.run_id
    design: AdaptiveDesign | None = None
    assert chosen.model_updates is not None  # check_model_update refused a baseline without them
    if chosen.model_updates.adaptive and not _verdict_withheld(new_outcome, new_config):
        design = run_adaptive_design(reference, baseline_run_id, new_config, new_run_id, chosen.model_updates,
                                     _run_baseline)
        logger.info("adaptive design: %s", design.report.decision)
    comparison = compare_runs(
        final_attempts(reference.store_location, baseline_run_id),
        final_attempts(new_config.store_location, new_run_id),
        baseline_run_id,
        new_run_id,
        baseline_status=stored_run_status(reference.store_location, baseline_run_id),
        new_status=stored_run_status(new_config.store_location, new_run_id),
    )
    comparison.withheld = _verdict_withheld(new_outcome, new_config)
    if comparison.withheld:
        logger.warning("no verdict for %s: %s", model, comparison.withheld)
    title = f"{model} vs baseline {chosen.name}" + (f" (checkpoint {checkpoint})" if checkpoint else "")
    markdown = model_update_report(comparison, design, title)
    if settings.export_failures:
        markdown += "\n\n" + _export_failures(new_config, new_run_id, Path(settings.export_failures),
                                              settings.export_format)
    best_effort(
        "publishing the comparison artifact",
        lambda: create_markdown_artifact(
            key=f"model-update-{slug(chosen.name)}",
            markdown=markdown,
            description=f"{model} vs baseline {chosen.name}: {comparison.verdict}",
        ),
    )
    logger.info("verdict: %s (p = %s)", comparison.verdict, comparison.p_value)
    logger.info("comparison\n%s", markdown)
    return comparison


def model_update_report(comparison: RunComparison, design: AdaptiveDesign | None, title: str) -> str:
    """The model update's artifact (markdown), with one verdict. When the adaptive design ran, its
    decision is the verdict (set on `comparison`) and heads the artifact: its trials were chosen by
    what earlier trials showed, so the fixed-sample test is not applied to them (6.5 % false
    verdicts between equal models in bench/adaptive_trials.py, and a verdict that could
    contradict the design's); the two
    runs' per-task means follow, described, not tested."""
    if design is not None:
        comparison.design_decision = design.report.decision
        comparison.design_summary = design.report.summary()
        if comparison.trials is not None:
            comparison.trials = comparison.trials.descriptive()
    markdown = comparison_markdown(comparison, title)
    return markdown if design is None else design.markdown() + "\n" + markdown


@dataclass
class AdaptiveDesign:
    """The adaptive design's end (adapters/results/trials/adaptive.py): its decision with the
    interval look by look, and what a fixed design would have cost for the same width."""

    report: Any  # AdaptiveReport
    fixed: Any  # FixedDesignCost, or None without an interval
    batches: int

    def markdown(self) -> str:
        """The artifact's section: decision, episodes spent, the interval as it narrowed, the
        fixed design's cost."""
        r = self.report
        lines = [f"## Adaptive design: **{r.decision}** (the model update's verdict)", "",
                 f"{r.episodes} further trials spent in the first pass's gaps and {self.batches} batch(es) "
                 f"(budget {r.budget}; {r.given_trials} trials of the two runs given at the start); margin "
                 f"+/-{100 * r.margin:.1f} points; {r.method}.", "", "```", r.render(), "```"]
        if self.fixed is not None:
            lines += ["", f"A fixed design reaching the same interval width ({100 * self.fixed.width:.1f} points) "
                          f"would run every task {self.fixed.trials_per_task} time(s) with each model: "
                          f"{self.fixed.episodes} episodes."]
        return "\n".join(lines) + "\n"


def run_adaptive_design(reference: SuiteRunConfig, baseline_run_id: str, new_config: SuiteRunConfig, new_run_id: str,
                        settings: ModelUpdates, run: Any = None) -> AdaptiveDesign:
    """Drive the adaptive design over two stored runs: the design (adaptive.py) decides what to
    run next and when to stop; each batch resumes the baseline's and the new model's runs with
    more trials of the tasks it picked (`task_trials`), and their outcomes are recorded back.
    `run` evaluates one configuration (default: as a subflow, `_run_baseline`)."""
    from adapters.results.trials.adaptive import (AdaptiveState, batch_trials, decide, fixed_design_cost,
                                                  next_batch, record_trial_rows, sound_outcomes)

    run = run or _run_baseline
    runs = {"baseline": (reference, baseline_run_id), "candidate": (new_config, new_run_id)}
    rows = {m: final_attempts(c.store_location, r) for m, (c, r) in runs.items()}
    known = {m: sound_outcomes(rows[m]) for m in runs}
    tasks = sorted(known["baseline"].keys() & known["candidate"].keys())  # comparable: sound in both
    trials = {m: _trials_per_task(rows[m]) for m in runs}
    budget = settings.budget_trials or default_budget_trials(len(tasks))
    state = AdaptiveState.start(tasks, budget=budget, margin=settings.margin,
                                baseline_trials={t: known["baseline"][t] for t in tasks},
                                candidate_trials={t: known["candidate"][t] for t in tasks})
    wanted: dict[str, dict[str, int]] = {m: dict(c.task_trials) for m, (c, _) in runs.items()}
    batches = 0
    while decide(state).decision == "continue":
        batch = next_batch(state, settings.batch_size)
        if not batch:
            break
        batches += 1
        for model, more in batch_trials(batch).items():
            if not more:
                continue
            config, run_id = runs[model]
            before = dict(trials[model])
            for task_id, n in more.items():
                wanted[model][task_id] = before.get(task_id, 0) + n
            run(config.model_copy(update={"run_id": run_id, "task_trials": dict(wanted[model])}))
            after = final_attempts(config.store_location, run_id)
            for task_id, n in more.items():
                fresh = [r for r in after if r["task_id"] == task_id and int(r["trial"]) > before.get(task_id, 0)]
                record_trial_rows(state, model, task_id, n, fresh)
            trials[model] = _trials_per_task(after)
    report = decide(state)
    return AdaptiveDesign(report=report, fixed=fixed_design_cost(state) if report.interval else None, batches=batches)


def default_budget_trials(tasks: int) -> int:
    """The adaptive design's default budget of further trials: what a fixed design of 3 trials
    per task and model costs (2 x 3 x tasks)."""
    return 2 * 3 * tasks


def _trials_per_task(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The highest trial number of each task in a run's final attempts."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row["task_id"])] = max(counts.get(str(row["task_id"]), 0), int(row.get("trial") or 1))
    return counts


def model_update_state(comparison: RunComparison) -> State:
    """Completed with the verdict, or Failed ("No verdict: ...") when the new model's run cannot give one
    (so Prefect's failure notifications fire); the comparison as data."""
    if comparison.withheld:
        return ended(Failed, f"No verdict: {comparison.withheld}", comparison)
    design = f" (the adaptive design's decision: {comparison.design_decision})" if comparison.design_decision else ""
    return ended(Completed, f"verdict: {comparison.verdict}{design}", comparison)


def _verdict_withheld(outcome: RunOutcome, config: SuiteRunConfig) -> str | None:
    """Why the new model's run can give no verdict (it did not finish, or never reached the
    model), or None."""
    if outcome.status != "completed":
        missing = outcome.completeness.missing if outcome.completeness else "some"
        return f"the new model's run {outcome.run_id} is {outcome.status} ({missing} task(s) without a final result)"
    calls = sum(r.usage.calls for r in outcome.results if r.usage is not None)
    if outcome.results and calls == 0:
        return (f"the new model's run {outcome.run_id} never reached the model at "
                f"{config.agent_options.base_url or 'its endpoint'} (0 model calls)")
    return None


def _export_failures(config: SuiteRunConfig, run_id: str, directory: Path, fmt: str) -> str:
    """Export the run's failed episodes for training; the markdown line the artifact shows."""
    from adapters.benchmark import OutcomeKind
    from adapters.training.export import export_training
    from adapters.training.selection import EpisodeFilter
    from adapters.training.suites import held_out_dirs

    logger = get_run_logger()
    target = (directory / run_id).resolve()
    selection = EpisodeFilter(run_ids=[run_id], outcomes=[OutcomeKind.AGENT_FAILURE, OutcomeKind.TIMEOUT])
    try:
        summary = export_training(config.store_location, selection, fmt, target,  # type: ignore[arg-type]
                                  held_out=held_out_dirs(), overwrite=True)
    except ValueError as exc:  # nothing failed, or held-out tasks: said, not fatal to the comparison
        logger.warning("failures of %s not exported: %s", run_id, exc)
        return f"**Failures not exported**: {exc}"
    logger.info("exported %d failed episode(s) of %s to %s", summary.episodes, run_id, target)
    return (f"**Failures exported for training**: {summary.episodes} episode(s), {summary.steps} step(s) as "
            f"`{fmt}` -> [{target}]({target.as_uri()}) (manifest: `{target / 'manifest.json'}`)")
