"""The served deployments refuse a parameter their flow does not take when the run is created,
against a real Prefect server (the local server's app): HTTP 409 naming the parameter, and no
flow run made. Before, Prefect created the run, and the runner ended it Crashed with no reason."""

from __future__ import annotations

from typing import Any

import pytest


def _deployments() -> dict[str, Any]:
    from deployments.serve import build_deployments

    return {f"{d.flow_name}/{d.name}": d for d in build_deployments()}


def test_unexpected_parameters_are_refused_at_creation_naming_them(own_prefect_server: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.exceptions import PrefectHTTPStatusError

    deployments = _deployments()
    assert set(deployments) >= {"evaluate-baseline/on-demand", "nightly-baselines/nightly-baselines",
                                "evaluate-model-update/on-model-update"}
    ids = {name: deployment.apply() for name, deployment in deployments.items()}
    hostile: dict[str, dict[str, Any]] = {
        "evaluate-baseline/on-demand": {"baseline": "scripted-bundled-local", "db_path": "/tmp/elsewhere.duckdb"},
        "nightly-baselines/nightly-baselines": {"baselines_file": "/tmp/mine.toml"},
        "evaluate-model-update/on-model-update": {"model": "m", "config": {"agent": "openai"}},
    }
    with get_client(sync_client=True) as client:
        for name, parameters in hostile.items():
            schema = client.read_deployment(ids[name]).parameter_openapi_schema
            extra = next(key for key in parameters if key not in schema["properties"])
            with pytest.raises(PrefectHTTPStatusError) as refused:
                client.create_flow_run_from_deployment(ids[name], parameters=parameters)
            assert refused.value.response.status_code == 409
            detail = refused.value.response.json()["detail"]
            assert f"'{extra}' was unexpected" in detail, detail
            assert client.read_flow_runs() == []  # nothing was created to crash later
            assert schema.get("additionalProperties") is False, (name, schema)
        # The parameters the flows take are still accepted (and wait for a runner here).
        run = client.create_flow_run_from_deployment(
            ids["evaluate-baseline/on-demand"], parameters={"baseline": "scripted-bundled-local", "run_id": "r-1"})
        assert run.parameters == {"baseline": "scripted-bundled-local", "run_id": "r-1"}
        assert run.state is not None and run.state.type == StateType.SCHEDULED
        update = client.create_flow_run_from_deployment(
            ids["evaluate-model-update/on-model-update"], parameters={"model": "m", "endpoint": None, "checkpoint": None})
        assert update.parameters["model"] == "m"
