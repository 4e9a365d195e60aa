"""The settle wait: a screen that changes on a timeline, watched with a virtual clock; then the
live adapter with adaptive settling and observation needs against the local WAA simulation."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from PIL import Image, ImageDraw

from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkTask, ObservationNeeds, OutcomeKind
from adapters.episode import EpisodeLimits, run_episode
from adapters.agents.claude_computer_use import ClaudeComputerUseAgent
from adapters.agents.random_agent import RandomAgent
from adapters.agents.scripted import ScriptedAgent
from adapters.agents.prompting import PromptingAgent
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.client import WAAClient
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter
from adapters.waa.localenv.launcher import LocalEnvHandle
from adapters.waa.settle import SettlePolicy, settle

W, H = 640, 400


def _screen(label: int | None = None, caret: bool = False, pointer: tuple[int, int] | None = None) -> bytes:
    """A desktop; `label` draws a window in a colour of its own, `caret` a blinking text caret,
    `pointer` a mouse pointer there."""
    image = Image.new("RGB", (W, H), (30, 60, 110))
    draw = ImageDraw.Draw(image)
    if label is not None:
        draw.rectangle((100, 80, 500, 320), fill=((40 * label) % 256, 200, (90 + 70 * label) % 256))
    if caret:
        draw.rectangle((120, 100, 121, 116), fill=(0, 0, 0))
    if pointer is not None:
        x, y = pointer
        draw.polygon([(x, y), (x, y + 18), (x + 12, y + 13)], fill=(255, 255, 255))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


class Timeline:
    """A virtual clock and a screen that shows `frames[i]` from time `at[i]` on."""

    def __init__(self, frames: list[tuple[float, bytes]], capture_seconds: float = 0.02) -> None:
        self.now = 0.0
        self.frames = frames
        self.capture_seconds = capture_seconds
        self.captured: list[bytes] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def capture(self) -> bytes:
        shown = [png for at, png in self.frames if at <= self.now][-1]
        self.now += self.capture_seconds  # a capture takes time too
        self.captured.append(shown)
        return shown


def _settle(timeline: Timeline, action: ActionType, policy: SettlePolicy | None = None):
    before = timeline.frames[0][1]
    return settle(timeline.capture, before, action, policy or SettlePolicy(), clock=timeline.clock, sleep=timeline.sleep)


def test_waits_for_a_late_change_and_its_transition_then_observes_the_final_screen() -> None:
    final = _screen(3)
    timeline = Timeline([(0.0, _screen()), (1.2, _screen(1)), (1.3, _screen(2)), (1.4, final)])
    result = _settle(timeline, ActionType.CLICK)
    assert result.screenshot == final and result.changed and not result.capped
    # Still for the quiet time after the last frame, and not much longer.
    assert 1.4 + 0.5 <= result.seconds <= 1.4 + 0.5 + 0.3


def test_a_quick_change_settles_long_before_the_fixed_three_seconds() -> None:
    timeline = Timeline([(0.0, _screen()), (0.08, _screen(1))])
    result = _settle(timeline, ActionType.KEY)
    assert result.changed and result.seconds < 1.0


def test_no_visible_change_waits_the_change_wait_then_observes() -> None:
    timeline = Timeline([(0.0, _screen())])
    result = _settle(timeline, ActionType.CLICK)
    assert not result.changed and not result.capped
    assert 3.0 <= result.seconds <= 3.0 + 0.3  # WAA's 3 s pause, then it is already still


def test_caret_blink_and_pointer_are_not_changes() -> None:
    frames = [(0.0, _screen(1, caret=True))]
    frames += [(0.53 * k, _screen(1, caret=k % 2 == 0, pointer=(300, 200))) for k in range(1, 12)]
    for text in (None, "ab"):  # a short text's effect size stays above a caret and a pointer
        result = _settle_text(frames, text)
        assert not result.changed and not result.capped and 3.0 <= result.seconds < 3.4


def _typed(text: str) -> bytes:
    """A window with `text` written in it, as an editor shows typed text."""
    image = Image.open(io.BytesIO(_screen(1)))
    ImageDraw.Draw(image).text((120, 100), text, fill=(0, 0, 0))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _settle_text(frames: list[tuple[float, bytes]], text: str | None):
    timeline = Timeline(frames)
    return settle(timeline.capture, frames[0][1], ActionType.TYPE, SettlePolicy(), text=text,
                  clock=timeline.clock, sleep=timeline.sleep)


LINE = "The quick brown fox jumps over the lazy dog"


def test_typed_text_that_shows_at_once_settles_fast() -> None:
    result = _settle_text([(0.0, _screen(1)), (0.01, _typed(LINE))], LINE)
    assert result.changed and result.screenshot == _typed(LINE) and result.seconds < 1.0


@pytest.mark.parametrize("late", [0.8, 2.0, 2.98, 3.0])
def test_typed_text_repainted_late_is_never_observed_stale(late: float) -> None:
    """An application that repaints up to WAA's 3 s after the keystrokes: the observation shows
    the text (the change wait counts from when a capture is asked for, so a repaint right at
    its end is seen too)."""
    result = _settle_text([(0.0, _screen(1)), (late, _typed(LINE))], LINE)
    assert result.changed and result.screenshot == _typed(LINE), late
    assert late <= result.seconds <= late + 0.5 + 0.3


def test_a_capture_asked_for_before_the_change_wait_ends_does_not_end_it() -> None:
    """A slow screenshot (0.35 s) taken from 2.85 s shows the screen before a repaint at 3.0 s;
    it ends after the change wait but must not count as the conclusion that nothing changed."""
    frames = [(0.0, _screen(1)), (3.0, _typed(LINE))]
    timeline = Timeline(frames, capture_seconds=0.35)
    result = settle(timeline.capture, frames[0][1], ActionType.TYPE, SettlePolicy(), text=LINE,
                    clock=timeline.clock, sleep=timeline.sleep)
    assert result.changed and result.screenshot == _typed(LINE)


def test_a_screen_that_never_stands_still_is_observed_at_the_cap() -> None:
    frames = [(0.0, _screen())] + [(0.15 * k, _screen(k % 5 + 1)) for k in range(1, 80)]
    result = _settle(Timeline(frames), ActionType.CLICK, SettlePolicy(cap_seconds=4.0))
    assert result.capped and 4.0 <= result.seconds <= 4.3


def test_fixed_pause_sleeps_and_captures_nothing() -> None:
    timeline = Timeline([(0.0, _screen())])
    result = _settle(timeline, ActionType.CLICK, SettlePolicy.fixed(3))
    assert result.screenshot is None and result.captures == 0 and timeline.captured == []
    assert result.seconds == pytest.approx(3.0)


def test_without_a_before_screenshot_a_change_cannot_short_cut_the_wait() -> None:
    timeline = Timeline([(0.0, _screen()), (0.1, _screen(1))])
    result = settle(timeline.capture, None, ActionType.TYPE, SettlePolicy(), clock=timeline.clock, sleep=timeline.sleep)
    assert result.screenshot == _screen(1) and result.seconds >= 0.5


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="fixed pause"):
        SettlePolicy.fixed(-1)
    with pytest.raises(ValueError, match="quiet_seconds"):
        SettlePolicy(quiet_seconds=-0.1)


# -- the live adapter against the simulation ---------------------------------------------


@pytest.fixture()
def client(sim: LocalEnvHandle) -> Iterator[WAAClient]:
    c = WAAClient(sim.base_url)
    requests.post(sim.base_url + "/sim/snapshot/load", json={"name": "initial"}, timeout=10)
    yield c
    requests.post(sim.base_url + "/sim/faults", json={"faults": []}, timeout=10)
    c.close()


def _notepad() -> BenchmarkTask:
    return BenchmarkTask(
        task_id="t-notepad", instruction="type", domain="notepad",
        raw_config={"config": [{"type": "launch", "parameters": {"command": "notepad"}}]},
        evaluation_spec={"func": "exact_match", "result": {"type": "rule", "rules": {}}, "expected": {"type": "rule", "rules": {}}},
    )


def test_adaptive_settle_on_the_simulation_observes_the_typed_text(client: WAAClient, tmp_path: Path) -> None:
    adapter = WAALiveAdapter(client, WAATaskCatalog(bundled_suite_dir()), tmp_path, LiveAdapterSettings())
    observation = adapter.reset(_notepad())
    editor = observation.accessibility_tree.find(role="Edit", name="Text Editor")
    adapter.step(BenchmarkAction(type=ActionType.CLICK, target_node_id=editor.node_id))
    text = "The quick brown fox jumps over the lazy dog, twice: the quick brown fox jumps over the lazy dog."
    observation, done, info = adapter.step(BenchmarkAction(type=ActionType.TYPE, text=text))
    assert not done and "error" not in info
    settled = observation.raw_observation["settle"]
    assert settled["changed"] and not settled["capped"]  # ended when the screen stood still, not at its cap
    # The observation's screenshot is the settle wait's last capture, and it shows the text.
    assert observation.screenshot == client.screenshot()
    assert observation.accessibility_tree.find(role="Edit", name="Text Editor").attributes["value"] == text


@pytest.mark.parametrize(
    ("make", "tree", "window"),
    [
        (lambda: ClaudeComputerUseAgent(), False, False),
        (lambda: RandomAgent(), False, False),
        (lambda: ScriptedAgent({}), True, False),
        (lambda: PromptingAgent(backend="openai", observation="screenshot"), False, True),
        (lambda: PromptingAgent(backend="openai", observation="som"), True, True),
    ],
    ids=["claude", "random", "scripted", "prompting-screenshot", "prompting-som"],
)
def test_agents_declare_what_they_read(make, tree: bool, window: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    assert make().observation_needs() == ObservationNeeds(accessibility_tree=tree, window=window)


def test_routes_the_agent_does_not_read_are_never_called(client: WAAClient, sim: LocalEnvHandle, tmp_path: Path) -> None:
    """A screenshot-only agent plays an episode while /accessibility and /obs_winagent fail
    every call: had the adapter fetched them, the episode would end as an infrastructure error."""
    adapter = WAALiveAdapter(client, WAATaskCatalog(bundled_suite_dir()), tmp_path, LiveAdapterSettings(settle=SettlePolicy.fixed(0)))
    adapter.reset(_notepad())
    requests.post(sim.base_url + "/sim/faults", json={"faults": [
        {"route": "/accessibility", "status": 500}, {"route": "/obs_winagent", "status": 500}]}, timeout=10)
    adapter.needs = RandomAgent().observation_needs()
    outcome = run_episode(adapter, RandomAgent(seed=3), _notepad(), EpisodeLimits(max_steps=4))
    assert outcome.final_outcome is None, outcome.error
    assert len(outcome.steps) == 4 and all(step.window_title is None for step in outcome.steps)
    # The same faults with an agent that reads the tree: the server's failure is infrastructure.
    adapter.needs = ObservationNeeds()
    outcome = run_episode(adapter, RandomAgent(seed=3), _notepad(), EpisodeLimits(max_steps=4))
    assert outcome.final_outcome is OutcomeKind.INFRASTRUCTURE_ERROR


def test_concurrent_and_sequential_reads_give_the_same_observation(client: WAAClient, tmp_path: Path) -> None:
    observations = []
    for concurrent in (True, False):
        requests.post(client.base_url + "/sim/snapshot/load", json={"name": "initial"}, timeout=10)
        adapter = WAALiveAdapter(client, WAATaskCatalog(bundled_suite_dir()), tmp_path,
                                 LiveAdapterSettings(settle=SettlePolicy.fixed(0), concurrent_reads=concurrent))
        observations.append(adapter.reset(_notepad()))
    first, second = observations
    assert first.window_title == second.window_title == "Untitled - Notepad"
    assert first.accessibility_tree == second.accessibility_tree and first.screenshot == second.screenshot


def test_a_slowly_repainting_application_is_never_observed_stale(tmp_path: Path) -> None:
    """The simulation's slow-repaint mode: screen and tree show a typing step's text only 2.5 s
    after it. The adaptive settle observes the text; observing at once would not."""
    from adapters.waa.localenv.launcher import start_local_env

    handle = start_local_env(tmp_path / "sim", quirks=True, quirk_settings={
        "ready_delay": 0, "accessibility_delay": 0, "launch_delay": 0, "failsafe": False, "repaint_delay": 2.5})
    try:
        for policy, stale in ((SettlePolicy(), False), (SettlePolicy.fixed(0), True)):
            requests.post(handle.base_url + "/sim/snapshot/load", json={"name": "initial"}, timeout=10)
            adapter = WAALiveAdapter(WAAClient(handle.base_url), WAATaskCatalog(bundled_suite_dir()), tmp_path,
                                     LiveAdapterSettings(settle=policy))
            observation = adapter.reset(_notepad())
            editor = observation.accessibility_tree.find(role="Edit", name="Text Editor")
            adapter.step(BenchmarkAction(type=ActionType.CLICK, target_node_id=editor.node_id))
            observation, _, info = adapter.step(BenchmarkAction(type=ActionType.TYPE, text="typed but drawn late"))
            shown = observation.accessibility_tree.find(role="Edit", name="Text Editor").attributes["value"]
            assert (shown == "") is stale, (policy.describe(), shown)
            if not stale:
                assert observation.raw_observation["settle"]["changed"]
                assert 2.5 <= observation.raw_observation["settle"]["seconds"], observation.raw_observation["settle"]
            adapter.close()
    finally:
        handle.stop()


# -- live regions: a screen that never stands still ------------------------------------------


class LiveTimeline(Timeline):
    """The simulation's own screen on a virtual clock: Notepad before an action until `delay`,
    after it from then on, with the live regions of quirks mode (a caret blinking every 530 ms,
    a turning progress ring, a clock with seconds) drawn at each capture's time, or none."""

    EPOCH = 1_700_000_000.0 + 37.3

    def __init__(self, kind: str, text: str, delay: float, live: bool = True) -> None:
        from adapters.waa.localenv.desktop import Desktop
        from adapters.waa.localenv.filesystem import SimFileSystem
        from adapters.waa.localenv.launch import launch

        self._root = __import__("tempfile").TemporaryDirectory()
        fs = SimFileSystem(Path(self._root.name))
        fs.initialise()
        self.before_desk = Desktop(fs)
        launch(self.before_desk, "notepad")
        self.after_desk = Desktop(fs)
        self.after_desk.restore(self.before_desk.capture())
        window = self.after_desk.windows[-1]
        if kind == "type":
            window.on_text(self.after_desk, text)
        else:
            window.on_click(self.after_desk, "menu:File", double=False, button="left")
        self.delay, self.live = delay, live
        super().__init__([], capture_seconds=0.03)
        self.shown_after: list[bool] = []

    def frame(self, at: float) -> bytes:
        from adapters.waa.localenv.render import png_bytes, render

        desk = self.after_desk if at >= self.delay else self.before_desk
        return png_bytes(render(desk, live_at=self.EPOCH + at if self.live else None))

    def capture(self) -> bytes:
        png = self.frame(self.now)
        self.shown_after.append(self.now >= self.delay)
        self.now += self.capture_seconds
        return png


