"""One test per classification rule of adapters/outcomes.py, against the local environment's
real-server behaviours (injected faults, a restarted server, unreadable trees, missing programs).

Each test names its rule (R1..R10); the README's outcome table points here.
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
from adapters.outcomes import (
    EnvironmentFault,
    Fault,
    classify_command_failure,
    classify_evaluation_call_error,
    classify_setup_error,
    is_folder_read,
)
from adapters.waa.actions import (
    WINDOWS_COMMAND_LINE_LIMIT,
    command_line_length,
    to_execute_command,
    to_pyautogui_write,
    untypable_characters,
)
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


# --- R1: a well-formed action the VM fails to carry out is the environment's --------------------


def test_r1_an_os_error_on_a_harness_translated_action_is_infrastructure_not_the_agents(
    sim: LocalEnvHandle, tmp_path: Path
) -> None:
    """/execute answers 200 with returncode 1 and `OSError: [WinError 5] Access is denied` (UAC's
    secure desktop, a locked session): the action was well formed, so the VM failed it."""
    adapter = _adapter(sim.base_url, tmp_path)
    first = adapter.reset(NOTEPAD_TASK)
    _faults(sim.base_url, {"route": "/execute", "returncode": 1})
    for action in (BenchmarkAction(type=ActionType.TYPE, text="hello"), BenchmarkAction(type=ActionType.KEY, key="enter"),
                   BenchmarkAction(type=ActionType.CLICK, x=300, y=300)):
        episode = run_episode(adapter, _Plan([action]), NOTEPAD_TASK, EpisodeLimits(max_steps=3), first_observation=first)
        assert episode.final_outcome is OutcomeKind.INFRASTRUCTURE_ERROR, (action, episode.error)
        assert "[WinError 5] Access is denied" in (episode.error or "") and "attempt not scored" in (episode.error or "")
        assert len(episode.steps) == 1 and "returncode 1" in (episode.steps[0].error or "")
    _faults(sim.base_url)
    assert _editor_text(adapter) == ""


def test_r1_r3_who_wrote_a_failing_command_decides_whose_failure_it_is() -> None:
    assert classify_command_failure(authored_by="harness") is Fault.ENVIRONMENT
    assert classify_command_failure(authored_by="agent") is Fault.AGENT


def test_r1_long_text_arrives_verbatim_in_pieces_within_windows_limits(sim: LocalEnvHandle, tmp_path: Path) -> None:
    """40,000 characters: one pyautogui.write would be a command line of 41,000+ characters
    (Windows refuses it, [WinError 206]) and at interval=0.01 would need 400 s (WAA's /execute
    stops at 120 s). In pieces of 1,000 it arrives verbatim and the step says how."""
    text = "".join(chr(32 + (i * 7) % 95) for i in range(39_995)) + "\ntail"
    assert len(text) == 40_000 and not untypable_characters(text)
    single = to_execute_command(to_pyautogui_write(text))
    assert command_line_length(single) > WINDOWS_COMMAND_LINE_LIMIT  # why one command cannot do it
    adapter = _adapter(sim.base_url, tmp_path)
    first = adapter.reset(NOTEPAD_TASK)
    episode = run_episode(adapter, _Plan([BenchmarkAction(type=ActionType.TYPE, text=text)]), NOTEPAD_TASK,
                          EpisodeLimits(max_steps=3), first_observation=first)
    assert episode.final_outcome is None and episode.steps[0].error is None, episode.error
    assert episode.steps[0].delivery == (
        "pyautogui.write through /execute: 40000 characters in 40 piece(s) of at most 1000"
    )
    assert _editor_text(adapter) == text


def test_r1_r2_a_piece_the_server_fails_ends_the_attempt_saying_how_much_was_typed(
    sim: LocalEnvHandle, tmp_path: Path
) -> None:
    """A dropped connection on the second piece: the piece may have typed, so it is not sent
    again (R10); the attempt ends unscored (R2), saying how much had been typed."""
    adapter = _adapter(sim.base_url, tmp_path)
    first = adapter.reset(NOTEPAD_TASK)
    # The first /execute is served as usual (status 200: counted, not failed), the second dropped.
    _faults(sim.base_url, {"route": "/execute", "status": 200, "count": 1}, {"route": "/execute", "drop": True, "count": 1})
    episode = run_episode(adapter, _Plan([BenchmarkAction(type=ActionType.TYPE, text="x" * 2500)]), NOTEPAD_TASK,
                          EpisodeLimits(max_steps=3), first_observation=first)
    hits = [f["hits"] for f in requests.get(f"{sim.base_url}/sim/faults", timeout=10).json()["faults"]]
    assert episode.final_outcome is OutcomeKind.INFRASTRUCTURE_ERROR, episode.error
    assert "typing piece 2 of 3; 1000 of 2500 characters were typed before it" in (episode.error or "")
    assert hits == [1, 1]  # the dropped piece was sent once, never again
    _faults(sim.base_url)
    assert _editor_text(adapter) == "x" * 1000


# --- R3: the agent's own mistakes are refused before anything is sent ----------------------------


@pytest.mark.parametrize(
    ("action", "says"),
    [
        (BenchmarkAction(type=ActionType.KEY, key="nosuchkey"), "unknown key 'nosuchkey'"),
        (BenchmarkAction(type=ActionType.CLICK, x=5000, y=300), "off the 1280x800 screen"),
        (BenchmarkAction(type=ActionType.DRAG, x=10, y=10, end_x=-5, end_y=10), "drag end point (-5, 10) is off"),
        (BenchmarkAction(type=ActionType.TYPE, text=""), "nothing to type"),
        (BenchmarkAction(type=ActionType.CLICK, target_node_id="no-such-element"), "[no-such-element] is not on screen"),
        (BenchmarkAction(type=ActionType.KEY, key="s", modifiers=["ctrl"], target_bbox=(0, 0, 1, 1)), None),
    ],
    ids=["unknown-key", "off-screen", "drag-off-screen", "empty-text", "missing-element", "fine"],
)
def test_r3_the_agents_mistakes_are_failed_steps_it_sees_and_never_reach_the_vm(
    sim: LocalEnvHandle, tmp_path: Path, action: BenchmarkAction, says: str | None
) -> None:
    adapter = _adapter(sim.base_url, tmp_path)
    first = adapter.reset(NOTEPAD_TASK)
    # Any action that reaches the VM would hit this fault (and count it).
    _faults(sim.base_url, {"route": "/execute", "returncode": 1}, {"route": "/execute_windows", "status": 500})
    episode = run_episode(adapter, _Plan([action, BenchmarkAction(type=ActionType.DONE)]), NOTEPAD_TASK,
                          EpisodeLimits(max_steps=3), first_observation=first)
    hits = sum(f["hits"] for f in requests.get(f"{sim.base_url}/sim/faults", timeout=10).json()["faults"])
    if says is None:  # a well-formed action reaches the VM, which fails it: the environment's (R1)
        assert episode.final_outcome is OutcomeKind.INFRASTRUCTURE_ERROR and hits == 1
        return
    assert episode.final_outcome is None, episode.error  # scored as usual
    assert says in (episode.steps[0].error or ""), episode.steps[0].error
    assert episode.steps[0].delivery is None and hits == 0


def test_r3_several_mistakes_in_a_row_end_the_episode_as_the_agents_failure(sim: LocalEnvHandle, tmp_path: Path) -> None:
    adapter = _adapter(sim.base_url, tmp_path)
    first = adapter.reset(NOTEPAD_TASK)
    mistakes = [BenchmarkAction(type=ActionType.KEY, key=f"nosuchkey{i}") for i in range(3)]
    episode = run_episode(adapter, _Plan(mistakes), NOTEPAD_TASK,
                          EpisodeLimits(max_steps=5, max_consecutive_action_errors=3), first_observation=first)
    assert episode.final_outcome is OutcomeKind.AGENT_FAILURE and "3 actions in a row failed" in (episode.error or "")


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


def test_r1_r6_a_launch_whose_answer_is_cut_short_is_infrastructure(sim: LocalEnvHandle, tmp_path: Path) -> None:
    """A server that stops mid-answer (headers sent, the body short of its Content-Length) dropped
    the connection (R1): a run whose first server died while answering a launch scored that task
    setup_failure, the task's own fault, from requests' ChunkedEncodingError."""
    runner = SetupRunner(WAAClient(sim.base_url, read_retries=1, backoff_seconds=0.01), tmp_path, launch_verify_seconds=5)
    _faults(sim.base_url, {"route": "/setup/launch", "cut": True, "count": 1})
    with pytest.raises(EnvironmentFault, match=r"/setup/launch during setup step 0 \(launch\).*cut short"):
        runner.run(NOTEPAD_TASK.setup_steps)  # a launch acts: not sent again


def test_r1_an_action_whose_answer_is_cut_short_mid_episode_is_infrastructure(sim: LocalEnvHandle, tmp_path: Path) -> None:
    adapter = WAALiveAdapter(WAAClient(sim.base_url, read_retries=0), CATALOG, tmp_path / "cache",
                             LiveAdapterSettings(settle=SettlePolicy.fixed(0), launch_verify_seconds=5))
    first = adapter.reset(NOTEPAD_TASK)
    cut = lambda: _faults(sim.base_url, {"route": "/execute", "cut": True})  # noqa: E731
    agent = _Plan([cut, BenchmarkAction(type=ActionType.TYPE, text="plain")])
    episode = run_episode(adapter, agent, NOTEPAD_TASK, EpisodeLimits(max_steps=3), first_observation=first)
    assert episode.final_outcome is OutcomeKind.INFRASTRUCTURE_ERROR, episode.error
    assert "/execute" in (episode.error or "") and "cut short" in (episode.error or "")


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
    # A 200 the client cannot read (not JSON) is the server's, never the task's.
    assert classify_setup_error(WAAHTTPError("/obs_winagent", 200, "answer is not JSON: Expecting value")) is Fault.ENVIRONMENT
    assert classify_setup_error(WAAHTTPError("/setup/execute", 500, "[WinError 2] nope")) is Fault.TASK_DATA
    assert (
        classify_setup_error(WAAHTTPError("/setup/activate_window", 500, "Get window by class name is not supported"))
        is Fault.TASK_DATA
    )


def test_r6_a_strict_activation_the_server_cannot_complete_is_logged_and_setup_carries_on(tmp_path: Path) -> None:
    """WAA's handler asserts the window is active after minimising and restoring it: a 500 with no
    message. WAA's setup controller logs it and goes on; so does this one, with a note on the result."""
    handle = start_local_env(tmp_path / "sim", quirks=True, quirk_settings={
        "ready_delay": 0, "accessibility_delay": 0, "launch_delay": 0, "strict_activation_fails": True})
    try:
        client = WAAClient(handle.base_url, read_retries=1, backoff_seconds=0.01)
        adapter = WAALiveAdapter(client, CATALOG, tmp_path / "cache",
                                 LiveAdapterSettings(settle=SettlePolicy.fixed(0), launch_verify_seconds=5))
        task = CATALOG.load("notepad-append-line")  # its setup ends with a strict activation
        adapter.reset(task)
        note = adapter.setup_runner.notes[-1]
        assert "strict activation of 'todo.txt - Notepad' failed on the VM" in note and "carries on" in note
        result = adapter.evaluate(task)  # nothing typed: scored as usual, the note travels with it
        assert result.outcome is OutcomeKind.AGENT_FAILURE and "strict activation of 'todo.txt - Notepad'" in (result.reason or "")
        # A window that is not there is still the task's data (404), strict or not.
        with pytest.raises(SetupStepError, match="no window matching 'Nowhere'"):
            adapter.setup_runner.run([{"type": "activate_window", "parameters": {"window_name": "Nowhere", "strict": True}}])
    finally:
        handle.stop()


