"""Model-backed agents driven through the REAL openai / anthropic SDKs against fake HTTP servers.

End-to-end runs solve bundled tasks on the local WAA simulation through run_episode; the rest
check the grammar, re-asks, SDK retries (Retry-After honoured), error mapping, usage and cost,
and that the API key never leaks.
"""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from installed import require
from PIL import Image

require("openai", "anthropic")

from fake_model_servers import (  # noqa: E402 - after the check that the SDKs are installed
    Fail,
    FakeModelServer,
    RecordedRequest,
    anthropic_message,
    element_id,
    openai_completion,
    tool_use,
    user_text,
)

from adapters.agents.action_grammar import ActionGrammarError, format_grammar_help, parse_action  # noqa: E402
from adapters.agents.claude_computer_use import (  # noqa: E402
    ClaudeComputerUseAgent,
    xdotool_combo,
)
from adapters.agents.pricing import DEFAULT_PRICES, ModelPrice, PriceTable, cost, price_known  # noqa: E402
from adapters.agents.prompting import AgentConfigError, PromptingAgent, fit_size, tree_text  # noqa: E402
from adapters.benchmark import (  # noqa: E402
    ActionType,
    AgentInfrastructureError,
    BenchmarkAction,
    BenchmarkObservation,
    BenchmarkTask,
    OutcomeKind,
    UIElement,
    UnparseableReplyError,
)
from adapters.episode import EpisodeLimits, run_episode  # noqa: E402
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir  # noqa: E402
from adapters.waa.client import WAAClient  # noqa: E402
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter  # noqa: E402
from adapters.waa.localenv.launcher import LocalEnvHandle  # noqa: E402
from adapters.waa.settle import SettlePolicy

SECRET = "sk-fake-SECRET-7f3a9c1e5b"
KEY_ENV = "WAA_TEST_MODEL_KEY"
PRICES = {"gpt-test": [2.0, 8.0], "claude-test": {"input_per_mtok": 3.0, "output_per_mtok": 15.0}}


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def fake_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, SECRET)
    # keep the SDKs from picking up a developer's real endpoints
    for name in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return SECRET


@pytest.fixture()
def openai_server() -> Iterator[FakeModelServer]:
    with FakeModelServer("openai") as server:
        yield server


@pytest.fixture()
def anthropic_server() -> Iterator[FakeModelServer]:
    with FakeModelServer("anthropic") as server:
        yield server


@pytest.fixture()
def adapter(sim: LocalEnvHandle, tmp_path: Path) -> Iterator[WAALiveAdapter]:
    client = WAAClient(sim.base_url)
    client._session.post(sim.base_url + "/sim/snapshot/load", json={"name": "initial"}, timeout=10)
    yield WAALiveAdapter(client, WAATaskCatalog(bundled_suite_dir()), tmp_path, LiveAdapterSettings(settle=SettlePolicy.fixed(0)))
    client.close()


class RecordingEnv:
    """The adapter as run_episode's environment, remembering the last observation it produced."""

    def __init__(self, adapter: WAALiveAdapter) -> None:
        self.adapter = adapter
        self.last: BenchmarkObservation | None = None

    def observe(self) -> BenchmarkObservation:
        self.last = self.adapter.observe()
        return self.last

    def apply(self, action) -> None:  # noqa: ANN001
        self.adapter.apply(action)

    def settle(self) -> None:
        self.adapter.settle()


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (40, 90, 160)).save(out, format="PNG")
    return out.getvalue()


def _task(instruction: str = "Do the thing.") -> BenchmarkTask:
    return BenchmarkTask(task_id="t-unit", instruction=instruction, domain="unit")


