"""One test per classification rule of adapters/outcomes.py, against the local environment's
real-server behaviours (injected faults, a restarted server, unreadable trees, missing programs).

Each test names its rule (R1..R7); the README's outcome table points here.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

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
from adapters.outcomes import EnvironmentFault, Fault, classify_setup_error
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.client import WAAClient, WAATimeouts
from adapters.waa.errors import WAAConnectionError, WAAHTTPError
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter
from adapters.waa.localenv.launcher import LocalEnvHandle, start_local_env
from adapters.waa.setup_steps import SetupRunner, SetupStepError
from adapters.waa.settle import SettlePolicy

CATALOG = WAATaskCatalog(bundled_suite_dir())
NOTEPAD_TASK = BenchmarkTask(
    task_id="type-into-notepad",
    instruction="type",
    domain="notepad",
    raw_config={"config": [{"type": "launch", "parameters": {"command": "notepad"}}]},
)
NON_ASCII = "façade 東京 ✓ 🙂"


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[LocalEnvHandle]:
    handle = start_local_env(tmp_path / "sim")
    yield handle
    handle.stop()


def _faults(base_url: str, *faults: dict[str, Any], seed: int = 0) -> None:
    response = requests.post(f"{base_url}/sim/faults", json={"faults": list(faults), "seed": seed}, timeout=10)
    response.raise_for_status()


def _adapter(base_url: str, tmp_path: Path) -> WAALiveAdapter:
    client = WAAClient(base_url, read_retries=1, backoff_seconds=0.01)
    return WAALiveAdapter(client, CATALOG, tmp_path / "cache", LiveAdapterSettings(settle=SettlePolicy.fixed(0), launch_verify_seconds=5))


class _Plan(BenchmarkAgent):
    """Plays a fixed list of actions (callables run before an action, for mid-episode events)."""

    name = "plan"

    def __init__(self, actions: list[BenchmarkAction | Any]) -> None:
        self.actions = list(actions)

    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        while self.actions and callable(self.actions[0]):
            self.actions.pop(0)()
        return self.actions.pop(0) if self.actions else BenchmarkAction(type=ActionType.DONE)


def _editor_text(adapter: WAALiveAdapter) -> str:
    tree = adapter.observe().accessibility_tree
    assert tree is not None
    editor = tree.find(role="Edit", name="Text Editor")
    assert editor is not None
    return editor.attributes["value"]


# --- R4: computer.* is set before use --------------------------------------------------------


def test_r4_non_ascii_text_right_after_a_fresh_server_start_arrives_verbatim(sim: LocalEnvHandle, tmp_path: Path) -> None:
    """WAA's computer.clipboard is None until /update_computer: the adapter sends it first."""
    adapter = _adapter(sim.base_url, tmp_path)
    first = adapter.reset(NOTEPAD_TASK)
    agent = _Plan([BenchmarkAction(type=ActionType.TYPE, text=NON_ASCII)])
    episode = run_episode(adapter, agent, NOTEPAD_TASK, EpisodeLimits(max_steps=3), first_observation=first)
    assert episode.final_outcome is None, episode.error
    assert [s.error for s in episode.steps] == [None, None]
    assert _editor_text(adapter) == NON_ASCII


def test_r4_a_server_restart_mid_episode_is_recovered(sim: LocalEnvHandle, tmp_path: Path) -> None:
    """After the server process restarts (computer back to None) the update is re-sent."""
    adapter = _adapter(sim.base_url, tmp_path)
    first = adapter.reset(NOTEPAD_TASK)
    restart = lambda: requests.post(f"{sim.base_url}/sim/restart", timeout=10).raise_for_status()  # noqa: E731
    agent = _Plan([
        BenchmarkAction(type=ActionType.TYPE, text="één "),
        restart,
        BenchmarkAction(type=ActionType.TYPE, text="twee ✓"),
    ])
    episode = run_episode(adapter, agent, NOTEPAD_TASK, EpisodeLimits(max_steps=5), first_observation=first)
    assert episode.final_outcome is None and all(s.error is None for s in episode.steps), episode.error
    assert _editor_text(adapter) == "één twee ✓"


# --- R1/R2: server-side failures are never scored -------------------------------------------


