"""Serve the pipeline's deployments from this process (no work pool needed).

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m deployments.serve

registers and serves, until interrupted:

    evaluate-baseline/on-demand             on demand (UI, CLI, API): one baseline of the
                                            baselines file, by name (default
                                            scripted-bundled-local); a run id resumes that run
    nightly-baselines/nightly-baselines     every baseline of the baselines file, on a cron
                                            schedule (default "0 2 * * *" UTC)
    evaluate-model-update/on-model-update   triggered by a `model.updated` event for resource
                                            "model.<name>": evaluates <name> against a baseline,
                                            if the baseline's model_updates admit it

A flow run's parameters are whatever its caller sends (anyone who reaches the Prefect API), so
these flows take names only: a baseline, a run id, a model id and endpoint the baseline's
allow-list admits. The baselines file, the store, suites, folders and the names of secrets'
variables come from this process's environment and the baselines file. A parameter the flow does
not take (``db_path``, ``config``) is refused when the run is created: each deployment's parameter
schema says ``additionalProperties: false`` and the server enforces it (HTTP 409 naming the
parameter), instead of a run that starts and ends Crashed with no reason.

Settings (environment):
    ARENA_NIGHTLY_CRON       cron of nightly-baselines (default "0 2 * * *")
    ARENA_NIGHTLY_TIMEZONE   its IANA time zone (default "UTC"), e.g. "Europe/Berlin"
    ARENA_BASELINES_FILE     the baselines file every served flow reads when it runs
                             (default deployments/baselines.toml)
    ARENA_MODEL_BASELINE     baseline a model update is compared with (default plan-replay-local, the
                             shipped demo that calls the local plan-replay endpoint); on-model-update is
                             not served when that baseline admits no model updates
    ARENA_MODEL_UPDATE_EXPORT_DIR, ARENA_MODEL_UPDATE_EXPORT_FORMAT   where (and as what) a model
                             update exports its new model's failed episodes
    ARENA_SERVE_LIMIT        at most this many flow runs at once in this process (default 4; 0 = no
                             limit). Runs beyond it wait. Runs at once share the results store
                             (adapters/store), so a model update need not wait for the nightly;
                             each run has its own VM pool, which this also bounds.

When this process exits, Prefect pauses the deployments it served (the scheduled nightly runs are
deleted); serving again re-registers them. A process started before the previous one has exited
would be left serving paused deployments, so for its first minutes it resumes any it finds
paused, and later reports one that is (deployments/health.py). `arena status` says whether and
when the nightly runs next. For workers on several hosts use
prefect.yaml instead (docs/deployments.md).
"""

from __future__ import annotations

import os
import sys
import threading

from prefect import serve
from prefect.deployments.runner import RunnerDeployment
from prefect.events import DeploymentEventTrigger
from prefect.schedules import Cron
from prefect.utilities.callables import ParameterSchema

from deployments.health import keep_active
from deployments.scheduled_names import keep_naming
from flows.baselines import (
    DEFAULT_BASELINE,
    DEFAULT_MODEL_BASELINE,
    OperatorSettings,
    evaluate_baseline,
    evaluate_model_update,
    find_baseline,
    load_baselines,
    nightly_baselines,
    nightly_run_name,
    resolve_baselines_file,
)
from flows.notify import MODEL_UPDATED

DEFAULT_CRON = "0 2 * * *"
DEFAULT_TIMEZONE = "UTC"

# Parameters of an on-model-update run, rendered by the server from the triggering event: the
# model is the resource id without its "model." prefix; endpoint and checkpoint come from the
# payload (null when the payload lacks them).
MODEL_UPDATE_PARAMETERS = {
    "model": "{{ event.resource.id[6:] }}",
    "endpoint": "{{ event.payload.get('endpoint') }}",
    "checkpoint": "{{ event.payload.get('checkpoint') }}",
}


class ClosedParameterSchema(ParameterSchema):
    """A flow's parameter schema that admits no parameter the flow does not take. Prefect 3.8.8's
    own schema leaves `additionalProperties` out (JSON Schema's default: anything goes), and its
    model keeps no field it does not define, hence this one."""

    additionalProperties: bool = False  # noqa: N815 - JSON Schema's own name


