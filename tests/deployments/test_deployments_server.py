"""The deployments against a REAL Prefect server: registration, cron schedule, automation, and a
`model.updated` event starting an on-model-update run that evaluates and publishes a comparison.

An ephemeral/test-harness server runs no triggers, so this starts `prefect server start` in a
subprocess (its own PREFECT_HOME, filesystem lease storage) and serves the deployments with
`python -m deployments.serve` in another one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from server_helpers import PREFECT_BIN, PROJECT, PrefectServer, clean_env, stop_all, tail, wait_for
from tests.agents.fake_model_servers import FakeModelServer, openai_completion


# Two tasks of the bundled suite keep the triggered evaluation short.
TEST_TASKS = ["notepad-append-line", "settings-notifications-off"]


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real Prefect server and `python -m deployments.serve` against it; yields their settings."""
    tmp = tmp_path_factory.mktemp("prefect-server")
    server = PrefectServer(tmp / "server-home", tmp / "server.log")
    api_url = server.api_url
    base_env = clean_env()
    # The model baseline's endpoint (a fake OpenAI-compatible server whose model gives up at once)
    # and a caller's server that must never be contacted.
    model = FakeModelServer("openai", default=openai_completion("FAIL()")).start()
    model.models = ["base-model", "test-ckpt-1"]  # a new checkpoint is served before it is announced
    attacker = FakeModelServer("openai", default=openai_completion("FAIL()")).start()
    common = (f"task_ids = {json.dumps(TEST_TASKS)}\n"
              'pool_size = 2\nprovider = "local"\nreset_level = "snapshot"\n'
              f'db_path = "{tmp / "arena.duckdb"}"\nartifacts_dir = "{tmp / "artifacts"}"\n')
    baselines = tmp / "baselines.toml"
    baselines.write_text(
        "version = 1\n\n[[baselines]]\n"
        f'name = "scripted-bundled-local"\nagent = "scripted"\nsuite = "bundled"\n{common}'
        f'[[baselines]]\nname = "model-bundled-local"\nagent = "openai"\nsuite = "bundled"\n{common}'
        f'[baselines.agent_options]\nmodel = "base-model"\nbase_url = "{model.url}"\napi_key_env = "FAKE_MODEL_KEY"\n'
        f'[baselines.model_updates]\nmodels = ["test-ckpt-*"]\nendpoints = ["{model.url}"]\n'
    )
    serve_env = {
        **base_env,
        "PREFECT_HOME": str(tmp / "serve-home"),
        "PREFECT_API_URL": api_url,
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PREFECT_LOGGING_LEVEL": "INFO",
        "PYTHONPATH": str(PROJECT),
        "ARENA_BASELINES_FILE": str(baselines),
        "ARENA_MODEL_BASELINE": "model-bundled-local",
        # A secret of the serving process a hostile caller would like to have sent to it.
        "FAKE_MODEL_KEY": "serve-process-secret",
        "ARENA_NIGHTLY_TIMEZONE": "Europe/Berlin",
        # Every minute, so the test sees the schedule itself start the nightly flow.
        "ARENA_NIGHTLY_CRON": "* * * * *",
    }
    server_log, serve_log = server.log, tmp / "serve.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        server.start()
        with serve_log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "deployments.serve"],
                    cwd=PROJECT, env=serve_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )
            )
        yield {"api_url": api_url, "tmp": tmp, "serve_log": serve_log, "server_log": server_log, "procs": procs,
               "model": model, "attacker": attacker}
    finally:
        stop_all(procs)
        server.stop()
        model.stop()
        attacker.stop()


# How long an event may take to become a flow run here. The automation's action creates the run
# through Prefect's own client, inside this stock server on SQLite: one request may wait up to 60 s
# for a database lock (Prefect's busy timeout), and a 503 is tried again 2, 4, 8, 16 and 32 s later
# (prefect/client/base.py). Under CI's load a 60 s wait once ran out (stop 57); the cause was not
# seen, these are Prefect's documented worst cases.
EVENT_TO_RUN_SECONDS = 150


def _run_from_event(prefect_api: dict[str, Any], what: str, check: Any) -> Any:
    """`wait_for` the flow run an event should make (EVENT_TO_RUN_SECONDS); a failure carries the
    serving process's and the server's log tails (the server logs an automation's failed action:
    "Action failed: ...")."""
    try:
        return wait_for(what, check, EVENT_TO_RUN_SECONDS)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nserve log:\n{tail(prefect_api['serve_log'])}\nserver log:\n{tail(prefect_api['server_log'])}"
        ) from None


@pytest.fixture()
def client(prefect_api: dict[str, Any]) -> Iterator[Any]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_api["api_url"]}):
        with get_client(sync_client=True) as c:
            yield c


def _deployment(client: Any, name: str) -> Any:
    from prefect.exceptions import ObjectNotFound

    try:
        return client.read_deployment_by_name(name)
    except ObjectNotFound:
        return None


