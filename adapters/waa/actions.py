"""Translate a BenchmarkAction into the pyautogui code WAA's server runs through /execute.

This is WAA's `pyautogui` action space: the server runs
`python -c "import pyautogui; ...; <code>"`. Every string an agent supplies (typed text, key names)
is embedded with `repr()`, which always yields one complete Python string literal, so no content
(quotes, newlines, backslashes, `'); import os #`) can leave the literal and become code. Key names
are additionally checked against pyautogui's key list.

Before anything is sent, `check_action` refuses what the agent asked for that cannot be carried
out (an unknown key, a point off the screen, an element that is not there, empty text): that is
the agent's mistake (adapters/outcomes.py R3). What passes it is well formed, so a VM that then
fails to carry it out has failed on its own (R1).

Typing of any length: text is typed in pieces of at most `TYPE_PIECE_CHARS` characters, one
/execute call each (`typing_pieces`), because one call must stay within two limits of the VM:

* Windows refuses a command line longer than 32,766 characters (CreateProcess, `[WinError 206]`),
  and WAA's /execute starts `python -c "<code>"` as a new process;
* WAA's /execute kills its subprocess after 120 s, and `pyautogui.write(..., interval=0.01)`
  sleeps 10 ms after each character; on the VM's Windows Python a 10 ms sleep lasts up to one
  timer tick (15.6 ms), and each key press costs a little more.

A piece of 1,000 characters takes 10 s of sleeps, about 16 s at the timer tick and 25 s even at
25 ms a character: a fifth of the 120 s timeout. Its command line is at most about 3,100
characters (the worst text alternates backslashes and quotes: `repr` doubles the backslash and
Windows' quoting escapes both again), a tenth of Windows' limit (`command_line_length`).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from adapters.benchmark import ActionType, BenchmarkAction, UIElement

# pyautogui's fail-safe fires when the pointer reaches a screen corner; keep every pointer
# position this many pixels away from the edges.
EDGE_MARGIN_PX = 2

# The key names pyautogui accepts (its KEYBOARD_KEYS), minus platform-only oddities.
_NAMED_KEYS = {
    "\t", "\n", "\r", " ", "accept", "add", "alt", "altleft", "altright", "apps", "backspace",
    "browserback", "browserfavorites", "browserforward", "browserhome", "browserrefresh",
    "browsersearch", "browserstop", "capslock", "clear", "convert", "ctrl", "ctrlleft",
    "ctrlright", "decimal", "del", "delete", "divide", "down", "end", "enter", "esc", "escape",
    "execute", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9", "f10", "f11", "f12", "f13",
    "f14", "f15", "f16", "f17", "f18", "f19", "f20", "f21", "f22", "f23", "f24", "final", "fn",
    "help", "home", "insert", "left", "launchapp1", "launchapp2", "launchmail",
    "launchmediaselect", "modechange", "multiply", "nexttrack", "nonconvert", "num0", "num1",
    "num2", "num3", "num4", "num5", "num6", "num7", "num8", "num9", "numlock", "pagedown",
    "pageup", "pause", "pgdn", "pgup", "playpause", "prevtrack", "print", "printscreen",
    "prntscrn", "prtsc", "prtscr", "return", "right", "scrolllock", "select", "separator",
    "shift", "shiftleft", "shiftright", "sleep", "space", "stop", "subtract", "tab", "up",
    "volumedown", "volumemute", "volumeup", "win", "winleft", "winright", "yen", "command",
    "option", "optionleft", "optionright",
}
_KEY_ALIASES = {
    "control": "ctrl", "cmd": "win", "super": "win", "meta": "win", "windows": "win",
    "return": "enter", "arrowdown": "down", "arrowup": "up", "arrowleft": "left",
    "arrowright": "right", "page_down": "pagedown", "page_up": "pageup", "escape": "esc",
    "spacebar": "space", "bksp": "backspace",
}

# pyautogui on Windows types only these characters; anything else is silently dropped there.
TYPABLE = {chr(c) for c in range(0x20, 0x7F)} | {"\n", "\t", "\b"}

PREAMBLE = "import pyautogui; import time; pyautogui.FAILSAFE = False; "

# Typing (see the module docstring): pyautogui's pause after each character, and the most
# characters one /execute call types.
TYPE_INTERVAL_SECONDS = 0.01
TYPE_PIECE_CHARS = 1000
# Windows' limit on a whole command line (CreateProcess), in characters.
WINDOWS_COMMAND_LINE_LIMIT = 32766


class ActionTranslationError(ValueError):
    """The action cannot be carried out as the agent asked (unknown key, unknown element id, a
    point off the screen, empty text): the agent's mistake, found before anything is sent."""


@dataclass(frozen=True)
class Screen:
    """What translation needs to know about the screen: its size and the current UI tree."""

    width: int
    height: int
    tree: UIElement | None = None


