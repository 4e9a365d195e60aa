"""The `evaluate-suite/arena-run` deployment every `arena run` belongs to (flows/evaluate_suite.py):
registered when it is missing or differs from what this code registers, read and reused otherwise;
each `arena run` creates one flow run of it."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.actions import DeploymentUpdate
from prefect.settings import PREFECT_API_URL

import flows.arena_run_deployment as arena_run
import flows.evaluate_suite as evaluate_suite
from flows.provenance import code_revision
from flows.run_config import SuiteRunConfig


def _fresh_lookup() -> str:
    """The deployment's id as a new `arena run` process finds it (no id remembered)."""
    arena_run._deployments.clear()
    with get_client(sync_client=True) as client:
        return arena_run.arena_run_deployment(client, evaluate_suite.evaluate_suite)


def test_the_arena_run_deployment_is_registered_once_and_again_only_when_it_changed(
        prefect_server: None, own_prefect_server: str) -> None:
    # On a server of its own: it changes the deployment that every `arena run` on a server uses;
    # the other test processes' runs on the shared one would meet that (or rewrite it meanwhile).
    with get_client(sync_client=True) as client:
        name = f"{evaluate_suite.evaluate_suite.name}/{arena_run.ARENA_RUN_DEPLOYMENT}"
        first = _fresh_lookup()
        registered = client.read_deployment_by_name(name)
        assert registered.id == first and registered.paused and registered.tags == ["waa"]
        # The code's revision (in a git checkout), whatever folder the run starts in.
        assert registered.version == (code_revision() or evaluate_suite.evaluate_suite.version)

        # As it is: reused, not written again.
        assert _fresh_lookup() == first
        assert client.read_deployment_by_name(name).updated == registered.updated

        # Someone resumed it in the UI, or an older version of the product registered other
        # parameters: registered again as this code has it (same deployment, paused again).
        for change in (DeploymentUpdate(paused=False),
                       DeploymentUpdate(parameter_openapi_schema={"type": "object", "properties": {}})):
            client.update_deployment(first, change)
            assert _fresh_lookup() == first
            again = client.read_deployment_by_name(name)
            assert again.paused and again.updated > registered.updated
            assert again.parameter_openapi_schema == registered.parameter_openapi_schema
            registered = again


def test_a_creation_the_client_sends_again_is_one_flow_run(prefect_server: None, tmp_path: Path) -> None:
    """Prefect's client sends a request again when its answer does not arrive (a busy server
    answering after the client's timeout). Without an idempotency key the server made a second
    flow run of the same `arena run`, which nothing executes: a ghost left Scheduled in the UI
    beside the real run. A resume of the same run id is still a new flow run."""
    from bench.prefect_server import api_for_this_block
    from lossy_prefect_proxy import losing_first_creation

    config = SuiteRunConfig(run_id="resent-creation", db_path=tmp_path / "arena.duckdb", artifacts_dir=tmp_path / "art")
    upstream = str(PREFECT_API_URL.value())
    with losing_first_creation(upstream) as proxy, api_for_this_block(proxy.api_url):
        created = _create(config)
    assert len(proxy.creations) >= 2, proxy.creations  # the creation was sent again
    assert _runs_named(evaluate_suite.run_name(config)) == [created.id]

    resumed = _create(config)
    assert sorted(_runs_named(evaluate_suite.run_name(config))) == sorted([created.id, resumed.id])
    assert resumed.id != created.id


def _create(config: SuiteRunConfig) -> object:
    """The flow run `arena run` makes for `config`."""
    return arena_run.create_arena_flow_run(evaluate_suite.evaluate_suite, config, evaluate_suite.run_name(config),
                                           evaluate_suite.run_tags(config))


def _runs_named(name: str) -> list[UUID]:
    """The ids of the flow runs called `name` on the current server."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
    return [run.id for run in runs]


def test_a_cancel_that_arrives_as_the_run_ends_leaves_prefect_saying_how_it_ended(
        prefect_server: None, tmp_path: Path) -> None:
    """A cancel from the UI that reached the server after the run's work had ended (every result
    stored) left the flow run Cancelling, later "cancellation timed out", while the store said
    `completed` and `arena run` exited 0. Prefect now says Completed too, and why."""
    import duckdb
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling

    def cancel(outcome: object) -> None:  # the flow has its outcome; Prefect has not taken its end yet
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(outcome.flow_run_id, Cancelling(message="cancelled from the UI"), force=True)

    db = tmp_path / "arena.duckdb"
    config = SuiteRunConfig(run_id="late-cancel", task_ids=["notepad-append-line"], pool_size=1, db_path=db,
                            artifacts_dir=tmp_path / "art")
    outcome = evaluate_suite.run_suite(config, on_outcome=cancel)
    assert outcome.status == "completed"
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(outcome.flow_run_id).state
    assert state.type == StateType.COMPLETED, state
    assert "the cancel arrived after the run had ended" in (state.message or ""), state.message
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status FROM runs WHERE run_id = 'late-cancel'").fetchone() == ("completed",)