def _settle_live(timeline: LiveTimeline, kind: str, text: str, think: float,
                 live: "LiveRegions | None" = None):
    from adapters.waa.settle import LiveRegions

    action = ActionType.TYPE if kind == "type" else ActionType.CLICK
    return settle(timeline.capture, timeline.frame(-think), action, SettlePolicy(),
                  text=text if kind == "type" else None, live=live if live is not None else LiveRegions(),
                  clock=timeline.clock, sleep=timeline.sleep)


@pytest.mark.parametrize(("kind", "delay", "think"), [
    ("type", 1.5, 0.0), ("type", 2.2, 4.0), ("type", 3.0, 40.0),
    ("click", 1.5, 12.0), ("click", 2.2, 0.0), ("click", 3.0, 70.0),
])
def test_live_regions_beside_a_late_repaint_never_make_a_stale_observation(kind: str, delay: float,
                                                                          think: float) -> None:
    """A caret, a progress ring and a seconds clock change more cells than typing "hello" or
    opening a menu does; the effect repaints 1.5-3 s late, and the screenshot the agent acted on
    is `think` seconds old (the clock ticked meanwhile). Nothing was learned beforehand (the
    first step): the settle still observes the repainted screen."""
    timeline = LiveTimeline(kind, "hello", delay)
    result = _settle_live(timeline, kind, "hello", think)
    assert timeline.shown_after[-1], f"stale: observed at {result.seconds:.2f} s, repaint at {delay} s"
    assert not result.capped and result.live_cells > 0


