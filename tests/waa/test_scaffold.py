"""`arena tasks new`: a scaffolded task is written in WAA's format, passes lint, loads with every
name implemented, and runs through the real pipeline on the local simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.waa.catalog import WAATaskCatalog
from adapters.waa.lint import lint_suite
from adapters.waa.scaffold import NewTask, ScaffoldError, parse_download, write_task

DOCUMENTS = "C:\\Users\\Docker\\Documents"


def _reports_task(**overrides: object) -> NewTask:
    values: dict[str, object] = dict(
        task_id="explorer-make-reports", app="file_explorer", instruction="Create a folder named Reports in Documents.",
        result_getter="vm_folder_exists_in_documents", result_params={"folder_name": "Reports"}, expected=True,
        open_paths=[DOCUMENTS],
    )
    values.update(overrides)
    return NewTask(**values)  # type: ignore[arg-type]


def test_a_scaffolded_task_is_clean_loads_and_runs(prefect_server: None, tmp_path: Path) -> None:
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    suite = tmp_path / "suite"
    result = write_task(suite, _reports_task())
    assert result.problems == []
    raw = json.loads(result.path.read_text())
    assert [s["type"] for s in raw["config"]] == ["launch", "open", "sleep"]
    assert raw["evaluator"]["expected"] == {"type": "rule", "rules": {"expected": True}}
    assert json.loads((suite / "test_all.json").read_text()) == {"file_explorer": ["explorer-make-reports"]}
    assert lint_suite(suite).problems == []
    WAATaskCatalog(suite, require_supported=True).load("explorer-make-reports")

    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"explorer-make-reports": [
        {"click": {"role": "Button", "name": "New folder"}}, {"type": "Reports"}, {"key": "enter"}, {"done": True}]}))
    from adapters.agents import AgentOptions

    outcome = run_suite(SuiteRunConfig(suite_dir=suite, agent_options=AgentOptions(plans_path=plans), pool_size=1,
                                       db_path=tmp_path / "r.duckdb", artifacts_dir=tmp_path / "a", run_id="scaffold"))
    assert [(r.task_id, r.outcome.value) for r in outcome.results] == [("explorer-make-reports", "success")]


def test_a_second_task_joins_the_index_and_a_repeat_is_refused(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    write_task(suite, _reports_task())
    write_task(suite, _reports_task(task_id="notepad-check", app="notepad", result_getter="vm_file",
                                    result_params={"path": f"{DOCUMENTS}\\a.txt", "dest": "a.txt"},
                                    metric="compare_text_file", expected=None, expected_getter="cloud_file",
                                    expected_params={"path": "https://files.example/a.txt", "dest": "gold.txt"},
                                    open_paths=[], postconfig_save=True))
    index = json.loads((suite / "test_all.json").read_text())
    assert index == {"file_explorer": ["explorer-make-reports"], "notepad": ["notepad-check"]}
    with pytest.raises(ScaffoldError, match="already exists"):
        write_task(suite, _reports_task())
    write_task(suite, _reports_task(instruction="Now in Pictures."), overwrite=True)
    assert "Pictures" in json.loads((suite / "examples/file_explorer/explorer-make-reports.json").read_text())["instruction"]


@pytest.mark.parametrize("overrides, message", [
    ({"app": "photoshop"}, "--app 'photoshop' is not an app"),
    ({"task_id": "../escape"}, "--id '../escape'"),
    ({"metric": "no_such_metric"}, "--metric 'no_such_metric' does not exist"),
    ({"result_getter": "no_such_getter"}, "--result 'no_such_getter' is not a getter"),
    ({"expected": None}, "--expected is needed"),
    ({"instruction": "  "}, "--instruction"),
    ({"expected_getter": "cloud_file"}, "--expected is the rule getter's value"),
])
def test_bad_input_names_the_option(tmp_path: Path, overrides: dict, message: str) -> None:
    with pytest.raises(ScaffoldError, match=message.replace("(", r"\(").replace("'", "'")):
        write_task(tmp_path / "s", _reports_task(**overrides))
    assert not (tmp_path / "s").exists()


def test_user_text_stays_data(tmp_path: Path) -> None:
    hostile = 'Type "; rm -rf / #" and {\n"injected": true} into $(whoami)'
    result = write_task(tmp_path / "s", _reports_task(instruction=hostile, expected='"); exit(1) #'))
    assert result.problems == []
    task = WAATaskCatalog(tmp_path / "s").load("explorer-make-reports")
    assert task.instruction == hostile.strip() and "injected" not in task.raw_config


def test_download_option_parsing() -> None:
    assert parse_download("https://x.example/a?b=c=C:\\Users\\Docker\\Downloads\\a.txt") == \
        ("https://x.example/a?b=c", "C:\\Users\\Docker\\Downloads\\a.txt")
    with pytest.raises(ScaffoldError, match="not a Windows path"):
        parse_download("https://x.example/a=/home/user/a.txt")


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    assert main(["tasks", "new", "--list"]) == 0
    assert "metrics: " in capsys.readouterr().out
    assert main(["tasks", "new", "--app", "notepad"]) == 2
    assert "--suite, --id, --instruction" in capsys.readouterr().err
    args = ["tasks", "new", "--suite", str(tmp_path / "s"), "--app", "file_explorer", "--id", "t1",
            "--instruction", "Make Reports.", "--result", "vm_folder_exists_in_documents",
            "--result-param", "folder_name=Reports", "--expected", "true"]
    assert main(args) == 0
    assert "checked: lint clean and it loads" in capsys.readouterr().out
    assert json.loads((tmp_path / "s/examples/file_explorer/t1.json").read_text())["evaluator"]["expected"] == \
        {"type": "rule", "rules": {"expected": True}}
    assert main(args) == 2  # exists
