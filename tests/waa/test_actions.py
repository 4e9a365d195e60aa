"""Action translation: every action type, clamping, and hostile strings staying data."""

from __future__ import annotations

import ast
import re

import pytest

from adapters.benchmark import ActionType, BenchmarkAction, UIElement
from adapters.waa.actions import (
    ActionTranslationError,
    Screen,
    normalize_key,
    to_execute_command,
    to_pyautogui,
    untypable_characters,
)

SCREEN = Screen(width=1280, height=800)

HOSTILE = [
    "it's \"quoted\"",
    "line one\nline two\r\n",
    "'); import os; os.system('x') #",
    '"""; __import__("os").system("x"); """',
    "back\\slash \\' \\\" end\\",
    "{__import__('os')}",
]


def _calls(code: str) -> list[ast.Call]:
    tree = ast.parse(code)
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


@pytest.mark.parametrize("text", HOSTILE)
def test_typed_text_is_one_literal(text: str) -> None:
    code = to_pyautogui(BenchmarkAction(type=ActionType.TYPE, text=text), SCREEN)
    assert code is not None
    calls = _calls(code)
    assert len(calls) == 1, code
    call = calls[0]
    assert ast.unparse(call.func) == "pyautogui.write"
    assert isinstance(call.args[0], ast.Constant) and call.args[0].value == text
    # The whole /execute program parses to exactly the preamble's statements plus this call.
    program = to_execute_command(code)[2]
    names = {ast.unparse(c.func) for c in _calls(program)}
    assert names == {"pyautogui.write"}


def test_every_action_type_translates() -> None:
    tree = UIElement(node_id="root", role="desktop", children=[UIElement(node_id="7", role="Button", name="Save", bbox=(100, 100, 140, 120))])
    screen = Screen(1280, 800, tree)
    cases = {
        ActionType.CLICK: ({"x": 10, "y": 20}, "pyautogui.click(10, 20)"),
        ActionType.DOUBLE_CLICK: ({"target_node_id": "7"}, "pyautogui.doubleClick(120, 110)"),
        ActionType.RIGHT_CLICK: ({"x": 0.5, "y": 0.5, "normalized": True}, "pyautogui.rightClick(640, 400)"),
        ActionType.TYPE: ({"text": "hi"}, "pyautogui.write('hi', interval=0.01)"),
        ActionType.KEY: ({"key": "s", "modifiers": ["ctrl"]}, "pyautogui.hotkey('ctrl', 's')"),
        ActionType.SCROLL: ({"scroll_direction": "down", "scroll_amount": 2}, "pyautogui.scroll(-2)"),
        ActionType.DRAG: ({"x": 10, "y": 10, "end_x": 50, "end_y": 60}, "pyautogui.dragTo(50, 60"),
        ActionType.WAIT: ({"seconds": 0.5}, "time.sleep(0.5)"),
    }
    for action_type, (fields, expected) in cases.items():
        code = to_pyautogui(BenchmarkAction(type=action_type, **fields), screen)
        assert code is not None and expected in code, (action_type, code)
    for ending in (ActionType.DONE, ActionType.FAIL):
        assert to_pyautogui(BenchmarkAction(type=ending), screen) is None
    assert to_pyautogui(BenchmarkAction(type=ActionType.ANSWER, answer="42"), screen) is None


def test_corners_are_clamped_away_from_the_failsafe() -> None:
    for x, y in [(0, 0), (1279, 799), (-50, 5000)]:
        code = to_pyautogui(BenchmarkAction(type=ActionType.CLICK, x=x, y=y), SCREEN)
        call = _calls(code)[0]
        px, py = (a.value for a in call.args)
        assert 0 < px < 1279 and 0 < py < 799


def test_key_names_are_checked() -> None:
    assert normalize_key("Enter") == "enter"
    assert normalize_key("Return") == "enter"
    assert normalize_key("PageDown") == "pagedown"
    with pytest.raises(ActionTranslationError, match="unknown key"):
        to_pyautogui(BenchmarkAction(type=ActionType.KEY, key="enter'); import os; ('"), SCREEN)
    combo = to_pyautogui(BenchmarkAction(type=ActionType.KEY, key="ctrl+shift+s"), SCREEN)
    assert combo == "pyautogui.hotkey('ctrl', 'shift', 's')"


def test_unknown_element_and_missing_tree_are_errors() -> None:
    with pytest.raises(ActionTranslationError, match="no accessibility tree"):
        to_pyautogui(BenchmarkAction(type=ActionType.CLICK, target_node_id="3"), SCREEN)
    screen = Screen(1280, 800, UIElement(node_id="0", role="desktop"))
    with pytest.raises(ActionTranslationError, match=r"\[3\] is not on screen"):
        to_pyautogui(BenchmarkAction(type=ActionType.CLICK, target_node_id="3"), screen)


def test_schema_rejects_incomplete_actions() -> None:
    with pytest.raises(ValueError, match="type needs text"):
        BenchmarkAction(type=ActionType.TYPE)
    with pytest.raises(ValueError, match="outside"):
        BenchmarkAction(type=ActionType.CLICK, x=1.5, y=0.2, normalized=True)
    with pytest.raises(ValueError, match="unknown modifier"):
        BenchmarkAction(type=ActionType.KEY, key="a", modifiers=["hyper"])