# --- R9: evaluation faults are infrastructure --------------------------------------------------------


SETTINGS_TASK = CATALOG.load("settings-storage-sense-on")  # its getter reads the registry through /execute


@pytest.mark.parametrize("scoring", ["strict", "waa-compat"])
def test_r9_a_getters_server_500_is_never_scored_unless_waa_compat_is_asked_for(
    sim: LocalEnvHandle, tmp_path: Path, scoring: str
) -> None:
    adapter = WAALiveAdapter(WAAClient(sim.base_url, read_retries=1, backoff_seconds=0.01), CATALOG, tmp_path / "cache",
                             LiveAdapterSettings(settle=SettlePolicy.fixed(0), scoring=scoring))  # type: ignore[arg-type]
    adapter.reset(SETTINGS_TASK)
    _faults(sim.base_url, {"route": "/execute", "status": 500})  # WAA's "timed out after 120 seconds"
    result = adapter.evaluate(SETTINGS_TASK)
    if scoring == "strict":
        assert result.outcome is OutcomeKind.INFRASTRUCTURE_ERROR and result.score == 0.0
        assert "the server failed /execute" in (result.error or "") and "timed out after 120 seconds" in (result.error or "")
        assert "not scored" in (result.error or "")
    else:  # WAA's own handling: the getter gets no value and the task scores 0
        assert result.outcome is OutcomeKind.AGENT_FAILURE and "scoring waa-compat" in (result.reason or "")


