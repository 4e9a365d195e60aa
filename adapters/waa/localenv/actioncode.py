"""Action code that WAA would run as Python, parsed with ``ast`` and applied, never executed.

Two dialects arrive at the server:

* ``/execute`` with ``["python", "-c", source]``: a fresh Python process importing pyautogui
  (WAA prefixes ``import pyautogui; import time; pyautogui.FAILSAFE = False;``);
* ``/execute_windows`` with ``{"command": source}``: ``exec`` inside the server with the
  globals ``computer`` (``server/computer.py``) and ``human``.

Only a whitelist is accepted: ``import pyautogui`` / ``import time``, assignments of literals to
``pyautogui.FAILSAFE`` / ``pyautogui.PAUSE``, calls of whitelisted pyautogui / ``time.sleep`` /
``computer.*`` functions whose arguments are all literals (numbers, strings, booleans, None and
tuples/lists of them). Arguments are bound against the real functions' signatures, so wrong
keywords fail like the real call would. String literals are data: whatever a string contains is
typed, never run. The whole program is checked before any of it is applied, so a rejected
program changes nothing (a real interpreter would have run the statements before the bad one).

Typing follows pyautogui on Windows: only printable ASCII plus ``\\n``, ``\\t`` and ``\\b`` reach
the desktop; other characters are dropped. Text pyautogui cannot type reaches an edit verbatim
through the clipboard: ``computer.clipboard.copy_text(text)`` (any Unicode; like the real one it
also prints the text, so text containing "error" makes ``/execute_windows`` answer 500 after the
copy) then ``computer.clipboard.paste()`` or ``pyautogui.hotkey('ctrl', 'v')`` (Ctrl+V).
``time.sleep`` is capped at 5 s per call.
Typing time is modelled, not spent: ``write``/``typewrite`` costs its ``interval`` per character
typed, and a ``Runner`` given a ``time_limit`` (``/execute``: WAA's 120 s subprocess timeout)
raises :class:`CommandTimedOut` once the modelled time passes it, after typing the characters
that fit, as the real subprocess is killed mid-text.
Fail-safe, as pyautogui does it: every pyautogui call first checks the pointer and raises
``pyautogui.FailSafeException`` (message :data:`FAILSAFE_MESSAGE`) when it is in a screen corner;
a move that itself ends in a corner does not raise (pyautogui skips the check for planned corner
targets), so it is the *next* call that fails, and every call after it, until something with the
fail-safe off moves the pointer away. In a ``python -c`` process the fail-safe is on unless the
program sets ``pyautogui.FAILSAFE = False``. ``computer.*`` methods fail where their pyautogui
call would (``clipboard.copy_text(text)`` uses pyperclip only and never does). The server process
runs with the fail-safe off (WAA's ``main.py`` disables it) unless quirks mode turns it on.
"""

from __future__ import annotations

import ast
import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .desktop import Desktop, norm_key

MAX_SLEEP = 5.0
FAILSAFE_MESSAGE = ("PyAutoGUI fail-safe triggered from mouse moving to a corner of the screen. To disable this "
                    "fail-safe, set pyautogui.FAILSAFE to False. DISABLING FAIL-SAFE IS NOT RECOMMENDED.")
"""str() of pyautogui's FailSafeException, word for word (pyautogui.failSafeCheck)."""
TYPABLE = {chr(c) for c in range(32, 127)} | {"\n", "\t", "\b"}
_NAMED_KEYS = {
    "enter", "return", "tab", "backspace", "delete", "del", "escape", "esc", "space", "up", "down",
    "left", "right", "home", "end", "pageup", "pagedown", "pgup", "pgdn", "insert", "capslock",
    "ctrl", "ctrlleft", "ctrlright", "shift", "shiftleft", "shiftright", "alt", "altleft", "altright",
    "win", "winleft", "winright", "command", "option", "printscreen", "numlock", "scrolllock", "pause",
    "apps", "volumeup", "volumedown", "volumemute", *(f"f{i}" for i in range(1, 25)),
}