def _observation(width: int = 1280, height: int = 800) -> BenchmarkObservation:
    tree = UIElement(node_id="0", role="desktop", children=[
        UIElement(node_id="7", role="Window", name="Notepad", bbox=(0, 0, width, height), attributes={"visible": "true"}, children=[
            UIElement(node_id="8", role="Edit", name="Text Editor", bbox=(10, 40, 600, 400), attributes={"value": "hi", "focused": "true"}),
            UIElement(node_id="9", role="Button", name="Save", bbox=(10, 10, 60, 30), attributes={"visible": "false"}),
        ]),
    ])
    return BenchmarkObservation(screenshot=_png(width, height), viewport=(width, height), accessibility_tree=tree,
                                window_title="Notepad")


def _anthropic_key(request: RecordedRequest) -> str | None:
    """The key as the anthropic SDK sent it: x-api-key (older SDKs) or Authorization: Bearer (2.x)."""
    bearer = request.header("authorization")
    return request.header("x-api-key") or (bearer.removeprefix("Bearer ") if bearer else None)


def _prompting(server: FakeModelServer, **settings) -> PromptingAgent:
    backend = "openai" if server.kind == "openai" else "anthropic"
    model = "gpt-test" if backend == "openai" else "claude-test"
    base = dict(backend=backend, model=model, base_url=server.url, api_key_env=KEY_ENV, prices=PRICES, max_retries=2)
    return PromptingAgent(**{**base, **settings})


def _computer_use(server: FakeModelServer, **settings) -> ClaudeComputerUseAgent:
    base = dict(model="claude-test", base_url=server.url, api_key_env=KEY_ENV, prices=PRICES, max_retries=2)
    return ClaudeComputerUseAgent(**{**base, **settings})


# -- grammar ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("CLICK([12])", {"type": ActionType.CLICK, "target_node_id": "12"}),
        ("I'll open it.\n```\nDOUBLE_CLICK([0.3.1])\n```", {"type": ActionType.DOUBLE_CLICK, "target_node_id": "0.3.1"}),
        ("right_click(640, 400)", {"type": ActionType.RIGHT_CLICK, "x": 640, "y": 400, "normalized": False}),
        ("CLICK(0.5, 0.25)", {"type": ActionType.CLICK, "x": 0.5, "y": 0.25, "normalized": True}),
        ("CLICK(0, 1)", {"type": ActionType.CLICK, "x": 0, "y": 1, "normalized": False}),
        ('TYPE("line one\\nsay \\"hi\\"")', {"type": ActionType.TYPE, "text": 'line one\nsay "hi"'}),
        ("TYPE('it\\'s')", {"type": ActionType.TYPE, "text": "it's"}),
        ('TYPE("__import__(\'os\').system(\'id\')")', {"type": ActionType.TYPE, "text": "__import__('os').system('id')"}),
        ('TYPE("CLICK([3])")', {"type": ActionType.TYPE, "text": "CLICK([3])"}),
        ('KEY("Enter")', {"type": ActionType.KEY, "key": "Enter", "modifiers": []}),
        ('KEY("ctrl+shift+s")', {"type": ActionType.KEY, "key": "s", "modifiers": ["ctrl", "shift"]}),
        ('SCROLL("down")', {"type": ActionType.SCROLL, "scroll_direction": "down", "scroll_amount": 3}),
        ('SCROLL("up", 5)', {"type": ActionType.SCROLL, "scroll_direction": "up", "scroll_amount": 5}),
        ("DRAG(10, 20, 300, 400)", {"type": ActionType.DRAG, "x": 10, "y": 20, "end_x": 300, "end_y": 400}),
        ("WAIT()", {"type": ActionType.WAIT}),
        ("WAIT(2.5)", {"type": ActionType.WAIT, "seconds": 2.5}),
        ("All set. DONE()", {"type": ActionType.DONE}),
        ("FAIL()", {"type": ActionType.FAIL}),
        ('ANSWER("42")', {"type": ActionType.ANSWER, "answer": "42"}),
        ("First CLICK([1]), then on reflection CLICK([2])", {"type": ActionType.CLICK, "target_node_id": "2"}),
        ("CLICK(here) is wrong; CLICK([5])", {"type": ActionType.CLICK, "target_node_id": "5"}),
    ],
)
def test_grammar_parses_the_last_action(reply: str, expected: dict) -> None:
    action = parse_action(reply)
    for name, value in expected.items():
        assert getattr(action, name) == value, (name, action)
    assert action.raw_action is not None


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ("", "empty"),
        ("I would click the button.", "no action found"),
        ("CLICK(12)", r"CLICK takes \[id\] or x, y"),
        ('TYPE("never closed)', "unterminated string"),
        ('SCROLL("sideways")', "SCROLL takes a direction"),
        ("DRAG(1, 2, 3)", "DRAG takes 4 numbers"),
        ("CLICK(", "not closed"),
        ("DONE(1)", "takes no arguments"),
    ],
)
def test_grammar_errors_are_clear(reply: str, message: str) -> None:
    with pytest.raises(ActionGrammarError, match=message):
        parse_action(reply)
    assert issubclass(ActionGrammarError, ValueError)


