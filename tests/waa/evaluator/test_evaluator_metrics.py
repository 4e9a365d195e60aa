"""Each metric on normal and odd inputs, with WAA's semantics."""

from __future__ import annotations

import pytest

from adapters.waa.evaluator import METRICS
from adapters.waa.evaluator.errors import EvaluationConfigError, MissingDependencyError

M = METRICS


@pytest.mark.parametrize(
    ("result", "expected", "score"),
    [
        ("7", "7", 1.0),
        ("7", 7, 0.0),  # a str is not an int
        (1, True, 1.0),  # 1 == True == 1.0
        (1.0, 1, 1.0),
        (True, 1.0, 1.0),
        ((1, 2), [1, 2], 0.0),  # a tuple is not a list
        ([1, 2], [1, 2], 1.0),
        (None, None, 1.0),
        (None, "x", 0.0),
        ({"a": 1}, {"a": 1}, 1.0),
    ],
)
def test_exact_match_plain_equality(result, expected, score):
    assert M["exact_match"](result, {"expected": expected}) == score


def test_exact_match_without_expected_key_raises():
    with pytest.raises(KeyError):
        M["exact_match"]("x", {})


def test_exact_match_rejects_unknown_options_like_waa():
    with pytest.raises(TypeError):
        M["exact_match"]("x", {"expected": "x"}, ignore_case=True)


def test_literal_match_str_and_list():
    lm = M["literal_match"]
    assert lm(7, "7") == 1.0  # compared as strings
    assert lm("Abc", "abc") == 0.0
    assert lm("Abc", "abc", ignore_case=True) == 1.0
    assert lm(None, "None") == 1.0
    assert lm((1, 2), ["1", "2"], type="list") == 1.0
    assert lm([1, 2], [1], type="list") == 0.0
    assert lm("12", ["1", "2"], type="list") == 0.0
    assert lm(["A"], ["a"], type="list", ignore_case=True) == 1.0
    with pytest.raises(NotImplementedError):
        lm("a", "a", type="set")


def test_is_in_list():
    assert M["is_in_list"](["a", "b"], {"expected": "a"}) == 1.0
    assert M["is_in_list"](["a", "b"], {"expected": "c"}) == 0.0
    assert M["is_in_list"]("abc", {"expected": "b"}) == 1.0  # substring, like WAA's `in`
    with pytest.raises(TypeError):
        M["is_in_list"](None, {"expected": "a"})


def test_check_include_exclude():
    f = M["check_include_exclude"]
    rules = {"include": ["foo", "bar"], "exclude": ["baz"]}
    assert f("foo bar", rules) == 1.0
    assert f("foo", rules) == 0.0
    assert f("foo bar baz", rules) == 0.0
    assert f(None, rules) == 0.0
    assert f("", {}) == 1.0
    with pytest.raises(TypeError):
        f(7, rules)


def test_is_extension_installed():
    f = M["is_extension_installed"]
    assert f("ms-python.python\n", {"type": "contain", "expected": "ms-python.python"}) == 1.0
    assert f("", {"type": "contain", "expected": "x"}) == 0.0
    assert f("abc", {"type": "not_contain", "expected": "x"}) == 1.0
    with pytest.raises(TypeError):
        f(None, {"type": "contain", "expected": "x"})
    with pytest.raises(NotImplementedError):
        f("x", {"type": "regex", "expected": "x"})


def test_file_contains(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("hello world\n", encoding="utf-8")
    f = M["file_contains"]
    assert f(str(path), {"expected": ["hello", "world"]}) == 1.0
    assert f(str(path), {"expected": ["nope"]}) == 0.0
    assert f(None, {"expected": ["x"]}) == 0.0
    assert f(str(tmp_path / "missing.txt"), {"expected": ["x"]}) == 0.0  # WAA's bare except
    assert f(str(path), {}) == 0.0  # even a malformed config scores 0 in WAA
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert f(str(empty), {"expected": []}) == 1.0
    assert f(str(empty), {"expected": ["x"]}) == 0.0


def test_diff_text_file(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("one\ntwo\nthree\n")
    b.write_bytes(b"one\r\ntwo\r\nfour\r\n")
    f = M["diff_text_file"]
    assert f(str(a), str(a)) == 1.0
    assert f(str(a), str(b)) == pytest.approx(2 / 3)  # fractional scores kept
    assert f(None, str(b)) == 0.0
    with pytest.raises(FileNotFoundError):
        f(str(tmp_path / "missing"), str(b))


def test_compare_text_file(tmp_path):
    f = M["compare_text_file"]
    lf, crlf = tmp_path / "lf.txt", tmp_path / "crlf.txt"
    lf.write_bytes(b"Hello\nWorld\n")
    crlf.write_bytes(b"Hello\r\nWorld\r\n")
    assert f(str(lf), str(crlf)) == 1.0  # universal newlines
    spaced = tmp_path / "spaced.txt"
    spaced.write_bytes(b"  Hello \t\n\n  World  ")
    assert f(str(spaced), str(lf)) == 0.0
    assert f(str(spaced), str(lf), ignore_blanks=True) == 1.0
    upper = tmp_path / "upper.txt"
    upper.write_bytes(b"HELLO\nWORLD\n")
    assert f(str(upper), str(lf)) == 0.0
    assert f(str(upper), str(lf), ignore_case=True) == 1.0
    assert f(None, str(lf)) == 0.0
    assert f("", str(lf)) == 0.0
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert f(str(empty), str(empty)) == 1.0
    assert f(str(empty), str(lf)) == 0.0
    with pytest.raises(FileNotFoundError):
        f(str(tmp_path / "missing.txt"), str(lf))
    with pytest.raises(TypeError):
        f(str(lf), None)


def test_check_json_settings(tmp_path):
    f = M["check_json_settings"]
    settings = tmp_path / "settings.json"
    settings.write_text('{"editor.fontSize": 14, "files.autoSave": "afterDelay", "x": 1}')
    assert f(str(settings), {"expected": {"editor.fontSize": 14}}) == 1.0
    assert f(str(settings), {"expected": {"editor.fontSize": "14"}}) == 0.0
    assert f(str(settings), {"expected": {"missing": None}}) == 0.0
    assert f(str(settings), {"expected": {"x": True}}) == 1.0  # 1 == True
    assert f(None, {"expected": {}}) == 0.0
    with pytest.raises(FileNotFoundError):
        f(str(tmp_path / "nope.json"), {"expected": {}})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError):
        f(str(bad), {"expected": {}})
    empty = tmp_path / "empty.json"
    empty.write_text("")
    with pytest.raises(ValueError):
        f(str(empty), {"expected": {}})


def test_fuzzy_match_needs_rapidfuzz_or_scores():
    try:
        import rapidfuzz  # noqa: F401
    except ImportError:
        with pytest.raises(MissingDependencyError, match="install the extra 'text'"):
            M["fuzzy_match"]("abc", {"expected": "abc"})
    else:
        assert M["fuzzy_match"]("abc", {"expected": "abc"}) == 1.0


def test_infeasible_metric_is_registered_but_not_callable():
    with pytest.raises(EvaluationConfigError):
        M["infeasible"]("x", "y")