@pytest.mark.parametrize("fault", ["drop", "cut"])
def test_r9_a_getters_dropped_connection_is_infrastructure_under_both_scorings(
    sim: LocalEnvHandle, tmp_path: Path, fault: str
) -> None:
    for scoring in ("strict", "waa-compat"):
        adapter = WAALiveAdapter(WAAClient(sim.base_url, read_retries=1, backoff_seconds=0.01), CATALOG,
                                 tmp_path / scoring, LiveAdapterSettings(settle=SettlePolicy.fixed(0), scoring=scoring))  # type: ignore[arg-type]
        adapter.reset(SETTINGS_TASK)
        _faults(sim.base_url, {"route": "/execute", fault: True})
        assert adapter.evaluate(SETTINGS_TASK).outcome is OutcomeKind.INFRASTRUCTURE_ERROR, scoring
        _faults(sim.base_url)


def test_r9_a_500_naming_a_program_the_vm_lacks_is_an_evaluation_error(sim: LocalEnvHandle, tmp_path: Path) -> None:
    adapter = _adapter(sim.base_url, tmp_path)
    adapter.reset(SETTINGS_TASK)
    _faults(sim.base_url, {"route": "/execute", "status": 500,
                           "message": "[WinError 2] The system cannot find the file specified"})
    result = adapter.evaluate(SETTINGS_TASK)
    assert result.outcome is OutcomeKind.EVALUATION_ERROR and "[WinError 2]" in (result.error or "")


