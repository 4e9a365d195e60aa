"""The `arena` command line: task listing on the real WAA tasks and clear errors on bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli import main

WAA_COUNTS = {
    "chrome": 17, "clock": 4, "file_explorer": 19, "libreoffice_calc": 24, "libreoffice_writer": 19,
    "microsoft_paint": 3, "msedge": 13, "notepad": 2, "settings": 5, "vlc": 21, "vs_code": 24, "windows_calc": 3,
}


def test_tasks_list_gives_waa_counts(waa_tasks_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "list", "--waa-dir", str(waa_tasks_dir)]) == 0
    out = capsys.readouterr().out
    counts = {line.split()[0]: int(line.split()[1]) for line in out.splitlines()[1:] if line.split()[0] != "total"}
    assert counts == WAA_COUNTS
    assert "total                    154         13" in out


def test_tasks_list_hard_mode_ids(waa_tasks_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "list", "--waa-dir", str(waa_tasks_dir), "--difficulty", "hard", "--ids", "--domain", "vlc"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 21 and sum(line.endswith("infeasible") for line in lines) == 7


def test_bad_task_directory_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "test_all.json").write_text("{not json")
    assert main(["tasks", "list", "--waa-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "test_all.json") in err and "JSON" in err


def test_tasks_coverage_reports_totals_and_reasons(waa_tasks_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tasks", "coverage", "--waa-dir", str(waa_tasks_dir)])
    out = capsys.readouterr().out
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert total.split()[1] == "154"
    supported = int(total.split()[2])
    unsupported_lines = [line for line in out.splitlines() if ": unsupported " in line]
    assert len(unsupported_lines) == 154 - supported
    assert code == (0 if supported == 154 else 1)
    assert supported == 154, unsupported_lines  # every real task's setup and evaluator are implemented


def test_unknown_metric_or_getter_fails_to_load(tmp_path: Path) -> None:
    import json

    from adapters.waa.catalog import TaskCatalogError, WAATaskCatalog

    (tmp_path / "examples" / "notepad").mkdir(parents=True)
    (tmp_path / "test_all.json").write_text(json.dumps({"notepad": ["t1"]}))
    task = {
        "id": "t1", "snapshot": "notepad", "instruction": "x", "source": "", "config": [], "trajectory": "",
        "related_apps": [], "evaluator": {"func": "no_such_metric", "result": {"type": "no_such_getter"},
                                          "expected": {"type": "rule", "rules": {}}},
    }
    (tmp_path / "examples" / "notepad" / "t1.json").write_text(json.dumps(task))
    assert WAATaskCatalog(tmp_path).load("t1").task_id == "t1"  # listing and inspecting still work
    with pytest.raises(TaskCatalogError, match=r"t1\.json: unsupported getters/metrics no_such_metric, no_such_getter"):
        WAATaskCatalog(tmp_path, require_supported=True).load("t1")
