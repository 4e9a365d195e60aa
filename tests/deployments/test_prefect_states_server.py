"""What a team sees in Prefect, against a REAL `prefect server start` (its triggers and actions
services included):

- an incomplete night ends Failed (parent and evaluation), its infrastructure errors are not
  green, and an automation on failed flow runs, built as the UI builds one, calls a webhook;
- cancelling the nightly's evaluation run, or the nightly itself, stops new work within seconds,
  and Prefect and the store both say cancelled.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import pytest
import requests

from adapters.waa.localenv.launcher import start_local_env
from server_helpers import PROJECT, PrefectServer, clean_env, running_server, tail, wait_for

TWO_TASKS = ["notepad-append-line", "explorer-rename-file"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    with running_server(tmp_path_factory.mktemp("prefect")) as s:
        yield s


@pytest.fixture()
def client(server: PrefectServer) -> Iterator[Any]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: server.api_url}):
        with get_client(sync_client=True) as c:
            yield c


class _Webhook:
    """An HTTP endpoint on 127.0.0.1 that keeps the bodies POSTed to it."""

    def __init__(self) -> None:
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                received.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/alert"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def _nightly(server: PrefectServer, tmp_path: Path, baselines: str) -> subprocess.Popen[bytes]:
    """The nightly flow in its own process against the server, with `baselines` as the
    operator's baselines file."""
    file = tmp_path / "baselines.toml"
    file.write_text("version = 1\n" + baselines)
    env = {**clean_env(), "PREFECT_API_URL": server.api_url, "PREFECT_HOME": str(tmp_path / "home"),
           "ARENA_BASELINES_FILE": str(file), "PYTHONPATH": str(PROJECT)}
    log = (tmp_path / "nightly.log").open("wb")
    return subprocess.Popen([sys.executable, "-c", "from flows.baselines import nightly_baselines; nightly_baselines(return_state=True)"],
                            cwd=PROJECT, env=env, stdout=log, stderr=subprocess.STDOUT)


def _flow_runs(client: Any, flow_name: str) -> list[Any]:
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])))


def _one_run(client: Any, flow_name: str) -> Any:
    runs = _flow_runs(client, flow_name)
    return runs[0] if len(runs) == 1 else None


def _final(client: Any, flow_run_id: Any) -> Any:
    state = client.read_flow_run(flow_run_id).state
    return state if state is not None and state.is_final() else None