class ActionError(Exception):
    """A failure of the action program, reported like the Python exception it imitates."""

    def __init__(self, exc_type: str, message: str, lineno: int = 1) -> None:
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message
        self.lineno = lineno

    def traceback_text(self) -> str:
        """A Python-like traceback, as a failing ``python -c`` writes to stderr."""
        if self.exc_type == "SyntaxError":
            return f'  File "<string>", line {self.lineno}\nSyntaxError: {self.message}\n'
        return (
            "Traceback (most recent call last):\n"
            f'  File "<string>", line {self.lineno}, in <module>\n'
            f"{self.exc_type}: {self.message}\n"
        )


class CommandTimedOut(Exception):
    """The program ran past the runner's time limit (WAA's /execute kills it at 120 s)."""


def _rejected(what: str, lineno: int) -> ActionError:
    return ActionError(
        "PermissionError",
        f"[WAA simulation] {what} is not allowed: only whitelisted pyautogui, time.sleep and computer.* "
        "calls with literal arguments are applied",
        lineno,
    )


# -- signatures of the real functions (stubs used only for argument binding) ---------------
def _click(x=None, y=None, clicks=1, interval=0.0, button="primary", duration=0.0, tween=None, logScreenshot=None, _pause=True): ...
def _double_click(x=None, y=None, interval=0.0, button="left", duration=0.0, tween=None, logScreenshot=None, _pause=True): ...
def _right_click(x=None, y=None, interval=0.0, duration=0.0, tween=None, logScreenshot=None, _pause=True): ...
def _move_to(x=None, y=None, duration=0.0, tween=None, logScreenshot=False, _pause=True): ...
def _move_rel(xOffset=None, yOffset=None, duration=0.0, tween=None, logScreenshot=False, _pause=True): ...
def _drag_to(x=None, y=None, duration=0.0, tween=None, button="primary", logScreenshot=None, _pause=True, mouseDownUp=True): ...
def _mouse_down(x=None, y=None, button="primary", duration=0.0, tween=None, logScreenshot=None, _pause=True): ...
def _typewrite(message, interval=0.0, logScreenshot=None, _pause=True): ...
def _press(keys, presses=1, interval=0.0, logScreenshot=None, _pause=True): ...
def _hotkey(*args, logScreenshot=None, interval=0.0): ...
def _key(key, logScreenshot=None, _pause=True): ...
def _scroll(clicks, x=None, y=None, logScreenshot=None, _pause=True): ...
def _sleep(secs): ...
def _no_args(): ...
def _id(id): ...
def _xy(x, y): ...
def _dir(dir="down"): ...
def _text(text): ...
def _opt_text(text=None): ...
def _program(program): ...
def _window(window=None): ...
def _app_name(app_name): ...
def _keys(*keys): ...


PYAUTOGUI_FUNCS: dict[str, Callable] = {
    "click": _click, "leftClick": _click, "doubleClick": _double_click, "tripleClick": _double_click,
    "rightClick": _right_click, "middleClick": _right_click, "moveTo": _move_to, "moveRel": _move_rel,
    "move": _move_rel, "dragTo": _drag_to, "dragRel": _drag_to, "drag": _drag_to, "mouseDown": _mouse_down,
    "mouseUp": _mouse_down, "typewrite": _typewrite, "write": _typewrite, "press": _press, "hotkey": _hotkey,
    "keyDown": _key, "keyUp": _key, "scroll": _scroll, "hscroll": _scroll, "vscroll": _scroll,
}
COMPUTER_FUNCS: dict[str, Callable] = {
    "mouse.move_id": _id, "mouse.move": _xy, "mouse.move_abs": _xy, "mouse.single_click": _no_args,
    "mouse.double_click": _no_args, "mouse.right_click": _no_args, "mouse.scroll": _dir, "mouse.drag": _xy,
    "keyboard.write": _text, "keyboard.press": _text, "keyboard.keyDown": _text, "keyboard.keyUp": _text,
    "keyboard.hotkey": _keys, "clipboard.copy_text": _opt_text, "clipboard.paste": _no_args,
    "clipboard.view_clipboard": _no_args, "os.open_program": _program, "os.maximize_window": _window,
    "window_manager.switch_to_application": _app_name,
}
SETTABLE = {"FAILSAFE", "PAUSE"}
# computer.* methods whose first act is a pyautogui call (so pyautogui's fail-safe check); the
# other pyautogui-backed ones (move_id, scroll, copy_text(None), paste, open_program,
# switch_to_application) check at the point their pyautogui call comes.
_PYAUTOGUI_FIRST = {"mouse.move", "mouse.move_abs", "mouse.drag", "mouse.single_click", "mouse.double_click",
                    "mouse.right_click", "keyboard.write", "keyboard.press", "keyboard.keyDown", "keyboard.keyUp",
                    "keyboard.hotkey"}