def closed(deployment: RunnerDeployment) -> RunnerDeployment:
    """`deployment` with its parameter schema closed and enforced by the server: creating a run
    with a parameter its flow does not take is refused (HTTP 409 naming the parameter)."""
    schema = deployment._parameter_openapi_schema  # noqa: SLF001 - Prefect has no setter for it
    deployment._parameter_openapi_schema = ClosedParameterSchema(  # noqa: SLF001
        **schema.model_dump(exclude_unset=True), additionalProperties=False)
    deployment.enforce_parameter_schema = True
    return deployment


def build_deployment() -> RunnerDeployment:
    """The on-demand deployment: one baseline by name (kept out of the flow code)."""
    return closed(evaluate_baseline.to_deployment(
        name="on-demand",
        parameters={"baseline": DEFAULT_BASELINE},
        description="Run one baseline of the baselines file by name (default: the bundled suite, scripted agent, "
                    "local simulation); give run_id to resume a run.",
        tags=["waa", "on-demand"],
    ))


def build_nightly_deployment() -> RunnerDeployment:
    cron = os.environ.get("ARENA_NIGHTLY_CRON", DEFAULT_CRON)
    timezone = os.environ.get("ARENA_NIGHTLY_TIMEZONE", DEFAULT_TIMEZONE)
    return closed(nightly_baselines.to_deployment(
        name="nightly-baselines",
        schedules=[Cron(cron, timezone=timezone)],
        description=f"Run every baseline of the baselines file ({cron}, {timezone}).",
        tags=["waa", "baselines"],
    ))


def model_update_baseline() -> str:
    """The baseline model updates are compared with (ARENA_MODEL_BASELINE)."""
    return os.environ.get("ARENA_MODEL_BASELINE") or DEFAULT_MODEL_BASELINE


def model_update_refusal() -> str | None:
    """Why on-model-update cannot be served (its baseline admits no model updates, or is not in
    the baselines file), or None."""
    file = resolve_baselines_file(OperatorSettings.from_env().baselines_file)
    try:
        return find_baseline(load_baselines(file), model_update_baseline(), file).model_update_refusal()
    except ValueError as exc:
        return str(exc)


def build_model_update_deployment() -> RunnerDeployment:
    baseline = model_update_baseline()
    return closed(evaluate_model_update.to_deployment(
        name="on-model-update",
        parameters={"baseline": baseline},
        triggers=[
            DeploymentEventTrigger(
                name="on-model-updated-event",
                description=f"Each {MODEL_UPDATED} event for a resource model.<name> starts on-model-update: <name> "
                            f"(at the event's endpoint) evaluated against baseline {baseline}",
                expect={MODEL_UPDATED},
                match={"prefect.resource.id": "model.*"},
                parameters=MODEL_UPDATE_PARAMETERS,
            )
        ],
        description=f"Evaluate a new model (from a {MODEL_UPDATED} event) against baseline {baseline} and compare.",
        tags=["waa", "model-update"],
    ))


def build_deployments() -> list[RunnerDeployment]:
    """Every deployment this process serves: on-model-update only when its baseline admits model
    updates (a baseline whose agent calls no model cannot test one)."""
    deployments = [build_deployment(), build_nightly_deployment()]
    refusal = model_update_refusal()
    if refusal is None:
        deployments.append(build_model_update_deployment())
    else:
        print(f"on-model-update is not served: {refusal}", file=sys.stderr, flush=True)
    return deployments


def main() -> None:
    """Register the deployments and serve them until interrupted."""
    limit = int(os.environ.get("ARENA_SERVE_LIMIT", "4"))
    deployments = build_deployments()
    stop = threading.Event()
    names = [f"{d.flow_name}/{d.name}" for d in deployments]
    threading.Thread(target=keep_active, args=(names, stop), name="keep-deployments-active", daemon=True).start()
    nightly = f"{nightly_baselines.name}/nightly-baselines"
    threading.Thread(target=keep_naming, args=(nightly, nightly_run_name, stop), name="name-scheduled-nights",
                     daemon=True).start()
    try:
        serve(*deployments, limit=limit if limit > 0 else None)
    finally:
        stop.set()


if __name__ == "__main__":
    main()