def _store(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_an_incomplete_night_is_failed_and_a_failed_run_automation_fires(
    server: PrefectServer, client: Any, tmp_path: Path
) -> None:
    from prefect.automations import Automation
    from prefect.blocks.webhook import Webhook
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import CallWebhook
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # The team's alert, as the UI's "flow run state: Failed" trigger builds it.
    hook = _Webhook()
    with temporary_settings({PREFECT_API_URL: server.api_url}):
        block_id = Webhook(url=hook.url, method="POST").save("failed-runs-hook", overwrite=True)
        Automation(
            name="failed runs", description="POST a line for every failed flow run",
            trigger=EventTrigger(expect={"prefect.flow-run.Failed"}, match={"prefect.resource.id": "prefect.flow-run.*"},
                                 posture=Posture.Reactive, threshold=1),
            actions=[CallWebhook(block_document_id=block_id,
                                 payload="{{ flow_run.name }} | {{ flow_run.state.message }}")],
        ).create()

    # A WAA server whose /execute fails every action (the real server's own 500): each task ends
    # in an infrastructure error with its one attempt used up, so the night is incomplete.
    waa = start_local_env(tmp_path / "waa")
    try:
        requests.post(f"{waa.base_url}/sim/faults", json={"faults": [{"route": "/execute", "status": 500}]},
                      timeout=10).raise_for_status()
        db = tmp_path / "arena.duckdb"
        proc = _nightly(server, tmp_path, (
            f'[[baselines]]\nname = "flaky-existing"\nagent = "scripted"\nprovider = "existing"\n'
            f'waa_urls = ["{waa.base_url}"]\nreset_level = "setup"\ntask_ids = {json.dumps(TWO_TASKS)}\n'
            f'pool_size = 1\nmax_attempts = 1\ndb_path = "{db}"\nartifacts_dir = "{tmp_path / "art"}"\n'))
        proc.wait(timeout=300)
    finally:
        waa.stop()
    log = tail(tmp_path / "nightly.log")

    nightly = _one_run(client, "nightly-baselines")
    assert nightly is not None and nightly.state.type == StateType.FAILED, log
    assert nightly.state.name == "Failed" and nightly.state.message.startswith("Incomplete night: 1 of 1"), nightly.state
    evaluation = _one_run(client, "evaluate-suite")
    assert evaluation.state.type == StateType.FAILED and evaluation.state.name == "Failed", evaluation.state
    assert evaluation.state.message.startswith("Incomplete: run ")
    assert "0 of 2 selected tasks have a final result (2 missing)" in evaluation.state.message
    assert evaluation.name.startswith("nightly-flaky-existing-")
    assert {"trigger:nightly", "baseline:flaky-existing", "agent:scripted", "provider:existing"} <= set(evaluation.tags)
    (status,) = _store(db, "SELECT status FROM runs")[0]
    assert status == "incomplete"

    # Infrastructure errors are not green: the tasks' runs are Crashed, named for the outcome.
    runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[evaluation.id])))
    tasks = [t for t in runs if t.name.split("/")[-1] in TWO_TASKS]  # evaluate-task's runs: <domain>/<task id>
    assert len(tasks) == 2, [t.name for t in runs]
    assert {(t.state.type, t.state.name) for t in tasks} == {(StateType.CRASHED, "Infrastructure error")}

    # The nightly's page links the evaluation's, with its state and counts.
    links = [a for a in client.read_artifacts() if a.type == "markdown" and a.flow_run_id == nightly.id]
    assert any(f"/runs/flow-run/{evaluation.id}" in (a.data or "") for a in links), links

    # Progress reached its end: both tasks done (their retries used up), no ETA, the status written.
    progress = json.loads((tmp_path / "art" / _store(db, "SELECT run_id FROM runs")[0][0] / "progress.json").read_text())
    assert (progress["done"], progress["selected"], progress["eta_seconds"], progress["status"]) == (2, 2, None, "incomplete")
    assert (progress["infrastructure_error_tasks"], progress["retries_exhausted"]) == (2, 2)

    # The automation fired for both failed runs (the webhook saw them by name).
    posts = wait_for("the failure automation's webhook calls", lambda: len(hook.received) >= 2 and hook.received, 60)
    assert any(p.startswith(f"{nightly.name} | Incomplete night") for p in posts), posts
    assert any(p.startswith(f"{evaluation.name} | Incomplete: ") for p in posts), posts


@pytest.mark.parametrize("which", ["evaluation", "nightly"])
def test_cancelling_the_nightly_or_its_evaluation_stops_new_work_and_both_say_cancelled(
    server: PrefectServer, client: Any, tmp_path: Path, which: str
) -> None:
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling

    # Separate flows per case: both cases share the module's server.
    for run in _flow_runs(client, "nightly-baselines") + _flow_runs(client, "evaluate-suite"):
        client.delete_flow_run(run.id)
    db, art = tmp_path / "arena.duckdb", tmp_path / "art"
    proc = _nightly(server, tmp_path, (
        '[[baselines]]\nname = "slow-local"\nagent = "scripted"\nquirks = true\npool_size = 1\n'
        f'db_path = "{db}"\nartifacts_dir = "{art}"\n'
        '[[baselines]]\nname = "never-reached"\nagent = "scripted"\npool_size = 1\n'
        f'db_path = "{db}"\nartifacts_dir = "{art}"\n'))
    try:
        # Prefect creates a subflow's run under a generated name and renames it once it starts, so
        # wait for the run's own name (it holds the run id).
        evaluation = wait_for("the evaluation's named flow run", lambda: (run := _one_run(client, "evaluate-suite"))
                              and run.name.startswith("nightly-slow-local-") and run, 120)
        run_id = evaluation.name.removeprefix("nightly-slow-local-")
        progress = art / run_id / "progress.json"
        wait_for("two recorded attempts", lambda: progress.exists()
                 and json.loads(progress.read_text()).get("attempts_recorded", 0) >= 2, 240, interval=0.2)
        target = evaluation if which == "evaluation" else _one_run(client, "nightly-baselines")
        client.set_flow_run_state(target.id, Cancelling(message=f"cancelled by the test ({which})"), force=True)
        recorded_at_cancel = json.loads(progress.read_text())["attempts_recorded"]
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = tail(tmp_path / "nightly.log")
    ended = _final(client, evaluation.id)
    nightly = _final(client, _one_run(client, "nightly-baselines").id)
    assert ended is not None and ended.type == StateType.CANCELLED, f"{ended}\n{log}"
    assert nightly is not None and nightly.type == StateType.CANCELLED, f"{nightly}\n{log}"
    assert "never-reached: not run" in (nightly.message or "")
    assert _store(db, "SELECT run_id, status FROM runs") == [(run_id, "cancelled")]
    # New work stopped: at most the attempt in flight at the cancel finished after it.
    (recorded,) = _store(db, "SELECT count(*) FROM task_results")[0]
    assert recorded <= recorded_at_cancel + 1 and recorded < 16, (recorded, recorded_at_cancel)
    assert "Traceback" not in log, log


