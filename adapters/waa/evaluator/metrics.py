"""Metrics: functions that turn (result state, expected state, **options) into a score.

Each metric mirrors the WAA function of the same name in
`client/desktop_env/evaluators/metrics/` (named in its docstring) on every input, odd ones
included: plain Python `==` (so "7" != 7, (1,) != [1], but 1 == True == 1.0), a None result
usually scoring 0, and an exception where WAA's function raises (the engine turns that into an
evaluation error that names the cause). Signatures match WAA's, so an option WAA's function does
not accept raises TypeError here too.

Text files are read as UTF-8 with universal newlines (WAA uses the platform default encoding,
UTF-8 in its container).
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any, Callable, TypeVar

from adapters.registry import Registry
from adapters.waa.evaluator.errors import EvaluationConfigError, require

Metric = Callable[..., Any]
METRICS: Registry[Metric] = Registry("metric")

_F = TypeVar("_F", bound=Metric)


# How many leading positional arguments of a metric are files on the evaluation host (the
# result and expected paths a file getter produced). The engine checks that such an argument
# names a file inside the evaluation's own folders, so a task's `rule` value cannot make a
# metric read another host file (adapters/host_paths.py).
FILE_ARGUMENTS: dict[str, int] = {}


def metric(name: str, *, files: int = 0) -> Callable[[_F], _F]:
    """Register a metric under the name evaluator specs use in `func`; `files` says how many
    of its leading positional arguments are host file paths."""
    if files:
        FILE_ARGUMENTS[name] = files
    return METRICS.register(name)


# Suite flavours whose evaluator differs from WAA's for some metrics: (flavour, name) -> metric.
SUITE_FLAVORS = ("waa", "waa-v2")
METRIC_VARIANTS: dict[tuple[str, str], Metric] = {}


def metric_variant(flavor: str, name: str) -> Callable[[_F], _F]:
    """Register `name`'s implementation for suites of `flavor` (WAA's stays the default)."""
    if flavor not in SUITE_FLAVORS[1:]:
        raise ValueError(f"unknown suite flavour {flavor!r}; known: {', '.join(SUITE_FLAVORS)}")

    def register(fn: _F) -> _F:
        METRIC_VARIANTS[(flavor, name)] = fn
        return fn

    return register


def metric_for(name: str, flavor: str = "waa") -> Metric:
    """The metric `name` as suites of `flavor` score it."""
    return METRIC_VARIANTS.get((flavor, name)) or METRICS[name]


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as handle:  # universal newlines: \r\n and \r become \n
        return handle.read()


@metric("infeasible")
def infeasible(*args: Any, **kwargs: Any) -> float:
    """WAA `infeasible`. The engine scores `func: "infeasible"` itself from the agent's last
    action and never calls this. WAA's function takes no arguments, so reaching it (e.g.
    "infeasible" inside a func list) raises in WAA; we raise a clear error instead."""
    raise EvaluationConfigError(
        "'infeasible' is only meaningful as the whole func (a string); WAA raises when it is called as a metric"
    )


@metric("exact_match")
def exact_match(result: Any, rules: Any) -> float:
    """WAA `exact_match`: 1.0 iff `result == rules["expected"]` (plain Python equality)."""
    return 1.0 if result == rules["expected"] else 0.0


@metric("literal_match")
def literal_match(result: Any, expected: Any, **options: Any) -> float:
    """WAA `literal_match`: compare as strings (`type` "str", the default) or as equal-length
    lists/tuples of strings (`type` "list"); `ignore_case` lower-cases both. Another `type`
    raises NotImplementedError, as in WAA."""
    kind = options.get("type", "str")
    fold = (lambda v: str(v).lower()) if options.get("ignore_case", False) else str
    if kind == "str":
        return float(fold(result) == fold(expected))
    if kind == "list":
        sequences = (list, tuple)
        if type(result) not in sequences or type(expected) not in sequences or len(result) != len(expected):
            return 0.0
        return float([fold(v) for v in result] == [fold(v) for v in expected])
    raise NotImplementedError(f"literal_match: type {kind!r} is not supported")


@metric("is_in_list")
def is_in_list(result: Any, rules: Any) -> float:
    """WAA `is_in_list`: 1.0 iff `rules["expected"] in result` (a None result raises TypeError)."""
    return 1.0 if rules["expected"] in result else 0.0


@metric("check_include_exclude")
def check_include_exclude(result: Any, rules: Any) -> float:
    """WAA `check_include_exclude`: 0 for a None result; else 1.0 iff every `include` string is
    in the result and no `exclude` string is."""
    if result is None:
        return 0.0
    include = rules.get("include", [])
    exclude = rules.get("exclude", [])
    ok = all(item in result for item in include) and not any(item in result for item in exclude)
    return 1.0 if ok else 0.0


@metric("is_extension_installed")
def is_extension_installed(actual: Any, rules: Any, **options: Any) -> float:
    """WAA `is_extension_installed` (vscode.py): a substring check on command output;
    rules {type: "contain" | "not_contain", expected}. Another type raises NotImplementedError;
    a None output raises TypeError, as in WAA."""
    kind = rules["type"]
    if kind == "contain":
        return 1.0 if rules["expected"] in actual else 0.0
    if kind == "not_contain":
        return 1.0 if rules["expected"] not in actual else 0.0
    raise NotImplementedError(f"is_extension_installed: rule type {kind!r} is not supported")


@metric("file_contains", files=1)
def file_contains(file_path: Any, config: Any) -> float:
    """WAA `file_contains`: 1.0 iff every string of `config["expected"]` occurs in the file.
    No path gives 0; WAA catches *every* error while reading and checking (missing file,
    undecodable bytes, even a malformed config) and scores 0, and so do we."""
    if not file_path:
        return 0.0
    try:
        text = _read_text(file_path)
        if any(needle not in text for needle in config["expected"]):
            return 0.0
    except Exception:  # noqa: BLE001 - WAA's bare except: any failure is a 0
        return 0.0
    return 1.0


@metric("diff_text_file", files=2)
def diff_text_file(result: Any, expect: Any) -> float:
    """WAA `diff_text_file`: difflib similarity ratio of the two files' lines (a fraction).
    A None result gives 0; a missing file raises."""
    if result is None:
        return 0.0
    ours = _read_text(result).splitlines()
    gold = _read_text(expect).splitlines()
    return difflib.SequenceMatcher(a=ours, b=gold).ratio()


_TABS_NEWLINES = re.compile(r"[\t\n]")
_WHITESPACE_RUN = re.compile(r"\s+")


def _squash_blanks(text: str) -> str:
    return _WHITESPACE_RUN.sub(" ", _TABS_NEWLINES.sub(" ", text).strip())


@metric("compare_text_file", files=2)
def compare_text_file(actual: Any, expected: Any, **options: Any) -> float:
    """WAA `compare_text_file` (vscode.py): 1.0 iff the two text files are equal after the
    options: `ignore_blanks` (tabs/newlines to spaces, trim, runs of whitespace to one space)
    then `ignore_case`. Universal newlines, so CRLF == LF. An empty/None `actual` gives 0; a
    missing file raises FileNotFoundError, as in WAA."""
    if not actual:
        return 0.0
    ours, gold = _read_text(actual), _read_text(expected)
    if options.get("ignore_blanks", False):
        ours, gold = _squash_blanks(ours), _squash_blanks(gold)
    if options.get("ignore_case", False):
        ours, gold = ours.lower(), gold.lower()
    return 1.0 if ours == gold else 0.0


@metric("check_json_settings", files=1)
def check_json_settings(actual: Any, expected: Any, **options: Any) -> float:
    """WAA `check_json_settings` (vscode.py): 1.0 iff the JSON file holds every key of
    `expected["expected"]` with an equal value (extra keys in the file are fine). An empty/None
    path gives 0; a missing file or invalid JSON raises, as in WAA."""
    if not actual:
        return 0.0
    with open(actual, encoding="utf-8") as handle:
        data = json.load(handle)
    wanted = expected["expected"]
    if not isinstance(data, dict):
        raise TypeError(f"check_json_settings: {actual} holds a JSON {type(data).__name__}, not an object")
    if not isinstance(wanted, dict):
        raise TypeError(f"check_json_settings: expected settings must be an object, got {type(wanted).__name__}")
    return 1.0 if all(key in data and data[key] == value for key, value in wanted.items()) else 0.0


@metric("fuzzy_match")
def fuzzy_match(result: Any, rules: Any) -> float:
    """WAA `fuzzy_match`: rapidfuzz `fuzz.ratio(result, rules["expected"]) / 100` (a fraction).
    Needs rapidfuzz (the 'text' extra); without it this raises a clear error, never a 0."""
    fuzz = require("rapidfuzz.fuzz", what="fuzzy_match", packages="rapidfuzz", extra="text")
    return fuzz.ratio(result, rules["expected"]) / 100.0
