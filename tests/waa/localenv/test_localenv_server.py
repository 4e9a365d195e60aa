"""The simulation process over HTTP: routes, shapes, status codes, safety and snapshots."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from adapters.waa.localenv.launcher import LocalEnvError, start_local_env
from localenv_helpers import bbox, find

DOCS = "C:\\Users\\Docker\\Documents"
HOSTILE = ["'); import os; os.system('touch /tmp/pwned') #", 'a "quoted" \\ back\\slash', "line1\nline2",
           "\"\"\"; __import__('os').system('x'); \"\"\""]


def test_probe_platform_and_sim_info(client):
    assert client.get("/probe").json() == {"status": "Probe successful", "message": "Service is operational"}
    assert client.get("/platform").text == "Windows"
    info = client.get("/sim/info").json()
    assert info["simulation"] is True and "initial" in info["snapshots"] and info["width"] == 1280
    assert client.post("/screen_size").json() == {"width": 1280, "height": 800}
    assert client.post("/documents_path").json() == {"documents_path": DOCS}


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_strings_are_typed_as_text(client, sim, text):
    client.post("/setup/launch", json={"command": "notepad"})
    before = sorted(p.relative_to(sim.root) for p in sim.root.rglob("*"))
    out = client.pyautogui(f"pyautogui.write({text!r})")
    assert out["returncode"] == 0, out
    editor = find(client.tree(), "Edit", "Text Editor")
    assert editor.text == text
    assert sorted(p.relative_to(sim.root) for p in sim.root.rglob("*")) == before
    assert not Path("/tmp/pwned").exists()


def test_rejected_code_reports_like_a_failing_python(client, sim):
    r = client.post("/execute", json={"command": ["python", "-c", "import os; os.system('touch /tmp/pwned2')"]})
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "success" and body["returncode"] == 1 and "import os" in body["error"]
    assert not Path("/tmp/pwned2").exists()
    body = client.post("/execute", json={"command": "rm -rf /", "shell": True}).json()
    assert body["returncode"] == 1 and "not available in the WAA simulation" in body["error"]
    r = client.post("/execute_windows", json={"command": "import os\nos.system('x')"})
    assert r.status_code == 500 and r.json()["status"] == "error" and "import os" in r.json()["message"]


def test_execute_windows_needs_update_computer_then_moves_by_id(client):
    r = client.post("/execute_windows", json={"command": "computer.mouse.move_id(0)"})
    assert r.status_code == 500 and "NoneType" in r.json()["message"]
    client.post("/setup/launch", json={"command": ["explorer", DOCS]})
    root = client.tree()
    elements = [el for el in root.iter() if el.get("id") is not None]
    rects = [list(bbox(el)) for el in elements]
    shot = base64.b64encode(client.get("/screenshot").content).decode()
    assert client.post("/update_computer", json={"rects": rects, "window_rect": [0, 0, 1280, 800], "screenshot": shot,
                                                 "scale": [1, 1]}).json() == {"success": True}
    target = find(root, "Button", "New folder")
    code = f"computer.mouse.move_id({int(target.get('id'))})\ncomputer.mouse.single_click()\ncomputer.keyboard.write('Made by id')\ncomputer.keyboard.press('enter')"
    assert client.post("/execute_windows", json={"command": code}).json() == {"status": "success"}
    assert client.post("/folder_exists", json={"folder_name": "Made by id", "path": DOCS}).status_code == 200
    r = client.post("/execute_windows", json={"command": "computer.clipboard.copy_text('an error text')"})
    assert r.status_code == 500  # like the real server: printed output containing "error" fails the call


def test_registry_query_and_settings_toggle(client):
    key = r"HKCU:\Software\Microsoft\Windows\CurrentVersion\StorageSense\Parameters\StoragePolicy"
    assert client.registry(key, "01") == {"status": "success", "output": "0\n", "error": "", "returncode": 0}
    missing = client.registry(key, "nope")
    assert missing["returncode"] == 1 and missing["output"] == "" and "does not exist" in missing["error"]
    client.post("/setup/launch", json={"command": "explorer ms-settings:storagesense"})
    el = find(client.tree(), "ToggleSwitch", "Storage Sense")
    x0, y0, x1, y1 = bbox(el)
    client.pyautogui(f"pyautogui.click({(x0 + x1) // 2}, {(y0 + y1) // 2})")
    assert client.registry(key, "01")["output"] == "1\n"
    assert find(client.tree(), "ToggleSwitch", "Storage Sense").get("{uri:deskat:state.at-spi.gnome.org}checked") == "true"


def test_snapshot_restores_exactly(client):
    client.post("/setup/create_file", json={"path": DOCS + "\\keep.txt", "content": "v1"})
    client.post("/setup/launch", json={"command": "notepad"})
    client.pyautogui("pyautogui.write('before'); pyautogui.hotkey('ctrl', 'a'); pyautogui.hotkey('ctrl', 'c'); pyautogui.moveTo(300, 300)")
    assert client.post("/sim/snapshot/save", json={"name": "s1"}).json() == {"status": "success"}
    saved_xml = client.get("/accessibility?backend=uia").json()["AT"]
    saved_shot = client.get("/screenshot").content
    saved_tree = client.post("/list_directory", json={"path": "C:\\Users\\Docker"}).json()

    client.post("/setup/create_file", json={"path": DOCS + "\\keep.txt", "content": "v2"})
    client.post("/setup/create_folder", json={"path": DOCS + "\\extra"})
    client.pyautogui("pyautogui.write('after'); pyautogui.moveTo(500, 500)")
    client.post("/setup/launch", json={"command": "start ms-settings:notifications"})
    client.post("/setup/close_all")

    assert client.post("/sim/snapshot/load", json={"name": "s1"}).status_code == 200
    assert client.get("/accessibility?backend=uia").json()["AT"] == saved_xml
    assert client.get("/screenshot").content == saved_shot
    assert client.post("/list_directory", json={"path": "C:\\Users\\Docker"}).json() == saved_tree
    assert client.read(DOCS + "\\keep.txt") == b"v1"
    client.pyautogui("pyautogui.press('end'); pyautogui.hotkey('ctrl', 'v')")  # the clipboard came back too
    assert find(client.tree(), "Edit", "Text Editor").text == "beforebefore"
    assert client.post("/sim/snapshot/load", json={"name": "missing"}).status_code == 404


def test_accessibility_boxes_match_screenshot(client):
    client.post("/setup/create_file", json={"path": DOCS + "\\a.txt", "content": "hello"})
    client.post("/setup/open_file", json={"path": DOCS})
    shot = Image.open(io.BytesIO(client.get("/screenshot").content))
    assert shot.size == (1280, 800)
    root = client.tree()
    assert root.tag == "desktop"
    ids = [int(el.get("id")) for el in root.iter() if el.get("id") is not None]
    assert ids == list(range(len(ids)))
    item = find(root, "ListItem", "a.txt", window="Documents")
    x0, y0, x1, y1 = bbox(item)
    assert 0 <= x0 < x1 <= 1280 and 0 <= y0 < y1 <= 800
    # Clicking the reported centre selects exactly that element, and the picture changes there.
    before = shot.crop((x0, y0, x1, y1)).tobytes()
    client.pyautogui(f"pyautogui.click({(x0 + x1) // 2}, {(y0 + y1) // 2}); pyautogui.moveTo(5, 400)")
    after_img = Image.open(io.BytesIO(client.get("/screenshot").content))
    assert after_img.crop((x0, y0, x1, y1)).tobytes() != before
    assert find(client.tree(), "ListItem", "a.txt").get("{uri:deskat:state.at-spi.gnome.org}selected") == "true"
    assert client.get("/accessibility?backend=bogus").status_code == 400
    assert client.get("/accessibility?backend=win32").status_code == 200


def test_obs_winagent_shape(client):
    client.post("/setup/launch", json={"command": "notepad"})
    obs = client.get("/obs_winagent").json()
    assert set(obs) >= {"image", "window_title", "rect", "window_names_str", "computer_clipboard", "human_input", "status"}
    assert obs["window_title"] == "Untitled - Notepad" and obs["simulation"] is True
    x0, y0, x1, y1 = obs["rect"]
    assert Image.open(io.BytesIO(base64.b64decode(obs["image"]))).size == (x1 - x0, y1 - y0)


@pytest.mark.parametrize("method,route,kw", [
    ("get", "/no/such/route", {}),
    ("get", "/execute", {}),
    ("post", "/execute", {"data": "{not json", "headers": {"Content-Type": "application/json"}}),
    ("get", "/cursor_position", {}),
    ("post", "/wallpaper", {}),
])
def test_errors_are_500_json(client, method, route, kw):
    r = getattr(client, method)(route, **kw)
    assert r.status_code == 500 and r.json()["status"] == "error"


def test_file_routes_and_path_traversal(client):
    assert client.post("/file", data={"file_path": "C:\\..\\..\\..\\etc\\passwd"}).status_code == 404
    assert client.post("/file", data={"file_path": DOCS + "\\missing.txt"}).status_code == 404
    assert client.post("/file", data={}).status_code == 400
    r = client.post("/setup/upload", data={"file_path": "C:\\..\\..\\escape.txt"}, files={"file_data": ("x", b"x")})
    assert r.status_code == 500
    assert client.post("/setup/create_folder", json={"path": "C:/../../outside"}).status_code == 400
    assert client.post("/setup/upload", data={"file_path": DOCS + "\\up.bin"}, files={"file_data": ("up.bin", b"\x00\x01")}).text == "File Uploaded"
    assert client.read(DOCS.lower() + "/UP.BIN") == b"\x00\x01"
    tree = client.post("/list_directory", json={"path": DOCS}).json()["directory_tree"]
    assert tree == {"type": "directory", "name": "Documents", "children": [{"type": "file", "name": "up.bin"}]}
    assert client.post("/file_exists", json={"file_name": "up.bin", "path": DOCS}).status_code == 200
    assert client.post("/file_exists", json={"file_name": "nope.bin", "path": DOCS}).status_code == 400
    assert client.post("/folder_exists", json={"folder_name": "Documents", "path": "C:\\Users\\Docker"}).status_code == 200
    assert client.post("/setup/open_file", json={"path": DOCS + "\\missing.txt"}).status_code == 404
    client.post("/setup/upload", data={"file_path": "C:\\Users\\Docker\\Downloads\\d.txt"}, files={"file_data": ("d", b"d")})
    assert "cleared successfully" in client.post("/setup/clear_task_files").text
    assert client.read("C:\\Users\\Docker\\Downloads\\d.txt") is None


def test_launch_and_window_routes(client):
    assert client.post("/setup/launch", json={"command": "no_such_program.exe"}).status_code == 200
    assert client.post("/setup/activate_window", json={"window_name": "Notepad"}).status_code == 404
    client.post("/setup/launch", json={"command": ["notepad"]})
    client.post("/setup/launch", json={"command": ["explorer", DOCS]})
    assert client.post("/setup/activate_window", json={"window_name": "notepad", "strict": True}).status_code == 200
    assert client.get("/obs_winagent").json()["window_title"] == "Untitled - Notepad"
    assert client.post("/setup/close_window", json={"window_name": "Notepad", "strict": True}).status_code == 404
    assert client.post("/setup/close_window", json={"window_name": "Notepad"}).status_code == 200
    assert client.get("/obs_winagent").json()["window_title"] == "Documents"
    assert client.post("/setup/close_all").status_code == 200
    assert client.get("/obs_winagent").json()["window_title"] == "Desktop"


def test_failsafe_over_http(client):
    # As pyautogui: the move into the corner itself passes, the next call trips the fail-safe.
    body = client.post("/execute", json={"command": ["python", "-c", "import pyautogui; pyautogui.moveTo(0, 0)"]}).json()
    assert body["returncode"] == 0, body
    body = client.post("/execute", json={"command": ["python", "-c", "import pyautogui; pyautogui.moveTo(9, 9)"]}).json()
    assert body["returncode"] == 1 and "pyautogui.FailSafeException: PyAutoGUI fail-safe triggered" in body["error"]
    assert client.pyautogui("pyautogui.moveTo(9, 9)")["returncode"] == 0  # FAILSAFE = False gets it out


def test_refuses_remote_host_and_reports_startup_failure(tmp_path):
    r = subprocess.run([sys.executable, "-m", "adapters.waa.localenv", "--host", "0.0.0.0", "--root", str(tmp_path)],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3], timeout=30)
    assert r.returncode == 2 and "non-loopback" in r.stderr
    with pytest.raises(LocalEnvError, match="screen too small"):
        start_local_env(tmp_path / "r", width=10, height=10, startup_timeout=20)


def test_stop_terminates(tmp_path):
    h = start_local_env(tmp_path / "root2")
    assert h.alive()
    h.stop()
    assert not h.alive()
    log = h.log_path.read_text()
    assert "WAA SIMULATION listening" in log and "WAA SIMULATION stopped" in log  # clean SIGTERM shutdown


def test_a_stopped_simulation_leaves_its_log_beside_its_root_and_nothing_in_the_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its log used to live in a temporary folder of its own that nothing removed: thousands of
    `waa-sim-*` folders piled up in /tmp."""
    import tempfile

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # tempfile's own setting for its folder
    h = start_local_env(tmp_path / "root")
    h.stop()
    assert h.log_path == tmp_path / "root.log" and "WAA SIMULATION stopped" in h.log_path.read_text()
    assert list(temporary.iterdir()) == []


def test_a_simulation_whose_parent_died_while_it_started_stops(tmp_path):
    """The process that started a simulation ends before the simulation is up (as when a shard's
    process tree is killed mid-start): the simulation, already handed to init, still stops."""
    import psutil

    starter = ("import os, subprocess, sys\n"
               "child = subprocess.Popen([sys.executable, '-m', 'adapters.waa.localenv', '--root', sys.argv[1],\n"
               "                          '--exit-with-parent', str(os.getpid())], start_new_session=True,\n"
               "                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
               "print(child.pid)\n")  # and exit at once, while the child still imports
    started = subprocess.run([sys.executable, "-c", starter, str(tmp_path / "root")], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[3], timeout=30, check=True)
    sim = psutil.Process(int(started.stdout))
    try:
        # It may come up first (and answer nobody): it stops within its watch's half-second poll.
        sim.wait(timeout=30)
    except psutil.TimeoutExpired:
        sim.kill()
        pytest.fail("the simulation outlived the process that started it by 30 s")