FOLDER_READ_TASK = BenchmarkTask(
    task_id="reads-a-folder", instruction="-", domain="file_explorer",
    evaluation_spec={"func": "exact_match",
                     "result": {"type": "vm_file", "path": "C:\\Users\\Docker\\Desktop", "dest": "desktop.txt"},
                     "expected": {"type": "rule", "rules": {"expected": "a file's path"}}},
)


def test_r9_a_getter_reading_a_folder_as_a_file_is_an_evaluation_error_naming_it(sim: LocalEnvHandle, tmp_path: Path) -> None:
    """WAA's /file answers 500 "[Errno 13] Permission denied" for a folder on Windows (the
    simulation too): the task's fault, not a VM to replace; under waa-compat it is scored as WAA
    scores it (the getter's None: 0)."""
    adapter = _adapter(sim.base_url, tmp_path)
    adapter.reset(FOLDER_READ_TASK)
    result = adapter.evaluate(FOLDER_READ_TASK)
    assert result.outcome is OutcomeKind.EVALUATION_ERROR, result.reason
    assert "C:\\Users\\Docker\\Desktop is a folder on the VM, not a file" in (result.error or "")
    assert "[Errno 13] Permission denied" in (result.error or "")
    compat = WAALiveAdapter(WAAClient(sim.base_url, read_retries=1, backoff_seconds=0.01), CATALOG, tmp_path / "compat",
                            LiveAdapterSettings(settle=SettlePolicy.fixed(0), scoring="waa-compat"))
    assert compat.evaluate(FOLDER_READ_TASK).outcome is OutcomeKind.AGENT_FAILURE


