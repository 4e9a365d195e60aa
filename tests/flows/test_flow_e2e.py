"""The whole pipeline end to end: Prefect flow, local simulation VMs, real evaluator, DuckDB."""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

import duckdb
import pytest

from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir


@pytest.fixture(scope="module")
def bundled_ids() -> list[str]:
    return WAATaskCatalog(bundled_suite_dir()).task_ids()


def _rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_scripted_agent_solves_the_bundled_suite(prefect_server: None, tmp_path: Path, bundled_ids: list[str]) -> None:
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    from adapters.store.duckdb_store import ResultStore

    db = tmp_path / "arena.duckdb"
    heard = []

    def hear(outcome) -> None:  # as `arena run` starts its report: the run's stored results are final
        with ResultStore(db, read_only=True) as store:
            heard.append((outcome, store.get_run(outcome.run_id).status))

    outcome = run_suite(
        SuiteRunConfig(agent="scripted", pool_size=3, db_path=db, artifacts_dir=tmp_path / "artifacts", run_id="e2e-scripted"),
        on_outcome=hear,
    )
    assert len(heard) == 1 and heard[0][0] is outcome and heard[0][1] == "completed"
    failures = [(r.task_id, r.outcome.value, r.reason) for r in outcome.results if not r.success]
    assert failures == []
    assert len(outcome.results) == len(bundled_ids) >= 12
    rows = _rows(db, "SELECT task_id, outcome, score FROM task_results WHERE run_id = 'e2e-scripted'")
    assert sorted(r[0] for r in rows) == sorted(bundled_ids)
    assert all(r[1] == "success" and r[2] == 1.0 for r in rows)
    steps = _rows(db, "SELECT count(*), count(screenshot_path) FROM steps WHERE run_id = 'e2e-scripted'")[0]
    assert steps[0] > len(bundled_ids) and steps[1] > 0
    run = _rows(db, "SELECT status, environment, task_count, suite_hash FROM runs WHERE run_id = 'e2e-scripted'")[0]
    assert run[0] == "completed" and run[1] == "local-simulation" and run[2] == len(bundled_ids) and run[3]
    assert "ALL" in outcome.table and "100.0%" in outcome.table and "LOCAL SIMULATION" in outcome.table
    # One sender of the flow run's heartbeats (the flow's own, flows/flow_run_heartbeats.py), naming its flow.
    from prefect_events import stored_heartbeats

    (heartbeat,) = stored_heartbeats(outcome.flow_run_id)
    assert [item["prefect.resource.name"] for item in heartbeat.related if item.role == "flow"] == ["evaluate-suite"]
    # The documented query (docs/results.md, linked from the README) runs as written and agrees with the run.
    readme = (Path(__file__).resolve().parents[2] / "docs" / "results.md").read_text()
    query = re.search(r"```sql\n(.*?)```", readme, re.S).group(1)
    by_domain = _rows(db, query)
    assert sum(r[1] for r in by_domain) == len(bundled_ids) and all(r[2] == 1.0 for r in by_domain)


def test_random_agent_scores_near_zero(prefect_server: None, tmp_path: Path, bundled_ids: list[str]) -> None:
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    db = tmp_path / "arena.duckdb"
    outcome = run_suite(
        SuiteRunConfig(agent="random", pool_size=3, max_steps=8, db_path=db, artifacts_dir=tmp_path / "a", run_id="e2e-random")
    )
    assert len(outcome.results) == len(bundled_ids)
    successes = sum(r.success for r in outcome.results)
    assert successes <= 2, [(r.task_id, r.outcome.value) for r in outcome.results]
    assert all(r.outcome.value in ("success", "agent_failure") for r in outcome.results), [
        (r.task_id, r.outcome.value, r.error) for r in outcome.results
    ]
    # In the Prefect UI each task's run is named by its outcome, with the VM in its message.
    # Prefect records task-run states from events, a moment after the flow has returned.
    deadline = time.monotonic() + 30
    while True:
        states = _evaluate_task_states(db, "e2e-random")
        attempts = _task_runs(db, "e2e-random", "attempt ")
        unsettled = {"Running", "Pending"} & ({n for n, _ in states} | {state for _, state, _ in attempts})
        settled = len(states) == len(attempts) == len(bundled_ids) and not unsettled
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(states) == len(bundled_ids), states
    assert {name for name, _ in states} <= {"Success", "Agent failure"} and "Agent failure" in {n for n, _ in states}
    assert all(message.startswith(("agent_failure on waa-", "success on waa-")) for _, message in states), states
    # Each attempt is a run of its own, named by the VM it ran on and its state by its outcome.
    assert len(attempts) == len(bundled_ids)
    assert all(re.fullmatch(r"attempt 1 on waa-[\w-]+-\d+", name) for name, _, _ in attempts), attempts
    assert {state for _, state, _ in attempts} == {name for name, _ in states}


