"""Operating the pipeline as a team does, against a REAL `prefect server start`:

- the server is SIGKILLed mid-run and restarted: the run still completes with every result;
- a served run is cancelled through the API (what the UI's Cancel and `prefect flow-run cancel`
  do): it is stored as `cancelled`, no simulation outlives it, and a resume finishes it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pytest

from server_helpers import PROJECT, PrefectServer, clean_env, running_server, stop, tail, wait_for


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[PrefectServer]:
    with running_server(tmp_path) as s:
        yield s


def _progress(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _run_row(db: Path, run_id: str) -> tuple[str, int]:
    with duckdb.connect(str(db), read_only=True) as con:
        (status,) = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
        (results,) = con.execute(
            "SELECT count(DISTINCT task_id) FROM task_results WHERE run_id = ?", [run_id]
        ).fetchone()
    return status, results


def _simulations(processes: list[psutil.Process]) -> list[int]:
    """The pids among `processes` that are still running local WAA simulations."""
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and "adapters.waa.localenv" in " ".join(p.cmdline()):
                alive.append(p.pid)
        except psutil.Error:
            pass
    return alive


def test_server_killed_and_restarted_mid_run_the_run_completes(server: PrefectServer, tmp_path: Path) -> None:
    """An outage of the Prefect server while the last tasks run and the run ends: task states,
    the progress artifact, releasing the pool's slots and the summary artifacts ride it out; the
    run (the six quirky notepad tasks) ends `completed` with all 6 results and exits 0."""
    db, artifacts = tmp_path / "arena.duckdb", tmp_path / "art"
    env = {**clean_env(), "PREFECT_API_URL": server.api_url, "PREFECT_HOME": str(tmp_path / "client-home")}
    out_log = tmp_path / "arena.log"
    with out_log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "run", "--run-id", "outage", "--quirks", "--pool-size", "2",
             "--domain", "notepad", "--db", str(db), "--artifacts", str(artifacts)],
            cwd=PROJECT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        progress = artifacts / "outage" / "progress.json"
        wait_for("4 recorded attempts", lambda: _progress(progress).get("attempts_recorded", 0) >= 4, 240, interval=0.2)
        assert proc.poll() is None, tail(out_log)
        server.kill()
        # The outage covers the end of the evaluation (the Prefect client does not retry a
        # refused connection, so that is where it used to fail): the last attempts are recorded
        # while the server is away.
        wait_for("6 recorded attempts or the run's end",
                 lambda: _progress(progress).get("attempts_recorded", 0) >= 6 or proc.poll() is not None, 240, interval=0.2)
        assert _progress(progress).get("attempts_recorded") == 6, tail(out_log)
        # And the run's end: its bookkeeping meets the refused server for a few of its retries
        # (1, 2, 4 s apart) before the server is back.
        time.sleep(5)
        server.start()
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, tail(out_log)
    assert _run_row(db, "outage") == ("completed", 6)
    assert "Traceback" not in out_log.read_text(errors="replace"), tail(out_log)


def _start_serve(server: PrefectServer, tmp_path: Path, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    """`python -m deployments.serve` against the server (nightly at 02:00 Berlin time), with a
    baselines file of one quirky local baseline (`quirky-local`: the six notepad tasks) whose
    results go to tmp_path."""
    baselines = tmp_path / "baselines.toml"
    baselines.write_text(
        'version = 1\n[[baselines]]\nname = "quirky-local"\nagent = "scripted"\nsuite = "bundled"\n'
        f'domains = ["notepad"]\nquirks = true\npool_size = 2\ndb_path = "{tmp_path / "arena.duckdb"}"\nartifacts_dir = "{tmp_path / "art"}"\n'
    )
    env = {
        "ARENA_BASELINES_FILE": str(baselines),
        **clean_env(),
        "PREFECT_HOME": str(tmp_path / f"{name}-home"),
        "PREFECT_API_URL": server.api_url,
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PYTHONPATH": str(PROJECT),
        "ARENA_NIGHTLY_TIMEZONE": "Europe/Berlin",
    }
    # The served runs' temporary folders (simulated disks, evaluation caches) land here.
    (tmp_path / f"{name}-tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / f"{name}-tmp")
    log = tmp_path / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "deployments.serve"], cwd=PROJECT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


@pytest.fixture()
def served(server: PrefectServer, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """`python -m deployments.serve` against the server; yields its process and a client."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    proc, log = _start_serve(server, tmp_path, "serve")
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            with get_client(sync_client=True) as client:
                yield {"proc": proc, "client": client, "log": log, "server": server}
    finally:
        stop(proc)


