"""The simulation's real-server failures: injected faults, a restarted server, trees lxml would
refuse, the process list, and the computer clipboard round trip (notes/waa.md, "Findings from
real-server behaviour")."""

from __future__ import annotations

import time

import pytest
import requests

from adapters.waa.localenv.launcher import start_local_env
from localenv_helpers import Client

CONTROL_MESSAGE = "All strings must be XML compatible: Unicode or ASCII, no NULL bytes or control characters"


@pytest.fixture()
def fresh(tmp_path) -> Client:
    """A simulation of its own (faults and restarts must not leak into other tests)."""
    handle = start_local_env(tmp_path / "root")
    yield Client(handle.base_url)
    handle.stop()


def _faults(c: Client, *faults: dict, seed: int = 0) -> requests.Response:
    return c.post("/sim/faults", json={"faults": list(faults), "seed": seed})


def test_an_injected_500_replaces_the_request_and_counts_down(fresh: Client) -> None:
    assert _faults(fresh, {"route": "/execute", "count": 1}).status_code == 200
    r = fresh.post("/execute", json={"command": ["python", "-c", "import pyautogui; pyautogui.press('a')"]})
    assert r.status_code == 500
    assert r.json() == {"status": "error", "message": "Command 'python -c ...' timed out after 120 seconds"}
    listed = fresh.get("/sim/faults").json()["faults"]
    assert listed == [{"route": "/execute", "status": 500, "message": None, "count": 1, "rate": None, "delay": 0.0,
                       "drop": False, "cut": False, "returncode": None, "hits": 1, "remaining": 0}]
    assert fresh.post("/execute", json={"command": ["python", "-c", "import pyautogui"]}).status_code == 200
    assert fresh.get("/probe").status_code == 200  # other routes are untouched
    assert _faults(fresh).json() == {"faults": []}


def test_a_failed_action_never_happens(fresh: Client) -> None:
    fresh.post("/setup/launch", json={"command": "notepad"})
    _faults(fresh, {"route": "/execute", "message": "boom"})
    assert fresh.post("/execute", json={"command": ["python", "-c", "import pyautogui; pyautogui.write('x')"]}).status_code == 500
    _faults(fresh)
    edit = [e for e in fresh.tree().iter() if e.get("name") == "Text Editor"]
    assert edit and (edit[0].text or "") == ""


def test_rate_faults_are_repeatable_with_a_seed(fresh: Client) -> None:
    def draw() -> list[int]:
        _faults(fresh, {"route": "/platform", "rate": 0.5}, seed=3)
        return [fresh.get("/platform").status_code for _ in range(20)]

    first = draw()
    assert first == draw() and 500 in first and 200 in first


def test_drop_and_delay(fresh: Client) -> None:
    _faults(fresh, {"route": "/screenshot", "drop": True, "count": 1})
    with pytest.raises(requests.ConnectionError):
        fresh.get("/screenshot")
    _faults(fresh, {"route": "/screenshot", "cut": True, "count": 1})
    with pytest.raises(requests.exceptions.ChunkedEncodingError):  # 200 and headers, then half a body
        fresh.get("/screenshot")
    assert fresh.get("/screenshot").status_code == 200
    _faults(fresh, {"route": "/platform", "status": 200, "delay": 0.5})
    started = time.monotonic()
    assert fresh.get("/platform").text == "Windows" and time.monotonic() - started >= 0.5


@pytest.mark.parametrize(
    "body, field",
    [({"faults": [{"route": "execute"}]}, "route"), ({"faults": [{"route": "/x", "status": 99}]}, "status"),
     ({"faults": [{"route": "/x", "rate": 2}]}, "rate"), ({"faults": [{"route": "/x", "bogus": 1}]}, "bogus"),
     ({"faults": "all"}, "faults"), ({"faults": [{"route": "/x", "cut": True, "status": 500}]}, "cut"),
     ({"faults": [{"route": "/x", "cut": 1}]}, "cut")],
)
def test_a_bad_fault_is_refused_naming_the_field(fresh: Client, body: dict, field: str) -> None:
    r = fresh.post("/sim/faults", json=body)
    assert r.status_code == 400 and field in r.json()["message"]


def test_quirks_action_fault_rate_fails_a_share_of_actions(tmp_path) -> None:
    handle = start_local_env(tmp_path / "q", quirks=True, quirk_settings={
        "ready_delay": 0, "accessibility_delay": 0, "launch_delay": 0, "action_fault_rate": 0.5, "fault_seed": 1})
    try:
        c = Client(handle.base_url)
        codes = [c.post("/execute", json={"command": ["python", "-c", "import pyautogui"]}).status_code for _ in range(30)]
        assert 8 <= codes.count(500) <= 22 and codes.count(200) + codes.count(500) == 30
        assert c.get("/sim/info").json()["quirk_settings"]["action_fault_rate"] == 0.5
    finally:
        handle.stop()


def test_a_restarted_server_has_no_computer_until_updated(fresh: Client) -> None:
    fresh.update_computer()
    assert fresh.computer("computer.clipboard.copy_text('a')").status_code == 200
    assert fresh.post("/sim/restart").json() == {"status": "success"}
    r = fresh.computer("computer.clipboard.copy_text('a')")
    assert r.status_code == 500 and "'NoneType' object has no attribute" in r.json()["message"]
    fresh.update_computer()
    assert fresh.computer("computer.clipboard.copy_text('a')").status_code == 200