@pytest.mark.parametrize("kind", ["type", "click"])
def test_where_nothing_moves_the_wait_is_the_quiet_time_after_the_effect(kind: str) -> None:
    """No live region: the effect at 1 s is observed after the quiet time, as before live
    regions were handled (not after the longer hold that unknown live regions need)."""
    timeline = LiveTimeline(kind, "The quick brown fox", 1.0, live=False)
    result = _settle_live(timeline, kind, "The quick brown fox", 0.0)
    assert result.changed and timeline.shown_after[-1] and result.live_cells == 0
    assert 1.0 + 0.5 <= result.seconds <= 1.0 + 0.5 + 0.15


def test_live_regions_learned_before_the_action_cost_no_longer_hold() -> None:
    """Frames taken before the action (while the agent thinks) teach where the screen moves by
    itself; the effect is then observed after the usual quiet time, not the longer hold."""
    from adapters.waa.settle import LIVE_HOLD_SECONDS, LiveRegions

    timeline = LiveTimeline("type", "The quick brown fox", 1.0)
    live = LiveRegions()
    frames = [timeline.frame(-3.0 + 0.45 * k) for k in range(6)]
    for earlier, later in zip(frames, frames[1:]):
        live.learn_frames(earlier, later)
    result = _settle_live(timeline, "type", "The quick brown fox", 0.0, live)
    assert result.changed and timeline.shown_after[-1]
    assert result.seconds < 1.0 + LIVE_HOLD_SECONDS