def test_grammar_help_names_every_action() -> None:
    text = format_grammar_help()
    for name in ("CLICK([id])", "DOUBLE_CLICK", "RIGHT_CLICK", "TYPE(", "KEY(", "SCROLL(", "DRAG(", "WAIT()", "DONE()", "FAIL()", "ANSWER("):
        assert name in text


# -- pricing ---------------------------------------------------------------------------------


def test_pricing_defaults_overrides_and_unknown_models(caplog: pytest.LogCaptureFixture) -> None:
    assert DEFAULT_PRICES["claude-sonnet-4-5"] == ModelPrice(3.0, 15.0)
    assert cost("claude-sonnet-4-5", 1_000_000, 1_000_000) == pytest.approx(18.0)
    assert cost("claude-sonnet-4-5-20250929", 1000, 0) == pytest.approx(0.003)  # dated snapshot -> alias
    table = PriceTable({"my-model": [1.0, 2.0]})
    assert table.cost("my-model", 500_000, 250_000) == pytest.approx(1.0)
    assert PriceTable('{"gpt-4o": {"input_per_mtok": 1, "output_per_mtok": 1}}').cost("gpt-4o", 10**6, 0) == 1.0
    with caplog.at_level(logging.WARNING):
        assert cost("no-such-model", 10**6, 10**6) == 0.0
        assert cost("no-such-model", 10**6, 10**6) == 0.0
    assert not price_known("no-such-model")
    assert caplog.text.count("no price known for model 'no-such-model'") == 1
    with pytest.raises(ValueError, match="malformed|must be"):
        PriceTable({"bad": "cheap"})


# -- end to end on the local WAA simulation ----------------------------------------------------