def test_deployments_schedule_trigger_and_event_run(prefect_api: dict[str, Any], client: Any) -> None:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.notify import notify_model_updated

    # 1. serve registered the three deployments.
    try:
        on_update = wait_for(
            "deployment evaluate-model-update/on-model-update",
            lambda: _deployment(client, "evaluate-model-update/on-model-update"),
            60,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nserve log:\n{tail(prefect_api['serve_log'])}") from None
    on_demand = _deployment(client, "evaluate-baseline/on-demand")
    nightly = _deployment(client, "nightly-baselines/nightly-baselines")
    assert on_demand is not None and nightly is not None

    # 2. The nightly cron schedule, in the configured time zone.
    assert len(nightly.schedules) == 1
    schedule = nightly.schedules[0]
    assert schedule.active
    assert schedule.schedule.cron == "* * * * *" and schedule.schedule.timezone == "Europe/Berlin"
    assert nightly.parameters == {}  # the baselines file is the serving process's, not a parameter

    # 3. The automation that runs on-model-update on model.updated events.
    def automation() -> Any:
        for a in client.read_automations():
            if any(getattr(action, "deployment_id", None) == on_update.id for action in a.actions):
                return a
        return None

    auto = wait_for("the on-model-update automation", automation, 30)
    assert auto.enabled
    assert auto.trigger.expect == {"model.updated"}
    assert auto.trigger.match.model_dump() == {"prefect.resource.id": "model.*"}

    # 4. A model.updated event creates a flow run of on-model-update with templated parameters.
    model, attacker = prefect_api["model"], prefect_api["attacker"]
    with temporary_settings({PREFECT_API_URL: prefect_api["api_url"]}):
        event_id = notify_model_updated("test-ckpt-1", endpoint=model.url, checkpoint=None)
    assert event_id

    def triggered_run() -> Any:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[on_update.id])))
        return next((r for r in runs if r.parameters.get("model") == "test-ckpt-1"), None)

    run = _run_from_event(prefect_api, "a flow run of on-model-update for model test-ckpt-1", triggered_run)
    assert run.parameters["endpoint"] == model.url
    assert run.parameters["checkpoint"] is None
    assert run.parameters == {"model": "test-ckpt-1", "endpoint": model.url, "checkpoint": None,
                              "baseline": "model-bundled-local"}

    # 5. The served runner picks it up, runs baseline and new model on two tasks, and publishes
    #    the comparison artifact.
    def finished() -> Any:
        state = client.read_flow_run(run.id).state
        return state if state is not None and state.is_final() else None

    try:
        state = wait_for("the on-model-update run to finish", finished, 90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nserve log:\n{tail(prefect_api['serve_log'])}") from None
    assert state.type == StateType.COMPLETED, f"{state}\nserve log:\n{tail(prefect_api['serve_log'])}"
    artifact = client.read_latest_artifacts()
    markdown = [a for a in artifact if a.key == "model-update-model-bundled-local"]
    assert markdown, [a.key for a in artifact]
    assert "test-ckpt-1" in markdown[0].data and "| **ALL** | 0.0% (0/2) | 0.0% (0/2) |" in markdown[0].data
    # The new model was really asked, at its endpoint, with the serving process's key.
    asked = [r for r in model.requests if r.method == "POST"]
    assert {r.body["model"] for r in asked} == {"base-model", "test-ckpt-1"}

    # 6. The same event POSTed as plain JSON to /api/events (what docs/deployments.md shows for
    #    curl) also starts a run.
    import uuid
    from datetime import datetime, timezone

    body = [{
        "id": str(uuid.uuid4()),
        "occurred": datetime.now(timezone.utc).isoformat(),
        "event": "model.updated",
        "resource": {"prefect.resource.id": "model.test-ckpt-2"},
        "payload": {"endpoint": attacker.url, "checkpoint": "s3://ckpts/2"},
    }]
    assert requests.post(f"{prefect_api['api_url']}/events", json=body, timeout=10).status_code == 204

    def curl_run() -> Any:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[on_update.id])))
        return next((r for r in runs if r.parameters.get("model") == "test-ckpt-2"), None)

    second = _run_from_event(prefect_api, "a flow run of on-model-update for model test-ckpt-2", curl_run)
    assert second.parameters["checkpoint"] == "s3://ckpts/2"
    # 7. Its endpoint is not one the baseline admits: the run fails naming the baseline, before
    #    any VM or model call, and the caller's server never hears from the serving process.
    ended = wait_for("the refused run to end", lambda: (st := client.read_flow_run(second.id).state) is not None
                     and st.is_final() and st, 60)
    assert ended.type == StateType.FAILED and "is not one of the admitted endpoints" in (ended.message or ""), ended
    assert attacker.requests == []
    assert "serve-process-secret" not in (ended.message or "")