def _actions_shown(png: bytes) -> tuple[int, int]:
    """(actions the frame shows, actions run) as the simulation labels its screenshots."""
    with Image.open(io.BytesIO(png)) as image:
        return int(image.text["sim-actions-shown"]), int(image.text["sim-actions-run"])  # type: ignore[attr-defined]


def test_typing_and_clicking_beside_live_regions_on_the_simulation_is_never_observed_stale(tmp_path: Path) -> None:
    """The simulation with quirks live_regions and a 2 s repaint, through the live adapter:
    every observation after typing or clicking shows every action sent (the frame's label)."""
    from adapters.waa.localenv.launcher import start_local_env

    handle = start_local_env(tmp_path / "sim", quirks=True, quirk_settings={
        "ready_delay": 0, "accessibility_delay": 0, "launch_delay": 0, "failsafe": False, "repaint_delay": 2.0,
        "live_regions": True})
    try:
        adapter = WAALiveAdapter(WAAClient(handle.base_url), WAATaskCatalog(bundled_suite_dir()), tmp_path,
                                 LiveAdapterSettings())
        observation = adapter.reset(_notepad())
        stale = []
        for step in range(5):
            if step % 2:
                menu = observation.accessibility_tree.find(role="MenuItem", name="File")
                action = BenchmarkAction(type=ActionType.CLICK, target_node_id=menu.node_id)
            else:
                action = BenchmarkAction(type=ActionType.TYPE, text=f"hi {step}")
            observation, _, info = adapter.step(action)
            assert "error" not in info
            shown, run = _actions_shown(observation.screenshot or b"")
            if shown < run:
                stale.append((step, observation.raw_observation["settle"]))
        adapter.close()
    finally:
        handle.stop()
    assert stale == []