def test_r1_execute_timing_out_on_the_server_ends_the_attempt_unscored(sim: LocalEnvHandle, tmp_path: Path) -> None:
    adapter = _adapter(sim.base_url, tmp_path)
    first = adapter.reset(NOTEPAD_TASK)
    _faults(sim.base_url, {"route": "/execute", "status": 500, "count": 1})
    agent = _Plan([BenchmarkAction(type=ActionType.TYPE, text="plain"), BenchmarkAction(type=ActionType.TYPE, text="more")])
    episode = run_episode(adapter, agent, NOTEPAD_TASK, EpisodeLimits(max_steps=5), first_observation=first)
    assert episode.final_outcome is OutcomeKind.INFRASTRUCTURE_ERROR
    assert "server failed /execute" in (episode.error or "") and "timed out after 120 seconds" in (episode.error or "")
    assert "attempt not scored" in (episode.error or "")
    # The failed step is kept, with the server's words; nothing after it was played.
    assert len(episode.steps) == 1 and "timed out after 120 seconds" in (episode.steps[0].error or "")
    assert _editor_text(adapter) == ""  # the action the server failed never happened


def test_r1_execute_windows_internal_error_is_infrastructure(sim: LocalEnvHandle, tmp_path: Path) -> None:
    adapter = _adapter(sim.base_url, tmp_path)
    first = adapter.reset(NOTEPAD_TASK)
    _faults(sim.base_url, {"route": "/execute_windows", "status": 500, "message": "boom inside the server"})
    agent = _Plan([BenchmarkAction(type=ActionType.TYPE, text=NON_ASCII)])
    episode = run_episode(adapter, agent, NOTEPAD_TASK, EpisodeLimits(max_steps=3), first_observation=first)
    assert episode.final_outcome is OutcomeKind.INFRASTRUCTURE_ERROR
    assert "/execute_windows" in (episode.error or "") and "boom inside the server" in (episode.error or "")


def test_r1_a_failing_observation_is_infrastructure_not_a_timeout(sim: LocalEnvHandle, tmp_path: Path) -> None:
    adapter = _adapter(sim.base_url, tmp_path)
    adapter.reset(NOTEPAD_TASK)
    _faults(sim.base_url, {"route": "/screenshot", "status": 500, "message": "screen grab failed"})
    episode = run_episode(adapter, _Plan([]), NOTEPAD_TASK, EpisodeLimits(max_steps=3))
    assert episode.final_outcome is OutcomeKind.INFRASTRUCTURE_ERROR and episode.steps == []
    assert "before the first observation" in (episode.error or "") and "/screenshot" in (episode.error or "")


# --- R3: what the agent caused stays the agent's -------------------------------------------


def test_r3_a_command_that_ran_and_failed_is_a_step_error_the_agent_sees(sim: LocalEnvHandle, tmp_path: Path) -> None:
    adapter = _adapter(sim.base_url, tmp_path)
    first = adapter.reset(NOTEPAD_TASK)
    # A click far outside the screen is clamped; an unknown key is refused by the translator.
    agent = _Plan([BenchmarkAction(type=ActionType.KEY, key="nosuchkey"), BenchmarkAction(type=ActionType.TYPE, text="ok")])
    episode = run_episode(adapter, agent, NOTEPAD_TASK, EpisodeLimits(max_steps=5), first_observation=first)
    assert episode.final_outcome is None  # scored as usual
    assert episode.steps[0].error and episode.steps[1].error is None


# --- R5: a tree the agent made unreadable degrades ------------------------------------------


def test_r5_control_characters_typed_by_the_agent_degrade_the_observation(sim: LocalEnvHandle, tmp_path: Path) -> None:
    adapter = _adapter(sim.base_url, tmp_path)
    first = adapter.reset(NOTEPAD_TASK)
    agent = _Plan([BenchmarkAction(type=ActionType.TYPE, text="ring \x07 bell"), BenchmarkAction(type=ActionType.TYPE, text="!")])
    episode = run_episode(adapter, agent, NOTEPAD_TASK, EpisodeLimits(max_steps=5), first_observation=first)
    assert episode.final_outcome is None, episode.error  # the agent's own doing: scored as usual
    assert [s.action.type for s in episode.steps] == [ActionType.TYPE, ActionType.TYPE, ActionType.DONE]
    assert "XML compatible" in (episode.steps[0].observation_error or "")
    assert all(s.error is None for s in episode.steps)