def normalize_key(name: str) -> str:
    """pyautogui's name for a key, or ActionTranslationError naming the bad key."""
    raw = name
    key = name.strip().lower().replace(" ", "")
    key = _KEY_ALIASES.get(key, key)
    if len(name) == 1:
        key = name.lower() if name.isalpha() else name
    if key in _NAMED_KEYS or (len(key) == 1 and key in TYPABLE):
        return key
    raise ActionTranslationError(f"unknown key {raw!r}")


def split_key_combo(action: BenchmarkAction) -> list[str]:
    """The keys of a KEY action in press order: modifiers first, then "ctrl+s" style parts."""
    assert action.key is not None
    parts = [action.key] if len(action.key) == 1 else [p for p in action.key.split("+") if p != ""]
    if action.key.endswith("++"):  # "ctrl++" means ctrl and the plus key
        parts.append("+")
    return [normalize_key(k) for k in [*action.modifiers, *parts]]


def untypable_characters(text: str) -> set[str]:
    """Characters that pyautogui on Windows would drop silently."""
    return {ch for ch in text if ch not in TYPABLE}


def resolve_point(action: BenchmarkAction, screen: Screen, *, end: bool = False) -> tuple[int, int]:
    """Pixel coordinates for an action, from its element, bbox or (normalized) x/y, clamped."""
    if not end and action.target_node_id is not None and action.x is None:
        if screen.tree is None:
            raise ActionTranslationError(
                f"element [{action.target_node_id}] cannot be resolved: no accessibility tree observed"
            )
        element = screen.tree.find(node_id=action.target_node_id)
        if element is None or element.center is None:
            raise ActionTranslationError(f"element [{action.target_node_id}] is not on screen")
        x, y = element.center
    elif not end and action.target_bbox is not None and action.x is None:
        left, top, right, bottom = action.target_bbox
        x, y = (left + right) / 2, (top + bottom) / 2
    else:
        x, y = (action.end_x, action.end_y) if end else (action.x, action.y)
        if x is None or y is None:
            raise ActionTranslationError(f"{action.type.value} has no coordinates")
        if action.normalized:
            x, y = x * (screen.width - 1), y * (screen.height - 1)
    return clamp(round(x), round(y), screen)


def clamp(x: int, y: int, screen: Screen) -> tuple[int, int]:
    """Keep a point on screen and away from the corners, where pyautogui's fail-safe fires."""
    x = min(max(x, EDGE_MARGIN_PX), screen.width - 1 - EDGE_MARGIN_PX)
    y = min(max(y, EDGE_MARGIN_PX), screen.height - 1 - EDGE_MARGIN_PX)
    return x, y


def to_pyautogui(action: BenchmarkAction, screen: Screen) -> str | None:
    """The pyautogui code for one action, or None for actions that touch nothing on the VM."""
    t = action.type
    if t in (ActionType.DONE, ActionType.FAIL, ActionType.ANSWER):
        return None
    if t is ActionType.WAIT:
        return f"time.sleep({float(action.seconds)!r})"
    if t in (ActionType.CLICK, ActionType.DOUBLE_CLICK, ActionType.RIGHT_CLICK):
        x, y = resolve_point(action, screen)
        call = {"click": "click", "double_click": "doubleClick", "right_click": "rightClick"}[t.value]
        code = f"pyautogui.{call}({x}, {y})"
        if action.modifiers:
            keys = [normalize_key(m) for m in action.modifiers]
            downs = "; ".join(f"pyautogui.keyDown({k!r})" for k in keys)
            ups = "; ".join(f"pyautogui.keyUp({k!r})" for k in reversed(keys))
            code = f"{downs}; {code}; {ups}"
        return code
    if t is ActionType.TYPE:
        assert action.text is not None
        if len(action.text) > TYPE_PIECE_CHARS:
            raise ValueError(
                f"{len(action.text)} characters do not fit one /execute call; type them with typing_pieces"
            )
        return to_pyautogui_write(action.text)
    if t is ActionType.KEY:
        keys = split_key_combo(action)
        if len(keys) == 1:
            return f"pyautogui.press({keys[0]!r})"
        return "pyautogui.hotkey(" + ", ".join(repr(k) for k in keys) + ")"
    if t is ActionType.SCROLL:
        amount = int(action.scroll_amount)
        where = ""
        if action.x is not None or action.target_node_id is not None or action.target_bbox is not None:
            x, y = resolve_point(action, screen)
            where = f", x={x}, y={y}"
        if action.scroll_direction in ("up", "down"):
            clicks = amount if action.scroll_direction == "up" else -amount
            return f"pyautogui.scroll({clicks}{where})"
        clicks = amount if action.scroll_direction == "right" else -amount
        return f"pyautogui.hscroll({clicks}{where})"
    if t is ActionType.DRAG:
        x, y = resolve_point(action, screen)
        ex, ey = resolve_point(action, screen, end=True)
        return f"pyautogui.moveTo({x}, {y}); pyautogui.dragTo({ex}, {ey}, duration=0.5, button='left')"
    raise ActionTranslationError(f"no translation for action type {t.value}")