def test_untypable_characters_are_reported() -> None:
    assert untypable_characters("héllo\r") == {"é", "\r"}
    assert untypable_characters("plain ascii\n\t") == set()


def test_clipboard_chunks_never_contain_error() -> None:
    from adapters.waa.actions import clipboard_chunks, to_clipboard_paste

    for text in ["no problem", "Error", "an error, ERRORERROR and errors", "errerror", "é error ü"]:
        chunks = clipboard_chunks(text)
        assert "".join(chunks) == text
        assert all("error" not in c.lower() for c in chunks)
    code = to_clipboard_paste("x'); import os #\nerror")
    calls = [ast.unparse(c.func) for c in _calls(code)]
    assert set(calls) == {"computer.clipboard.copy_text", "computer.clipboard.paste"}
    pasted = "".join(c.args[0].value for c in _calls(code) if c.args)
    assert pasted == "x'); import os #\nerror"


def test_element_click_goes_through_move_id() -> None:
    from adapters.waa.actions import to_computer_click

    code = to_computer_click(BenchmarkAction(type=ActionType.DOUBLE_CLICK, target_node_id="7", modifiers=["ctrl"]), 3)
    assert code.splitlines() == [
        "computer.keyboard.keyDown('ctrl')",
        "computer.mouse.move_id(3)",
        "computer.mouse.double_click()",
        "computer.keyboard.keyUp('ctrl')",
    ]


# -- typing of any length ------------------------------------------------------------------------


def test_typing_pieces_keep_the_text_and_each_fits_one_execute_call() -> None:
    from adapters.waa.actions import (
        TYPE_INTERVAL_SECONDS,
        TYPE_PIECE_CHARS,
        WINDOWS_COMMAND_LINE_LIMIT,
        command_line_length,
        to_pyautogui_write,
        typing_pieces,
    )

    text = "".join(chr(32 + i % 95) for i in range(40_000)) + "\n\t\b"
    pieces = typing_pieces(text)
    assert "".join(pieces) == text and len(pieces) == 41 and max(map(len, pieces)) == TYPE_PIECE_CHARS
    # The worst case for the command line: backslash-quote pairs, which repr and then Windows'
    # quoting both lengthen (6 characters a pair); other typable characters cost at most 2.
    for worst in ('\\"' * (TYPE_PIECE_CHARS // 2), ('"\\\'\n\t\b' * TYPE_PIECE_CHARS)[:TYPE_PIECE_CHARS]):
        length = command_line_length(to_execute_command(to_pyautogui_write(worst)))
        assert length <= 3_200 < WINDOWS_COMMAND_LINE_LIMIT / 10, length
    # At pyautogui's interval a piece's sleeps alone take 10 s: a twelfth of WAA's 120 s timeout.
    assert TYPE_PIECE_CHARS * TYPE_INTERVAL_SECONDS <= 120 / 10
    with pytest.raises(ValueError, match="typing_pieces"):
        to_pyautogui(BenchmarkAction(type=ActionType.TYPE, text="x" * 1001), SCREEN)
    assert typing_pieces("") == []


# -- the agent's mistakes are found before anything is sent -------------------------------------


def test_check_action_refuses_what_cannot_be_carried_out() -> None:
    from adapters.waa.actions import check_action

    tree = UIElement(node_id="root", role="desktop",
                     children=[UIElement(node_id="7", role="Button", name="Save", bbox=(100, 100, 140, 120))])
    screen = Screen(1280, 800, tree)
    refused = {
        "unknown key 'hyperdrive'": BenchmarkAction(type=ActionType.KEY, key="ctrl+hyperdrive"),
        "click point (1280, 10) is off the 1280x800 screen": BenchmarkAction(type=ActionType.CLICK, x=1280, y=10),
        "scroll point (-1, 10) is off": BenchmarkAction(type=ActionType.SCROLL, x=-1, y=10, scroll_direction="down"),
        "target box centre": BenchmarkAction(type=ActionType.CLICK, target_bbox=(2000, 0, 2100, 50)),
        "drag end point": BenchmarkAction(type=ActionType.DRAG, x=10, y=10, end_x=10, end_y=900),
        "[8] is not on screen": BenchmarkAction(type=ActionType.DOUBLE_CLICK, target_node_id="8"),
        "nothing to type": BenchmarkAction(type=ActionType.TYPE, text=""),
    }
    for says, action in refused.items():
        with pytest.raises(ActionTranslationError, match=re.escape(says)):
            check_action(action, screen)
    for action in (
        BenchmarkAction(type=ActionType.CLICK, x=0, y=0),  # on screen: clamped off the corner, not refused
        BenchmarkAction(type=ActionType.CLICK, x=1.0, y=1.0, normalized=True),
        BenchmarkAction(type=ActionType.CLICK, target_node_id="7"),
        BenchmarkAction(type=ActionType.TYPE, text=" "),
        BenchmarkAction(type=ActionType.KEY, key="s", modifiers=["ctrl"]),
        BenchmarkAction(type=ActionType.SCROLL, scroll_direction="up"),
        BenchmarkAction(type=ActionType.DONE),
    ):
        check_action(action, screen)
