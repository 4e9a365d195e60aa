"""Quirks mode (slow readiness, slow /accessibility, fail-safe in the server, delayed launches), the
always-on clipboard behaviours of the real server, and the refused Chrome DevTools endpoint."""

from __future__ import annotations

import io

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from adapters.waa.client import WAAClient
from adapters.waa.localenv.actioncode import FAILSAFE_MESSAGE
from adapters.waa.localenv.environment import SimEnvironment
from adapters.waa.localenv.launcher import start_local_env
from adapters.waa.localenv.quirks import QuirkSettings
from adapters.waa.localenv.server import create_app
from localenv_helpers import Client, find

SETTINGS = {"ready_delay": 0.3, "accessibility_delay": 0.6, "launch_delay": 0.5}
FAILSAFE_500 = {"status": "error", "message": FAILSAFE_MESSAGE}
DEVTOOLS_501 = {"status": "error",
                "message": "no browser in the WAA simulation: the Chrome DevTools endpoint is not available"}
UNICODE_TEXTS = [
    "café naïve Ünïcödé ß Œ €",
    "日本語のテキスト 中文 한국어",
    "emoji 😀👍🏽 🇫🇷 ✓",
    "line1\nline2\r\nline3\ttabbed\n",
    "quotes \"double\" 'single' `back` «guillemets»",
    "back\\slash C:\\Users\\Docker \\n is not a newline \\x00",
    "'); import os; os.system('touch /tmp/pwned') #",
    "\"\"\"; __import__('os').system('x'); \"\"\"",
    "{{computer.mouse.move_id(0)}} ${HOME} %USERPROFILE% <b>&amp;</b>",
]


@pytest.fixture(scope="module")
def quirk_sim(tmp_path_factory):
    t0 = time.monotonic()
    handle = start_local_env(tmp_path_factory.mktemp("waa-quirks-root"), quirks=True, quirk_settings=SETTINGS)
    handle.startup_seconds = time.monotonic() - t0
    yield handle
    handle.stop()


@pytest.fixture()
def qclient(quirk_sim) -> Client:
    c = Client(quirk_sim.base_url)
    c.reset()
    return c


def notepad_text(client: Client) -> str | None:
    el = find(client.tree(), "Edit", "Text Editor")
    return None if el is None else (el.text or "")


# -- settings and /sim/info ----------------------------------------------------------------
def test_quirk_settings_defaults_and_validation():
    assert QuirkSettings().to_dict() == {"ready_delay": 2.0, "accessibility_delay": 1.0, "launch_delay": 0.5,
                                         "failsafe": True, "action_fault_rate": 0.0, "fault_seed": 0,
                                         "repaint_delay": 0.0, "strict_activation_fails": False,
                                         "live_regions": False, "save_prompts": True}
    assert QuirkSettings.from_dict({"ready_delay": 0}).ready_delay == 0.0
    for bad in ({"bogus": 1}, {"ready_delay": -1}, {"launch_delay": "1"}, {"failsafe": 1}, {"accessibility_delay": True},
                {"action_fault_rate": 1.5}, {"action_fault_rate": True}, {"fault_seed": 1.5}, {"live_regions": 1},
                {"save_prompts": "yes"}):
        with pytest.raises(ValueError):
            QuirkSettings.from_dict(bad)
    with pytest.raises(ValueError, match="without quirks=True"):
        start_local_env("/nonexistent-never-created", quirk_settings={"ready_delay": 0})


