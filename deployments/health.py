"""Whether the served deployments will run: paused deployments, schedules, the next nightly.

A served deployment is paused by Prefect when the process serving it exits (the runner's
`pause_on_shutdown`). Starting a new `python -m deployments.serve` before the old one has exited
therefore ends with the new process serving paused deployments: the schedule still shows
active, and the nightly silently never runs. `keep_active` (a thread of deployments.serve) puts
such deployments back, and `arena status` says whether, and when, the nightly will run next.

    read_status(client, names)   DeploymentStatus of each deployment (None when not registered)
    keep_active(names, stop)     re-activate deployments paused in the first minutes of serving
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prefect.logging import get_logger

logger = get_logger("deployments.health")

# A deployment found paused this soon after serving started was paused by the process this one
# replaced; later, a person may have paused it on purpose, so it is only reported.
HEAL_WINDOW_SECONDS = 300.0
POLL_SECONDS = 5.0


@dataclass(frozen=True)
class ScheduleInfo:
    cron: str | None
    timezone: str | None
    active: bool

    def describe(self) -> str:
        state = "active" if self.active else "INACTIVE"
        return f"cron {self.cron!r} ({self.timezone or 'UTC'}), {state}"


@dataclass(frozen=True)
class DeploymentStatus:
    """What decides whether a deployment runs on its own."""

    name: str
    paused: bool
    schedules: list[ScheduleInfo] = field(default_factory=list)
    next_run: datetime | None = None  # the earliest scheduled flow run, in the schedule's zone

    @property
    def will_run_on_schedule(self) -> bool:
        return not self.paused and any(s.active for s in self.schedules) and self.next_run is not None


def _next_scheduled_run(client: Any, deployment_id: Any) -> datetime | None:
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    runs = client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))),
        sort=FlowRunSort.EXPECTED_START_TIME_ASC,
        limit=1,
    )
    return runs[0].expected_start_time if runs else None


def read_status(client: Any, names: list[str]) -> dict[str, DeploymentStatus | None]:
    """Each deployment's paused flag, schedules and next scheduled run (None: not registered)."""
    from zoneinfo import ZoneInfo

    from prefect.exceptions import ObjectNotFound

    statuses: dict[str, DeploymentStatus | None] = {}
    for name in names:
        try:
            deployment = client.read_deployment_by_name(name)
        except ObjectNotFound:
            statuses[name] = None
            continue
        schedules = [
            ScheduleInfo(getattr(s.schedule, "cron", None), getattr(s.schedule, "timezone", None), bool(s.active))
            for s in deployment.schedules
        ]
        next_run = _next_scheduled_run(client, deployment.id) if schedules else None
        if next_run is not None and schedules and schedules[0].timezone:
            next_run = next_run.astimezone(ZoneInfo(schedules[0].timezone))
        statuses[name] = DeploymentStatus(name, bool(deployment.paused), schedules, next_run)
    return statuses


def keep_active(names: list[str], stop: threading.Event, heal_window: float = HEAL_WINDOW_SECONDS,
                poll: float = POLL_SECONDS) -> None:
    """Until `stop` is set: resume any of `names` found paused within `heal_window` seconds of
    the start (the serve process this one replaced paused them on its way out), and log an error
    for one found paused later (left as it is: someone may have paused it on purpose)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    started = time.monotonic()
    reported: set[str] = set()
    while not stop.wait(poll):
        try:
            with get_client(sync_client=True) as client:
                for name in names:
                    try:
                        deployment = client.read_deployment_by_name(name)
                    except ObjectNotFound:
                        continue  # not registered yet
                    if not deployment.paused:
                        reported.discard(name)
                    elif time.monotonic() - started < heal_window:
                        client.resume_deployment(deployment.id)
                        logger.warning(
                            "deployment %s was paused (a previous serve process exiting pauses what it "
                            "served); resumed it so its schedule runs", name,
                        )
                    elif name not in reported:
                        reported.add(name)
                        logger.error(
                            "deployment %s is PAUSED: it will not run on its schedule; resume it with "
                            "`prefect deployment resume %s` or in the UI", name, name,
                        )
        except Exception as exc:  # noqa: BLE001 - the server may be restarting; look again later
            logger.debug("could not check the deployments: %s", exc)