def test_prompting_agent_openai_solves_explorer_task(adapter: WAALiveAdapter, openai_server: FakeModelServer) -> None:
    seen: list[str] = []

    def click_new_folder(request: RecordedRequest) -> dict:
        text = user_text(request)
        seen.append(text)
        node = element_id(text, "Button", "New folder")
        return openai_completion(f"The command bar has a New folder button.\n```\nCLICK([{node}])\n```",
                                 prompt_tokens=1200, completion_tokens=30)

    openai_server.add(
        click_new_folder,
        openai_completion('A new folder is being renamed. TYPE("Projects")', prompt_tokens=1300, completion_tokens=25),
        openai_completion('KEY("Enter")', prompt_tokens=1400, completion_tokens=10),
        openai_completion("The folder exists now.\nDONE()", prompt_tokens=1500, completion_tokens=12),
    )
    agent = _prompting(openai_server, observation="a11y_tree", temperature=0.0)
    task = adapter.load_task("explorer-create-projects-folder")
    first = adapter.reset(task)
    outcome = run_episode(adapter, agent, task, EpisodeLimits(max_steps=10), first_observation=first)

    assert not openai_server.errors
    assert outcome.final_outcome is None, outcome.error
    assert [s.action.type for s in outcome.steps] == [ActionType.CLICK, ActionType.TYPE, ActionType.KEY, ActionType.DONE]
    assert adapter.evaluate(task).score == 1.0
    # what the model was given
    first_request = openai_server.requests[0]
    assert first_request.path == "/v1/chat/completions"
    assert first_request.header("authorization") == f"Bearer {SECRET}"
    body = first_request.body
    assert body["model"] == "gpt-test" and body["max_tokens"] == 1024 and body["temperature"] == 0.0
    assert body["messages"][0]["role"] == "system" and "CLICK([id])" in body["messages"][0]["content"]
    assert "Create a new folder named \"Projects\"" in seen[0] and "Previous actions:\n(none yet)" in seen[0]
    assert "1. click [" in user_text(openai_server.requests[1])  # history of previous actions
    # usage and cost summed over the episode
    assert outcome.usage.calls == 4
    assert outcome.usage.input_tokens == 1200 + 1300 + 1400 + 1500
    assert outcome.usage.output_tokens == 30 + 25 + 10 + 12
    assert outcome.usage.cost_usd == pytest.approx((5400 * 2.0 + 77 * 8.0) / 1e6)
    assert outcome.steps[0].usage is not None and outcome.steps[0].usage.input_tokens == 1200


def test_prompting_agent_anthropic_som_solves_notepad_task(adapter: WAALiveAdapter, anthropic_server: FakeModelServer) -> None:
    def click_editor(request: RecordedRequest) -> dict:
        node = element_id(user_text(request), "Edit", "Text Editor")
        return anthropic_message(f"CLICK([{node}])", input_tokens=2000, output_tokens=15)

    anthropic_server.add(
        click_editor,
        anthropic_message('TYPE("call the plumber")', input_tokens=2100, output_tokens=12),
        anthropic_message('Saving now: KEY("ctrl+s")', input_tokens=2200, output_tokens=14),
        anthropic_message("DONE()", input_tokens=2300, output_tokens=5),
    )
    agent = _prompting(anthropic_server, observation="som")
    task = adapter.load_task("notepad-append-line")
    first = adapter.reset(task)
    outcome = run_episode(adapter, agent, task, EpisodeLimits(max_steps=10), first_observation=first)

    assert not anthropic_server.errors
    assert outcome.final_outcome is None, outcome.error
    assert adapter.evaluate(task).score == 1.0
    request = anthropic_server.requests[0]
    assert request.path == "/v1/messages"
    assert _anthropic_key(request) == SECRET and request.header("anthropic-version")
    body = request.body
    assert "CLICK([id])" in body["system"] and "temperature" not in body
    image = next(p for p in body["messages"][0]["content"] if p["type"] == "image")
    assert image["source"]["media_type"] == "image/png"
    png = Image.open(io.BytesIO(base64.b64decode(image["source"]["data"])))
    assert png.size == (1280, 800)  # within both limits: not scaled
    assert "Elements labelled in the screenshot" in user_text(request)
    assert outcome.usage.calls == 4 and outcome.usage.input_tokens == 8600 and outcome.usage.output_tokens == 46
    assert outcome.usage.cost_usd == pytest.approx((8600 * 3.0 + 46 * 15.0) / 1e6)


