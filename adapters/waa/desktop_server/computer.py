"""The ``computer`` object of WAA's ``/execute_windows`` and ``/update_computer``, for X11.

WAA's server ``exec()``s the posted code with a ``computer`` object (Set-of-Marks mouse, keyboard,
clipboard). This server runs no posted Python at all: the code must be a sequence of calls
``computer.<part>.<method>(<literals>)`` (the only form the harness sends: element clicks and
clipboard pastes, adapters/waa/actions.py), checked with ``ast`` and carried out here with
pyautogui; anything else is refused like a failing exec (500). So text in a string literal stays
text, whatever it holds.

As on WAA, ``computer`` has no mouse, keyboard or clipboard until the first ``/update_computer``
(a fresh server answers 500 ``'NoneType' object has no attribute ...``), and pyautogui's
fail-safe is on: a pointer left in a screen corner fails the call with pyautogui's message.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Callable


class ActionCodeError(RuntimeError):
    """The posted code is not a sequence of computer.* calls with literal arguments, or one failed."""


@dataclass
class Marks:
    """What /update_computer sent: element rectangles (screenshot pixels) and their scale."""

    rects: list[list[float]]
    window_rect: list[float]
    scale: list[float]
    clipboard_content: str | None = None
    swap_ctrl_alt: bool = False


@dataclass
class Computer:
    """Set-of-Marks mouse, keyboard and clipboard over pyautogui and the X clipboard."""

    marks: Marks
    set_clipboard: Callable[[str], None]
    pyautogui: Any
    calls: dict[str, Callable[..., None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        gui = self.pyautogui
        self.calls = {
            "mouse.move_id": self._move_id,
            "mouse.move_abs": lambda x, y: gui.moveTo(*self._scaled(x, y)),
            "mouse.single_click": lambda: gui.click(),
            "mouse.double_click": lambda: gui.doubleClick(),
            "mouse.right_click": lambda: gui.rightClick(),
            "mouse.scroll": lambda dy: gui.scroll(int(dy)),
            "keyboard.keyDown": lambda key: gui.keyDown(self._key(key)),
            "keyboard.keyUp": lambda key: gui.keyUp(self._key(key)),
            "keyboard.press": lambda key: gui.press(self._key(key)),
            "keyboard.hotkey": lambda *keys: gui.hotkey(*[self._key(k) for k in keys]),
            "keyboard.write": lambda text: gui.write(str(text)),
            "clipboard.copy_text": lambda text: self.set_clipboard(str(text)),
            "clipboard.paste": lambda: gui.hotkey("ctrl", "v"),
        }

    def _key(self, key: str) -> str:
        if self.marks.swap_ctrl_alt and key in ("ctrl", "alt"):
            return "alt" if key == "ctrl" else "ctrl"
        return key

    def _scaled(self, x: float, y: float) -> tuple[int, int]:
        sx, sy = (self.marks.scale + [1.0, 1.0])[:2]
        left, top = (self.marks.window_rect + [0, 0])[:2]
        return int(round(left + x / (sx or 1.0))), int(round(top + y / (sy or 1.0)))

    def _move_id(self, index: int) -> None:
        if not isinstance(index, int) or not 0 <= index < len(self.marks.rects):
            raise ActionCodeError(f"list index out of range: mark {index!r} of {len(self.marks.rects)}")
        left, top, right, bottom = self.marks.rects[index][:4]
        self.pyautogui.moveTo(*self._scaled((left + right) / 2, (top + bottom) / 2))


def parse_calls(code: str) -> list[tuple[str, list[Any]]]:
    """The calls of `code` as (``"part.method"``, literal arguments); ActionCodeError otherwise."""
    try:
        module = ast.parse(code, mode="exec")
    except SyntaxError as exc:
        raise ActionCodeError(f"SyntaxError: {exc.msg} (line {exc.lineno})") from None
    calls = []
    for statement in module.body:
        call = statement.value if isinstance(statement, ast.Expr) else None
        if not isinstance(call, ast.Call) or call.keywords:
            raise ActionCodeError(f"only computer.<part>.<method>(literals) calls are run here, not: "
                                  f"{ast.unparse(statement)[:200]}")
        target = _dotted(call.func)
        if target is None or not target.startswith("computer.") or target.count(".") != 2:
            raise ActionCodeError(f"not a computer.<part>.<method> call: {ast.unparse(call.func)[:200]}")
        try:
            arguments = [ast.literal_eval(argument) for argument in call.args]
        except ValueError:
            raise ActionCodeError(f"arguments of {target} must be literals") from None
        calls.append((target.removeprefix("computer."), arguments))
    return calls


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def run(code: str, computer: Computer | None) -> None:
    """Carry out `code` on `computer` (ActionCodeError for code this server does not run)."""
    calls = parse_calls(code)
    for target, arguments in calls:
        part = target.split(".", 1)[0]
        if computer is None:
            raise ActionCodeError(f"'NoneType' object has no attribute '{target.split('.')[1]}'"
                                  if part in ("mouse", "keyboard", "clipboard") else f"unknown call computer.{target}")
        function = computer.calls.get(target)
        if function is None:
            raise ActionCodeError(f"'{part}' object has no attribute '{target.split('.', 1)[1]}'")
        function(*arguments)
