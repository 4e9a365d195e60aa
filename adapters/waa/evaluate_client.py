"""Client of the /evaluate endpoint (adapters/waa/evaluate_server.py) deployed beside a WAA server."""

from __future__ import annotations

import os
from typing import Any

import requests

from adapters.waa.evaluate_server import TOKEN_ENV
from adapters.waa.evaluator import EvaluationOutcome


class EvaluateEndpointClient:
    """Scores a task through a remote /evaluate; answers with the same EvaluationOutcome as the engine."""

    def __init__(self, base_url: str, *, timeout: float = 900.0, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._token = token if token is not None else os.environ.get(TOKEN_ENV)

    def evaluate(self, task_raw: dict[str, Any], last_action: str | None) -> EvaluationOutcome:
        """Never raises for a remote failure: an unreachable or failing endpoint is infrastructure."""
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        url = self.base_url + "/evaluate"
        try:
            response = requests.post(
                url, json={"task": task_raw, "last_action": last_action}, headers=headers, timeout=self.timeout
            )
        except requests.RequestException as exc:
            return EvaluationOutcome(0.0, f"/evaluate endpoint {url} unreachable: {exc}", "infrastructure_error")
        if response.status_code != 200:
            return EvaluationOutcome(
                0.0,
                f"/evaluate endpoint {url} answered HTTP {response.status_code}: {response.text[:300]}",
                "infrastructure_error" if response.status_code >= 500 else "evaluation_error",
            )
        body = response.json()
        return EvaluationOutcome(
            score=float(body["score"]), reason=str(body["reason"]), kind=body["kind"], details=list(body.get("details") or [])
        )
