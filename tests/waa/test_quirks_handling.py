"""The adapter against the simulation in quirks mode: each real-server quirk is handled, and
unreachable, dying or hanging servers end as infrastructure errors naming the route, in time."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.agents.scripted import ScriptedAgent, load_plans
from adapters.benchmark import (
    ActionType,
    BenchmarkAction,
    BenchmarkAgent,
    BenchmarkObservation,
    BenchmarkTask,
    OutcomeKind,
    StepRecord,
)
from adapters.episode import EpisodeLimits, run_episode
from adapters.vms.base import ProviderError
from adapters.vms.local import LocalSimulationProvider
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.client import WAAClient, WAATimeouts
from adapters.waa.errors import WAAConnectionError, WAAHTTPError
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter
from adapters.waa.localenv.launcher import start_local_env
from adapters.waa.settle import SettlePolicy

CATALOG = WAATaskCatalog(bundled_suite_dir())
PLANS = load_plans(bundled_suite_dir() / "solutions.json")
QUIRKS = {"ready_delay": 1.0, "accessibility_delay": 0.05, "launch_delay": 0.3, "failsafe": True}


@pytest.fixture(scope="module")
def quirky(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalSimulationProvider, str]]:
    provider = LocalSimulationProvider(tmp_path_factory.mktemp("quirky"), quirks=True, quirk_settings=QUIRKS)
    started = time.monotonic()
    vm = provider.create("quirky")
    assert time.monotonic() - started >= QUIRKS["ready_delay"]  # create waited for readiness
    yield provider, vm.base_url
    provider.close()


def _adapter(base_url: str, tmp_path: Path) -> WAALiveAdapter:
    client = WAAClient(base_url)
    client._session.post(base_url + "/sim/snapshot/load", json={"name": "initial"}, timeout=10)
    return WAALiveAdapter(client, CATALOG, tmp_path, LiveAdapterSettings(settle=SettlePolicy.fixed(0), launch_verify_seconds=5))


def test_bundled_suite_scores_100_percent_in_quirks_mode(quirky: tuple[LocalSimulationProvider, str], tmp_path: Path) -> None:
    _, base_url = quirky
    scores = {}
    for task in CATALOG.tasks():
        adapter = _adapter(base_url, tmp_path)
        observation = adapter.reset(task)
        episode = run_episode(adapter, ScriptedAgent(PLANS), task, EpisodeLimits(), first_observation=observation)
        assert episode.final_outcome is None, (task.task_id, episode.error)
        scores[task.task_id] = adapter.evaluate(task).score
    assert scores == {t: 1.0 for t in CATALOG.task_ids()}


def test_delayed_readiness_is_waited_for(tmp_path: Path) -> None:
    handle = start_local_env(tmp_path, quirks=True, wait_ready=False, quirk_settings={"ready_delay": 1.0})
    try:
        client = WAAClient(handle.base_url)
        assert client.probe() is False
        with pytest.raises(WAAConnectionError, match="/probe: server not ready"):
            client.wait_until_ready(0.2, poll_seconds=0.05)
        assert client.wait_until_ready(10, poll_seconds=0.1) > 0.5
    finally:
        handle.stop()


def test_a_simulation_that_never_gets_ready_is_not_left_running(tmp_path: Path) -> None:
    provider = LocalSimulationProvider(tmp_path, quirks=True, quirk_settings={"ready_delay": 60.0}, ready_timeout=0.5)
    with pytest.raises(ProviderError, match="local VM slow: simulation did not start") as failed:
        provider.create("slow")
    try:
        (line,) = [line for line in (tmp_path / "slow.log").read_text().splitlines() if "listening on" in line]
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        # The process it started is gone: nothing listens on its port any more.
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        assert "/probe" in str(failed.value)
    finally:
        provider.close()


def test_slow_accessibility_within_and_beyond_the_timeout(quirky: tuple[LocalSimulationProvider, str]) -> None:
    _, base_url = quirky
    assert "<desktop" in WAAClient(base_url).accessibility()
    impatient = WAAClient(base_url, timeouts=WAATimeouts(accessibility=0.02), read_retries=1, backoff_seconds=0.01)
    with pytest.raises(WAAConnectionError, match="/accessibility: no answer within 0.02 s"):
        impatient.accessibility()


def test_failsafe_is_recovered_from(quirky: tuple[LocalSimulationProvider, str], tmp_path: Path) -> None:
    _, base_url = quirky
    adapter = _adapter(base_url, tmp_path)
    task = CATALOG.load("explorer-create-projects-folder")
    observation = adapter.reset(task)
    address = observation.accessibility_tree.find(role="Edit", name="Address")
    adapter.apply(BenchmarkAction(type=ActionType.CLICK, target_node_id=address.node_id))  # marks now sent
    adapter.client.execute_windows("computer.mouse.move_abs(0, 0)")  # pointer parked in a corner
    with pytest.raises(WAAHTTPError, match="fail-safe"):
        adapter.client.execute_windows("computer.mouse.single_click()")
    button = adapter.observe().accessibility_tree.find(role="Button", name="New folder")
    adapter.apply(BenchmarkAction(type=ActionType.CLICK, target_node_id=button.node_id))
    items = adapter.observe().accessibility_tree.find(role="List", name="Items View")
    assert any(child.name.startswith("New folder") for child in items.children)


@pytest.mark.parametrize("text", ["Error: café ☕ 日本", "'); import os #\\n\r\nERRORerror", "plain ascii error"])
def test_text_with_error_and_unicode_arrives_verbatim(quirky: tuple[LocalSimulationProvider, str], tmp_path: Path, text: str) -> None:
    _, base_url = quirky
    adapter = _adapter(base_url, tmp_path)
    task = BenchmarkTask(
        task_id="type", instruction="", domain="notepad",
        raw_config={"config": [{"type": "launch", "parameters": {"command": "notepad"}}]},
    )
    observation = adapter.reset(task)
    editor = observation.accessibility_tree.find(role="Edit", name="Text Editor")
    adapter.apply(BenchmarkAction(type=ActionType.CLICK, target_node_id=editor.node_id))
    adapter.apply(BenchmarkAction(type=ActionType.TYPE, text=text))
    value = adapter.observe().accessibility_tree.find(role="Edit", name="Text Editor").attributes["value"]
    assert value == text


def test_status_code_booleans_and_failed_commands(quirky: tuple[LocalSimulationProvider, str]) -> None:
    _, base_url = quirky
    client = WAAClient(base_url)
    assert client.folder_exists("C:\\Users\\Docker", "Documents") is True
    assert client.folder_exists("C:\\Users\\Docker", "Nope") is False
    assert client.file_exists("C:\\Users\\Docker", "Documents") is False
    result = client.execute(["python", "-c", "import os"])  # answers 200 although it failed
    assert result.status == "success" and not result.ok and result.returncode != 0


class _KillingAgent(BenchmarkAgent):
    """Clicks harmlessly, and kills the VM before its third action."""

    name = "killer"

    def __init__(self, kill: "callable") -> None:  # type: ignore[valid-type]
        self.kill = kill

    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        if len(history) == 2:
            self.kill()
        return BenchmarkAction(type=ActionType.CLICK, x=0.5, y=0.5, normalized=True)


def test_server_dying_mid_episode_is_an_infrastructure_error(tmp_path: Path) -> None:
    handle = start_local_env(tmp_path / "dying")
    client = WAAClient(handle.base_url, read_retries=1, backoff_seconds=0.01)
    adapter = WAALiveAdapter(client, CATALOG, tmp_path, LiveAdapterSettings(settle=SettlePolicy.fixed(0)))
    task = CATALOG.load(CATALOG.task_ids()[0])
    adapter.reset(task)
    started = time.monotonic()
    episode = run_episode(adapter, _KillingAgent(handle.stop), task, EpisodeLimits(max_steps=10))
    assert episode.final_outcome is OutcomeKind.INFRASTRUCTURE_ERROR
    assert episode.error is not None and "server failed /execute" in episode.error
    assert "attempt not scored" in episode.error
    # The two steps played, then the one the dead server failed, kept with its error.
    assert len(episode.steps) == 3 and episode.steps[2].error and time.monotonic() - started < 10


def test_hanging_server_times_out_naming_the_route() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []

    def accept_and_never_answer() -> None:
        with contextlib.suppress(OSError):  # the listener's shutdown at the end of the test
            while True:
                accepted.append(listener.accept()[0])

    acceptor = threading.Thread(target=accept_and_never_answer, daemon=True)
    acceptor.start()
    client = WAAClient(
        f"http://127.0.0.1:{listener.getsockname()[1]}", timeouts=WAATimeouts(default=0.3), read_retries=1, backoff_seconds=0.01
    )
    started = time.monotonic()
    with pytest.raises(WAAConnectionError, match="/obs_winagent: no answer within 0.3 s"):
        client.obs_winagent()
    assert time.monotonic() - started < 10  # the server would never answer
    # Wake the blocked accept() before closing: a thread left in it would go on accepting on
    # whatever socket later reuses the descriptor's number (another test's server).
    listener.shutdown(socket.SHUT_RDWR)
    acceptor.join(timeout=5)
    assert not acceptor.is_alive()
    listener.close()
    for conn in accepted:
        conn.close()


# -- round 4: what WAA's reset leaves -----------------------------------------------------------------


def test_the_save_prompt_waas_reset_leaves_is_answered_without_saving(quirky: tuple[LocalSimulationProvider, str],
                                                                       tmp_path: Path) -> None:
    """Quirks mode's save_prompts: WAA's /setup/close_all asks an unsaved Notepad to close and it
    answers with "Do you want to save changes to Untitled?", which stays on screen. The reset
    answers it "Don't Save": the next task starts on a clear desktop and nothing was saved."""
    _, base_url = quirky
    adapter = _adapter(base_url, tmp_path)
    observation = adapter.reset(BenchmarkTask(task_id="t-notepad", instruction="type", domain="notepad", raw_config={
        "config": [{"type": "launch", "parameters": {"command": "notepad"}}]}))
    editor = observation.accessibility_tree.find(role="Edit", name="Text Editor")
    adapter.step(BenchmarkAction(type=ActionType.CLICK, target_node_id=editor.node_id))
    adapter.step(BenchmarkAction(type=ActionType.TYPE, text="draft that nobody saved"))
    documents = adapter.client.list_directory("C:\\Users\\Docker\\Documents")
    client = adapter.client
    client.setup_close_all()  # WAA's reset by itself leaves the prompt
    left = client.obs_winagent().window_names.splitlines()
    assert "Notepad" in left and "Untitled - Notepad" in left
    adapter.clean_desktop()  # this product's reset
    assert client.obs_winagent().window_names.splitlines() == ["Program Manager"]
    assert client.list_directory("C:\\Users\\Docker\\Documents") == documents  # nothing saved