def _task_runs(db: Path, run_id: str, prefix: str) -> list[tuple[str, str, str]]:
    """(name, state name, state message) of a run's task runs whose name starts with `prefix`."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterName

    with duckdb.connect(str(db), read_only=True) as con:
        (flow_run_id,) = con.execute("SELECT prefect_flow_run_id FROM runs WHERE run_id = ?", [run_id]).fetchone()
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_=prefix)),
        )
    return [(r.name, r.state.name, r.state.message or "") for r in runs if r.state is not None and r.name.startswith(prefix)]


def _evaluate_task_states(db: Path, run_id: str) -> list[tuple[str, str]]:
    """(state name, state message) of every evaluate-task run of a run's flow run."""
    from uuid import UUID

    import duckdb
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterName

    with duckdb.connect(str(db), read_only=True) as con:
        (flow_run_id,) = con.execute("SELECT prefect_flow_run_id FROM runs WHERE run_id = ?", [run_id]).fetchone()
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="/")),
        )
    return [(r.state.name, r.state.message or "") for r in runs if r.state is not None and r.name.count("/") == 1
            and not r.name.startswith(("lane", "episode", "reset", "setup", "evaluate", "record"))]


def test_resume_keeps_the_runs_selection_and_record(prefect_server: None, tmp_path: Path, bundled_ids: list[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The selection is part of the run: a resume with another one is refused (naming
    --change-selection), an explicit change runs only the new tasks with the counts right, and
    resuming a complete run changes nothing, not even its finish time. None of these runs, the
    refused ones included, leaves its provider's folder behind."""
    from adapters.store.duckdb_store import StoreError
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # tempfile's own setting: where the runs' folders go
    db = tmp_path / "arena.duckdb"

    def run(ids: list[str], **extra: object):
        return run_suite(SuiteRunConfig(task_ids=ids, pool_size=2, db_path=db, artifacts_dir=tmp_path / "a",
                                        run_id="resume", **extra))

    run(bundled_ids[:2])
    finished_at = _rows(db, "SELECT finished_at FROM runs WHERE run_id = 'resume'")[0][0]
    again = run(bundled_ids[:2])
    assert again.status == "completed" and again.results == []
    assert _rows(db, "SELECT finished_at, task_count FROM runs WHERE run_id = 'resume'")[0] == (finished_at, 2)

    for ids in (bundled_ids[:3], bundled_ids[:1]):
        with pytest.raises(StoreError, match=r"selected 2 task\(s\); this resume selects .*--change-selection"):
            run(ids)
    assert _rows(db, "SELECT status, finished_at FROM runs WHERE run_id = 'resume'")[0] == ("completed", finished_at)

    widened = run(bundled_ids[:3], change_selection=True)
    assert [r.task_id for r in widened.results] == [bundled_ids[2]]
    assert widened.completeness.selected == 3 and widened.completeness.final == 3
    assert _rows(db, "SELECT count(*) FROM task_results WHERE run_id = 'resume'")[0][0] == 3
    assert _rows(db, "SELECT task_count, status FROM runs WHERE run_id = 'resume'")[0] == (3, "completed")
    assert list(temporary.iterdir()) == []


def test_a_lost_answer_to_the_runs_final_state_still_gives_its_outcome(prefect_server: None, tmp_path: Path) -> None:
    """The server takes the run's Completed state but its answer is lost (a 503 from a proxy in
    between): the client sends the state again, the server rejects the copy as a duplicate and
    returns its own state, which has no data. The run still ends with its outcome, not a
    MissingResult traceback, and the server shows it Completed."""
    import json

    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    from bench.prefect_server import api_for_this_block
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig
    from lossy_proxy import lossy_proxy

    def final_state(method: str, path: str, body: bytes) -> bool:
        if method != "POST" or not path.endswith("/set_state") or "/flow_runs/" not in path:
            return False
        return json.loads(body or b"{}").get("state", {}).get("type") == "COMPLETED"

    server = str(PREFECT_API_URL.value())
    with lossy_proxy(server.removesuffix("/api"), final_state) as proxy, api_for_this_block(f"{proxy.url}/api"):
        outcome = run_suite(SuiteRunConfig(agent="scripted", pool_size=2, domains=["notepad"], run_id="e2e-lost-answer",
                                           db_path=tmp_path / "arena.duckdb", artifacts_dir=tmp_path / "a"))
    assert len(proxy.lost) == 1, proxy.lost  # the answer was lost, and only that one
    assert outcome.status == "completed" and outcome.results and all(r.success for r in outcome.results)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(outcome.flow_run_id)
    assert run.state is not None and run.state.is_completed()