def test_api_callers_choose_names_not_configurations(prefect_api: dict[str, Any], client: Any) -> None:
    """A plain create_flow_run with a configuration (a suite, a store, an agent endpoint, the name of a
    secret's variable) is not a run of the served flows: they take names only."""
    from prefect.client.schemas.objects import StateType
    from prefect.exceptions import PrefectHTTPStatusError

    attacker = prefect_api["attacker"]
    on_demand = wait_for("deployment evaluate-baseline/on-demand",
                         lambda: _deployment(client, "evaluate-baseline/on-demand"), 60)
    config = {"agent": "openai", "agent_options": {"base_url": attacker.url, "api_key_env": "FAKE_MODEL_KEY"},
              "db_path": "/tmp/elsewhere.duckdb", "suite_dir": "/tmp"}
    try:
        run = client.create_flow_run_from_deployment(on_demand.id, parameters={"config": config})
    except PrefectHTTPStatusError as exc:  # the server enforces the deployment's parameter schema
        assert exc.response.status_code in (409, 422)
    else:  # or the flow refuses parameters it does not take, before doing anything
        state = wait_for("the run to end", lambda: (st := client.read_flow_run(run.id).state) is not None
                         and st.is_final() and st, 60)
        assert state.type in (StateType.FAILED, StateType.CRASHED)
    unknown = client.create_flow_run_from_deployment(on_demand.id, parameters={"baseline": "no-such-baseline"})
    state = wait_for("the run to end", lambda: (st := client.read_flow_run(unknown.id).state) is not None
                     and st.is_final() and st, 60)
    assert state.type == StateType.FAILED and "no baseline named 'no-such-baseline'" in (state.message or "")
    assert attacker.requests == []


def test_nightly_baselines_run_from_their_schedule(prefect_api: dict[str, Any], client: Any) -> None:
    """The scheduler, not the test, starts nightly-baselines (every minute here); the served
    runner runs it to completion and the baseline's run lands in DuckDB."""
    import duckdb
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.objects import StateType

    nightly = wait_for(
        "deployment nightly-baselines/nightly-baselines",
        lambda: _deployment(client, "nightly-baselines/nightly-baselines"),
        60,
    )

    def scheduled_and_finished() -> Any:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[nightly.id])))
        return next((r for r in runs if r.auto_scheduled and r.state is not None and r.state.is_final()), None)

    try:
        run = wait_for("a scheduled nightly-baselines run to finish", scheduled_and_finished, 150, interval=2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nserve log:\n{tail(prefect_api['serve_log'])}") from None
    assert run.state.type == StateType.COMPLETED, f"{run.state}\nserve log:\n{tail(prefect_api['serve_log'])}"
    # The served process is the DuckDB file's only writer, and it may be running the next
    # minute's run: read the file once no run of the deployment is running.
    def idle() -> bool:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[nightly.id])))
        return not any(r.state is not None and r.state.is_running() for r in runs)

    def baseline_runs() -> list[tuple[str, str]]:
        if not idle():
            return []
        with duckdb.connect(str(prefect_api["tmp"] / "arena.duckdb"), read_only=True) as con:
            return con.execute(
                "SELECT agent, status FROM runs WHERE prefect_flow_run_id IS NOT NULL AND status = 'completed'"
            ).fetchall()

    assert ("scripted", "completed") in wait_for("a completed baseline run in DuckDB", baseline_runs, 60, interval=1)


def test_prefect_yaml_deploys_to_a_work_pool(prefect_api: dict[str, Any], client: Any) -> None:
    """`prefect deploy --all` with prefect.yaml registers the same deployments on a process work
    pool, with the cron schedule, the event trigger and a pull step resolved on each worker."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        "PREFECT_HOME": str(prefect_api["tmp"] / "deploy-home"),
        "PREFECT_API_URL": prefect_api["api_url"],
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    prefect = [str(PREFECT_BIN), "--no-prompt"]
    for args in (
        ["work-pool", "create", "waa-controllers", "--type", "process"],
        ["work-pool", "create", "waa-shards", "--type", "process"],
        ["deploy", "--all"],
    ):
        done = subprocess.run([*prefect, *args], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    names = ["evaluate-baseline/on-demand", "nightly-baselines/nightly-baselines", "evaluate-model-update/on-model-update"]
    deployments = {n: client.read_deployment_by_name(n) for n in names}
    assert all(d.work_pool_name == "waa-controllers" for d in deployments.values())
    assert client.read_deployment_by_name("evaluate-shard/shard").work_pool_name == "waa-shards"
    (schedule,) = deployments["nightly-baselines/nightly-baselines"].schedules
    assert schedule.schedule.cron == "0 2 * * *" and schedule.schedule.timezone == "UTC"
    on_update = deployments["evaluate-model-update/on-model-update"]
    assert on_update.pull_steps == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $ARENA_PROJECT_DIR }}"}}
    ]
    automations = [
        a for a in client.read_automations()
        if any(getattr(action, "deployment_id", None) == on_update.id for action in a.actions)
    ]
    assert automations and automations[-1].trigger.expect == {"model.updated"}
    assert automations[-1].actions[0].parameters["model"] == "{{ event.resource.id[6:] }}"
