"""A task file cannot name host files outside its folder: refused when the suite loads (one line
naming file and field), reported by `arena tasks lint`, refused again by the engine at run time,
and `arena run` on a hostile suite writes nothing anywhere."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from adapters.waa.catalog import TaskCatalogError, WAATaskCatalog
from adapters.waa.evaluator import METRICS, evaluate_task
from adapters.waa.evaluator.metrics import FILE_ARGUMENTS
from adapters.waa.lint import lint_suite
from adapters.waa.task_paths import host_path_problems

PLANTED = Path("/tmp/arena-task-paths-planted")


def _task(task_id: str, config: list[dict[str, Any]], evaluator: dict[str, Any]) -> dict[str, Any]:
    return {"id": task_id, "snapshot": "notepad", "instruction": "x", "source": "test", "trajectory": "",
            "related_apps": [], "config": config, "evaluator": evaluator}


def _suite(root: Path, tasks: dict[str, dict[str, Any]]) -> Path:
    (root / "examples" / "notepad").mkdir(parents=True)
    for name, data in tasks.items():
        (root / "examples" / "notepad" / f"{name}.json").write_text(json.dumps(data))
    (root / "test_all.json").write_text(json.dumps({"notepad": list(tasks)}))
    return root


EXPECT_ONE = {"type": "rule", "rules": {"expected": 1}}
ONE = {"type": "rule", "rules": 1}
HOSTILE = {
    "dest-up": ({"func": "exact_match", "result": {"type": "vm_file", "path": "C:\\a.txt", "dest": f"../../../..{PLANTED}"},
                 "expected": EXPECT_ONE}, [], "evaluator.result.dest"),
    "dest-absolute": ({"func": "exact_match", "result": {"type": "vlc_config", "dest": str(PLANTED)}, "expected": EXPECT_ONE},
                      [], "evaluator.result.dest"),
    "multi-dest": ({"func": "exact_match", "result": {"type": "vm_file", "multi": True, "path": ["C:\\a", "C:\\b"],
                                                      "dest": ["ok.txt", "..\\..\\x"]}, "expected": EXPECT_ONE},
                   [], "evaluator.result.dest[1]"),
    "cache-file": ({"func": "file_contains", "result": {"type": "cache_file", "path": "/etc/passwd"},
                    "expected": {"type": "rule", "rules": {"expected": ["root"]}}}, [], "evaluator.result.path"),
    "rule-as-file": ({"func": ["exact_match", "compare_text_file"], "result": [ONE, {"type": "rule", "rules": "/etc/hostname"}],
                      "expected": [EXPECT_ONE, {"type": "cache_file", "path": "g.txt"}]},
                     [], "evaluator.result[1].rules"),
    "stdout": ({"func": "exact_match", "result": EXPECT_ONE, "expected": EXPECT_ONE},
               [{"type": "execute", "parameters": {"command": "whoami", "stdout": f"../../..{PLANTED}"}}],
               "config[0].parameters.stdout"),
    "download-name": ({"func": "exact_match", "result": EXPECT_ONE, "expected": EXPECT_ONE},
                      [{"type": "download", "parameters": {"files": [{"url": "https://x.example/f", "path": "C:\\Users\\.."}]}}],
                      "config[0].parameters.files[0].path"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_host_path_field_is_found(name: str) -> None:
    evaluator, config, field = HOSTILE[name]
    assert [f for f, _ in host_path_problems(_task(name, config, evaluator))] == [field]


def test_the_real_tasks_name_no_host_path_outside_its_folder(waa_tasks_dir: Path) -> None:
    for difficulty in ("normal", "hard"):
        catalog = WAATaskCatalog(waa_tasks_dir, difficulty=difficulty)
        for task_id in catalog.task_ids():
            assert host_path_problems(catalog.load(task_id).raw_config) == []


def test_a_hostile_task_is_refused_when_the_suite_loads_naming_file_and_field(tmp_path: Path) -> None:
    evaluator, config, field = HOSTILE["stdout"]
    catalog = WAATaskCatalog(_suite(tmp_path / "s", {"evil": _task("evil", config, evaluator)}))
    with pytest.raises(TaskCatalogError) as caught:
        catalog.load("evil")
    message = str(caught.value)
    assert "\n" not in message and "examples/notepad/evil.json" in message and field in message


def test_lint_reports_every_such_field(tmp_path: Path) -> None:
    suite = _suite(tmp_path / "s", {name: _task(name, config, evaluator) for name, (evaluator, config, _) in HOSTILE.items()})
    report = lint_suite(suite)
    found = {(f.task_id, f.field) for f in report.problems if f.rule == "path-outside-folder"}
    assert found == {(name, field) for name, (_, _, field) in HOSTILE.items()}
    assert not any(f.rule == "unreadable-task" for f in report.problems)


class _FileVM:
    """A VM whose every file holds the same bytes (only /file is used here)."""

    def get_file(self, path: str) -> bytes:
        return b"planted by a hostile task"


def test_the_engine_refuses_escapes_at_run_time_too(tmp_path: Path) -> None:
    # The /evaluate endpoint and the catalog refuse these first; the engine holds the line alone.
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "g.txt").write_text("gold")
    for name in ("dest-up", "dest-absolute", "cache-file", "rule-as-file"):
        outcome = evaluate_task(HOSTILE[name][0], _FileVM(), last_action="DONE", cache_dir=cache)  # type: ignore[arg-type]
        assert outcome.kind == "evaluation_error", (name, outcome)
        assert "outside" in outcome.reason or "absolute" in outcome.reason or "'..'" in outcome.reason
    assert not PLANTED.exists()


def test_every_metric_that_opens_files_says_so() -> None:
    # A metric whose first parameter names a file must declare it, or the engine's check misses it.
    file_words = ("path", "file", "docx", "pdf", "image", "video", "audio")
    for name, fn in METRICS.items():
        first = next(iter(inspect.signature(fn).parameters), "")
        if any(word in first for word in file_words):
            assert name in FILE_ARGUMENTS, f"metric {name} reads a file but has no files= in its @metric"
    assert set(FILE_ARGUMENTS) <= set(METRICS)


def test_arena_run_on_a_hostile_suite_writes_nothing(tmp_path: Path) -> None:
    PLANTED.unlink(missing_ok=True)
    evaluator, config, _ = HOSTILE["dest-up"]
    suite = _suite(tmp_path / "s", {"evil": _task("evil", HOSTILE["stdout"][1], evaluator)})
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--suite", str(suite), "--db", str(results / "r.duckdb"),
         "--artifacts", str(results / "artifacts")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "evil.json" in proc.stderr and "refused" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not PLANTED.exists() and not results.exists()