def test_cancelled_served_run_is_stored_cancelled_leaves_no_process_and_resumes(
    served: dict[str, Any], tmp_path: Path
) -> None:
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling

    client, log = served["client"], served["log"]
    deployment = wait_for("deployment evaluate-baseline/on-demand",
                          lambda: client.read_deployment_by_name("evaluate-baseline/on-demand"), 60)
    db, artifacts = tmp_path / "arena.duckdb", tmp_path / "art"  # the baseline's, in the operator's file
    names = {"baseline": "quirky-local", "run_id": "cancel-me"}
    run = client.create_flow_run_from_deployment(deployment.id, parameters=names)
    progress = artifacts / "cancel-me" / "progress.json"
    try:
        wait_for("a recorded attempt", lambda: _progress(progress).get("attempts_recorded", 0) >= 1, 180, interval=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nserve log:\n{tail(log)}") from None
    simulations = [p for p in psutil.Process(served["proc"].pid).children(recursive=True)
                   if _simulations([p])]
    assert len(simulations) >= 2, "the pool's simulations run under the served process"

    client.set_flow_run_state(run.id, Cancelling(message="cancelled by the test"), force=True)

    def final() -> Any:
        state = client.read_flow_run(run.id).state
        return state if state is not None and state.is_final() else None

    try:
        state = wait_for("the cancelled run to end", final, 90)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nserve log:\n{tail(log)}") from None
    assert state.type == StateType.CANCELLED, f"{state}\n{tail(log)}"
    # Nothing of the run is left: every simulation it started has ended (none re-parented to PID 1),
    # and its temporary folders are gone, however Prefect ended its process.
    wait_for("the run's simulations to end", lambda: _simulations(simulations) == [], 15)
    wait_for("the run's temporary folders to go", lambda: not list((tmp_path / "serve-tmp").glob("waa-*")), 15)
    status, recorded = _run_row(db, "cancel-me")
    assert status == "cancelled" and 1 <= recorded < 6, (status, recorded, tail(log))
    assert "StoreError" not in log.read_text(errors="replace"), tail(log)

    # A resume (same run id) finishes the run.
    resumed = client.create_flow_run_from_deployment(deployment.id, parameters=names)
    try:
        state = wait_for("the resumed run to end",
                         lambda: (s := client.read_flow_run(resumed.id).state) is not None and s.is_final() and s, 240)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nserve log:\n{tail(log)}") from None
    assert state.type == StateType.COMPLETED, f"{state}\n{tail(log)}"
    assert _run_row(db, "cancel-me") == ("completed", 6)



def test_arena_run_cancelled_from_prefect_stops_and_exits_5(server: PrefectServer, tmp_path: Path) -> None:
    """`arena run` against a persistent server has no runner to stop it: cancelling its flow
    run (the UI's Cancel) still stops it cleanly, stores `cancelled` and exits 5."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Cancelling

    db, artifacts = tmp_path / "arena.duckdb", tmp_path / "art"
    env = {**clean_env(), "PREFECT_API_URL": server.api_url, "PREFECT_HOME": str(tmp_path / "client-home")}
    out_log = tmp_path / "arena.log"
    with out_log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "run", "--run-id", "ui-cancel", "--quirks", "--pool-size", "2",
             "--db", str(db), "--artifacts", str(artifacts)],
            cwd=PROJECT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        wait_for("a recorded attempt",
                 lambda: _progress(artifacts / "ui-cancel" / "progress.json").get("attempts_recorded", 0) >= 1,
                 180, interval=0.2)
        simulations = [p for p in psutil.Process(proc.pid).children(recursive=True) if _simulations([p])]
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            with get_client(sync_client=True) as client:
                (run,) = [r for r in client.read_flow_runs() if r.state is not None and r.state.is_running()]
                client.set_flow_run_state(run.id, Cancelling(message="cancelled in the UI"), force=True)
                proc.wait(timeout=90)
                ended = client.read_flow_run(run.id)
                deployment = client.read_deployment(ended.deployment_id) if ended.deployment_id else None
    finally:
        if proc.poll() is None:
            proc.kill()
    output = out_log.read_text(errors="replace")
    assert proc.returncode == 5, tail(out_log)
    assert "arena: run ui-cancel was cancelled from Prefect" in output and "Traceback" not in output, output[-3000:]
    # Prefect says what happened (not Crashed), and the run is one the UI can cancel (the UI
    # enables Cancel only for a deployment's run), named and tagged so it can be found.
    assert ended.state.type == StateType.CANCELLED and "Crash" not in (ended.state.message or ""), ended.state
    assert deployment is not None and deployment.name == "arena-run" and deployment.paused
    assert ended.name == "ad-hoc-ui-cancel"
    assert {"waa", "trigger:ad-hoc", "agent:scripted", "suite:bundled", "provider:local"} <= set(ended.tags)
    assert f"Flow run: {server.api_url.removesuffix('/api')}/runs/flow-run/{run.id}" in output
    status, recorded = _run_row(db, "ui-cancel")
    assert status == "cancelled" and 1 <= recorded < 16
    assert _simulations(simulations) == []


def test_a_new_serve_process_keeps_the_deployments_active_and_status_says_when_the_nightly_runs(
    served: dict[str, Any], tmp_path: Path
) -> None:
    """Starting a new serve before the old one exits: the old one pauses every deployment on its
    way out; the new one resumes them, the nightly is scheduled again, and `arena status` says
    when it runs next, in the schedule's time zone."""
    client, server = served["client"], served["server"]
    serve_banner = "Your deployments are being served"
    wait_for("the first serve process", lambda: serve_banner in served["log"].read_text(errors="replace"), 60)
    new, new_log = _start_serve(server, tmp_path, "serve-new")
    try:
        wait_for("the new serve process", lambda: serve_banner in new_log.read_text(errors="replace"), 60)
        stop(served["proc"])  # the old one exits and pauses what it served
        # (on-model-update is not served: this baselines file has no baseline that calls a model)
        names = ["evaluate-baseline/on-demand", "nightly-baselines/nightly-baselines"]

        def all_active() -> bool:
            return not any(client.read_deployment_by_name(n).paused for n in names)

        # The old process's pause lands, then the new one undoes it.
        wait_for("the deployments to be active again", all_active, 60)
        status_env = {**clean_env(), "PREFECT_API_URL": server.api_url, "PREFECT_HOME": str(tmp_path / "status-home")}

        def status_ok() -> subprocess.CompletedProcess[str] | None:
            done = subprocess.run([sys.executable, "-m", "flows.cli", "status"], cwd=PROJECT, env=status_env,
                                  capture_output=True, text=True, timeout=60)
            return done if done.returncode == 0 else None

        try:
            done = wait_for("arena status to report the next nightly run", status_ok, 90, interval=3)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nnew serve log:\n{tail(new_log)}") from None
        assert "nightly-baselines/nightly-baselines: active; cron '0 2 * * *' (Europe/Berlin), active" in done.stdout
        assert re.search(r"Next nightly run: \d{4}-\d\d-\d\d 02:00 CET \(in \d+h\d\dm\)", done.stdout), done.stdout
        assert "was paused" in new_log.read_text(errors="replace"), tail(new_log)
    finally:
        stop(new)

    # With nothing serving them, the deployments are paused and status says the nightly won't run.
    wait_for("the deployments to be paused", lambda: client.read_deployment_by_name("nightly-baselines/nightly-baselines").paused, 30)
    done = subprocess.run([sys.executable, "-m", "flows.cli", "status"], cwd=PROJECT, env=status_env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "arena: the nightly will NOT run: it is PAUSED" in done.stderr, done
