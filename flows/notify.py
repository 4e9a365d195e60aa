"""Tell the Prefect server that a model changed, which starts the `on-model-update` deployment.

    notify_model_updated("qwen7b-ft-003", endpoint="http://gpu-host:8000/v1", checkpoint="s3://ckpt/003")

emits the event

    event:    model.updated
    resource: {"prefect.resource.id": "model.qwen7b-ft-003", "prefect.resource.name": "qwen7b-ft-003"}
    payload:  {"endpoint": "http://gpu-host:8000/v1", "checkpoint": "s3://ckpt/003"}

to the server at PREFECT_API_URL. Programs in other languages can POST the same event to the
server's /api/events (docs/deployments.md has a curl example).
"""

from __future__ import annotations

import asyncio

from prefect.events import Event
from prefect.events.clients import PrefectEventsClient
from prefect.settings import PREFECT_API_URL

from adapters.secrets import refuse_url_secret

MODEL_UPDATED = "model.updated"


def model_updated_event(model: str, endpoint: str | None, checkpoint: str | None) -> dict:
    """The event's name, resource and payload (what emit_event sends, and what curl should POST)."""
    if not model or not model.strip():
        raise ValueError("model must not be empty")
    if endpoint:
        refuse_url_secret(endpoint, "--endpoint", "leave it out: the baseline's api_key_env names the key's variable")
    return {
        "event": MODEL_UPDATED,
        "resource": {"prefect.resource.id": f"model.{model}", "prefect.resource.name": model},
        "payload": {"endpoint": endpoint, "checkpoint": checkpoint},
    }


def notify_model_updated(model: str, endpoint: str | None = None, checkpoint: str | None = None) -> str:
    """Emit `model.updated` for `model` to the Prefect server at PREFECT_API_URL; returns the event id.

    Raises RuntimeError when no server is configured: without PREFECT_API_URL Prefect would send
    the event to a throwaway ephemeral server, which runs no automations.
    """
    if not PREFECT_API_URL.value():
        raise RuntimeError(
            "PREFECT_API_URL is not set; point it at the Prefect server that serves the deployments, "
            "e.g. PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    api_url = str(PREFECT_API_URL.value())
    event = Event(**model_updated_event(model, endpoint, checkpoint))

    # A client of our own, bound to this URL: Prefect's shared background events worker keeps the
    # server it first talked to, so in a process that already used another server the event
    # would silently go there.
    async def send() -> None:
        async with PrefectEventsClient(api_url=api_url) as client:
            await client.emit(event)

    asyncio.run(send())
    return str(event.id)


def deployments_started_by(event_name: str = MODEL_UPDATED) -> list[str]:
    """The deployments ("flow/deployment") that enabled automations on the server at
    PREFECT_API_URL start when `event_name` arrives, each with the parameters it sets."""
    from prefect.client.orchestration import get_client

    started: list[str] = []
    with get_client(sync_client=True) as client:
        for automation in client.read_automations():
            expect = getattr(automation.trigger, "expect", None) or set()
            if not automation.enabled or event_name not in expect:
                continue
            for action in automation.actions:
                deployment_id = getattr(action, "deployment_id", None)
                if deployment_id is None:
                    continue
                deployment = client.read_deployment(deployment_id)
                flow = client.read_flow(deployment.flow_id)
                baseline = (deployment.parameters or {}).get("baseline")
                started.append(f"{flow.name}/{deployment.name}" + (f" (baseline {baseline})" if baseline else "")
                               + (" [paused]" if deployment.paused else ""))
    return started
