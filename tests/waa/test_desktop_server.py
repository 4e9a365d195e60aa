"""The real desktop's WAA server, the parts that need no X display: where WAA paths land, what
/execute_windows agrees to run, how /execute ends a command past its timeout, the tasklist the
harness verifies launches with, and the desktop guest's cache keys and preset.

The server against a real display runs in tests/vms/test_desktop_guest.py (in the guest)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.vms import kvm_image
from adapters.vms.kvm_desktop import DESKTOP
from adapters.waa.desktop_server import commands, computer
from adapters.waa.desktop_server.paths import PathRefused, local_path
from adapters.waa.setup_steps import TASKLIST_COMMAND, parse_tasklist

SERVER = Path(__file__).resolve().parents[2] / "adapters/waa/desktop_server"


@pytest.mark.parametrize("given, expected", [
    ("C:\\Users\\Docker\\waa-arena-reset-check.txt", "/home/user/waa-arena-reset-check.txt"),
    ("c:/users/docker/Documents/a b.txt", "/home/user/Documents/a b.txt"),
    ("C:\\Users\\Docker", "/home/user"),
    ("~/Desktop/x", "/home/user/Desktop/x"),
    ("/home/user/Documents/../Desktop/y", "/home/user/Desktop/y"),
])
def test_waa_paths_land_in_the_users_home(given: str, expected: str) -> None:
    assert local_path(given) == expected


@pytest.mark.parametrize("given", ["D:\\data\\x.txt", "C:\\Windows\\System32", "relative/x", "", "C:\\Users\\Dockerx"])
def test_paths_with_no_place_here_are_refused(given: str) -> None:
    with pytest.raises(PathRefused):
        local_path(given)


class _Recorder:
    """Stands in for the pyautogui module: records the calls the computer object makes."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        return lambda *args: self.calls.append((name, *args))


def _computer(recorder: _Recorder, clipboard: list[str]) -> computer.Computer:
    marks = computer.Marks(rects=[[0, 0, 100, 50], [200, 100, 300, 140]], window_rect=[0, 0, 1280, 800], scale=[1, 1])
    return computer.Computer(marks, clipboard.append, recorder)


def test_harness_code_runs_as_calls_and_text_stays_text() -> None:
    recorder, clipboard = _Recorder(), []
    hostile = "'); import os; os.system('touch /tmp/pwned') #\n\"x\" \\ 😀"
    code = f"computer.clipboard.copy_text({hostile!r})\ncomputer.clipboard.paste()\ncomputer.mouse.move_id(1)\n" \
           "computer.mouse.single_click()"
    computer.run(code, _computer(recorder, clipboard))
    assert clipboard == [hostile]
    assert recorder.calls == [("hotkey", "ctrl", "v"), ("moveTo", 250, 120), ("click",)]


@pytest.mark.parametrize("code", [
    "import os", "computer.mouse.move_id(__import__('os').getpid())", "x = 1", "computer.mouse.move_id(0); print(1)",
    "getattr(computer, 'mouse').single_click()", "computer.mouse.single_click(button='left')", "computer.__class__.x(1)",
])
def test_anything_but_literal_computer_calls_is_refused(code: str) -> None:
    recorder = _Recorder()
    with pytest.raises(computer.ActionCodeError):
        computer.run(code, _computer(recorder, []))
    assert recorder.calls == []


def test_no_computer_before_update_computer_fails_as_waa_does() -> None:
    with pytest.raises(computer.ActionCodeError, match="'NoneType' object has no attribute 'move_id'"):
        computer.run("computer.mouse.move_id(0)", None)


def test_execute_answers_failures_and_ends_a_command_past_its_timeout(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    failed = commands.execute(["sh", "-c", "echo out; echo err >&2; exit 3"], False, env)
    assert failed == {"status": "success", "output": "out\n", "error": "err\n", "returncode": 3}
    start = time.monotonic()
    with pytest.raises(commands.CommandTimedOut, match="timed out after 1 seconds"):
        # The shell's child must end too: its marker would appear after the timeout otherwise.
        commands.execute(f"sleep 3 && touch {tmp_path}/late", True, env, timeout=1)
    time.sleep(3 - (time.monotonic() - start) + 0.5)
    assert not (tmp_path / "late").exists()


def test_tasklist_lists_processes_as_the_harness_reads_them() -> None:
    # A child of known name: pytest-xdist renames its own workers' processes.
    with subprocess.Popen(["sleep", "30"]) as child:
        try:
            done = subprocess.run([sys.executable, str(SERVER / "bin/tasklist"), *TASKLIST_COMMAND[1:]],
                                  capture_output=True, text=True, check=True)
        finally:
            child.kill()
    processes = parse_tasklist(done.stdout)
    assert processes.get(child.pid) == "sleep", processes.get(child.pid)
    assert len(processes) > 2


def test_desktop_guest_is_keyed_apart_and_leaves_the_simulation_key_alone() -> None:
    assert kvm_image.base_key() == kvm_image.RECIPE.key() == kvm_image.SIM.recipe.key()
    assert kvm_image.base_key(DESKTOP) != kvm_image.base_key()
    files = kvm_image.code_files(kind=DESKTOP)
    assert "adapters/waa/desktop_server/app.py" in files and "adapters/waa/desktop_server/bin/tasklist" in files
    assert not any("localenv" in name for name in files) and not any("__pycache__" in name for name in files)
    assert kvm_image.code_key(files) != kvm_image.code_key()
    assert kvm_image.guest("debian-desktop") is DESKTOP


def test_desktop_preset_says_how_to_build_a_missing_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from adapters.vms.kvm import KVMSettings

    monkeypatch.setenv(kvm_image.CACHE_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="kvm_image build --preset debian-desktop"):
        KVMSettings(preset="debian-desktop")