def test_claude_computer_use_solves_explorer_task_with_scaled_screenshots(
    adapter: WAALiveAdapter, anthropic_server: FakeModelServer
) -> None:
    env = RecordingEnv(adapter)
    sizes: list[tuple[int, int]] = []

    def click_new_folder(request: RecordedRequest) -> dict:
        tool = request.body["tools"][0]
        width, height = tool["display_width_px"], tool["display_height_px"]
        sizes.append((width, height))
        assert env.last is not None
        button = env.last.accessibility_tree.find(role="Button", name="New folder")
        cx, cy = button.center
        screen_w, screen_h = env.last.viewport
        return anthropic_message(tool_use("left_click", say="I will click New folder.",
                                          coordinate=[round(cx * width / screen_w), round(cy * height / screen_h)]),
                                 input_tokens=1500, output_tokens=40)

    def type_name(request: RecordedRequest) -> dict:
        # the conversation is kept: the last user turn is the click's tool_result with a screenshot
        messages = request.body["messages"]
        click_use = next(b for b in messages[-2]["content"] if b["type"] == "tool_use")
        result = messages[-1]["content"][0]
        assert result["type"] == "tool_result" and result["tool_use_id"] == click_use["id"]
        assert any(part["type"] == "image" for part in result["content"]) and "is_error" not in result, result["content"][0]
        return anthropic_message(tool_use("type", say="Naming it.", text="Projects"), input_tokens=1600, output_tokens=30)

    anthropic_server.add(
        anthropic_message(tool_use("screenshot"), input_tokens=1000, output_tokens=20),
        click_new_folder,
        type_name,
        anthropic_message(tool_use("key", say="Press Return to confirm.", text="Return"), input_tokens=1700, output_tokens=30),
        anthropic_message("The Projects folder has been created.", input_tokens=1800, output_tokens=10),
    )
    agent = _computer_use(anthropic_server, max_long_edge=1024)
    task = adapter.load_task("explorer-create-projects-folder")
    first = adapter.reset(task)
    env.last = first
    outcome = run_episode(env, agent, task, EpisodeLimits(max_steps=10), first_observation=first)

    assert not anthropic_server.errors
    assert outcome.final_outcome is None, outcome.error
    assert [s.action.type for s in outcome.steps] == [ActionType.CLICK, ActionType.TYPE, ActionType.KEY, ActionType.DONE]
    assert outcome.steps[2].action.key == "enter"
    assert adapter.evaluate(task).score == 1.0
    # screenshots were scaled to the long-edge limit, aspect kept, and clicks scaled back
    assert sizes == [(1024, 640)]
    click = outcome.steps[0].action
    button = first.accessibility_tree.find(role="Button", name="New folder")
    assert abs(click.x - button.center[0]) <= 2 and abs(click.y - button.center[1]) <= 2
    request = anthropic_server.requests[0]
    assert request.path.startswith("/v1/messages")
    assert request.header("anthropic-beta") == "computer-use-2025-01-24"
    assert request.body["tools"][0]["type"] == "computer_20250124" and request.body["tools"][0]["name"] == "computer"
    first_image = request.body["messages"][0]["content"][1]
    assert Image.open(io.BytesIO(base64.b64decode(first_image["source"]["data"]))).size == (1024, 640)
    # the screenshot request of step 1 was answered at once: two calls in the first step
    assert outcome.steps[0].usage.calls == 2
    assert outcome.usage.calls == 5
    assert outcome.usage.input_tokens == 1000 + 1500 + 1600 + 1700 + 1800
    assert outcome.usage.cost_usd == pytest.approx((outcome.usage.input_tokens * 3.0 + outcome.usage.output_tokens * 15.0) / 1e6)


# -- computer-use mapping ----------------------------------------------------------------------