@pytest.mark.parametrize("path, message, outcome", [
    # Linux's words for a folder (a server of ours on a Linux desktop guest): the task's fault.
    ("C:\\Users\\Docker\\Desktop", "[Errno 21] Is a directory: 'C:\\\\Users\\\\Docker\\\\Desktop'",
     OutcomeKind.EVALUATION_ERROR),
    # Windows' words for a file another program holds open: the same as for a folder, but the VM
    # says the path is no folder, so it stays infrastructure.
    ("C:\\Users\\Docker\\Documents\\notes.txt", "[Errno 13] Permission denied: 'C:\\\\Users\\\\Docker\\\\notes.txt'",
     OutcomeKind.INFRASTRUCTURE_ERROR),
    # Any other 500 for a folder's path stays infrastructure.
    ("C:\\Users\\Docker\\Desktop", "Internal Server Error", OutcomeKind.INFRASTRUCTURE_ERROR),
], ids=["errno-21-folder", "errno-13-locked-file", "other-500"])
def test_r9_only_a_500_saying_the_named_path_is_a_folder_is_the_tasks_fault(
    sim: LocalEnvHandle, tmp_path: Path, path: str, message: str, outcome: OutcomeKind
) -> None:
    task = FOLDER_READ_TASK.model_copy(update={"evaluation_spec": {
        **FOLDER_READ_TASK.evaluation_spec, "result": {"type": "vm_file", "path": path, "dest": "read.txt"}}})
    adapter = _adapter(sim.base_url, tmp_path)
    adapter.reset(task)
    _faults(sim.base_url, {"route": "/file", "status": 500, "message": message})
    result = adapter.evaluate(task)
    assert result.outcome is outcome, result.reason
    assert message in (result.error or "")


def test_r9_evaluation_call_classification_table() -> None:
    assert classify_evaluation_call_error(WAAConnectionError("/file", "reset")) is Fault.ENVIRONMENT
    assert classify_evaluation_call_error(WAAHTTPError("/execute", 500, "Command ... timed out after 120 seconds")) is Fault.ENVIRONMENT
    assert classify_evaluation_call_error(WAAHTTPError("/execute", 500, "[WinError 3] path not found")) is Fault.TASK_DATA
    assert classify_evaluation_call_error(WAAHTTPError("/file", 404, "File not found")) is None
    assert classify_evaluation_call_error(WAAHTTPError("/list_directory", 200, "answer is not JSON: ...")) is Fault.ENVIRONMENT
    unreadable = WAAHTTPError("/accessibility", 500, "All strings must be XML compatible: ...")
    assert classify_evaluation_call_error(unreadable, agent_typed_control_characters=True) is Fault.AGENT
    assert classify_evaluation_call_error(unreadable) is Fault.ENVIRONMENT
    denied = WAAHTTPError("/file", 500, "[Errno 13] Permission denied: 'C:\\\\x'")
    assert is_folder_read(denied, "C:\\x", lambda path: True)
    assert not is_folder_read(denied, "C:\\x", lambda path: False)  # a locked file: infrastructure
    assert is_folder_read(WAAHTTPError("/file", 500, "[Errno 21] Is a directory: '/x'"), "/x", lambda path: True)
    assert not is_folder_read(WAAHTTPError("/file", 500, "timed out"), "C:\\x", lambda path: True)
    assert not is_folder_read(WAAHTTPError("/file", 400, "[Errno 13] Permission denied"), "C:\\x", lambda path: True)
    assert not is_folder_read(WAAHTTPError("/execute", 500, "[Errno 13] Permission denied"), "C:\\x", lambda path: True)
    assert not is_folder_read(WAAConnectionError("/file", "reset"), "C:\\x", lambda path: True)


