"""The loader (adapters/waa/catalog.py) and `arena tasks lint` read a task file alike: a dest that
leaves its folder only once `time_suffix` renames it, a file nested deeper than any task needs,
and a UTF-8 byte order mark (which WAA's own loader refuses) are each one line naming the file
in both, never a crash and never accepted by one and refused by the other."""

from __future__ import annotations

import codecs
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from adapters.waa.catalog import MAX_JSON_DEPTH, TaskCatalogError, WAATaskCatalog
from adapters.waa.lint import lint_suite
from adapters.waa.task_paths import host_path_problems, time_stamp, time_suffixed

EXPECT_X = {"type": "rule", "rules": {"expected": "x"}}


def _task(task_id: str, result: dict[str, Any] | None = None, **evaluator: Any) -> dict[str, Any]:
    return {"id": task_id, "snapshot": "notepad", "instruction": "x", "source": "test", "trajectory": "",
            "related_apps": [], "config": [],
            "evaluator": {"func": "exact_match", "expected": EXPECT_X, **evaluator,
                          "result": result or {"type": "vm_file", "path": "C:\\a.txt", "dest": "a.txt"}}}


def _suite(root: Path, files: dict[str, bytes], index: bytes | None = None) -> Path:
    (root / "examples" / "notepad").mkdir(parents=True)
    for name, data in files.items():
        (root / "examples" / "notepad" / f"{name}.json").write_bytes(data)
    (root / "test_all.json").write_bytes(index or json.dumps({"notepad": list(files)}).encode())
    return root


def _load_error(suite: Path, task_id: str) -> str:
    with pytest.raises(TaskCatalogError) as refused:
        WAATaskCatalog(suite).load(task_id)
    return str(refused.value)


def _lint_lines(suite: Path) -> dict[str, Any]:
    """{file: (rule, field, message)} of every problem lint finds (it must not raise)."""
    return {f.file: (f.rule, f.field, f.message) for f in lint_suite(suite).problems}


# -- time_suffix -------------------------------------------------------------------------------


def _suffixed(dest: str, time_format: str) -> dict[str, Any]:
    return {"type": "vm_file", "path": "C:\\Users\\Docker\\report.txt", "dest": dest, "time_suffix": True,
            "time_format": time_format}


SUFFIX_ESCAPES = {
    "up": _suffixed("report.txt", "/../../../../tmp/arena-suffix-planted"),  # report/../../../../tmp/...txt
    "absolute": _suffixed(".txt", "/tmp/arena-suffix-planted"),  # /tmp/arena-suffix-planted.txt
    "windows-absolute": _suffixed(".txt", "C:\\Windows\\x"),
}


@pytest.mark.parametrize("name", sorted(SUFFIX_ESCAPES))
def test_a_dest_that_escapes_only_after_time_suffix_is_refused_by_loader_and_lint(tmp_path: Path, name: str) -> None:
    entry = SUFFIX_ESCAPES[name]
    assert host_path_problems({"evaluator": {"result": {**entry, "time_suffix": False}}}) == []  # fine as written
    suite = _suite(tmp_path / "s", {"evil": json.dumps(_task("evil", entry)).encode()})
    message = _load_error(suite, "evil")
    assert "\n" not in message and "evil.json" in message and "evaluator.result.dest" in message
    assert "time_suffix" in message
    rule, field, lint_message = _lint_lines(suite)["examples/notepad/evil.json"]
    assert (rule, field) == ("path-outside-folder", "evaluator.result.dest") and "time_suffix" in lint_message


def test_the_check_sees_the_name_the_getter_writes() -> None:
    entry = SUFFIX_ESCAPES["up"]
    final = time_suffixed(entry["dest"], time_stamp(entry))
    assert final == "report/../../../../tmp/arena-suffix-planted.txt"
    assert time_suffixed("a.b.c", "X") == "aX.b" and time_suffixed("plain", "X") == "plain"
    assert time_stamp({}, datetime(2026, 5, 9)) == "2026_05_09"


@pytest.mark.parametrize(("entry", "why"), [
    ({**SUFFIX_ESCAPES["up"], "time_format": 7}, "time_format must be a strftime format"),
])
def test_a_time_format_that_is_not_a_format_is_a_problem(tmp_path: Path, entry: dict[str, Any], why: str) -> None:
    suite = _suite(tmp_path / "s", {"odd": json.dumps(_task("odd", entry)).encode()})
    assert why in _load_error(suite, "odd")


