"""The `evaluate-suite/arena-run` deployment every `arena run` belongs to (flows/evaluate_suite.py):
registered when it is missing or differs from what this code registers, read and reused otherwise."""

from __future__ import annotations

from prefect import get_client
from prefect.client.schemas.actions import DeploymentUpdate

import flows.evaluate_suite as evaluate_suite
from flows.provenance import code_revision


def _fresh_lookup() -> str:
    """The deployment's id as a new `arena run` process finds it (no id remembered)."""
    evaluate_suite._deployments.clear()
    return evaluate_suite._arena_run_deployment()


def test_the_arena_run_deployment_is_registered_once_and_again_only_when_it_changed(prefect_server: None) -> None:
    with get_client(sync_client=True) as client:
        name = f"{evaluate_suite.evaluate_suite.name}/{evaluate_suite.ARENA_RUN_DEPLOYMENT}"
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
