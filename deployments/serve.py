"""Serve the evaluate-suite flow as a Prefect deployment so runs can be started from the UI.

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m deployments.serve

Schedules and model-update triggers are not defined yet; this registers the deployment
`evaluate-suite/bundled-local` (the bundled suite, scripted agent, local simulation by default;
every field of SuiteRunConfig can be changed per run in the UI) and serves it until interrupted.
"""

from __future__ import annotations

from prefect import serve
from prefect.deployments.runner import RunnerDeployment

from flows.evaluate_suite import SuiteRunConfig, evaluate_suite


def build_deployment() -> RunnerDeployment:
    """The deployment definition, kept out of the flow code."""
    return evaluate_suite.to_deployment(
        name="bundled-local",
        parameters={"config": SuiteRunConfig().model_dump(mode="json")},
        description="Evaluate the bundled WAA suite on local simulation VMs.",
        tags=["waa", "local-simulation"],
    )


def main() -> None:
    """Register the deployment and serve it until interrupted."""
    serve(build_deployment())


if __name__ == "__main__":
    main()