def to_pyautogui_write(piece: str) -> str:
    """The pyautogui code that types one piece of text (at most TYPE_PIECE_CHARS characters)."""
    return f"pyautogui.write({piece!r}, interval={TYPE_INTERVAL_SECONDS!r})"


def typing_pieces(text: str, size: int = TYPE_PIECE_CHARS) -> list[str]:
    """`text` cut into consecutive pieces of at most `size` characters, each typed by its own
    /execute call (the module docstring says why 1,000); "".join(pieces) == text."""
    if size < 1:
        raise ValueError(f"piece size must be >= 1, got {size}")
    return [text[start : start + size] for start in range(0, len(text), size)]


def command_line_length(command: list[str]) -> int:
    """The length of the command line Windows' CreateProcess gets for `command` (Python's
    subprocess joins a list with `list2cmdline`); it must not exceed WINDOWS_COMMAND_LINE_LIMIT."""
    return len(subprocess.list2cmdline(command))


def _on_screen(x: float, y: float, screen: Screen, what: str) -> None:
    """ActionTranslationError when a pixel point lies outside the screen."""
    if not (0 <= x < screen.width and 0 <= y < screen.height):
        raise ActionTranslationError(f"{what} ({x:g}, {y:g}) is off the {screen.width}x{screen.height} screen")


def check_action(action: BenchmarkAction, screen: Screen) -> None:
    """Refuse, before anything reaches the VM, what the agent asked for that cannot be carried
    out: an unknown key or modifier name, a point off the screen (pixels; normalised points are
    checked by the schema), a target box whose centre is off the screen, an element id the
    observed tree does not have, or text that is empty. ActionTranslationError names the problem
    (adapters/outcomes.py R3: a failed step the agent sees; the VM is not touched)."""
    t = action.type
    for modifier in action.modifiers:
        normalize_key(modifier)
    if t is ActionType.TYPE and not action.text:
        raise ActionTranslationError("type with empty text: there is nothing to type")
    if t is ActionType.KEY:
        split_key_combo(action)
    if t in _POINTING:
        if action.x is not None and action.y is not None and not action.normalized:
            _on_screen(action.x, action.y, screen, f"{t.value} point")
        elif action.target_bbox is not None and action.x is None:
            left, top, right, bottom = action.target_bbox
            _on_screen((left + right) / 2, (top + bottom) / 2, screen, f"{t.value} target box centre")
        elif action.target_node_id is not None and action.x is None:
            resolve_point(action, screen)  # the element must be in the observed tree, with a box
    if t is ActionType.DRAG and action.end_x is not None and action.end_y is not None and not action.normalized:
        _on_screen(action.end_x, action.end_y, screen, "drag end point")


_POINTING = frozenset({
    ActionType.CLICK, ActionType.DOUBLE_CLICK, ActionType.RIGHT_CLICK, ActionType.DRAG, ActionType.SCROLL,
})


_COMPUTER_CLICKS = {
    ActionType.CLICK: "single_click",
    ActionType.DOUBLE_CLICK: "double_click",
    ActionType.RIGHT_CLICK: "right_click",
}


def to_computer_click(action: BenchmarkAction, mark_index: int) -> str:
    """`computer.*` code clicking Set-of-Marks element `mark_index` (run via /execute_windows)."""
    keys = [normalize_key(m) for m in action.modifiers]
    lines = [f"computer.keyboard.keyDown({k!r})" for k in keys]
    lines.append(f"computer.mouse.move_id({int(mark_index)})")
    lines.append(f"computer.mouse.{_COMPUTER_CLICKS[action.type]}()")
    lines += [f"computer.keyboard.keyUp({k!r})" for k in reversed(keys)]
    return "\n".join(lines)


def clipboard_chunks(text: str) -> list[str]:
    """Split text so that no piece contains "error" in any case.

    The server's `computer.clipboard.copy_text` prints its text, and /execute_windows answers 500
    whenever the printed output contains "error"; cutting every occurrence in two avoids that.
    """
    chunks: list[str] = []
    rest = text
    while True:
        at = rest.lower().find("error")
        if at < 0:
            break
        chunks.append(rest[: at + 3])
        rest = rest[at + 3 :]
    chunks.append(rest)
    return [c for c in chunks if c]


def to_clipboard_paste(text: str) -> str:
    """`computer.*` code that types `text` verbatim through the clipboard (any unicode)."""
    return "\n".join(
        f"computer.clipboard.copy_text({chunk!r})\ncomputer.clipboard.paste()" for chunk in clipboard_chunks(text)
    )


def to_execute_command(code: str) -> list[str]:
    """The /execute payload that runs `code` with pyautogui, as WAA's action space does."""
    return ["python", "-c", PREAMBLE + code]
