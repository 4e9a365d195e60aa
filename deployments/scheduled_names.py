"""Nights that have not started yet, named like the ones that have.

Prefect's scheduler creates a deployment's upcoming flow runs ahead of time under generated names
("brave-otter"); the flow's own `flow_run_name` applies only once a run starts. So the UI listed
tonight's and tomorrow's nightly as random words beside `nightly-2026-11-25-0200utc`. The serve
process (deployments/serve.py) renames the scheduled ones, from their scheduled time, as the
flow will name them: `keep_naming`, a thread, every POLL_SECONDS.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from prefect.logging import get_logger

logger = get_logger("deployments.scheduled_names")

POLL_SECONDS = 60.0


def name_scheduled_runs(client: Any, deployment: str, name_for: Callable[[datetime], str]) -> int:
    """Rename the SCHEDULED flow runs of `deployment` ("flow/deployment") to `name_for(their
    scheduled time)` where they are named otherwise; the number renamed."""
    from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterId, FlowRunFilter,
                                                FlowRunFilterState, FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType

    found = client.read_deployment_by_name(deployment)
    runs = client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[found.id])),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))),
    )
    renamed = 0
    for run in runs:
        when = run.expected_start_time or run.next_scheduled_start_time
        if when is None:
            continue
        wanted = name_for(when)
        if run.name != wanted:
            client.update_flow_run(run.id, name=wanted)
            renamed += 1
    return renamed


def keep_naming(deployment: str, name_for: Callable[[datetime], str], stop: threading.Event,
                poll: float = POLL_SECONDS) -> None:
    """Until `stop` is set, rename `deployment`'s scheduled runs every `poll` seconds (a server
    that does not answer is asked again next time)."""
    from prefect.client.orchestration import get_client

    while True:
        try:
            with get_client(sync_client=True) as client:
                name_scheduled_runs(client, deployment, name_for)
        except Exception as exc:  # noqa: BLE001 - naming is cosmetic; the schedule runs anyway
            logger.debug("could not name the scheduled runs of %s: %s", deployment, exc)
        if stop.wait(poll):
            return