def test_plain_time_suffixes_load_and_lint_clean(tmp_path: Path) -> None:
    tasks = {"dated": _task("dated", _suffixed("report.txt", "%Y%m%d")),
             "default": _task("default", {"type": "vm_file", "path": "C:\\r.txt", "dest": "r.txt", "time_suffix": True}),
             "multi": _task("multi", {"type": "vm_file", "multi": True, "path": ["C:\\a.txt"], "dest": ["a.txt"],
                                      "time_suffix": True, "time_format": "/../../x"})}  # WAA ignores it with multi
    suite = _suite(tmp_path / "s", {name: json.dumps(task).encode() for name, task in tasks.items()})
    for name in tasks:
        assert WAATaskCatalog(suite).load(name).task_id == name
    assert not any(rule == "path-outside-folder" for rule, _, _ in _lint_lines(suite).values())


# -- nesting -------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [100_000, 990, 500, MAX_JSON_DEPTH + 1])
def test_a_deeply_nested_task_file_is_one_line_in_loader_and_lint(tmp_path: Path, depth: int) -> None:
    text = json.dumps(_task("deep")).replace('"expected": "x"', '"expected": ' + "[" * depth + "]" * depth)
    suite = _suite(tmp_path / "s", {"deep": text.encode()})
    message = _load_error(suite, "deep")
    assert "\n" not in message and "deep.json" in message and "nested more than" in message
    rule, field, lint_message = _lint_lines(suite)["examples/notepad/deep.json"]
    assert (rule, field) == ("unreadable-task", "(file)") and "nested more than" in lint_message


def test_a_deeply_nested_index_is_one_line_in_loader_and_lint(tmp_path: Path) -> None:
    index = ('{"notepad": ["t"], "x": ' + "[" * 50_000 + "]" * 50_000 + "}").encode()
    suite = _suite(tmp_path / "s", {"t": json.dumps(_task("t")).encode()}, index=index)
    with pytest.raises(TaskCatalogError, match=r"test_all\.json: JSON nested more than"):
        WAATaskCatalog(suite)
    rule, field, message = _lint_lines(suite)["test_all.json"]
    assert rule == "unreadable-task" and "nested more than" in message


def test_nesting_as_deep_as_real_tasks_go_loads(tmp_path: Path) -> None:
    text = json.dumps(_task("ok")).replace('"expected": "x"', '"expected": ' + "[" * 20 + "]" * 20)
    suite = _suite(tmp_path / "s", {"ok": text.encode()})
    assert WAATaskCatalog(suite).load("ok").task_id == "ok"
    assert _lint_lines(suite) == {}


# -- byte order mark --------------------------------------------------------------------------------


def test_a_bom_is_refused_by_both_as_waa_refuses_it(tmp_path: Path) -> None:
    suite = _suite(tmp_path / "s", {"bom": codecs.BOM_UTF8 + json.dumps(_task("bom")).encode(),
                                    "plain": json.dumps(_task("plain")).encode()})
    message = _load_error(suite, "bom")
    assert "\n" not in message and "bom.json" in message and "byte order mark" in message
    problems = _lint_lines(suite)
    assert problems["examples/notepad/bom.json"][0] == "unreadable-task"
    assert "byte order mark" in problems["examples/notepad/bom.json"][2]
    assert "examples/notepad/plain.json" not in problems
    assert WAATaskCatalog(suite).load("plain").task_id == "plain"
    # What WAA does with it: json.load on the file opened as UTF-8.
    with open(suite / "examples" / "notepad" / "bom.json", encoding="utf-8") as handle, \
            pytest.raises(json.JSONDecodeError, match="BOM"):
        json.load(handle)


def test_an_index_with_a_bom_is_refused_by_both(tmp_path: Path) -> None:
    suite = _suite(tmp_path / "s", {"t": json.dumps(_task("t")).encode()},
                   index=codecs.BOM_UTF8 + json.dumps({"notepad": ["t"]}).encode())
    with pytest.raises(TaskCatalogError, match=r"test_all\.json: starts with a UTF-8 byte order mark"):
        WAATaskCatalog(suite)
    rule, _, message = _lint_lines(suite)["test_all.json"]
    assert rule == "unreadable-task" and "byte order mark" in message