@dataclass
class Op:
    """One whitelisted step: a call with bound literal arguments, or a setting."""

    target: str  # "pyautogui.click", "time.sleep", "computer.mouse.move_id", "set.FAILSAFE"
    args: dict[str, Any]
    lineno: int


@dataclass
class ComputerState:
    """What /update_computer gave the server's ``computer`` object (Set-of-Marks geometry)."""

    rects: list[list[float]]
    window_rect: list[float]
    scale: list[float] = field(default_factory=lambda: [1.0, 1.0])
    clipboard_content: str | None = None
    swap_ctrl_alt: bool = False


def _literal(node: ast.AST, lineno: int) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float))
            and not isinstance(node.operand.value, bool)):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_literal(e, lineno) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    raise _rejected(f"the non-literal argument {ast.unparse(node)!r}", lineno)


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def parse(source: str, *, dialect: str) -> list[Op]:
    """Check a program against the whitelist; return its steps or raise ActionError.

    dialect is "python" (``python -c``) or "computer" (``/execute_windows``).
    """
    try:
        tree = ast.parse(source, mode="exec")
    except SyntaxError as exc:
        raise ActionError("SyntaxError", exc.msg or "invalid syntax", exc.lineno or 1) from None
    defined = {"computer", "human"} if dialect == "computer" else set()
    ops: list[Op] = []
    for stmt in tree.body:
        ln = stmt.lineno
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.name not in ("pyautogui", "time") or alias.asname:
                    raise _rejected(f"'import {alias.name}{' as ' + alias.asname if alias.asname else ''}'", ln)
                defined.add(alias.name)
        elif isinstance(stmt, ast.Pass):
            continue
        elif isinstance(stmt, ast.Assign):
            target = _dotted(stmt.targets[0]) if len(stmt.targets) == 1 else None
            if target not in {f"pyautogui.{n}" for n in SETTABLE}:
                raise _rejected(f"the assignment {ast.unparse(stmt)!r}", ln)
            if "pyautogui" not in defined:
                raise ActionError("NameError", "name 'pyautogui' is not defined", ln)
            ops.append(Op(f"set.{target.split('.')[1]}", {"value": _literal(stmt.value, ln)}, ln))
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            ops.append(_parse_call(stmt.value, defined, dialect, ln))
        else:
            raise _rejected(f"the statement {ast.unparse(stmt)[:60]!r}", ln)
    return ops


def _parse_call(call: ast.Call, defined: set[str], dialect: str, ln: int) -> Op:
    name = _dotted(call.func)
    if name is None:
        raise _rejected(f"the call {ast.unparse(call.func)[:60]!r}", ln)
    root, _, rest = name.partition(".")
    if root not in defined and root in ("pyautogui", "time", "computer", "human"):
        raise ActionError("NameError", f"name '{root}' is not defined", ln)
    if root == "pyautogui" and rest in PYAUTOGUI_FUNCS:
        stub = PYAUTOGUI_FUNCS[rest]
    elif name == "time.sleep":
        stub = _sleep
    elif root == "computer" and dialect == "computer" and rest in COMPUTER_FUNCS:
        stub = COMPUTER_FUNCS[rest]
    else:
        raise _rejected(f"'{name}'", ln)
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise _rejected("argument unpacking", ln)
    args = [_literal(a, ln) for a in call.args]
    kwargs = {k.arg: _literal(k.value, ln) for k in call.keywords}
    try:
        bound = inspect.signature(stub).bind(*args, **kwargs)
    except TypeError as exc:
        raise ActionError("TypeError", f"{rest.rsplit('.', 1)[-1]}() {exc}", ln) from None
    bound.apply_defaults()
    return Op(name, dict(bound.arguments), ln)