def test_sim_info_reports_quirks_and_devtools(client, qclient, quirk_sim):
    info = client.get("/sim/info").json()
    assert info["quirks"] is False and info["devtools"] is False and info["ready"] is True
    assert info["quirk_settings"] == {"ready_delay": 0.0, "accessibility_delay": 0.0, "launch_delay": 0.0,
                                      "failsafe": False, "action_fault_rate": 0.0, "fault_seed": 0,
                                      "repaint_delay": 0.0, "strict_activation_fails": False,
                                      "live_regions": False, "save_prompts": False}
    qinfo = qclient.get("/sim/info").json()
    assert set(qinfo) == {"simulation", "label", "width", "height", "snapshots", "devtools", "quirks",
                          "quirk_settings", "ready", "ready_in", "server_failsafe"}
    assert qinfo["quirks"] is True and qinfo["devtools"] is False and qinfo["ready"] is True
    assert qinfo["quirk_settings"] == {**SETTINGS, "failsafe": True, "action_fault_rate": 0.0, "fault_seed": 0,
                                       "repaint_delay": 0.0, "strict_activation_fails": False,
                                       "live_regions": False, "save_prompts": True} \
        == quirk_sim.quirks.to_dict()
    assert qinfo["server_failsafe"] is True


# -- readiness -----------------------------------------------------------------------------
def test_readiness_refused_then_ok(tmp_path):
    # Long enough that even a loaded machine checks before it ends: the refusals below are what
    # shows start_local_env returned without waiting for /probe (no bound on its own duration).
    delay = 3.0
    t0 = time.monotonic()
    handle = start_local_env(tmp_path / "root", quirks=True, wait_ready=False, quirk_settings={"ready_delay": delay})
    try:
        with pytest.raises(requests.ConnectionError):
            requests.get(handle.base_url + "/probe", timeout=5)
        with pytest.raises(requests.ConnectionError):
            requests.post(handle.base_url + "/execute", json={"command": ["python", "-c", "pass"]}, timeout=5)
        info = requests.get(handle.base_url + "/sim/info", timeout=5).json()  # /sim/* stays available
        assert info["ready"] is False and 0 < info["ready_in"] <= delay and info["quirks"] is True
        client = WAAClient(handle.base_url)
        assert not client.probe()
        client.wait_until_ready(30, poll_seconds=0.05)  # the caller's own readiness wait
        assert time.monotonic() - t0 >= delay
        assert requests.get(handle.base_url + "/probe", timeout=5).status_code == 200
    finally:
        handle.stop()


def test_not_ready_fallback_is_503_in_process(tmp_path):
    # Served other than by the simulation's own HTTP server (here Flask's test client), the
    # not-ready period answers 503 with an empty body instead of resetting the connection.
    env = SimEnvironment(tmp_path / "root", quirks=QuirkSettings(ready_delay=60))
    web = create_app(env).test_client()
    r = web.get("/probe")
    assert r.status_code == 503 and r.data == b""
    assert web.get("/sim/info").json["ready"] is False
    env.ready_at = 0
    assert web.get("/probe").status_code == 200


def test_cli_refuses_quirk_knobs_without_quirks(tmp_path):
    r = subprocess.run([sys.executable, "-m", "adapters.waa.localenv", "--root", str(tmp_path), "--ready-delay", "1"],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3], timeout=30)
    assert r.returncode == 2 and "need --quirks" in r.stderr


def test_wait_ready_waits_out_the_delay(quirk_sim, qclient):
    assert quirk_sim.startup_seconds >= SETTINGS["ready_delay"]
    assert qclient.get("/probe").status_code == 200


# -- slow accessibility ----------------------------------------------------------------------
def test_accessibility_is_slow_but_does_not_block_other_routes(qclient):
    done: dict[str, float] = {}
    t0 = time.monotonic()

    def fetch_tree():
        assert qclient.get("/accessibility", params={"backend": "uia"}).status_code == 200
        done["tree"] = time.monotonic() - t0

    worker = threading.Thread(target=fetch_tree)
    worker.start()
    time.sleep(0.1)
    assert Client(qclient.base).get("/screenshot").status_code == 200  # state lock not held while sleeping
    done["screenshot"] = time.monotonic() - t0
    worker.join(10)
    assert done["tree"] >= SETTINGS["accessibility_delay"]
    assert done["screenshot"] < SETTINGS["accessibility_delay"] <= done["tree"]


