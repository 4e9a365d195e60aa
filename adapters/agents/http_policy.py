"""An agent whose every decision is made by the user's own policy server, over HTTP.

Each `act` POSTs one JSON request (the task, the step index, the observation and the actions
taken so far) to the configured URL and expects one BenchmarkAction as JSON back. The schemas,
with examples and a small example server, are in docs/http_policy.md; `build_request` is the
single place the request is built.

Errors are sorted as the episode loop expects: a reply that is not a valid action is the
policy's failure (UnparseableReplyError, with the raw body); a server that cannot be reached,
times out or answers with an HTTP error is infrastructure (AgentInfrastructureError, naming the
URL and status), which the pipeline retries and never scores.

Secret headers are given as environment variable NAMES, `headers_from_env={"Authorization":
"POLICY_AUTH"}`: the header's value is the variable's value, verbatim (so the variable holds
e.g. "Bearer abc123"). Values are read once, at construction, and never appear in `config()`.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from pydantic import ValidationError

from adapters.benchmark import (
    AgentInfrastructureError,
    BenchmarkAction,
    BenchmarkAgent,
    BenchmarkObservation,
    BenchmarkTask,
    ModelUsage,
    StepRecord,
    UIElement,
    UnparseableReplyError,
)

SCHEMA_VERSION = 1
"""Sent as `schema_version` in every request; raised when the request schema changes incompatibly."""

# How much of an error body goes into an exception message.
_BODY_IN_MESSAGE = 500
_ACTION_FIELDS = frozenset(BenchmarkAction.model_fields)
_REPLY_EXTRAS = frozenset({"usage"})


class HttpPolicyConfigError(ValueError):
    """The agent is misconfigured (bad URL, a header's environment variable is not set)."""


def redact_url(url: str) -> str:
    """The URL without user info, query string or fragment (where tokens tend to hide)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    redacted = urlunsplit((parts.scheme, host, parts.path, "", ""))
    return redacted + ("?<redacted>" if parts.query else "")


def element_to_json(element: UIElement, include_attributes: bool = True) -> dict[str, Any]:
    """One accessibility node and its subtree as the request schema's nested node object."""
    node: dict[str, Any] = {
        "node_id": element.node_id,
        "role": element.role,
        "name": element.name,
        "bbox": list(element.bbox) if element.bbox is not None else None,
        "text": element.text,
    }
    if include_attributes:
        node["attributes"] = dict(element.attributes)
    node["children"] = [element_to_json(child, include_attributes) for child in element.children]
    return node


def action_to_json(action: BenchmarkAction) -> dict[str, Any]:
    """An action as JSON: `type` plus every field that differs from its default (raw_action dropped)."""
    return action.model_dump(mode="json", exclude_defaults=True, exclude={"raw_action"})


def build_request(
    task: BenchmarkTask,
    observation: BenchmarkObservation,
    history: list[StepRecord],
    *,
    episode_id: str,
    send_screenshot: bool = True,
    include_attributes: bool = True,
) -> dict[str, Any]:
    """The JSON body POSTed to the policy server for one step (schema in docs/http_policy.md)."""
    screenshot = observation.screenshot
    if screenshot is None and send_screenshot and observation.screenshot_path:
        path = Path(observation.screenshot_path)
        screenshot = path.read_bytes() if path.is_file() else None
    tree = observation.accessibility_tree
    focused = observation.focused_element
    return {
        "schema_version": SCHEMA_VERSION,
        "episode_id": episode_id,
        "task": {"task_id": task.task_id, "instruction": task.instruction, "domain": task.domain},
        "step": len(history),
        "observation": {
            "screenshot_png_base64": base64.b64encode(screenshot).decode("ascii") if send_screenshot and screenshot else None,
            "viewport": list(observation.viewport) if observation.viewport is not None else None,
            "window_title": observation.window_title,
            "url": observation.url,
            "focused_node_id": focused.node_id if focused is not None else None,
            "accessibility_tree": element_to_json(tree, include_attributes) if tree is not None else None,
        },
        "history": [action_to_json(step.action) for step in history],
        "last_action_error": history[-1].error if history else None,
    }


class HttpPolicyAgent(BenchmarkAgent):
    """Asks a policy server for each action: POST request JSON, get BenchmarkAction JSON back."""

    name = "http_policy"

    def __init__(
        self,
        url: str,
        timeout: float = 60,
        headers_from_env: dict[str, str] | None = None,
        *,
        send_screenshot: bool = True,
        include_attributes: bool = True,
        session: requests.Session | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise HttpPolicyConfigError(f"policy URL must be an http(s) URL, got {redact_url(url)!r}")
        if timeout <= 0:
            raise HttpPolicyConfigError(f"timeout must be > 0 seconds, got {timeout}")
        self.url = url
        self.timeout = float(timeout)
        self.send_screenshot = send_screenshot
        self.include_attributes = include_attributes
        self.headers_from_env = dict(headers_from_env or {})
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        for header, variable in self.headers_from_env.items():
            value = os.environ.get(variable)
            if not value:
                raise HttpPolicyConfigError(
                    f"policy header {header!r} takes its value from environment variable {variable}, which is not set"
                )
            headers[header] = value
        self._session = session or requests.Session()
        self._headers = headers
        self._episode_id = uuid.uuid4().hex
        self._usage: ModelUsage | None = None

    def reset(self, task: BenchmarkTask) -> None:
        self._episode_id = uuid.uuid4().hex
        self._usage = None

    def config(self) -> dict[str, Any]:
        # Env var names are not secrets; their values (the header values) never appear here.
        return {
            "name": self.name,
            "url": redact_url(self.url),
            "timeout": self.timeout,
            "send_screenshot": self.send_screenshot,
            "include_attributes": self.include_attributes,
            "header_env_vars": dict(self.headers_from_env),
            "schema_version": SCHEMA_VERSION,
        }

    def last_usage(self) -> ModelUsage | None:
        return self._usage

    def close(self) -> None:
        self._session.close()

    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        self._usage = None
        body = build_request(
            task,
            observation,
            history,
            episode_id=self._episode_id,
            send_screenshot=self.send_screenshot,
            include_attributes=self.include_attributes,
        )
        where = f"policy server {redact_url(self.url)}"
        step = body["step"]
        try:
            response = self._session.post(self.url, json=body, headers=self._headers, timeout=self.timeout)
        except requests.Timeout as exc:
            raise AgentInfrastructureError(f"{where} did not answer step {step} within {self.timeout:g} s: {exc}") from exc
        except requests.ConnectionError as exc:
            raise AgentInfrastructureError(f"{where} could not be reached (step {step}): {exc}") from exc
        except requests.RequestException as exc:
            raise AgentInfrastructureError(f"{where}: request for step {step} failed: {exc}") from exc
        raw = response.text
        status = response.status_code
        if status >= 500:
            raise AgentInfrastructureError(
                f"{where} answered HTTP {status} (server error) for step {step}: {raw[:_BODY_IN_MESSAGE]!r}"
            )
        if status >= 400:
            raise AgentInfrastructureError(
                f"{where} answered HTTP {status} for step {step}: a client error, the server rejected the request "
                f"(check the URL, the auth headers and the request schema): {raw[:_BODY_IN_MESSAGE]!r}"
            )
        if not 200 <= status < 300:
            raise AgentInfrastructureError(f"{where} answered unexpected HTTP {status} for step {step}: {raw[:_BODY_IN_MESSAGE]!r}")
        action, usage = parse_reply(raw, where=where)
        self._usage = usage
        return action


def parse_reply(raw: str, where: str = "policy server") -> tuple[BenchmarkAction, ModelUsage | None]:
    """The action (and optional usage) in a policy server's reply; UnparseableReplyError otherwise."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise UnparseableReplyError(f"{where} replied with something that is not JSON: {exc}", raw) from exc
    if not isinstance(data, dict):
        raise UnparseableReplyError(f"{where} replied with JSON {type(data).__name__}, expected an action object", raw)
    unknown = sorted(set(data) - _ACTION_FIELDS - _REPLY_EXTRAS)
    if unknown:
        raise UnparseableReplyError(f"{where} replied with unknown action field(s) {unknown}", raw)
    usage_data = data.pop("usage", None)
    try:
        action = BenchmarkAction.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        raise UnparseableReplyError(f"{where} replied with an invalid action: {problems}", raw) from exc
    usage = None
    if usage_data is not None:
        try:
            usage = ModelUsage.model_validate(usage_data)
        except ValidationError as exc:
            raise UnparseableReplyError(f"{where} replied with invalid usage: {exc.errors()[0]['msg']}", raw) from exc
    return action, usage


def _problem(error: Any) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    location = ".".join(str(part) for part in error["loc"])
    return f"{location}: {message}" if location else message