def test_a_snapshot_taken_before_any_update_restores_no_computer(fresh: Client) -> None:
    fresh.update_computer()
    fresh.reset()  # the "initial" snapshot was taken at start, before any /update_computer
    r = fresh.computer("computer.clipboard.copy_text('a')")
    assert r.status_code == 500 and "NoneType" in r.json()["message"]


def test_clipboard_round_trip_reports_non_ascii_text_verbatim(fresh: Client) -> None:
    text = "façade 東京 ✓ 🙂"
    fresh.update_computer()
    assert fresh.computer(f"computer.clipboard.copy_text({text!r})").status_code == 200
    assert fresh.get("/obs_winagent").json()["computer_clipboard"] == text


def test_control_characters_make_the_tree_unreadable_until_gone(fresh: Client) -> None:
    fresh.post("/setup/launch", json={"command": "notepad"})
    fresh.update_computer()
    assert fresh.computer("computer.clipboard.copy_text('ring \\x07 bell')\ncomputer.clipboard.paste()").status_code == 200
    r = fresh.get("/accessibility", params={"backend": "uia"})
    assert r.status_code == 500 and r.json() == {"status": "error", "message": CONTROL_MESSAGE}
    assert fresh.get("/screenshot").status_code == 200 and fresh.get("/obs_winagent").status_code == 200
    fresh.pyautogui("pyautogui.hotkey('ctrl', 'a'); pyautogui.press('backspace')")
    assert fresh.get("/accessibility", params={"backend": "uia"}).status_code == 200


def test_tasklist_follows_the_open_windows(fresh: Client) -> None:
    def processes() -> dict[int, str]:
        out = fresh.post("/execute", json={"command": ["tasklist", "/fo", "csv", "/nh"]}).json()
        assert out["returncode"] == 0
        return {int(line.split('","')[1]): line.split('","')[0].strip('"') for line in out["output"].splitlines()}

    before = processes()
    assert "explorer.exe" in before.values() and "System" in before.values()
    fresh.post("/setup/launch", json={"command": "notepad"})
    after = processes()
    new = {pid: image for pid, image in after.items() if pid not in before}
    assert list(new.values()) == ["notepad.exe"]
    fresh.post("/setup/launch", json={"command": "photoshop"})  # unknown: 200, but nothing starts
    assert processes() == after
    fresh.post("/setup/launch", json={"command": "explorer C:\\Users\\Docker"})  # lives in the shell's process
    assert processes() == after
    shell = fresh.post("/execute", json={"command": "tasklist /fo csv /nh", "shell": True}).json()
    assert shell["returncode"] == 0 and "notepad.exe" in shell["output"]


# -- Windows' limits on /execute, and a command that ran and failed ------------------------------


def _editor_text(c: Client) -> str:
    edit = [e for e in c.tree().iter() if e.get("name") == "Text Editor"]
    assert edit
    return edit[0].text or ""


def test_a_returncode_fault_answers_200_with_the_os_error_and_does_nothing(fresh: Client) -> None:
    fresh.post("/setup/launch", json={"command": "notepad"})
    _faults(fresh, {"route": "/execute", "returncode": 1, "count": 1})
    r = fresh.post("/execute", json={"command": ["python", "-c", "import pyautogui; pyautogui.write('x')"]})
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "success" and body["returncode"] == 1 and body["output"] == ""
    assert body["error"].startswith("Traceback") and body["error"].strip().endswith("OSError: [WinError 5] Access is denied")
    assert _editor_text(fresh) == ""  # the VM failed to carry it out
    for bad in ({"route": "/screenshot", "returncode": 1}, {"route": "/execute", "returncode": 0},
                {"route": "/execute", "returncode": 1, "status": 500}):
        assert _faults(fresh, bad).status_code == 400, bad


def test_a_command_line_over_windows_limit_fails_to_start(fresh: Client) -> None:
    fresh.post("/setup/launch", json={"command": "notepad"})
    long_text = "a" * 33_000
    r = fresh.post("/execute", json={"command": ["python", "-c", f"import pyautogui; pyautogui.write({long_text!r})"]})
    assert r.status_code == 500
    assert r.json() == {"status": "error", "message": "[WinError 206] The filename or extension is too long"}
    assert _editor_text(fresh) == ""
    fits = "b" * 30_000  # under the limit (and typed without an interval: within the timeout)
    assert fresh.post("/execute", json={"command": ["python", "-c", f"import pyautogui; pyautogui.write({fits!r})"]}).status_code == 200
    assert _editor_text(fresh) == fits


def test_typing_past_the_120_s_timeout_is_killed_mid_text(fresh: Client) -> None:
    """pyautogui.write(..., interval=0.01) of 15,000 characters needs 150 s: WAA's /execute kills
    the subprocess at 120 s, so 12,000 characters are typed and the answer is its timeout 500."""
    fresh.post("/setup/launch", json={"command": "notepad"})
    code = f"import pyautogui; pyautogui.write({'c' * 15_000!r}, interval=0.01)"
    r = fresh.post("/execute", json={"command": ["python", "-c", code]})
    assert r.status_code == 500
    message = r.json()["message"]
    assert message.startswith("Command '['python', '-c', ") and message.endswith("' timed out after 120 seconds")
    assert _editor_text(fresh) == "c" * 12_000