# -- fail-safe ----------------------------------------------------------------------------------
def test_failsafe_500_then_recovery_via_execute(qclient):
    qclient.update_computer()
    assert qclient.computer("computer.mouse.move_abs(0.5, 0.5)\ncomputer.mouse.single_click()").status_code == 200
    # pyautogui semantics: the move into the corner passes, the next pyautogui call trips.
    assert qclient.computer("computer.mouse.move_abs(0, 0)").status_code == 200
    r = qclient.computer("computer.mouse.single_click()")
    assert r.status_code == 500 and r.json() == FAILSAFE_500
    r = qclient.computer("computer.mouse.move_abs(0.5, 0.5)")  # stuck: moving away fails too
    assert r.status_code == 500 and r.json() == FAILSAFE_500
    r = qclient.computer("computer.keyboard.write('x')")
    assert r.status_code == 500 and r.json() == FAILSAFE_500
    assert qclient.pyautogui("pyautogui.moveTo(640, 400)")["returncode"] == 0  # FAILSAFE = False in /execute
    assert qclient.computer("computer.mouse.single_click()").status_code == 200
    # A move and a click in one program: the bottom-right corner (coordinates are clamped to the screen).
    r = qclient.computer("computer.mouse.move_abs(1.0, 1.0)\ncomputer.mouse.single_click()")
    assert r.status_code == 500 and r.json() == FAILSAFE_500


def test_failsafe_off_in_server_persists_until_revert(qclient):
    qclient.update_computer()
    code = "import pyautogui\npyautogui.FAILSAFE = False"
    assert qclient.computer(code).status_code == 200
    assert qclient.get("/sim/info").json()["server_failsafe"] is False
    assert qclient.computer("computer.mouse.move_abs(0, 0)\ncomputer.mouse.single_click()").status_code == 200
    qclient.reset()  # reverting the VM restarts the server: back to the quirks default
    assert qclient.get("/sim/info").json()["server_failsafe"] is True


def test_failsafe_is_off_without_quirks(client):
    client.update_computer()
    assert client.computer("computer.mouse.move_abs(0, 0)\ncomputer.mouse.single_click()").json() == {"status": "success"}


# -- delayed launch ---------------------------------------------------------------------------
def test_launch_window_appears_only_after_the_delay(qclient):
    t0 = time.monotonic()
    assert qclient.post("/setup/launch", json={"command": "no_such_program.exe"}).status_code == 200
    r = qclient.post("/setup/launch", json={"command": "notepad"})
    assert r.status_code == 200 and r.text == "notepad launched successfully"
    assert qclient.title() == "Desktop"  # answered before the window appeared
    while qclient.title() != "Untitled - Notepad":
        assert time.monotonic() - t0 < 10, "notepad never opened"
        time.sleep(0.05)
    assert time.monotonic() - t0 >= SETTINGS["launch_delay"]
    time.sleep(0.2)  # the unknown program never opens
    assert qclient.get("/obs_winagent").json()["window_names_str"] == "Untitled - Notepad\nProgram Manager"


def test_snapshot_load_cancels_pending_launch(qclient):
    qclient.post("/setup/launch", json={"command": "notepad"})
    qclient.reset()
    time.sleep(SETTINGS["launch_delay"] + 0.2)
    assert qclient.title() == "Desktop"


# -- clipboard (always, not only in quirks mode) ------------------------------------------------
def test_copy_text_with_error_is_500_but_clipboard_is_set(client):
    client.update_computer()
    client.post("/setup/launch", json={"command": "notepad"})
    r = client.computer("computer.clipboard.copy_text('Error: disk full')")
    # The real server prints the text, finds "error" in the captured stdout and raises it.
    assert r.status_code == 500 and r.json() == {"status": "error", "message": "Error: disk full\n"}
    assert client.get("/obs_winagent").json()["computer_clipboard"] == "Error: disk full"
    assert client.computer("computer.clipboard.paste()").status_code == 200
    assert notepad_text(client) == "Error: disk full"


