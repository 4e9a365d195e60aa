"""The served deployment carries a complete, valid default configuration."""

from __future__ import annotations

from deployments.serve import build_deployment
from flows.evaluate_suite import SuiteRunConfig


def test_deployment_defaults_round_trip() -> None:
    deployment = build_deployment()
    assert deployment.name == "bundled-local"
    config = SuiteRunConfig.model_validate(deployment.parameters["config"])
    assert config.agent == "scripted" and config.provider == "local"
    assert (config.suite_dir / "test_all.json").exists()
