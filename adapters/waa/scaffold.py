"""`arena tasks new`: a new task in WAA's format, written into a suite and checked at once.

The task gets the app's launch step (and optional files to open or download first), an
evaluator built from the registries (a metric, a result getter with its parameters, and the
expected value as WAA's `rule` getter), and is then linted (adapters/waa/lint.py) and loaded by
the catalog with every name required to be implemented, so a task that would fail on a VM fails
here. Nothing a user types is evaluated: values go into the JSON as strings.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath
from typing import Any

from adapters.waa.catalog import TaskCatalogError, WAATaskCatalog
from adapters.waa.lint import INDEX, Finding, lint_suite

# How each app WAA covers is started on the VM (the `launch` step a new task opens with).
APP_LAUNCH: dict[str, list[str]] = {
    "notepad": ["notepad"],
    "file_explorer": ["explorer"],
    "chrome": ["chrome"],
    "msedge": ["msedge"],
    "vs_code": ["code"],
    "libreoffice_calc": ["soffice", "--calc"],
    "libreoffice_writer": ["soffice", "--writer"],
    "vlc": ["vlc"],
    "windows_calc": ["calc"],
    "microsoft_paint": ["mspaint"],
    "settings": ["cmd", "/c", "start", "ms-settings:"],
    "clock": ["cmd", "/c", "start", "ms-clock:"],
}
_TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class ScaffoldError(ValueError):
    """The task cannot be made as asked; the message names the option and what was wrong."""


@dataclass
class NewTask:
    """What `arena tasks new` was asked for."""

    task_id: str
    app: str
    instruction: str
    metric: str = "exact_match"
    result_getter: str = "vm_command_line"
    result_params: dict[str, Any] = field(default_factory=dict)
    expected: Any = None  # with the `rule` getter: the value itself
    expected_getter: str = "rule"
    expected_params: dict[str, Any] = field(default_factory=dict)  # for another expected getter
    open_paths: list[str] = field(default_factory=list)
    downloads: list[tuple[str, str]] = field(default_factory=list)  # (url, VM path)
    postconfig_save: bool = False  # ctrl+s in the app before evaluation (files the agent edited)


@dataclass
class ScaffoldResult:
    """The written file and what the checks found in it."""

    path: Path
    problems: list[Finding]


def registry_listing() -> str:
    """The setup step types, getters and metrics a task may use."""
    from adapters.waa.evaluator import GETTERS, METRICS
    from adapters.waa.setup_steps import STEP_HANDLERS

    return "\n".join([
        f"apps: {', '.join(sorted(APP_LAUNCH))}",
        f"setup step types: {', '.join(sorted(STEP_HANDLERS))}",
        f"result getters: {', '.join(sorted(GETTERS))}",
        f"metrics: {', '.join(sorted(METRICS))}",
    ])


def build_task(spec: NewTask) -> dict[str, Any]:
    """The task's JSON (WAA's keys); ScaffoldError for an unknown app, getter or metric."""
    from adapters.waa.evaluator import GETTERS, METRICS

    if not _TASK_ID.fullmatch(spec.task_id):
        raise ScaffoldError(f"--id {spec.task_id!r}: use letters, digits, '.', '_' and '-' (it names the file)")
    if spec.app not in APP_LAUNCH:
        raise ScaffoldError(f"--app {spec.app!r} is not an app WAA covers; choose one of {', '.join(sorted(APP_LAUNCH))}")
    if not spec.instruction.strip():
        raise ScaffoldError("--instruction must say what the agent is to do")
    if spec.metric not in METRICS:
        raise ScaffoldError(f"--metric {spec.metric!r} does not exist (arena tasks new --list shows the metrics)")
    if spec.result_getter not in GETTERS:
        raise ScaffoldError(f"--result {spec.result_getter!r} is not a getter (arena tasks new --list shows them)")
    if spec.expected_getter not in GETTERS:
        raise ScaffoldError(f"--expected-getter {spec.expected_getter!r} is not a getter (arena tasks new --list)")
    if spec.metric != "infeasible" and spec.expected_getter == "rule" and spec.expected is None:
        raise ScaffoldError(f"--expected is needed: the value {spec.metric} compares the getter's result with")
    if spec.expected_getter != "rule" and spec.expected is not None:
        raise ScaffoldError("--expected is the rule getter's value; give --expected-param KEY=VALUE for "
                            f"{spec.expected_getter}")
    for url, path in spec.downloads:
        if not url.startswith(("https://", "http://")):
            raise ScaffoldError(f"--download {url}={path}: the URL must be http(s)")
    config: list[dict[str, Any]] = []
    if spec.downloads:
        config.append({"type": "download", "parameters": {"files": [{"url": u, "path": p} for u, p in spec.downloads]}})
    config.append({"type": "launch", "parameters": {"command": APP_LAUNCH[spec.app]}})
    config += [{"type": "open", "parameters": {"path": p}} for p in spec.open_paths]
    config.append({"type": "sleep", "parameters": {"seconds": 2}})
    evaluator: dict[str, Any] = {"func": spec.metric}
    if spec.metric != "infeasible":
        evaluator["result"] = {"type": spec.result_getter, **spec.result_params}
        evaluator["expected"] = ({"type": "rule", "rules": {"expected": spec.expected}} if spec.expected_getter == "rule"
                                 else {"type": spec.expected_getter, **spec.expected_params})
    if spec.postconfig_save:
        evaluator["postconfig"] = [
            {"type": "execute", "parameters": {"command": ["python", "-c",
                                                           "import pyautogui; pyautogui.hotkey('ctrl', 's')"]}},
            {"type": "sleep", "parameters": {"seconds": 1}},
        ]
    return {
        "id": spec.task_id,
        "snapshot": spec.app,
        "instruction": spec.instruction.strip(),
        "source": "arena tasks new",
        "config": config,
        "trajectory": "trajectories/",
        "related_apps": [spec.app],
        "evaluator": evaluator,
    }


def write_task(suite_dir: Path, spec: NewTask, *, overwrite: bool = False) -> ScaffoldResult:
    """Write the task into `suite_dir` (creating the suite when new), add it to the index, then
    lint it and load it with every name required to exist. A task whose checks fail is kept
    on disk (to be fixed by hand) and its problems returned."""
    task = build_task(spec)
    suite_dir = Path(suite_dir).expanduser().resolve()
    index_path = suite_dir / INDEX
    index: dict[str, list[str]] = {}
    if index_path.exists():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ScaffoldError(f"{index_path}: not a JSON index: {exc}") from None
        if not isinstance(index, dict):
            raise ScaffoldError(f"{index_path}: the index must map domains to task id lists")
    listed = {task_id: domain for domain, ids in index.items() for task_id in ids}
    path = suite_dir / "examples" / spec.app / f"{spec.task_id}.json"
    if (spec.task_id in listed or path.exists()) and not overwrite:
        raise ScaffoldError(f"task {spec.task_id!r} already exists in {suite_dir} (domain "
                            f"{listed.get(spec.task_id, spec.app)!r}); pass --overwrite to replace it")
    if listed.get(spec.task_id, spec.app) != spec.app:
        raise ScaffoldError(f"task {spec.task_id!r} is listed under domain {listed[spec.task_id]!r}, not {spec.app!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(task, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if spec.task_id not in listed:
        index.setdefault(spec.app, []).append(spec.task_id)
        index_path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    report = lint_suite(suite_dir)
    problems = [f for f in report.problems if f.task_id == spec.task_id or f.file.endswith(f"/{spec.task_id}.json")]
    try:
        WAATaskCatalog(suite_dir, require_supported=True).load(spec.task_id)
    except TaskCatalogError as exc:
        problems.append(Finding(path.relative_to(suite_dir).as_posix(), "(file)", "unreadable-task", str(exc),
                                "fix the file by hand", spec.task_id))
    return ScaffoldResult(path=path, problems=problems)


def parse_params(values: list[str] | None, option: str) -> dict[str, Any]:
    """KEY=VALUE options as a dict; a VALUE that is JSON (a number, list, true...) is kept typed."""
    params: dict[str, Any] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ScaffoldError(f"{option} {item!r}: expected KEY=VALUE")
        params[key.strip()] = json_or_text(value)
    return params


def json_or_text(value: str) -> Any:
    """`value` parsed as JSON when it is JSON (42, true, ["a"]), else the text itself."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def parse_download(value: str) -> tuple[str, str]:
    """URL=VM_PATH for --download (the path must be a Windows path)."""
    url, sep, path = value.rpartition("=")
    if not sep or not url or not path:
        raise ScaffoldError(f"--download {value!r}: expected URL=C:\\Users\\Docker\\Downloads\\name")
    if not PureWindowsPath(path).drive:
        raise ScaffoldError(f"--download {value!r}: {path!r} is not a Windows path such as C:\\Users\\Docker\\...")
    return url, path