@pytest.mark.parametrize("text", UNICODE_TEXTS + ["".join(UNICODE_TEXTS)])
def test_copy_text_and_paste_are_verbatim(client, sim, text):
    client.update_computer()
    client.post("/setup/launch", json={"command": "notepad"})
    before = sorted(p.relative_to(sim.root) for p in sim.root.rglob("*"))
    r = client.computer(f"computer.clipboard.copy_text({text!r})\ncomputer.clipboard.paste()")
    assert r.json() == {"status": "success"}, r.text
    assert notepad_text(client) == text
    assert client.get("/obs_winagent").json()["computer_clipboard"] == text
    assert client.get("/screenshot").status_code == 200  # drawable even where the font has no glyph
    client.pyautogui("pyautogui.hotkey('ctrl', 'v')")  # Ctrl+V from /execute pastes the same clipboard
    assert notepad_text(client) == text + text
    assert sorted(p.relative_to(sim.root) for p in sim.root.rglob("*")) == before


# -- Chrome DevTools stand-in ----------------------------------------------------------------
@pytest.mark.parametrize("method,route", [
    ("get", "/json"), ("get", "/json/list"), ("get", "/json/version"), ("put", "/json/new"), ("get", "/json/new"),
    ("put", "/json/new?about:blank"), ("get", "/json/close/ABC123"), ("put", "/json/activate/ABC123"),
])
def test_devtools_routes_refuse_with_501(client, method, route):
    r = getattr(client.s, method)(client.base + route, timeout=10)
    assert r.status_code == 501 and r.json() == DEVTOOLS_501


# -- slow repaint and failing strict activation ----------------------------------------------------


def _pixels(png: bytes) -> bytes:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        return image.convert("RGB").tobytes()


def _label(png: bytes) -> dict[str, str]:
    """The simulation's label of a frame (PNG text chunks)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        return dict(image.text)  # type: ignore[attr-defined]


def test_slow_repaint_shows_the_old_screen_and_tree_until_the_delay_has_passed(tmp_path) -> None:
    handle = start_local_env(tmp_path / "root", quirks=True, quirk_settings={
        "ready_delay": 0, "accessibility_delay": 0, "launch_delay": 0, "repaint_delay": 0.6})
    try:
        c = Client(handle.base_url)
        c.post("/setup/launch", json={"command": "notepad"})
        time.sleep(0.7)  # (setup is not an action: shown at once)
        before = _pixels(c.get("/screenshot").content)
        assert c.pyautogui("pyautogui.write('late text')")["returncode"] == 0
        acted = time.monotonic()
        shot = c.get("/screenshot").content
        assert notepad_text(c) == "" and _pixels(shot) == before  # not repainted yet
        assert _label(shot) == {"sim-actions-shown": "0", "sim-actions-run": "1"}  # the frame says it is stale
        assert c.pyautogui("pyautogui.write('!')")["returncode"] == 0  # another action re-arms it
        time.sleep(max(0.0, acted + 0.45 - time.monotonic()))
        assert notepad_text(c) == ""
        time.sleep(0.7)
        shot = c.get("/screenshot").content
        assert notepad_text(c) == "late text!" and _pixels(shot) != before
        assert _label(shot) == {"sim-actions-shown": "2", "sim-actions-run": "2"}
        assert c.get("/sim/info").json()["quirk_settings"]["repaint_delay"] == 0.6
    finally:
        handle.stop()


def test_a_failing_strict_activation_answers_500_with_no_message(tmp_path) -> None:
    handle = start_local_env(tmp_path / "root", quirks=True, quirk_settings={
        "ready_delay": 0, "accessibility_delay": 0, "launch_delay": 0, "strict_activation_fails": True})
    try:
        c = Client(handle.base_url)
        c.post("/setup/launch", json={"command": "notepad"})
        r = c.post("/setup/activate_window", json={"window_name": "Notepad", "strict": True})
        assert (r.status_code, r.json()) == (500, {"status": "error", "message": ""})
        # Non-strict only checks existence, and a window that is not there is still a 404.
        assert c.post("/setup/activate_window", json={"window_name": "Notepad"}).status_code == 200
        assert c.post("/setup/activate_window", json={"window_name": "Nowhere", "strict": True}).status_code == 404
    finally:
        handle.stop()
