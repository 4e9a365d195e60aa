"""The text action grammar that prompted models answer in, and its parser.

A reply may contain any prose and code fences; the LAST well-formed action in it is taken::

    CLICK([12])            CLICK(640, 400)         CLICK(0.5, 0.5)   (all in [0, 1] with a
    DOUBLE_CLICK([12])     RIGHT_CLICK(10, 20)                        decimal point: normalized)
    TYPE("text with \\n escapes")    KEY("Enter")    KEY("ctrl+s")
    SCROLL("down")         SCROLL("up", 5)         DRAG(10, 20, 300, 400)
    WAIT()  WAIT(2)        DONE()                  FAIL()            ANSWER("42")

String arguments are double-quoted JSON strings (parsed with ``json.loads``) or single-quoted
Python string literals (parsed with ``ast.literal_eval`` on that one literal token only). Nothing
the model writes is ever evaluated as code. Action names are case-insensitive.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Union

from pydantic import ValidationError

from adapters.benchmark import ActionType, BenchmarkAction


class ActionGrammarError(ValueError):
    """The text holds no well-formed action; the message says what was wrong."""


_NAMES = {
    "CLICK": ActionType.CLICK,
    "DOUBLE_CLICK": ActionType.DOUBLE_CLICK,
    "RIGHT_CLICK": ActionType.RIGHT_CLICK,
    "TYPE": ActionType.TYPE,
    "KEY": ActionType.KEY,
    "SCROLL": ActionType.SCROLL,
    "DRAG": ActionType.DRAG,
    "WAIT": ActionType.WAIT,
    "DONE": ActionType.DONE,
    "FAIL": ActionType.FAIL,
    "ANSWER": ActionType.ANSWER,
}
_CALL = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(sorted(_NAMES, key=len, reverse=True)) + r")\s*\(", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_MODIFIERS = {"ctrl": "ctrl", "control": "ctrl", "alt": "alt", "shift": "shift", "win": "win", "windows": "win",
              "super": "win", "meta": "win", "cmd": "win"}
_DIRECTIONS = ("up", "down", "left", "right")


@dataclass(frozen=True)
class ElementRef:
    """An element id argument: [12]."""

    node_id: str


@dataclass(frozen=True)
class Number:
    value: float
    is_float: bool  # written with a decimal point or exponent


Arg = Union[str, ElementRef, Number]


def format_grammar_help() -> str:
    """The grammar as prompt text."""
    return (
        "Answer with exactly one action, written on the last line of your reply, in this grammar:\n"
        "  CLICK([id])                 click the element with that id (ids are shown in square brackets)\n"
        "  CLICK(x, y)                 click a point, in screenshot pixels\n"
        "  DOUBLE_CLICK([id]) / DOUBLE_CLICK(x, y)\n"
        "  RIGHT_CLICK([id]) / RIGHT_CLICK(x, y)\n"
        '  TYPE("text")                type text (a JSON string: use \\n for a new line, \\" for a quote)\n'
        '  KEY("Enter")                press a key or a combination such as KEY("ctrl+s")\n'
        '  SCROLL("down") / SCROLL("up", 5)   scroll the mouse wheel (direction up/down/left/right, clicks)\n'
        "  DRAG(x1, y1, x2, y2)        drag with the left button from one point to another\n"
        "  WAIT()                      wait for the screen to change\n"
        "  DONE()                      the task is complete\n"
        "  FAIL()                      the task is impossible (infeasible)\n"
        '  ANSWER("text")              answer a question the task asked\n'
        "You may think briefly before the action; only the last action in your reply is performed."
    )


def format_action(action: BenchmarkAction) -> str:
    """`action` written in the grammar, so that `parse_action` reads it back (the inverse, for
    demonstrations and training data made from recorded steps).

    Pointer actions use their element id when they have no coordinates; normalized coordinates
    keep a decimal point (that is what marks them normalized); strings are JSON strings.
    """
    kind = action.type
    name = next(n for n, k in _NAMES.items() if k is kind)
    if kind in (ActionType.CLICK, ActionType.DOUBLE_CLICK, ActionType.RIGHT_CLICK, ActionType.DRAG):
        points = [action.x, action.y] + ([action.end_x, action.end_y] if kind is ActionType.DRAG else [])
        if any(v is None for v in points):
            if kind is not ActionType.DRAG and action.target_node_id is not None:
                return f"{name}([{action.target_node_id}])"
            raise ActionGrammarError(f"{name} without coordinates or an element id cannot be written")
        return f"{name}({', '.join(_number_text(float(v), action.normalized) for v in points)})"  # type: ignore[arg-type]
    if kind is ActionType.TYPE:
        return f"TYPE({json.dumps(action.text or '', ensure_ascii=False)})"
    if kind is ActionType.ANSWER:
        return f"ANSWER({json.dumps(action.answer or '', ensure_ascii=False)})"
    if kind is ActionType.KEY:
        combo = "+".join([*action.modifiers, action.key or ""])
        return f"KEY({json.dumps(combo, ensure_ascii=False)})"
    if kind is ActionType.SCROLL:
        return f'SCROLL("{action.scroll_direction or "down"}", {action.scroll_amount})'
    if kind is ActionType.WAIT:
        return f"WAIT({_number_text(action.seconds, False)})"
    return f"{name}()"


def _number_text(value: float, normalized: bool) -> str:
    if normalized:
        return repr(float(value))  # keeps "0.5" / "1.0": the decimal point marks normalized
    return str(int(value)) if value == int(value) else f"{value:g}"


def parse_action(text: str) -> BenchmarkAction:
    """The last well-formed action in `text`; ActionGrammarError when there is none."""
    if not isinstance(text, str) or not text.strip():
        raise ActionGrammarError("the reply is empty: it contains no action")
    found: list[tuple[int, int, BenchmarkAction]] = []
    errors: list[str] = []
    covered_until = 0
    for match in _CALL.finditer(text):
        if match.start() < covered_until:
            continue  # inside an action already parsed (e.g. TYPE("CLICK([3])"))
        name = match.group(1).upper()
        try:
            args, end = _parse_args(text, match.end())
            action = _build(name, args)
        except ActionGrammarError as exc:
            errors.append(f"{text[match.start():match.end()]}...: {exc}")
            continue
        covered_until = end
        found.append((match.start(), end, action))
    if not found:
        if errors:
            raise ActionGrammarError(f"malformed action {errors[-1]}")
        raise ActionGrammarError(
            "no action found; expected one of " + ", ".join(f"{n}(...)" for n in _NAMES)
        )
    start, end, action = found[-1]
    raw = text[start:end]
    reasoning = text[:start].strip() or None
    return action.model_copy(update={"raw_action": raw, "reasoning": reasoning[-2000:] if reasoning else None})


def _parse_args(text: str, pos: int) -> tuple[list[Arg], int]:
    """Arguments from just after "(" up to the matching ")"; returns them and the index after ")"."""
    args: list[Arg] = []
    n = len(text)

    def skip(p: int) -> int:
        while p < n and text[p].isspace():
            p += 1
        return p

    pos = skip(pos)
    if pos < n and text[pos] == ")":
        return args, pos + 1
    while True:
        pos = skip(pos)
        if pos >= n:
            raise ActionGrammarError("the argument list is not closed with ')'")
        ch = text[pos]
        if ch in "\"'":
            value, pos = _string(text, pos)
            args.append(value)
        elif ch == "[":
            close = text.find("]", pos)
            if close < 0:
                raise ActionGrammarError("an element id's '[' is not closed with ']'")
            inner = text[pos + 1 : close].strip()
            if len(inner) >= 2 and inner[0] == inner[-1] and inner[0] in "\"'":
                inner = inner[1:-1].strip()
            if not inner or any(c.isspace() or c in "[](),\"'" for c in inner):
                raise ActionGrammarError(f"bad element id [{text[pos + 1:close]}]")
            args.append(ElementRef(inner))
            pos = close + 1
        else:
            match = _NUMBER.match(text, pos)
            if not match:
                snippet = text[pos : pos + 20].splitlines()[0] if text[pos:pos + 20].strip() else text[pos:pos + 20]
                raise ActionGrammarError(f"expected a number, a quoted string or [id], found {snippet!r}")
            literal = match.group(0)
            args.append(Number(float(literal), any(c in literal for c in ".eE")))
            pos = match.end()
        pos = skip(pos)
        if pos < n and text[pos] == ",":
            pos += 1
            continue
        if pos < n and text[pos] == ")":
            return args, pos + 1
        raise ActionGrammarError("arguments must be separated by ',' and closed with ')'")


def _string(text: str, pos: int) -> tuple[str, int]:
    """One quoted string literal starting at pos, decoded without evaluating anything."""
    quote = text[pos]
    p = pos + 1
    while p < len(text):
        c = text[p]
        if c == "\\":
            p += 2
            continue
        if c == quote:
            token = text[pos : p + 1]
            try:
                if quote == '"':
                    try:
                        value = json.loads(token, strict=False)  # strict=False: raw newlines allowed
                    except json.JSONDecodeError:
                        value = ast.literal_eval(token)  # Python-only escapes such as \' or \x41
                else:
                    value = ast.literal_eval(token)
            except (ValueError, SyntaxError) as exc:
                raise ActionGrammarError(f"bad string literal {token[:40]!r}: {exc}") from exc
            if not isinstance(value, str):  # cannot happen for a single quoted token; be sure
                raise ActionGrammarError(f"not a string literal: {token[:40]!r}")
            return value, p + 1
        p += 1
    raise ActionGrammarError(f"unterminated string starting {text[pos:pos + 20]!r}")


def _numbers(name: str, args: list[Arg], count: int) -> list[Number]:
    if len(args) != count or not all(isinstance(a, Number) for a in args):
        raise ActionGrammarError(f"{name} takes {count} numbers here, got {_show(args)}")
    return list(args)  # type: ignore[arg-type]


def _show(args: list[Arg]) -> str:
    if not args:
        return "no arguments"
    return "(" + ", ".join(
        f"[{a.node_id}]" if isinstance(a, ElementRef) else (f"{a.value:g}" if isinstance(a, Number) else repr(a))
        for a in args
    ) + ")"


def _normalized(numbers: list[Number]) -> bool:
    return all(0.0 <= n.value <= 1.0 for n in numbers) and any(n.is_float for n in numbers)


def split_key(combo: str) -> tuple[str, list[str]]:
    """("ctrl+shift+s") -> ("s", ["ctrl", "shift"]); a combo with unknown leading parts is kept whole."""
    combo = combo.strip()
    if len(combo) <= 1 or "+" not in combo:
        return combo, []
    parts = combo.split("+")
    if combo.endswith("++"):  # "ctrl++": the plus key
        parts = [p for p in parts if p] + ["+"]
    key, mods = parts[-1].strip(), [p.strip().lower() for p in parts[:-1]]
    if key and all(m in _MODIFIERS for m in mods):
        return key, [_MODIFIERS[m] for m in mods]
    return combo, []


def _build(name: str, args: list[Arg]) -> BenchmarkAction:
    kind = _NAMES[name]
    fields: dict[str, object] = {"type": kind}
    if kind in (ActionType.CLICK, ActionType.DOUBLE_CLICK, ActionType.RIGHT_CLICK):
        if len(args) == 1 and isinstance(args[0], ElementRef):
            fields["target_node_id"] = args[0].node_id
        elif len(args) == 2 and all(isinstance(a, Number) for a in args):
            x, y = _numbers(name, args, 2)
            fields.update(x=x.value, y=y.value, normalized=_normalized([x, y]))
        else:
            raise ActionGrammarError(f"{name} takes [id] or x, y; got {_show(args)}")
    elif kind in (ActionType.TYPE, ActionType.ANSWER, ActionType.KEY):
        if len(args) != 1 or not isinstance(args[0], str):
            raise ActionGrammarError(f'{name} takes one quoted string, e.g. {name}("..."); got {_show(args)}')
        if kind is ActionType.TYPE:
            fields["text"] = args[0]
        elif kind is ActionType.ANSWER:
            fields["answer"] = args[0]
        else:
            if not args[0].strip():
                raise ActionGrammarError("KEY needs a key name")
            key, modifiers = split_key(args[0])
            fields.update(key=key, modifiers=modifiers)
    elif kind is ActionType.SCROLL:
        if not args or not isinstance(args[0], str) or args[0].strip().lower() not in _DIRECTIONS or len(args) > 2:
            raise ActionGrammarError(f'SCROLL takes a direction ("up", "down", "left", "right") and an optional amount; got {_show(args)}')
        fields["scroll_direction"] = args[0].strip().lower()
        if len(args) == 2:
            amount = args[1]
            if not isinstance(amount, Number) or amount.value != int(amount.value) or not 1 <= amount.value <= 100:
                raise ActionGrammarError(f"SCROLL's amount must be a whole number from 1 to 100; got {_show(args[1:])}")
            fields["scroll_amount"] = int(amount.value)
    elif kind is ActionType.DRAG:
        numbers = _numbers(name, args, 4)
        fields.update(x=numbers[0].value, y=numbers[1].value, end_x=numbers[2].value, end_y=numbers[3].value,
                      normalized=_normalized(numbers))
    elif kind is ActionType.WAIT:
        if len(args) > 1 or (args and not isinstance(args[0], Number)):
            raise ActionGrammarError(f"WAIT takes nothing or a number of seconds; got {_show(args)}")
        if args:
            seconds = args[0].value  # type: ignore[union-attr]
            if not 0 <= seconds <= 60:
                raise ActionGrammarError(f"WAIT's seconds must be within 0..60; got {seconds:g}")
            fields["seconds"] = seconds
    elif args:  # DONE, FAIL
        raise ActionGrammarError(f"{name} takes no arguments; got {_show(args)}")
    try:
        return BenchmarkAction(**fields)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(e["msg"] for e in exc.errors())
        raise ActionGrammarError(f"{name}{_show(args)} is not a valid action: {problems}") from exc