def test_computer_use_scaling_clamping_and_action_mapping(anthropic_server: FakeModelServer) -> None:
    obs = _observation(2000, 1000)
    anthropic_server.add(
        anthropic_message(tool_use("left_click", coordinate=[758, 379], text="shift")),
        anthropic_message(tool_use("right_click", coordinate=[5000, -20])),
        anthropic_message(tool_use("key", text="ctrl+a ctrl+c")),
        anthropic_message(tool_use("scroll", coordinate=[100, 100], scroll_direction="down", scroll_amount=4)),
        anthropic_message(tool_use("left_click_drag", start_coordinate=[0, 0], coordinate=[1516, 758])),
        anthropic_message(tool_use("triple_click", coordinate=[1, 1])),  # unsupported: answered with an error
        anthropic_message(tool_use("wait", duration=2)),
        anthropic_message("I cannot do this: the font is not installed. INFEASIBLE"),
    )
    agent = _computer_use(anthropic_server)
    task = _task()
    agent.reset(task)
    width, height = fit_size(2000, 1000, 1568, 1_150_000)
    assert width <= 1568 and width * height <= 1_150_000 and abs(width / height - 2.0) < 0.01

    click = agent.act(task, obs, [])
    tool = anthropic_server.requests[0].body["tools"][0]
    assert (tool["display_width_px"], tool["display_height_px"]) == (width, height)
    assert click.type is ActionType.CLICK and click.modifiers == ["shift"]
    assert abs(click.x - 758 * 2000 / width) <= 1 and abs(click.y - 379 * 1000 / height) <= 1
    right = agent.act(task, obs, [])
    assert (right.type, right.x, right.y) == (ActionType.RIGHT_CLICK, 1999, 0)  # clamped into the screen
    select_all, copy = agent.act(task, obs, []), agent.act(task, obs, [])
    assert (select_all.key, select_all.modifiers, copy.key, copy.modifiers) == ("a", ["ctrl"], "c", ["ctrl"])
    scroll = agent.act(task, obs, [])
    assert (scroll.type, scroll.scroll_direction, scroll.scroll_amount) == (ActionType.SCROLL, "down", 4)
    drag = agent.act(task, obs, [])
    assert drag.type is ActionType.DRAG and (drag.x, drag.y) == (0, 0) and drag.end_x >= 1990
    wait = agent.act(task, obs, [])  # the triple_click was refused inside this act, then wait came
    assert wait.type is ActionType.WAIT and wait.seconds == 2
    refused = anthropic_server.requests[6].body["messages"][-1]["content"][0]
    assert refused["is_error"] is True and "triple_click is not supported" in refused["content"][0]["text"]
    final = agent.act(task, obs, [])
    assert final.type is ActionType.FAIL
    assert len(anthropic_server.requests) == 8
    # two key presses from one tool call share one tool_result
    key_results = anthropic_server.requests[3].body["messages"][-1]["content"]
    assert len(key_results) == 1 and key_results[0]["type"] == "tool_result"


def test_xdotool_key_names() -> None:
    assert xdotool_combo("Return") == ("enter", [])
    assert xdotool_combo("ctrl+s") == ("s", ["ctrl"])
    assert xdotool_combo("ctrl+shift+Escape") == ("esc", ["ctrl", "shift"])
    assert xdotool_combo("alt+Tab") == ("tab", ["alt"])
    assert xdotool_combo("Page_Down") == ("pagedown", [])
    assert xdotool_combo("super") == ("win", [])
    assert xdotool_combo("KP_5") == ("num5", [])
    assert xdotool_combo("F5") == ("f5", [])
    with pytest.raises(ValueError):
        xdotool_combo("a+b")


def test_computer_use_ends_with_done_and_resets(anthropic_server: FakeModelServer) -> None:
    anthropic_server.add(anthropic_message("Nothing to do, all finished."), anthropic_message("Done again."))
    agent = _computer_use(anthropic_server)
    task = _task()
    agent.reset(task)
    assert agent.act(task, _observation(), []).type is ActionType.DONE
    agent.reset(task)
    agent.act(task, _observation(), [])
    assert len(anthropic_server.requests[1].body["messages"]) == 1  # a new conversation after reset


# -- re-asks, retries, failures ---------------------------------------------------------------


def test_unparseable_reply_is_reasked_then_fails_with_the_raw_reply(openai_server: FakeModelServer) -> None:
    openai_server.add(*[openai_completion(f"I am not sure what to do ({i}).") for i in range(3)])
    agent = _prompting(openai_server, max_reasks=2)
    with pytest.raises(UnparseableReplyError) as info:
        agent.act(_task(), _observation(), [])
    assert info.value.raw_reply == "I am not sure what to do (2)."
    assert len(openai_server.requests) == 3
    reask = openai_server.requests[2].body["messages"]
    assert [m["role"] for m in reask] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "could not find a valid action" in reask[3]["content"] and "no action found" in reask[3]["content"]
    assert agent.last_usage().calls == 3 and agent.last_usage().input_tokens == 300


