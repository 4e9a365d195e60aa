"""A flow run's heartbeats sent by the flow itself (flows/flow_run_heartbeats.py), as `arena run`
has them so that its end does not wait on Prefect's heartbeat thread: on a real Prefect server,
the events match what Prefect's engine sends for the same kind of run, one sender at a time."""

from __future__ import annotations

import threading
from typing import Any

from prefect import flow, get_client
from prefect.flow_engine import run_flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from flows.flow_run_heartbeats import flow_run_heartbeats, heartbeats_from_the_flow
from prefect_events import stored_heartbeats


@flow(name="heartbeat-probe")
def probe() -> int:
    with flow_run_heartbeats():
        # How many of the product's heartbeat senders run beside the body.
        return sum(thread.name == "flow-run-heartbeat" for thread in threading.enumerate())


def _new_run(tags: list[str]) -> Any:
    """A new flow run of a deployment of `probe`, as `arena run` has one of its deployment."""
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(probe)
        deployment_id = client.create_deployment(flow_id=flow_id, name="probe", paused=True)
        return client.create_flow_run_from_deployment(deployment_id, tags=tags)


def _shape(event: Any) -> tuple[dict[str, str], list[dict[str, str]]]:
    """An event's resource and related resources, without what names this particular run."""
    resource = {key: value for key, value in event.resource.root.items()
                if key not in ("prefect.resource.id", "prefect.resource.name")}
    related = sorted(({key: value for key, value in item.root.items() if key != "prefect.resource.id"}
                      | {"kind": item.id.rsplit(".", 1)[0]} for item in event.related),
                     key=lambda labels: (labels["kind"], labels.get("prefect.resource.name", "")))
    return resource, related


def test_the_products_heartbeats_are_prefects_own_sent_once_and_stop_with_the_run(prefect_server: None) -> None:
    tags = ["waa", "heartbeat-probe"]
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
        by_prefect = _new_run(tags)
        state = run_flow(probe, flow_run=by_prefect, return_type="state")
        assert state.is_completed() and state.result() == 0  # the body sends nothing: Prefect does

        by_product = _new_run(tags)
        with heartbeats_from_the_flow():
            state = run_flow(probe, flow_run=by_product, return_type="state")
        assert state.is_completed() and state.result() == 1
        # The sender has ended with the body: nothing is left to wait for at the run's end.
        assert not [thread for thread in threading.enumerate() if thread.name == "flow-run-heartbeat"]

    theirs, ours = stored_heartbeats(by_prefect.id), stored_heartbeats(by_product.id)
    assert len(theirs) == 1, theirs  # sent as the run starts; the next one would be 30 s later
    assert len(ours) == 1, ours  # the product's alone: Prefect's engine sent none beside it
    assert _shape(ours[0]) == _shape(theirs[0])
    for run, event in ((by_prefect, theirs[0]), (by_product, ours[0])):
        assert event.resource.id == f"prefect.flow-run.{run.id}"
        assert event.resource.name == run.name
    related = _shape(ours[0])[1]
    assert {item["kind"] for item in related} == {"prefect.flow", "prefect.deployment", "prefect.tag"}
    assert ({item["prefect.resource.id"] for item in ours[0].related if item.role == "flow"}
            == {f"prefect.flow.{by_product.flow_id}"})


def test_heartbeats_turned_off_in_the_settings_are_not_sent(prefect_server: None) -> None:
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        run = _new_run(["heartbeat-probe"])
        with heartbeats_from_the_flow():
            state = run_flow(probe, flow_run=run, return_type="state")
    assert state.is_completed() and state.result() == 0
    assert stored_heartbeats(run.id) == []
