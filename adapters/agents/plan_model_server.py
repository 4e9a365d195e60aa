"""A stand-in model endpoint for the local environment: it replays the suite's solution plans.

NOT A MODEL. It answers the OpenAI chat-completions API (`POST /v1/chat/completions`, `GET
/v1/models`) the way a model would answer the `openai` prompting agent, but every reply is the
next step of the task's solution plan (the suite's `solutions.json`, which the scripted agent
follows), written in the agent's action grammar. It exists so the model-update path (a baseline
whose agent calls a model, a `model.updated` event naming a checkpoint, the comparison) can be
run and tested end to end on a laptop with no GPU and no API key, and so such a run really
reaches an endpoint: every request is answered here and counted.

    python -m adapters.agents.plan_model_server --port 8765 [--suite DIR] [--models a,b]

How it answers: the task is the one whose instruction the prompt's `Task:` line holds; the step
is the number of actions under `Previous actions:` other than waits (the plan's own waits are
left to the harness's settling; a WAIT is what it answers while a step's element is not on the
screen yet, as the scripted agent waits); a click step names an element by role
and name, found as `[id] Role "Name"` in the prompt's accessibility outline (inside the named
window's part of the outline when the step names one), so the baseline must show the agent the
tree (`observation = "a11y_tree"`). Any model name is answered; `/v1/models` lists `--models`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir

DEFAULT_PORT = 8765
DEFAULT_MODELS = ("plan-replay",)
_POINTER = {"click": "CLICK", "double_click": "DOUBLE_CLICK", "right_click": "RIGHT_CLICK"}
_ACTION_LINE = re.compile(r"^\d+\. (\S+)", re.M)  # a previous action: its type first
_ids = itertools.count(1)


@dataclass
class PlanReplay:
    """The replies: for a prompt, the next plan step of its task in the action grammar."""

    plans: dict[str, list[dict[str, Any]]]
    tasks_by_instruction: dict[str, str]
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_suite(cls, suite_dir: Path) -> PlanReplay:
        """The plans (`solutions.json`) and instructions of the suite at `suite_dir`."""
        catalog = WAATaskCatalog(suite_dir)
        plans = json.loads((Path(suite_dir) / "solutions.json").read_text(encoding="utf-8"))
        instructions = {catalog.load(task_id).instruction.strip(): task_id for task_id in catalog.task_ids()}
        return cls(plans, instructions)

    def reply(self, prompt: str) -> str:
        """The grammar action for `prompt` (FAIL() when the task or its next element is unknown)."""
        with self._lock:
            self.requests += 1
        task_id = self._task(prompt)
        if task_id is None or task_id not in self.plans:
            return "The task is not one this replay knows.\nFAIL()"
        history = _section(prompt, "Previous actions:")
        done = len([line for line in _ACTION_LINE.findall(history) if not line.startswith("wait")])
        plan = [step for step in self.plans[task_id] if next(iter(step)) != "wait"]
        if done >= len(plan):
            return "The plan is finished.\nDONE()"
        return f"Step {done + 1} of the plan for {task_id}.\n{self._step(plan[done], prompt)}"

    def _task(self, prompt: str) -> str | None:
        match = re.search(r"^Task: (.*)$", prompt, re.M)
        return self.tasks_by_instruction.get(match.group(1).strip()) if match else None

    @staticmethod
    def _step(step: dict[str, Any], prompt: str) -> str:
        kind = next(iter(step))
        if kind in _POINTER:
            element = _element_id(prompt, step[kind])
            return f"{_POINTER[kind]}([{element}])" if element else "WAIT(0.5)"  # not on screen yet
        if kind == "type":
            return f"TYPE({json.dumps(str(step[kind]))})"
        if kind == "key":
            return f"KEY({json.dumps('+'.join([*step.get('modifiers', []), str(step[kind])]))})"
        if kind == "wait":
            return f"WAIT({float(step[kind]):g})"
        return "DONE()" if kind == "done" else "FAIL()"


def _section(prompt: str, heading: str) -> str:
    return prompt.split(heading + "\n", 1)[1].split("\n\n", 1)[0] if heading in prompt else ""


def _element_id(prompt: str, target: dict[str, Any]) -> str | None:
    """The id of the first `[id] Role "Name"` line for `target`, inside a top-level window whose
    name holds the step's `window` when it names one (as the scripted agent finds it)."""
    wanted = re.compile(r"^\s*\[([^\]\s]+)\] " + re.escape(str(target.get("role"))) + r' "' +
                        re.escape(str(target.get("name"))) + '"')
    window = str(target.get("window") or "").lower()
    inside = not window
    for line in prompt.splitlines():
        top = re.match(r'^\[[^\]\s]+\] \S+ "([^"]*)"', line)  # a top-level window: no indentation
        if window and top:
            inside = window in top.group(1).lower()
        match = wanted.match(line) if inside else None
        if match:
            return match.group(1)
    return None


def _completion(text: str, model: str, prompt_chars: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-replay-{next(_ids)}", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": max(1, prompt_chars // 4), "completion_tokens": max(1, len(text) // 4),
                  "total_tokens": max(1, prompt_chars // 4) + max(1, len(text) // 4)},
    }


def _prompt_text(body: dict[str, Any]) -> str:
    parts: list[str] = []
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [c.get("text", "") for c in content if isinstance(c, dict) and c.get("type") == "text"]
    return "\n".join(parts)


def make_server(replay: PlanReplay, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                models: tuple[str, ...] = DEFAULT_MODELS) -> ThreadingHTTPServer:
    """The HTTP server (not yet serving); port 0 picks a free one."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.split("?")[0].rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "plan-replay (not a model)"} for m in models]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found_error"}})

        def do_POST(self) -> None:  # noqa: N802
            if self.path.split("?")[0].rstrip("/") != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found_error"}})
                return
            length = int(self.headers.get("content-length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                self._send(400, {"error": {"message": "the body is not JSON", "type": "invalid_request_error"}})
                return
            prompt = _prompt_text(body)
            self._send(200, _completion(replay.reply(prompt), str(body.get("model", models[0])), len(prompt)))

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A stand-in model endpoint that replays the suite's solution plans "
                                                 "(not a model; for the local environment's model-update demo).")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--suite", type=Path, default=bundled_suite_dir(), help="the suite whose plans it replays")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="model names /v1/models lists (comma-separated; any name is answered)")
    args = parser.parse_args(argv)
    server = make_server(PlanReplay.from_suite(args.suite), port=args.port,
                         models=tuple(m.strip() for m in args.models.split(",") if m.strip()))
    print(f"plan-replay endpoint (NOT a model: it replays {args.suite}'s solution plans) on "
          f"http://127.0.0.1:{server.server_port}/v1", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