def test_reask_that_succeeds(anthropic_server: FakeModelServer) -> None:
    anthropic_server.add(anthropic_message("Click the editor"), anthropic_message("Sorry: CLICK([8])"))
    agent = _prompting(anthropic_server, observation="screenshot_a11y_tree")
    action = agent.act(_task(), _observation(), [])
    assert action.target_node_id == "8" and agent.last_usage().calls == 2
    text = user_text(anthropic_server.requests[0])
    assert '[8] Edit "Text Editor" value=\'hi\' (focused)' in text and "Save" not in text  # invisible element hidden


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_rate_limit_retry_after_is_honoured(kind: str) -> None:
    ok = openai_completion("DONE()") if kind == "openai" else anthropic_message("DONE()")
    # Longer than the SDKs' own first back-off (at most 0.5 s), so the wait shows which one ruled.
    with FakeModelServer(kind, [Fail(429, retry_after=2.0), ok]) as server:
        agent = _prompting(server, max_retries=2)
        action = agent.act(_task(), _observation(), [])
    assert action.type is ActionType.DONE
    assert len(server.requests) == 2
    waited = server.requests[1].at - server.requests[0].at
    assert waited >= 2.0, waited  # the SDK waited what retry-after said, not its own back-off
    assert agent.last_usage().calls == 1


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_persistent_server_error_is_an_infrastructure_error(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with FakeModelServer(kind, [Fail(500, retry_after=0.05, message="boom")] * 3) as server:
        agent = _prompting(server, max_retries=2)
        with pytest.raises(AgentInfrastructureError) as info:
            agent.act(_task(), _observation(), [])
    message = str(info.value)
    assert "HTTP 500" in message and server.url.split("/v1")[0] in message and kind in message
    assert len(server.requests) == 3  # one try and the SDK's two retries
    assert SECRET not in message and SECRET not in repr(info.value)
    assert SECRET not in caplog.text


def test_unreachable_endpoint_is_an_infrastructure_error() -> None:
    with FakeModelServer("openai") as server:
        url = server.url
    agent = PromptingAgent(backend="openai", model="gpt-test", base_url=url, api_key_env=KEY_ENV, max_retries=0,
                           timeout_seconds=5)
    with pytest.raises(AgentInfrastructureError, match="unreachable"):
        agent.act(_task(), _observation(), [])


def test_computer_use_errors_and_episode_outcome(anthropic_server: FakeModelServer) -> None:
    anthropic_server.add(Fail(529, retry_after=0.05), Fail(529, retry_after=0.05))
    agent = _computer_use(anthropic_server, max_retries=1)

    class StaticEnv:
        def observe(self) -> BenchmarkObservation:
            return _observation()

        def apply(self, action) -> None:  # noqa: ANN001
            pass

        def settle(self) -> None:
            pass

    outcome = run_episode(StaticEnv(), agent, _task(), EpisodeLimits(max_steps=3))
    assert outcome.final_outcome is OutcomeKind.INFRASTRUCTURE_ERROR
    assert "HTTP 529" in outcome.error and SECRET not in outcome.error


# -- secrets ----------------------------------------------------------------------------------


def test_api_key_never_leaks(openai_server: FakeModelServer, anthropic_server: FakeModelServer,
                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    openai_server.add(openai_completion("CLICK([8])"), Fail(401, message="bad key"))
    anthropic_server.add(anthropic_message(tool_use("type", text="x")), Fail(400, message="bad request"))
    agents = [_prompting(openai_server), _computer_use(anthropic_server)]
    texts: list[str] = []
    for agent in agents:
        agent.reset(_task())
        agent.act(_task(), _observation(), [])
        with pytest.raises(AgentInfrastructureError) as info:
            agent.act(_task(), _observation(), [])
        texts += [str(agent.config()), repr(agent), str(info.value), repr(info.value)]
        assert agent.config()["model"] in ("gpt-test", "claude-test")
        assert not any("key" in k.lower() for k in agent.config())
    assert all(SECRET not in t for t in texts)
    assert SECRET not in caplog.text
    # the key was really sent, from the variable the setting named
    assert openai_server.requests[0].header("authorization") == f"Bearer {SECRET}"
    assert _anthropic_key(anthropic_server.requests[0]) == SECRET


def test_missing_keys(monkeypatch: pytest.MonkeyPatch, openai_server: FakeModelServer) -> None:
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(AgentConfigError, match=KEY_ENV):
        PromptingAgent(backend="anthropic", model="claude-test", api_key_env=KEY_ENV, base_url="http://127.0.0.1:9")
    with pytest.raises(AgentConfigError, match=KEY_ENV):
        ClaudeComputerUseAgent(api_key_env=KEY_ENV, base_url="http://127.0.0.1:9")
    # a self-hosted OpenAI-compatible server (vLLM, SGLang) needs no key
    openai_server.add(openai_completion("WAIT()"))
    agent = PromptingAgent(backend="openai", model="local-model", base_url=openai_server.url, api_key_env=KEY_ENV)
    assert agent.act(_task(), _observation(), []).type is ActionType.WAIT
    assert openai_server.requests[0].header("authorization") == "Bearer EMPTY"
    assert agent.last_usage().cost_usd == 0.0 and agent.config()["price_per_mtok"] is None


def test_config_and_tree_text(openai_server: FakeModelServer) -> None:
    agent = _prompting(openai_server, observation="som", max_tokens=333, temperature=0.2)
    config = agent.config()
    assert {k: config[k] for k in ("backend", "model", "observation", "max_tokens", "temperature")} == {
        "backend": "openai", "model": "gpt-test", "observation": "som", "max_tokens": 333, "temperature": 0.2}
    assert config["base_url"].startswith(openai_server.url) and config["prompt_version"]
    assert config["price_per_mtok"] == [2.0, 8.0]
    text = tree_text(_observation().accessibility_tree)
    assert text.splitlines()[0].startswith('[7] Window "Notepad"')
    assert text.splitlines()[1].startswith('  [8] Edit "Text Editor"')


@pytest.mark.parametrize("action", [
    BenchmarkAction(type=ActionType.CLICK, x=10, y=20),
    BenchmarkAction(type=ActionType.DOUBLE_CLICK, x=0.5, y=1.0, normalized=True),
    BenchmarkAction(type=ActionType.RIGHT_CLICK, target_node_id="12"),
    BenchmarkAction(type=ActionType.TYPE, text='a "quoted"\nline ünï \\ CLICK([3])'),
    BenchmarkAction(type=ActionType.KEY, key="s", modifiers=["ctrl", "shift"]),
    BenchmarkAction(type=ActionType.SCROLL, scroll_direction="up", scroll_amount=5),
    BenchmarkAction(type=ActionType.DRAG, x=1, y=2, end_x=3, end_y=4.5),
    BenchmarkAction(type=ActionType.WAIT, seconds=2),
    BenchmarkAction(type=ActionType.DONE),
    BenchmarkAction(type=ActionType.FAIL),
    BenchmarkAction(type=ActionType.ANSWER, answer="42 (\"exactly\")"),
])
def test_format_action_is_read_back_by_the_parser(action: BenchmarkAction) -> None:
    from adapters.agents.action_grammar import format_action

    text = format_action(action)
    assert parse_action(text).model_dump(exclude={"raw_action", "reasoning"}) == \
        action.model_dump(exclude={"raw_action", "reasoning"}), text