def test_a_night_that_regresses_is_flagged_on_its_page_and_its_event_fires_an_automation(
    server: PrefectServer, client: Any, tmp_path: Path
) -> None:
    """The nightly's page shows its progress over the baselines, each baseline's rate and its
    history; a night whose tasks are worse than its recent past sends `waa.baseline.regression`,
    and an automation on it (as docs/deployments.md writes it) calls a webhook."""
    from prefect.automations import Automation
    from prefect.blocks.webhook import Webhook
    from prefect.events.actions import CallWebhook
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from adapters.waa.catalog import bundled_suite_dir

    for run in _flow_runs(client, "nightly-baselines") + _flow_runs(client, "evaluate-suite"):
        client.delete_flow_run(run.id)
    hook = _Webhook()
    with temporary_settings({PREFECT_API_URL: server.api_url}):
        block_id = Webhook(url=hook.url, method="POST").save("regression-hook", overwrite=True)
        Automation(
            name="WAA regressions",
            trigger=EventTrigger(expect={"waa.baseline.regression"}, match={"prefect.resource.id": "waa.baseline.*"},
                                 posture=Posture.Reactive, threshold=1),
            actions=[CallWebhook(block_document_id=block_id,
                                 payload="{{ event.resource['prefect.resource.name'] }} | {{ event.payload.summary }}")],
        ).create()
    tasks = ["notepad-append-line", "notepad-draft-documents", "notepad-replace-notes", "settings-notifications-off"]
    db, art = tmp_path / "arena.duckdb", tmp_path / "art"
    baseline = (f'[[baselines]]\nname = "watched"\nagent = "scripted"\npool_size = 2\ntask_ids = {json.dumps(tasks)}\n'
                f'db_path = "{db}"\nartifacts_dir = "{art}"\n')
    assert _nightly(server, tmp_path, baseline).wait(timeout=300) == 0, tail(tmp_path / "nightly.log")
    # Three more good nights before it, as copies of this one (earlier, other run ids).
    with duckdb.connect(str(db)) as con:
        (good,) = con.execute("SELECT run_id FROM runs").fetchone()
        for k in (1, 2, 3):
            con.execute(f"INSERT INTO runs SELECT * REPLACE (run_id || '-{k}' AS run_id, "
                        f"started_at - INTERVAL {k} DAY AS started_at, finished_at - INTERVAL {k} DAY AS finished_at) "
                        "FROM runs WHERE run_id = ?", [good])
            con.execute(f"INSERT INTO task_results SELECT * REPLACE (run_id || '-{k}' AS run_id) FROM task_results "
                        "WHERE run_id = ?", [good])
    # Tonight the notepad tasks' plans are broken on purpose (the agent gives up at once).
    plans = json.loads((bundled_suite_dir() / "solutions.json").read_text())
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({k: ([{"done": True}] if k.startswith("notepad") else v) for k, v in plans.items()}))
    assert _nightly(server, tmp_path, baseline + f'[baselines.agent_options]\nplans_path = "{broken}"\n').wait(
        timeout=300) == 0, tail(tmp_path / "nightly.log")

    tonight = max(_flow_runs(client, "nightly-baselines"), key=lambda r: r.start_time)
    artifacts = sorted((a for a in client.read_artifacts() if a.flow_run_id == tonight.id), key=lambda a: a.updated)
    progress = [a for a in artifacts if a.type == "progress"]
    assert progress and float(progress[-1].data) == 100.0, [(a.type, a.data) for a in artifacts]
    table = [a for a in artifacts if a.key == "waa-nightly"][-1]  # its latest version
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert rows[0]["baseline"] == "watched" and rows[0]["rate"] == "25.0%" and "regression" in rows[0]["change"]
    history = [a for a in artifacts if a.key == "waa-history-watched"][-1]
    assert "REGRESSION" in history.data and "notepad-append-line" in history.data
    posts = wait_for("the regression automation's webhook call", lambda: hook.received, 90)
    assert posts[0].startswith("watched | regression: 1 solved where its last 4 nights give 4.0"), posts
