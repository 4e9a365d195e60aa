"""`arena run`'s flow run: a run of the `evaluate-suite/arena-run` deployment, executed in the
`arena run` process that creates it.

Nothing serves that deployment (it is registered paused, so no one starts a run of it from the
UI); it is there because Prefect's UI offers Cancel only on runs of a deployment, and a run with a
page that can be cancelled is what a person watching expects.

    create_arena_flow_run(flow, config, name, tags)   the flow run, registering the deployment once
    flow_run_url(flow_run_id)                         its page in the Prefect UI
    stopped_while_starting(flow_run_id, stop)         a stop before the flow could handle it
"""

from __future__ import annotations

import uuid
from typing import Any

from prefect import get_client

from flows.bookkeeping import best_effort
from flows.provenance import code_revision
from flows.run_config import SuiteRunConfig

ARENA_RUN_DEPLOYMENT = "arena-run"


def stopped_while_starting(flow_run_id: Any, stop: BaseException) -> None:
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


def create_arena_flow_run(flow: Any, config: SuiteRunConfig, name: str, tags: list[str]) -> Any:
    """A new flow run of `flow`'s `arena-run` deployment for `config` (its run id set), named
    `name` with `tags`, which the calling process then executes.

    The creation carries an idempotency key (the run id and a token of this call): Prefect's
    client sends a request again when its answer does not arrive (a busy server answering after
    the client's timeout, a dropped connection), and without the key the server made a second
    flow run that nobody executes: a ghost run left Scheduled in the UI beside the real one. The
    token makes a resume of the same run id a new flow run, not the earlier one again."""
    with get_client(sync_client=True) as client:
        return client.create_flow_run_from_deployment(
            arena_run_deployment(client, flow), parameters={"config": config.model_dump(mode="json")},
            tags=tags, name=name,
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


def arena_run_deployment(client: Any, flow: Any) -> Any:
    """The id of `<flow>/arena-run` on the current Prefect server (read with `client`, a sync
    Prefect client), registered when it is missing or not as this code would register it."""
    from prefect.settings import PREFECT_API_URL

    server = str(PREFECT_API_URL.value())
    if server not in _deployments:
        version = code_revision() or flow.version
        _deployments[server] = _current_arena_run_deployment(client, flow, version) or flow.to_deployment(
            name=ARENA_RUN_DEPLOYMENT, version=version, paused=True, tags=_ARENA_RUN_TAGS,
            description=_ARENA_RUN_DESCRIPTION,
        ).apply()
    return _deployments[server]


def _current_arena_run_deployment(client: Any, flow: Any, version: str) -> Any:
    """The registered deployment's id when it is what `to_deployment(...).apply()` would make of
    this code (its `version`: the git revision, else Prefect's hash of the flow's source, given
    explicitly because Prefect's own choice depends on the folder it runs in; its parameters'
    schema; paused; tags and description), else None. Reading it takes about 50 ms; registering it
    again, about 0.3 s of every `arena run`'s start (measured here), when it is nearly always there
    already."""
    from prefect.exceptions import ObjectNotFound
    from prefect.utilities.callables import parameter_schema

    try:
        found = client.read_deployment_by_name(f"{flow.name}/{ARENA_RUN_DEPLOYMENT}")
    except ObjectNotFound:
        return None
    wanted_schema = parameter_schema(flow).model_dump(exclude_unset=True)
    current = (found.version == version and found.paused and sorted(found.tags) == _ARENA_RUN_TAGS
               and found.description == _ARENA_RUN_DESCRIPTION and found.parameter_openapi_schema == wanted_schema)
    return found.id if current else None