# --- R10: what is safe to repeat is retried ------------------------------------------------------------


@pytest.mark.parametrize("fault", ["drop", "cut"])
@pytest.mark.parametrize("route", ["/setup/close_all", "/setup/clear_task_files"])
def test_r10_a_dropped_connection_on_a_reset_or_clean_up_call_is_retried(
    sim: LocalEnvHandle, tmp_path: Path, route: str, fault: str
) -> None:
    adapter = _adapter(sim.base_url, tmp_path)
    _faults(sim.base_url, {"route": route, fault: True, "count": 1})
    adapter.clean_desktop()  # no error: the call was repeated
    assert [f["hits"] for f in requests.get(f"{sim.base_url}/sim/faults", timeout=10).json()["faults"]] == [1]


def test_r10_the_read_only_process_list_is_retried_but_a_launch_is_not(sim: LocalEnvHandle, tmp_path: Path) -> None:
    runner = SetupRunner(WAAClient(sim.base_url, read_retries=1, backoff_seconds=0.01), tmp_path, launch_verify_seconds=5)
    _faults(sim.base_url, {"route": "/setup/execute", "drop": True, "count": 1})
    runner.run(NOTEPAD_TASK.setup_steps)  # tasklist answered on the second try
    _faults(sim.base_url, {"route": "/setup/launch", "drop": True, "count": 1})
    with pytest.raises(EnvironmentFault, match="/setup/launch"):
        runner.run(NOTEPAD_TASK.setup_steps)  # a launch acts: never sent twice


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
        client = WAAClient(f"http://127.0.0.1:{port}", timeouts=WAATimeouts(accessibility=1.0), read_retries=10,
                           backoff_seconds=0.05)
        started = time.monotonic()
        with pytest.raises(WAAConnectionError, match="/accessibility: no answer within 1 s"):
            client.accessibility()
        assert time.monotonic() - started < 5  # one 1 s deadline, not ten
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()


class _Thinking(_Plan):
    """A plan whose every decision takes `seconds` of the agent's own time."""

    def __init__(self, actions: list[BenchmarkAction | Any], seconds: float) -> None:
        super().__init__(actions)
        self.seconds = seconds

    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        time.sleep(self.seconds)
        return super().act(task, observation, history)


def test_r7_a_slow_tree_past_the_episode_limit_is_the_servers_time_not_the_agents(tmp_path: Path) -> None:
    """WAA's slow accessibility tree (quirks: 1.5 s a read) pushes an episode past its 3 s
    limit while the agent spends almost nothing: infrastructure, with both times in the reason,
    not the agent's `timeout`."""
    handle = start_local_env(tmp_path / "sim", quirks=True, quirk_settings={
        "ready_delay": 0, "accessibility_delay": 1.5, "launch_delay": 0, "failsafe": False})
    try:
        adapter = _adapter(handle.base_url, tmp_path)
        first = adapter.reset(NOTEPAD_TASK)
        agent = _Plan([BenchmarkAction(type=ActionType.TYPE, text=f"line {n}\n") for n in range(10)])
        episode = run_episode(adapter, agent, NOTEPAD_TASK, EpisodeLimits(max_steps=10, wall_clock_seconds=3.0),
                              first_observation=first)
    finally:
        handle.stop()
    assert episode.final_outcome is OutcomeKind.INFRASTRUCTURE_ERROR, episode.error
    assert episode.env_seconds > 3.0 and episode.agent_seconds < 1.0
    assert "because the server was slow" in (episode.error or "")
    assert f"the agent {episode.agent_seconds:.1f} s, the environment (WAA server) {episode.env_seconds:.1f} s" \
        in (episode.error or "")


