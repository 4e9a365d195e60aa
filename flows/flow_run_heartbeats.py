"""A flow run's heartbeats, sent by the process that executes it, without Prefect's wait at its end.

Prefect's engine sends a `prefect.flow-run.heartbeat` event when a flow run starts and then every
`PREFECT_FLOWS_HEARTBEAT_FREQUENCY` seconds (default 180, at least 30); an automation that expects
them is how a team's server tells a crashed run from a long one. Its thread sleeps in one-second
steps, and a synchronous flow run ends by joining it: every `arena run` waited up to a second
(half a second on average, measured) after its flow run was already final.

Around a flow run executed in this process, `heartbeats_from_the_flow()` turns Prefect's own off;
in the flow's body, `flow_run_heartbeats()` then sends the same events from a thread that stops
the moment the body returns, so the flow run has one sender of heartbeats, as before. The thread
starts inside the run's context, as Prefect's does, so Prefect's event worker adds the same
related resources to them (the run's flow, deployment, work queue and pool, their tags), and
automations written for Prefect's heartbeats match them (tests/flows/test_flow_run_heartbeats.py
compares the two on a real server). A flow run nobody wrapped (a served or a worker's run, a
subflow) keeps Prefect's.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from prefect import __version__ as prefect_version
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext
from prefect.events import emit_event
from prefect.events.related import tags_as_related_resources
from prefect.events.schemas.events import RelatedResource
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

log = logging.getLogger(__name__)

HEARTBEAT_EVENT = "prefect.flow-run.heartbeat"
# Prefect's engine never sends them more often than this, whatever the setting says.
MINIMUM_SECONDS = 30
# The interval at which the flow's body sends heartbeats (set by `heartbeats_from_the_flow`).
_sent_by_the_flow: contextvars.ContextVar[int | None] = contextvars.ContextVar("arena_flow_run_heartbeats",
                                                                               default=None)


def heartbeat_seconds() -> int | None:
    """The interval this process's Prefect settings ask for, None when heartbeats are off."""
    value = get_current_settings().flows.heartbeat_frequency
    return None if value is None else max(int(value), MINIMUM_SECONDS)


def heartbeat_event_parts(flow_run: FlowRun, flow_name: str) -> tuple[dict[str, str], list[RelatedResource]]:
    """The resource and related resources of `flow_run`'s heartbeat event, as Prefect's engine
    builds them: the run (id, name, Prefect's version), its flow, its deployment, its tags."""
    resource = {
        "prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
        "prefect.resource.name": flow_run.name or "",
        "prefect.version": prefect_version,
    }
    related: list[RelatedResource] = []
    if flow_run.flow_id:
        related.append(RelatedResource.model_validate({
            "prefect.resource.id": f"prefect.flow.{flow_run.flow_id}",
            "prefect.resource.role": "flow",
            "prefect.resource.name": flow_name,
        }))
    if flow_run.deployment_id:
        related.append(RelatedResource.model_validate({
            "prefect.resource.id": f"prefect.deployment.{flow_run.deployment_id}",
            "prefect.resource.role": "deployment",
        }))
    related += tags_as_related_resources(set(flow_run.tags or []))
    return resource, related


@contextmanager
def heartbeats_from_the_flow() -> Iterator[None]:
    """Around executing a flow run in this process (`run_flow`): Prefect's engine sends it no
    heartbeats; the flow's body sends them (`flow_run_heartbeats`) at the interval the settings
    ask for. Heartbeats off in the settings: nobody sends any."""
    seconds = heartbeat_seconds()
    if seconds is None:
        yield
        return
    token = _sent_by_the_flow.set(seconds)
    try:
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield
    finally:
        _sent_by_the_flow.reset(token)


@contextmanager
def flow_run_heartbeats() -> Iterator[None]:
    """In a flow's body: while it runs, send the flow run's heartbeats when
    `heartbeats_from_the_flow` turned Prefect's off for it, from a thread that ends with the
    block at once; otherwise (Prefect sends them, or they are off) nothing."""
    seconds = _sent_by_the_flow.get()
    context = FlowRunContext.get()
    if seconds is None or context is None or context.flow_run is None:
        yield
        return
    resource, related = heartbeat_event_parts(context.flow_run, context.flow.name if context.flow else "")
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                emit_event(event=HEARTBEAT_EVENT, resource=resource, related=related)
            except Exception:  # noqa: BLE001 - as Prefect's own: a missed heartbeat must not end the run
                log.debug("the flow run's heartbeat could not be sent", exc_info=True)
            if stop.wait(seconds):
                return

    # In the run's context (its settings, its run), as Prefect's own thread.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(beat,),
                              name="flow-run-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2)
