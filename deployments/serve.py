"""Serve the evaluate-suite flow as a Prefect deployment so runs can be started from the UI.

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m deployments.serve

Schedules and model-update triggers are not defined yet; this only registers the deployment
`evaluate-suite/bundled-local` with the bundled suite and the scripted agent as defaults.
"""

from __future__ import annotations

from flows.evaluate_suite import SuiteRunConfig, evaluate_suite


def main() -> None:
    """Register the deployment and serve it until interrupted."""
    evaluate_suite.serve(name="bundled-local", parameters={"config": SuiteRunConfig().model_dump(mode="json")})


if __name__ == "__main__":
    main()