def test_r7_the_agents_own_time_past_the_limit_is_its_timeout(sim: LocalEnvHandle, tmp_path: Path) -> None:
    """An agent that thinks 0.6 s a step on a server that answers at once: past a 1.5 s limit
    the time is the agent's (`timeout`), and the reason says what the environment took."""
    adapter = _adapter(sim.base_url, tmp_path)
    first = adapter.reset(NOTEPAD_TASK)
    agent = _Thinking([BenchmarkAction(type=ActionType.TYPE, text="x")] * 10, seconds=0.6)
    episode = run_episode(adapter, agent, NOTEPAD_TASK, EpisodeLimits(max_steps=10, wall_clock_seconds=1.5),
                          first_observation=first)
    assert episode.final_outcome is OutcomeKind.TIMEOUT, episode.error
    assert episode.agent_seconds > 1.5
    assert "the agent's time ran out" in (episode.error or "") and "the environment (WAA server)" in (episode.error or "")


# --- R11: a fault that repeats ----------------------------------------------------------------


def _evaluation_failure(task_id: str, vm_id: str, message: str, attempt: int = 1) -> Any:
    from adapters.benchmark import BenchmarkResult

    error = (f"result getter vm_command_line: the server failed /execute: HTTP 500: {message} "
             "(not scored; the attempt is retried)")
    return BenchmarkResult(task_id=task_id, outcome=OutcomeKind.INFRASTRUCTURE_ERROR, error=error, reason=error,
                           vm_id=vm_id, attempt=attempt, timings={"evaluate": 0.2})


def test_r11_an_evaluation_fault_that_repeats_is_the_tasks_unless_another_task_met_it() -> None:
    from adapters.outcomes import RepeatedFaults, evaluation_fault_signature

    charmap = "'charmap' codec can't decode byte 0x81 in position 1: character maps to <undefined>"
    faults = RepeatedFaults()
    first = _evaluation_failure("t", "vm-0", charmap)
    assert faults.judge(None, first) is first  # once is the server's (R9): retried
    again = faults.judge(first, _evaluation_failure("t", "vm-1", charmap, 2))
    assert again.outcome is OutcomeKind.EVALUATION_ERROR and "on VM vm-0, then on a fresh VM vm-1" in (again.error or "")
    assert charmap in (again.error or "")
    # Another message the second time: not a repeat.
    other = _evaluation_failure("u", "vm-2", "Internal server error")
    assert faults.judge(other, _evaluation_failure("u", "vm-3", charmap, 2)).outcome is OutcomeKind.INFRASTRUCTURE_ERROR
    # The same failure met by two tasks is the server's: it stays infrastructure for both.
    shared = RepeatedFaults()
    shared.judge(None, _evaluation_failure("a", "vm-0", "Internal server error"))
    b1 = _evaluation_failure("b", "vm-1", "Internal server error")
    shared.judge(None, b1)
    assert shared.judge(b1, _evaluation_failure("b", "vm-2", "Internal server error", 2)).outcome \
        is OutcomeKind.INFRASTRUCTURE_ERROR
    # A VM out of reach, or a failure outside evaluation, never counts.
    unreachable = _evaluation_failure("c", "vm-0", "x").model_copy(update={"error": "result getter vm_file: VM "
                                                                           "unreachable (...) (not scored; ...)"})
    assert evaluation_fault_signature(unreachable) is None
    assert evaluation_fault_signature(first.model_copy(update={"timings": {"setup": 1.0}})) is None