def test_r5_an_unreadable_tree_the_agent_did_not_cause_is_infrastructure(sim: LocalEnvHandle, tmp_path: Path) -> None:
    adapter = _adapter(sim.base_url, tmp_path)
    adapter.reset(NOTEPAD_TASK)
    message = "All strings must be XML compatible: Unicode or ASCII, no NULL bytes or control characters"
    _faults(sim.base_url, {"route": "/accessibility", "status": 500, "message": message})
    episode = run_episode(adapter, _Plan([]), NOTEPAD_TASK, EpisodeLimits(max_steps=3))
    assert episode.final_outcome is OutcomeKind.INFRASTRUCTURE_ERROR and "/accessibility" in (episode.error or "")


# --- R6: setup ----------------------------------------------------------------------------


def test_r6_a_transient_launch_failure_is_infrastructure(sim: LocalEnvHandle, tmp_path: Path) -> None:
    runner = SetupRunner(WAAClient(sim.base_url), tmp_path, launch_verify_seconds=2)
    _faults(sim.base_url, {"route": "/setup/launch", "status": 500, "count": 1})
    with pytest.raises(EnvironmentFault, match=r"/setup/launch during setup step 0 \(launch\)"):
        runner.run(NOTEPAD_TASK.setup_steps)
    runner.run(NOTEPAD_TASK.setup_steps)  # the next try works: the fault was the server's


def test_r6_a_program_the_vm_lacks_is_a_setup_failure(sim: LocalEnvHandle, tmp_path: Path) -> None:
    runner = SetupRunner(WAAClient(sim.base_url), tmp_path, launch_verify_seconds=1)
    with pytest.raises(SetupStepError, match="neither a new window nor a new 'photoshop' process"):
        runner.run([{"type": "launch", "parameters": {"command": "photoshop"}}])
    # A launch that starts a process is verified by the process list (tasklist) too.
    runner.run([{"type": "launch", "parameters": {"command": "notepad"}}])


def test_r6_execute_step_failures_carry_the_servers_message(sim: LocalEnvHandle, tmp_path: Path) -> None:
    runner = SetupRunner(WAAClient(sim.base_url), tmp_path)
    step = {"type": "execute", "parameters": {"command": ["nosuch.exe", "/x"]}}
    _faults(sim.base_url, {"route": "/setup/execute", "status": 500,
                           "message": "[WinError 2] The system cannot find the file specified"})
    with pytest.raises(SetupStepError, match=r"setup step 0 \(execute\).*\[WinError 2\] The system cannot find"):
        runner.run([step])
    _faults(sim.base_url, {"route": "/setup/execute", "status": 500})  # WAA's 120 s subprocess timeout
    with pytest.raises(EnvironmentFault, match="timed out after 120 seconds"):
        runner.run([step])


def test_r6_setup_classification_table() -> None:
    assert classify_setup_error(WAAConnectionError("/setup/launch", "refused")) is Fault.ENVIRONMENT
    assert classify_setup_error(WAAHTTPError("/setup/launch", 500, "internal")) is Fault.ENVIRONMENT
    assert classify_setup_error(WAAHTTPError("/setup/open_file", 404, "File not found")) is Fault.TASK_DATA
    assert classify_setup_error(WAAHTTPError("/setup/execute", 500, "[WinError 2] nope")) is Fault.TASK_DATA
    assert (
        classify_setup_error(WAAHTTPError("/setup/activate_window", 500, "Get window by class name is not supported"))
        is Fault.TASK_DATA
    )


# --- R7: deadlines --------------------------------------------------------------------------


def test_r7_one_deadline_covers_a_reads_retries() -> None:
    """A hanging route costs its deadline once, not once per retry (WAA's 300 s is the total)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])  # never answers
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        port = listener.getsockname()[1]
        client = WAAClient(f"http://127.0.0.1:{port}", timeouts=WAATimeouts(accessibility=1.0), read_retries=3,
                           backoff_seconds=0.05)
        started = time.monotonic()
        with pytest.raises(WAAConnectionError, match="/accessibility: no answer within 1 s"):
            client.accessibility()
        assert time.monotonic() - started < 1.6
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()
