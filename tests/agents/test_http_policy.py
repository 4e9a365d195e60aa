"""HttpPolicyAgent against a real policy server on 127.0.0.1 (http.server in a thread), and one
episode where that server solves a bundled task on the local WAA simulation."""

from __future__ import annotations

import base64
import http.server
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.agents.http_policy import HttpPolicyAgent, HttpPolicyConfigError, build_request, parse_reply, redact_url
from adapters.benchmark import (
    ActionType,
    AgentInfrastructureError,
    BenchmarkAction,
    BenchmarkObservation,
    BenchmarkTask,
    ModelUsage,
    OutcomeKind,
    StepRecord,
    UIElement,
    UnparseableReplyError,
)
from adapters.episode import EpisodeLimits, run_episode
from adapters.waa.settle import SettlePolicy

Reply = tuple[int, str]  # (HTTP status, body)


class PolicyServer:
    """A policy server: each path maps to a function from the request JSON to (status, body)."""

    def __init__(self, routes: dict[str, Callable[[dict[str, Any]], Reply]]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []  # (path, headers, body)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, dict(self.headers), body))
                status, text = server.routes[self.path.split("?")[0]](body)
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out first
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def __enter__(self) -> PolicyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _slow(body: dict[str, Any]) -> Reply:
    time.sleep(1.0)
    return 200, json.dumps({"type": "done"})


ROUTES: dict[str, Callable[[dict[str, Any]], Reply]] = {
    "/click": lambda body: (200, json.dumps({"type": "click", "target_node_id": "btn", "reasoning": f"step {body['step']}"})),
    "/key": lambda body: (200, json.dumps({"type": "key", "key": "s", "modifiers": ["ctrl"],
                                           "usage": {"calls": 1, "input_tokens": 120, "output_tokens": 7, "cost_usd": 0.001}})),
    "/malformed": lambda body: (200, json.dumps({"type": "click"})),  # a click with no target
    "/unknown-field": lambda body: (200, json.dumps({"type": "done", "target_nodeid": "btn"})),
    "/not-json": lambda body: (200, "CLICK the button"),
    "/error": lambda body: (500, "policy crashed: KeyError 'observation'"),
    "/forbidden": lambda body: (403, "bad token"),
    "/slow": _slow,
}


@pytest.fixture(scope="module")
def server() -> Iterator[PolicyServer]:
    with PolicyServer(ROUTES) as s:
        yield s


TASK = BenchmarkTask(task_id="notepad-save", instruction="Save the file.", domain="notepad")
TREE = UIElement(
    node_id="root", role="desktop", children=[
        UIElement(node_id="win", role="Window", name="Untitled - Notepad", bbox=(0, 0, 800, 600), children=[
            UIElement(node_id="btn", role="Button", name="Save", bbox=(10, 10, 60, 30), attributes={"enabled": "true"}),
            UIElement(node_id="ed", role="Edit", name="Text Editor", bbox=(0, 40, 800, 600), text="hello"),
        ]),
    ],
)
OBSERVATION = BenchmarkObservation(
    screenshot=b"\x89PNG\r\n\x1a\nfake", viewport=(1280, 800), accessibility_tree=TREE, window_title="Untitled - Notepad",
    url=None, focused_element=TREE.find(node_id="ed"),
)
HISTORY = [
    StepRecord(index=0, action=BenchmarkAction(type=ActionType.CLICK, target_node_id="ed", reasoning="focus", raw_action=object())),
    StepRecord(index=1, action=BenchmarkAction(type=ActionType.TYPE, text="hello"), error="typing was slow"),
]


def test_action_reply_and_request_body_shape(server: PolicyServer) -> None:
    agent = HttpPolicyAgent(server.url("/click"), timeout=5)
    agent.reset(TASK)
    action = agent.act(TASK, OBSERVATION, HISTORY)
    assert action == BenchmarkAction(type=ActionType.CLICK, target_node_id="btn", reasoning="step 2")
    assert agent.last_usage() is None
    path, headers, body = server.requests[-1]
    assert path == "/click" and headers["Content-Type"] == "application/json"
    assert set(body) == {"schema_version", "episode_id", "task", "step", "observation", "history", "last_action_error"}
    assert body["schema_version"] == 1 and len(body["episode_id"]) == 32
    assert body["task"] == {"task_id": "notepad-save", "instruction": "Save the file.", "domain": "notepad"}
    assert body["step"] == 2
    observation = body["observation"]
    assert set(observation) == {"screenshot_png_base64", "viewport", "window_title", "url", "focused_node_id", "accessibility_tree"}
    assert base64.b64decode(observation["screenshot_png_base64"]) == b"\x89PNG\r\n\x1a\nfake"
    assert observation["viewport"] == [1280, 800] and observation["window_title"] == "Untitled - Notepad"
    assert observation["url"] is None and observation["focused_node_id"] == "ed"
    tree = observation["accessibility_tree"]
    assert set(tree) == {"node_id", "role", "name", "bbox", "text", "attributes", "children"}
    button = tree["children"][0]["children"][0]
    assert button == {"node_id": "btn", "role": "Button", "name": "Save", "bbox": [10, 10, 60, 30], "text": "",
                      "attributes": {"enabled": "true"}, "children": []}
    assert tree["children"][0]["children"][1]["text"] == "hello"
    assert body["history"] == [{"type": "click", "target_node_id": "ed", "reasoning": "focus"}, {"type": "type", "text": "hello"}]
    assert body["last_action_error"] == "typing was slow"
    # Every history entry is itself a valid action in the reply schema.
    assert [BenchmarkAction.model_validate(a).type for a in body["history"]] == [ActionType.CLICK, ActionType.TYPE]


def test_episode_id_changes_per_episode_and_screenshot_can_be_left_out(server: PolicyServer) -> None:
    agent = HttpPolicyAgent(server.url("/click"), send_screenshot=False, include_attributes=False)
    agent.reset(TASK)
    agent.act(TASK, OBSERVATION, [])
    agent.act(TASK, OBSERVATION, [])
    agent.reset(TASK)
    agent.act(TASK, OBSERVATION, [])
    bodies = [b for _, _, b in server.requests[-3:]]
    assert bodies[0]["episode_id"] == bodies[1]["episode_id"] != bodies[2]["episode_id"]
    assert bodies[0]["step"] == 0 and bodies[0]["history"] == [] and bodies[0]["last_action_error"] is None
    assert bodies[0]["observation"]["screenshot_png_base64"] is None
    assert "attributes" not in bodies[0]["observation"]["accessibility_tree"]


def test_usage_in_the_reply_is_reported(server: PolicyServer) -> None:
    agent = HttpPolicyAgent(server.url("/key"))
    action = agent.act(TASK, OBSERVATION, [])
    assert (action.type, action.key, action.modifiers) == (ActionType.KEY, "s", ["ctrl"])
    assert agent.last_usage() == ModelUsage(calls=1, input_tokens=120, output_tokens=7, cost_usd=0.001)


@pytest.mark.parametrize(
    ("path", "message", "raw"),
    [
        ("/malformed", "invalid action: click needs x/y, target_node_id or target_bbox", '{"type": "click"}'),
        ("/unknown-field", r"unknown action field\(s\) \['target_nodeid'\]", '{"type": "done", "target_nodeid": "btn"}'),
        ("/not-json", "not JSON", "CLICK the button"),
    ],
)
def test_invalid_replies_are_unparseable_with_the_raw_body(server: PolicyServer, path: str, message: str, raw: str) -> None:
    agent = HttpPolicyAgent(server.url(path))
    with pytest.raises(UnparseableReplyError, match=message) as info:
        agent.act(TASK, OBSERVATION, [])
    assert info.value.raw_reply == raw


def test_server_error_is_infrastructure_naming_url_and_status(server: PolicyServer) -> None:
    agent = HttpPolicyAgent(server.url("/error"))
    with pytest.raises(AgentInfrastructureError, match=r"policy server http://127\.0\.0\.1:\d+/error answered HTTP 500 \(server error\).*KeyError"):
        agent.act(TASK, OBSERVATION, [])


def test_client_error_is_infrastructure_and_says_so(server: PolicyServer) -> None:
    agent = HttpPolicyAgent(server.url("/forbidden"))
    with pytest.raises(AgentInfrastructureError, match=r"/forbidden answered HTTP 403 for step 0: a client error.*bad token"):
        agent.act(TASK, OBSERVATION, [])


def test_slow_server_times_out_as_infrastructure(server: PolicyServer) -> None:
    agent = HttpPolicyAgent(server.url("/slow"), timeout=0.2)
    # /slow answers "done" after 1 s: the error at all is the timeout applied.
    with pytest.raises(AgentInfrastructureError, match=r"/slow did not answer step 0 within 0\.2 s"):
        agent.act(TASK, OBSERVATION, [])


def test_unreachable_server_is_infrastructure() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    agent = HttpPolicyAgent(f"http://127.0.0.1:{port}/policy", timeout=2)
    with pytest.raises(AgentInfrastructureError, match=rf"policy server http://127\.0\.0\.1:{port}/policy could not be reached"):
        agent.act(TASK, OBSERVATION, [])


def test_secret_headers_come_from_env_and_never_reach_config(server: PolicyServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLICY_AUTH", "Bearer s3cret-value")
    url = server.url("/click") + "?api_key=also-secret"
    agent = HttpPolicyAgent(url, headers_from_env={"Authorization": "POLICY_AUTH"})
    agent.act(TASK, OBSERVATION, [])
    path, headers, _ = server.requests[-1]
    assert path == "/click?api_key=also-secret" and headers["Authorization"] == "Bearer s3cret-value"
    config = json.dumps(agent.config())
    assert "s3cret" not in config and "also-secret" not in config
    assert agent.config()["header_env_vars"] == {"Authorization": "POLICY_AUTH"}
    assert agent.config()["url"].endswith("/click?<redacted>")
    monkeypatch.delenv("POLICY_AUTH")
    with pytest.raises(HttpPolicyConfigError, match="environment variable POLICY_AUTH, which is not set"):
        HttpPolicyAgent(url, headers_from_env={"Authorization": "POLICY_AUTH"})
    with pytest.raises(HttpPolicyConfigError, match="http"):
        HttpPolicyAgent("ftp://example.org/policy")
    assert redact_url("https://user:pw@host:8443/p?token=x#f") == "https://host:8443/p?<redacted>"


class _FakeEnv:
    """The episode loop's environment protocol, with nothing behind it."""

    def __init__(self) -> None:
        self.applied: list[BenchmarkAction] = []

    def observe(self) -> BenchmarkObservation:
        return OBSERVATION

    def apply(self, action: BenchmarkAction) -> None:
        self.applied.append(action)

    def settle(self) -> None:
        pass


@pytest.mark.parametrize(
    ("path", "outcome", "text"),
    [("/error", OutcomeKind.INFRASTRUCTURE_ERROR, "backend failed"), ("/malformed", OutcomeKind.AGENT_FAILURE, "raw reply")],
)
def test_episode_loop_sorts_policy_failures(server: PolicyServer, path: str, outcome: OutcomeKind, text: str) -> None:
    episode = run_episode(_FakeEnv(), HttpPolicyAgent(server.url(path)), TASK, EpisodeLimits(max_steps=3))
    assert episode.final_outcome is outcome and text in (episode.error or "")


# --- the documented schema and example server; end to end on the WAA simulation -------------


DOC = Path(__file__).resolve().parents[2] / "docs" / "http_policy.md"


def _doc_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def _documented_policy() -> Callable[[dict[str, Any]], Reply]:
    """The `decide` function of the example server in docs/http_policy.md, run as documented."""
    (source,) = [b for b in _doc_blocks("python") if "serve_forever" in b]
    namespace: dict[str, Any] = {}
    exec(source.replace("HTTPServer((", "_ = ((").replace(".serve_forever()", ""), namespace)  # noqa: S102 - our own doc
    return lambda body: (200, json.dumps(namespace["decide"](body)))


def test_documented_request_example_matches_the_real_request() -> None:
    (example,) = [json.loads(b) for b in _doc_blocks("json") if '"schema_version"' in b]
    real = build_request(TASK, OBSERVATION, [], episode_id="e")
    assert set(example) == set(real)
    assert set(example["observation"]) == set(real["observation"])
    assert set(example["observation"]["accessibility_tree"]) == set(real["observation"]["accessibility_tree"])
    for line in [b for b in _doc_blocks("json") if '"schema_version"' not in b][0].splitlines():
        parse_reply(line)  # every documented reply example is a valid reply


def test_policy_server_solves_a_bundled_task_on_the_simulation(tmp_path: Path) -> None:
    from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
    from adapters.waa.client import WAAClient
    from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter
    from adapters.waa.localenv.launcher import start_local_env

    sim = start_local_env(tmp_path / "vm")
    try:
        with PolicyServer({"/policy": _documented_policy()}) as policy:
            adapter = WAALiveAdapter(WAAClient(sim.base_url), WAATaskCatalog(bundled_suite_dir()), tmp_path / "cache",
                                     LiveAdapterSettings(settle=SettlePolicy.fixed(0)))
            task = adapter.load_task("explorer-create-projects-folder")
            observation = adapter.reset(task)
            assert adapter.evaluate(task).score == 0.0  # not solved before the policy acts
            agent = HttpPolicyAgent(policy.url("/policy"), timeout=10)
            episode = run_episode(adapter, agent, task, EpisodeLimits(max_steps=8), first_observation=observation)
            assert episode.final_outcome is None, episode.error
            assert [s.action.type for s in episode.steps] == [ActionType.CLICK, ActionType.TYPE, ActionType.KEY, ActionType.DONE]
            assert [s.error for s in episode.steps] == [None] * 4
            result = adapter.evaluate(task)
            assert result.score == 1.0 and result.outcome is OutcomeKind.SUCCESS, result.reason
            first = policy.requests[0][2]
            assert first["task"]["task_id"] == "explorer-create-projects-folder" and first["step"] == 0
            assert base64.b64decode(first["observation"]["screenshot_png_base64"]).startswith(b"\x89PNG")
            assert first["observation"]["viewport"] == [1280, 800] and first["observation"]["window_title"] == "Documents"
            assert [r[2]["step"] for r in policy.requests] == [0, 1, 2, 3]
            adapter.close()
    finally:
        sim.stop()


def test_build_request_reads_a_screenshot_file_when_no_bytes(tmp_path: Path) -> None:
    shot = tmp_path / "s.png"
    shot.write_bytes(b"\x89PNGfile")
    body = build_request(TASK, BenchmarkObservation(screenshot_path=str(shot)), [], episode_id="e")
    assert base64.b64decode(body["observation"]["screenshot_png_base64"]) == b"\x89PNGfile"
    assert body["observation"]["accessibility_tree"] is None and body["observation"]["viewport"] is None