class Runner:
    """Applies parsed steps to the desktop."""

    def __init__(self, desk: Desktop, *, failsafe: bool, computer: ComputerState | None = None,
                 sleep: Callable[[float], None] = time.sleep, time_limit: float | None = None) -> None:
        self.desk = desk
        self.failsafe = failsafe
        self.computer = computer
        self.sleep = sleep
        self.stdout: list[str] = []
        self.time_limit = time_limit
        self.elapsed = 0.0  # modelled seconds the program has taken (typing intervals, sleeps)

    def _spend(self, seconds: float) -> None:
        """Count modelled time; past the time limit the program is killed (CommandTimedOut)."""
        self.elapsed += max(0.0, seconds)
        if self.time_limit is not None and self.elapsed > self.time_limit:
            raise CommandTimedOut(f"ran past {self.time_limit:g} s")

    # -- pointer ---------------------------------------------------------------------------
    def _corner(self) -> bool:
        x, y = self.desk.mouse
        w, h = self.desk.width - 1, self.desk.height - 1
        return (x, y) in {(0, 0), (w, 0), (0, h), (w, h)}

    def _failsafe_check(self, ln: int) -> None:
        """pyautogui's check before every call: raise while the pointer sits in a corner."""
        if self.failsafe and self._corner():
            raise ActionError("pyautogui.FailSafeException", FAILSAFE_MESSAGE, ln)

    def _point(self, x: Any, y: Any, ln: int) -> tuple[int, int]:
        cx, cy = self.desk.mouse
        if isinstance(x, (tuple, list)):
            if len(x) < 2:
                raise ActionError("pyautogui.PyAutoGUIException", "x must be a number or an (x, y) pair", ln)
            x, y = x[0], x[1]
        if isinstance(x, str):
            raise ActionError("pyautogui.ImageNotFoundException",
                              "locating images on screen is not available in the WAA simulation", ln)
        for v in (x, y):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ActionError("TypeError", f"coordinates must be numbers, not {type(v).__name__}", ln)
        nx = cx if x is None else int(x)
        ny = cy if y is None else int(y)
        # pyautogui keeps the pointer on the screen.
        return max(0, min(nx, self.desk.width - 1)), max(0, min(ny, self.desk.height - 1))

    def _move(self, x: int, y: int, ln: int) -> None:
        # No check after the move: pyautogui skips it when the planned target is a corner, and
        # otherwise the pointer is not in one. The next pyautogui call's check catches it.
        self.desk.mouse = (x, y)

    @staticmethod
    def _button(button: Any, ln: int) -> str:
        b = {"primary": "left", "secondary": "right"}.get(button, button)
        if b not in ("left", "right", "middle"):
            raise ActionError("ValueError", f'button argument must be one of ("left", "middle", "right", '
                                            f'"primary", "secondary"), not {button!r}', ln)
        return b

    # -- keys ------------------------------------------------------------------------------
    def _key_ok(self, key: Any, ln: int) -> str | None:
        if not isinstance(key, str):
            raise ActionError("TypeError", f"key must be a str, not {type(key).__name__}", ln)
        k = key.lower() if len(key) > 1 else key
        if len(k) == 1:
            return k if k in TYPABLE else None
        return k if k in _NAMED_KEYS else None  # pyautogui ignores unknown key names

    def _press(self, key: str, mods: frozenset[str] = frozenset()) -> None:
        if key in ("\n", "\r"):
            key = "enter"
        elif key == "\t":
            key = "tab"
        elif key == "\b":
            key = "backspace"
        self.desk.press(key, mods)

    def _write(self, message: Any, ln: int, interval: Any = 0.0) -> None:
        pause = float(interval) if isinstance(interval, (int, float)) and not isinstance(interval, bool) else 0.0
        if isinstance(message, str):
            for ch in message:
                if ch in TYPABLE:
                    self._press(ch)
                    self._spend(pause)
        elif isinstance(message, (list, tuple)):
            for k in message:
                ok = self._key_ok(k, ln)
                if ok:
                    self._press(ok)
        else:
            raise ActionError("TypeError", f"message must be a str or a list, not {type(message).__name__}", ln)

    def _hotkey(self, keys: tuple[Any, ...], ln: int) -> None:
        names = [k for k in (self._key_ok(k, ln) for k in keys) if k]
        mods = frozenset(norm_key(k) for k in names if norm_key(k) in ("ctrl", "shift", "alt", "win"))
        others = [k for k in names if norm_key(k) not in mods]
        for k in others:
            self._press(k, mods)

    # -- dispatch --------------------------------------------------------------------------
    def run(self, ops: list[Op]) -> None:
        """Apply the steps in order; raises ActionError on the first failing one."""
        for op in ops:
            self.step(op)

    def step(self, op: Op) -> None:  # noqa: C901 - one flat dispatch table reads best here
        """Apply one step."""
        a, ln, t = op.args, op.lineno, op.target
        if t == "set.FAILSAFE":
            self.failsafe = bool(a["value"])
            return
        if t == "set.PAUSE":
            return
        if t == "time.sleep":
            secs = a["secs"]
            if isinstance(secs, bool) or not isinstance(secs, (int, float)):
                raise ActionError("TypeError", f"'{type(secs).__name__}' object cannot be interpreted as a number", ln)
            if secs < 0:
                raise ActionError("ValueError", "sleep length must be non-negative", ln)
            self.sleep(min(float(secs), MAX_SLEEP))
            self._spend(float(secs))
            return
        if t.startswith("computer."):
            self._computer(t[9:], a, ln)
            return
        fn = t.split(".", 1)[1]
        self._failsafe_check(ln)
        d = self.desk
        if fn in ("click", "leftClick", "doubleClick", "tripleClick", "rightClick", "middleClick"):
            x, y = self._point(a["x"], a["y"], ln)
            button = {"rightClick": "right", "middleClick": "middle"}.get(fn) or self._button(a.get("button", "left"), ln)
            clicks = {"doubleClick": 2, "tripleClick": 3}.get(fn, a.get("clicks", 1))
            if not isinstance(clicks, int) or isinstance(clicks, bool):
                raise ActionError("TypeError", "clicks must be an int", ln)
            self._move(x, y, ln)
            if clicks >= 2:
                d.click(x, y, button=button, clicks=1)
                d.click(x, y, button=button, clicks=2)
                for _ in range(clicks - 2):
                    d.click(x, y, button=button, clicks=1)
            else:
                for _ in range(max(0, clicks)):
                    d.click(x, y, button=button, clicks=1)
        elif fn in ("moveTo",):
            self._move(*self._point(a["x"], a["y"], ln), ln)
        elif fn in ("moveRel", "move"):
            dx, dy = a["xOffset"] or 0, a["yOffset"] or 0
            if isinstance(dx, (tuple, list)):
                dx, dy = dx[0], dx[1]
            self._move(*self._point(d.mouse[0] + dx, d.mouse[1] + dy, ln), ln)
        elif fn in ("dragTo", "drag", "dragRel"):
            x, y = (a["x"], a["y"]) if fn == "dragTo" else (d.mouse[0] + (a["x"] or 0), d.mouse[1] + (a["y"] or 0))
            self._button(a["button"], ln)
            self._move(*self._point(x, y, ln), ln)  # dragging is not simulated beyond the move
        elif fn in ("mouseDown", "mouseUp"):
            self._button(a["button"], ln)
            if a["x"] is not None or a["y"] is not None:
                self._move(*self._point(a["x"], a["y"], ln), ln)
            if fn == "mouseUp":
                d.click(*d.mouse, button=self._button(a["button"], ln))
        elif fn in ("typewrite", "write"):
            self._write(a["message"], ln, a["interval"])
        elif fn == "press":
            keys = a["keys"] if isinstance(a["keys"], (list, tuple)) else [a["keys"]]
            presses = a["presses"] if isinstance(a["presses"], int) else 1
            for _ in range(max(0, min(presses, 1000))):
                for k in keys:
                    ok = self._key_ok(k, ln)
                    if ok:
                        self._press(ok)
        elif fn == "hotkey":
            self._hotkey(a["args"], ln)
        elif fn in ("keyDown", "keyUp"):
            k = self._key_ok(a["key"], ln)
            if k:
                nk = norm_key(k)
                if nk in ("ctrl", "shift", "alt", "win"):
                    (d.held.add if fn == "keyDown" else d.held.discard)(nk)
                elif fn == "keyDown":
                    self._press(k)
        elif fn in ("scroll", "hscroll", "vscroll"):
            if a["x"] is not None or a["y"] is not None:
                self._move(*self._point(a["x"], a["y"], ln), ln)
            # Scrolling has no effect: no simulated view is longer than its window.

    def _computer(self, fn: str, a: dict[str, Any], ln: int) -> None:
        c = self.computer
        if c is None:
            # Until /update_computer runs, the server's computer.mouse etc. are None.
            raise ActionError("AttributeError", f"'NoneType' object has no attribute '{fn.split('.', 1)[1]}'", ln)
        wr = c.window_rect
        if fn in _PYAUTOGUI_FIRST:
            self._failsafe_check(ln)
        if fn == "mouse.move_id":
            idx = a["id"]
            if isinstance(idx, bool) or not isinstance(idx, int):
                raise ActionError("TypeError", f"list indices must be integers or slices, not {type(idx).__name__}", ln)
            if not -len(c.rects) <= idx < len(c.rects):
                raise ActionError("IndexError", "list index out of range", ln)
            r = c.rects[idx]
            cx = (r[0] + r[2]) // 2 * c.scale[0]
            cy = (r[1] + r[3]) // 2 * c.scale[1]
            self._failsafe_check(ln)  # pyautogui.moveTo
            self._move(*self._point(cx + wr[0], cy + wr[1], ln), ln)
        elif fn in ("mouse.move", "mouse.move_abs", "mouse.drag"):
            x = int(a["x"] * (wr[2] - wr[0])) + wr[0]
            y = int(a["y"] * (wr[3] - wr[1])) + wr[1]
            self._move(*self._point(x, y, ln), ln)
        elif fn == "mouse.single_click":
            self.desk.click(*self.desk.mouse)
        elif fn == "mouse.double_click":
            self.desk.click(*self.desk.mouse)
            self.desk.click(*self.desk.mouse, clicks=2)
        elif fn == "mouse.right_click":
            self.desk.click(*self.desk.mouse, button="right")
        elif fn == "mouse.scroll":
            if a["dir"] not in ("up", "down"):
                raise ActionError("ValueError", "direction must be 'up' or 'down'", ln)
            self._failsafe_check(ln)  # pyautogui.scroll
        elif fn == "keyboard.write":
            self._write(a["text"], ln)
        elif fn == "keyboard.press":
            key = a["text"]
            if isinstance(key, str) and len(key) > 1 and ("+" in key or "-" in key):
                self._hotkey(tuple(k.strip() for k in key.split("+" if "+" in key else "-")), ln)
            else:
                ok = self._key_ok(key, ln)
                if ok:
                    self._press(ok)
        elif fn in ("keyboard.keyDown", "keyboard.keyUp"):
            self.step(Op("pyautogui." + fn.split(".")[1], {"key": a["text"]}, ln))
        elif fn == "keyboard.hotkey":
            self._hotkey(a["keys"], ln)
        elif fn == "clipboard.copy_text":
            text = a["text"]
            self.stdout.append(f"{text}\n")  # the real method prints its argument
            if text is not None:
                self.desk.clipboard = str(text)  # pyperclip.copy: any text, verbatim
            else:
                self._failsafe_check(ln)  # pyautogui.doubleClick
                self.desk.click(*self.desk.mouse, clicks=2)
                self._hotkey(("alt", "c") if c.swap_ctrl_alt else ("ctrl", "c"), ln)
            c.clipboard_content = text
        elif fn == "clipboard.paste":
            self._failsafe_check(ln)  # pyautogui.hotkey; Ctrl+V inserts the clipboard verbatim
            self._hotkey(("alt", "v") if c.swap_ctrl_alt else ("ctrl", "v"), ln)
        elif fn == "clipboard.view_clipboard":
            pass
        elif fn == "os.open_program":
            from .launch import launch

            if not launch(self.desk, str(a["program"])):
                self.stdout.append(f"error: Program {a['program']} is not installed\n")
            else:
                self._failsafe_check(ln)  # pyautogui.press('esc') after starting it
        elif fn == "os.maximize_window":
            win = self.desk.focused_window()
            if win is not None and win.owner is None:
                win.rect = (0, 0, self.desk.width, self.desk.height - 48)
        elif fn == "window_manager.switch_to_application":
            import difflib

            titles = [w.title for w in self.desk.windows]
            match = difflib.get_close_matches(" ".join(str(a["app_name"]).split()), titles, n=1)
            if match:
                win = next(w for w in self.desk.windows if w.title == match[0])
                self.desk.activate(win)
                self._failsafe_check(ln)  # pyautogui.press('esc')
                self.desk.press("escape")
            else:
                self.stdout.append(f"No open window found for the application '{a['app_name']}'\n")
