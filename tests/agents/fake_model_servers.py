"""Fake model APIs for tests: real HTTP servers on 127.0.0.1 that replay scripted replies.

`FakeModelServer("anthropic")` answers POST /v1/messages (Messages API JSON, text and tool_use
content blocks, usage); `FakeModelServer("openai")` answers POST /v1/chat/completions (chat
completion JSON with usage). Each request takes the next item of the script:

* a dict: sent as the 200 JSON body (build it with `anthropic_message` / `openai_completion`);
* `Fail(status, retry_after=...)`: an error response in the API's error format, with a
  retry-after header when given (seconds; floats allowed, as both SDKs accept them);
* a callable `f(request) -> dict | Fail`: computed from the recorded request (its JSON body),
  for replies that depend on what the agent sent (element ids, screenshot sizes).

Every request is recorded (path, headers, JSON body, arrival time) in `server.requests`. When the
script runs out the server answers its `default` reply, or 500 with "script exhausted".
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Literal, Union

_ids = itertools.count(1)


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float  # time.monotonic() on arrival

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)


@dataclass
class Fail:
    """An error reply: HTTP status, optional retry-after seconds, optional message."""

    status: int
    retry_after: float | None = None
    message: str = "scripted failure"


Reply = Union[dict, Fail, Callable[[RecordedRequest], Union[dict, Fail]]]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def anthropic_message(content: list[dict] | str, *, input_tokens: int = 100, output_tokens: int = 20,
                      stop_reason: str | None = None, model: str = "claude-test") -> dict:
    """A Messages API response body; a str becomes one text block."""
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if stop_reason is None:
        stop_reason = "tool_use" if any(b.get("type") == "tool_use" for b in blocks) else "end_turn"
    return {
        "id": f"msg_{next(_ids):06d}", "type": "message", "role": "assistant", "model": model,
        "content": blocks, "stop_reason": stop_reason, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def tool_use(action: str, say: str | None = None, **inputs: Any) -> list[dict]:
    """Content blocks for one computer-tool call (`say`: a text block before it)."""
    blocks = [{"type": "text", "text": say}] if say else []
    blocks.append({"type": "tool_use", "id": f"toolu_{next(_ids):06d}", "name": "computer",
                   "input": {"action": action, **inputs}})
    return blocks


def openai_completion(text: str, *, prompt_tokens: int = 100, completion_tokens: int = 20,
                      model: str = "gpt-test") -> dict:
    """A chat.completion response body."""
    return {
        "id": f"chatcmpl-{next(_ids):06d}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


class FakeModelServer:
    """One fake API server in a background thread; use as a context manager."""

    def __init__(self, kind: Literal["anthropic", "openai"], script: list[Reply] | None = None, *,
                 default: Reply | None = None) -> None:
        self.kind = kind
        self.script: list[Reply] = list(script or [])
        self.default = default  # the reply once the script has run out (None: a 500)
        self.requests: list[RecordedRequest] = []
        self.errors: list[str] = []  # callbacks that raised (answered as 500s)
        # The model listing (GET /v1/models): the models served, and the key it accepts (None: any).
        self.models: list[str] = ["gpt-test", "claude-test"]
        self.accepted_key: str | None = None
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """The base_url to give the SDK (the OpenAI SDK's includes /v1)."""
        root = f"http://127.0.0.1:{self.port}"
        return root + "/v1" if self.kind == "openai" else root

    @property
    def expected_path(self) -> str:
        return "/v1/messages" if self.kind == "anthropic" else "/v1/chat/completions"

    def add(self, *replies: Reply) -> None:
        with self._lock:
            self.script.extend(replies)

    def start(self) -> FakeModelServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- request handling -------------------------------------------------------------------

    def _next_reply(self, request: RecordedRequest) -> tuple[int, dict[str, str], dict]:
        with self._lock:
            self.requests.append(request)
            item: Reply | None = self.script.pop(0) if self.script else self.default
        if request.path.split("?")[0] != self.expected_path:
            return 404, {}, self._error_body(404, f"no route {request.path}")
        if item is None:
            return 500, {}, self._error_body(500, "script exhausted")
        if callable(item) and not isinstance(item, (dict, Fail)):
            item = item(request)
        if isinstance(item, Fail):
            headers = {"retry-after": f"{item.retry_after:g}"} if item.retry_after is not None else {}
            return item.status, headers, self._error_body(item.status, item.message)
        return 200, {}, item

    def _error_body(self, status: int, message: str) -> dict:
        kind = _ERROR_TYPES.get(status, "api_error")
        if self.kind == "anthropic":
            return {"type": "error", "error": {"type": kind, "message": message}}
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    body = raw.decode("utf-8", "replace")
                request = RecordedRequest("POST", self.path, dict(self.headers.items()), body, time.monotonic())
                try:
                    status, headers, payload = server._next_reply(request)
                except Exception as exc:  # a test callback crashed: report it as a 500 the test can see
                    server.errors.append(f"{type(exc).__name__}: {exc}")
                    status, headers, payload = 500, {}, server._error_body(500, f"fake server callback failed: {exc!r}")
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - the model listing, as both APIs serve it
                given = self.headers.get("x-api-key") or (self.headers.get("authorization") or "").removeprefix("Bearer ")
                if self.path.split("?")[0] != "/v1/models":
                    status, payload = 404, server._error_body(404, f"no route {self.path}")
                elif server.accepted_key is not None and given != server.accepted_key:
                    status, payload = 401, server._error_body(401, "invalid api key")
                else:
                    status = 200
                    payload = {"object": "list", "data": [
                        {"id": m, "object": "model", "type": "model", "created": 0, "owned_by": "test",
                         "created_at": "2026-01-01T00:00:00Z", "display_name": m} for m in server.models],
                        "has_more": False, "first_id": None, "last_id": None}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

        return Handler


# -- reading what an agent sent --------------------------------------------------------------


def user_text(request: RecordedRequest) -> str:
    """The first user message's text, for either API."""
    messages = request.body["messages"]
    user = next(m for m in messages if m["role"] == "user")
    content = user["content"]
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content if part.get("type") == "text")


def element_id(text: str, role: str, name: str) -> str:
    """The [id] of an element in a prompt's accessibility text, e.g. element_id(t, "Button", "OK")."""
    match = re.search(r"\[([^\]\s]+)\] " + re.escape(role) + r' "' + re.escape(name) + '"', text)
    assert match, f'{role} "{name}" not in the prompt:\n{text}'
    return match.group(1)
