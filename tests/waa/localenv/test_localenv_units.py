"""Pure-logic tests of the simulation: file system mapping, action-code whitelist, rendering."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.waa.localenv import actioncode
from adapters.waa.localenv.accessibility import build_xml, element_rects, tag_for
from adapters.waa.localenv.apps.notepad import open_notepad
from adapters.waa.localenv.desktop import Desktop
from adapters.waa.localenv.environment import SimEnvironment
from adapters.waa.localenv.filesystem import ROOT_MARKER, ForeignRootError, PathError, SimFileSystem, parse_winpath
from adapters.waa.localenv.registry import canonical_key
from adapters.waa.localenv.render import png_bytes, render


@pytest.fixture()
def fs(tmp_path):
    f = SimFileSystem(tmp_path / "root")
    f.initialise()
    return f


def test_paths_map_under_root_case_insensitively(fs, tmp_path):
    fs.write_bytes("C:\\Users\\Docker\\Desktop\\a.txt", b"x")
    assert (tmp_path / "root" / "C" / "Users" / "Docker" / "Desktop" / "a.txt").read_bytes() == b"x"
    assert fs.read_bytes("c:/users/DOCKER/desktop/A.TXT") == b"x"
    assert fs.is_dir("C:\\Users\\Docker\\Documents\\")
    assert str(fs.to_winpath("c:/users/docker/desktop/a.TXT")) == "C:\\Users\\Docker\\Desktop\\a.txt"
    assert str(parse_winpath("C:\\Users\\Docker\\..\\Docker\\.\\Music")) == "C:\\Users\\Docker\\Music"
    assert str(parse_winpath("%USERPROFILE%\\Videos")) == "C:\\Users\\Docker\\Videos"


@pytest.mark.parametrize("bad", ["C:\\..\\..\\etc\\passwd", "C:/Users/../../x", "\\\\server\\share\\x", "relative\\x.txt",
                                 "/etc/passwd", "C:\\a<b", ""])
def test_escaping_or_malformed_paths_are_refused(fs, bad):
    with pytest.raises(PathError):
        fs.host_path(bad)


def test_symlink_out_of_root_is_refused(fs, tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "root" / "C" / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(PathError):
        fs.host_path("C:\\link\\x")


def test_registry_key_spellings():
    a = canonical_key(r"HKCU:\Software\Microsoft\Windows\CurrentVersion\PushNotifications")
    assert a == canonical_key(r"HKCU:Software\Microsoft\Windows\CurrentVersion\PushNotifications")
    assert a == canonical_key(r"Registry::HKEY_CURRENT_USER\Software\Microsoft\Windows\CurrentVersion\PushNotifications")


def test_whitelist_accepts_waa_action_code():
    ops = actioncode.parse("import pyautogui; import time; pyautogui.FAILSAFE = False; pyautogui.click(10, 20, button='left'); "
                           "pyautogui.scroll(-3); pyautogui.hotkey('ctrl', 's'); time.sleep(0.1); pyautogui.press(['a', 'b'])",
                           dialect="python")
    assert [o.target for o in ops] == ["set.FAILSAFE", "pyautogui.click", "pyautogui.scroll", "pyautogui.hotkey",
                                       "time.sleep", "pyautogui.press"]
    assert ops[1].args["x"] == 10 and ops[1].args["button"] == "left"


@pytest.mark.parametrize("code,needle", [
    ("import os", "import os"),
    ("import pyautogui; import os; os.system('x')", "import os"),
    ("import pyautogui; pyautogui.click(x=f'{1}')", "non-literal"),
    ("import pyautogui; pyautogui.write(open('/etc/passwd').read())", "non-literal"),
    ("import pyautogui; pyautogui.screenshot('x.png')", "pyautogui.screenshot"),
    ("import pyautogui; (lambda: 1)()", "call"),
    ("import pyautogui; x = 1", "assignment"),
    ("import pyautogui; pyautogui.click(*[1, 2])", "unpacking"),
    ("import pyautogui; __import__('os').system('x')", "__import__"),
    ("import pyautogui as p", "import pyautogui as p"),
    ("import pyautogui; pyautogui.click([1][0], 2)", "non-literal"),
    ("import pyautogui; pyautogui.FAILSAFE = False; pyautogui.click.__globals__", "statement"),
])
def test_whitelist_rejects(code, needle):
    with pytest.raises(actioncode.ActionError) as ei:
        actioncode.parse(code, dialect="python")
    assert needle in ei.value.message
    assert ei.value.traceback_text().startswith("Traceback")


def test_bad_arguments_fail_like_python():
    with pytest.raises(actioncode.ActionError) as ei:
        actioncode.parse("import pyautogui; pyautogui.click(1, 2, bogus=3)", dialect="python")
    assert ei.value.exc_type == "TypeError" and "bogus" in ei.value.message
    with pytest.raises(actioncode.ActionError) as ei:
        actioncode.parse("pyautogui.click(1, 2)", dialect="python")
    assert ei.value.exc_type == "NameError"
    with pytest.raises(actioncode.ActionError) as ei:
        actioncode.parse("import pyautogui; pyautogui.click(1, 2", dialect="python")
    assert ei.value.exc_type == "SyntaxError"


def _desk(fs) -> Desktop:
    return Desktop(fs, 1280, 800)


def test_typing_drops_what_pyautogui_cannot_type(fs):
    desk = _desk(fs)
    win = open_notepad(desk)
    ops = actioncode.parse("import pyautogui; pyautogui.write('caf\u00e9 \U0001f600ok\\r\\nx\\ty')", dialect="python")
    actioncode.Runner(desk, failsafe=True, sleep=lambda s: None).run(ops)
    assert win.editor.text == "caf ok\nx\ty"


def test_failsafe_triggers_only_when_enabled(fs):
    desk = _desk(fs)
    with pytest.raises(actioncode.ActionError) as ei:
        actioncode.Runner(desk, failsafe=True).run(
            actioncode.parse("import pyautogui; pyautogui.moveTo(0, 0); pyautogui.press('a')", dialect="python"))
    assert ei.value.exc_type == "pyautogui.FailSafeException" and ei.value.message == actioncode.FAILSAFE_MESSAGE
    assert ei.value.lineno == 1 and desk.mouse == (0, 0)  # the move went through; press() tripped
    desk.mouse = (0, 0)
    actioncode.Runner(desk, failsafe=True).run(
        actioncode.parse("import pyautogui; pyautogui.FAILSAFE = False; pyautogui.moveTo(0, 799)", dialect="python"))
    assert desk.mouse == (0, 799)


def test_sleep_is_capped(fs):
    slept = []
    actioncode.Runner(_desk(fs), failsafe=False, sleep=slept.append).run(
        actioncode.parse("import time; time.sleep(3600)", dialect="python"))
    assert slept == [actioncode.MAX_SLEEP]


def test_render_draws_the_screen_the_tree_describes(fs):
    # How fast a frame renders is for a benchmark to measure, not for a test to assert.
    desk = _desk(fs)
    open_notepad(desk)
    img = render(desk)
    assert img.size == (1280, 800)
    assert png_bytes(img)[:8] == b"\x89PNG\r\n\x1a\n"
    xml = build_xml(desk)
    assert xml.count(' id="') == len(element_rects(desk))


def test_tag_rule():
    assert tag_for("#32770") == "tag-32770"
    assert tag_for("Shell_TrayWnd") == "shell_traywnd"
    assert tag_for("Windows.UI.Core.CoreWindow") == "windows-ui-core-corewindow"


def test_the_simulated_disk_is_only_a_new_empty_or_earlier_simulated_folder(tmp_path: Path) -> None:
    """Restoring a snapshot replaces everything in the simulation's folder: `arena localenv
    --root ~/project` deleted the project's files written after the start. A folder holding
    anything else is refused, naming it, and left as it was; a new or empty folder becomes a disk
    (marked), and a disk made earlier is used again."""
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('mine')\n")
    with pytest.raises(ForeignRootError, match=f"{project}: not empty and not a simulated disk"):
        SimEnvironment(project)
    assert sorted(p.relative_to(project).as_posix() for p in project.rglob("*")) == ["src", "src/main.py"]
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ForeignRootError, match="is a file"):
        SimFileSystem(tmp_path / "a-file")

    empty = tmp_path / "empty"
    empty.mkdir()
    env = SimEnvironment(empty)
    assert (empty / ROOT_MARKER).is_file()
    env.save_snapshot("start")
    env.fs.write_bytes(r"C:\Users\Docker\Desktop\later.txt", b"after the snapshot")
    assert env.load_snapshot("start")
    assert not env.fs.exists(r"C:\Users\Docker\Desktop\later.txt")
    assert (empty / ROOT_MARKER).is_file()  # still a disk after the restore
    SimEnvironment(empty)  # made before: used again
