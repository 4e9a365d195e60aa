"""The start-state check's own rules (adapters/waa/initial_state.py): which of a task's getters
it may run before the agent acts, and what it compares; the whole check runs against the
simulation in tests/flows/test_truthful_runs.py and tests/waa/test_quirks_handling.py."""

from __future__ import annotations

from typing import Any

from adapters.benchmark import BenchmarkTask
from adapters.waa.initial_state import StartStates, leftover_windows, state_reads

REGISTRY = "powershell -Command \"Get-ItemPropertyValue -Path 'HKCU:\\Software\\X' -Name '01'\""


def _task(task_id: str, *results: dict[str, Any], func: Any = "exact_match") -> BenchmarkTask:
    return BenchmarkTask(task_id=task_id, instruction="", domain="settings", evaluation_spec={
        "func": func, "result": list(results) if len(results) > 1 else results[0],
        "expected": {"type": "rule", "rules": {"expected": "1"}}})


def test_only_getters_that_read_are_run_before_the_agent_acts() -> None:
    """A task file is data: a getter command that chains another command (which could change the
    state the agent starts from) is never run early, nor one that writes; reads are."""
    reads = state_reads(_task(
        "t",
        {"type": "vm_command_line", "command": REGISTRY},
        {"type": "vm_command_line", "command": "powershell -Command \"Get-Item x; Remove-Item C:\\Users\\Docker\""},
        {"type": "vm_command_line", "command": "cmd /c type a.txt & del b.txt"},
        {"type": "vm_command_line", "command": "powershell -Command \"Set-ItemProperty -Path x -Name y -Value 1\""},
        {"type": "vm_file", "path": "C:\\Users\\Docker\\a.txt", "dest": "a.txt"},
        {"type": "accessibility_tree"},
    ))
    assert [r.get("command", r.get("path")) for r in reads] == [REGISTRY, "C:\\Users\\Docker\\a.txt"]
    assert state_reads(_task("inf", {"type": "vm_command_line", "command": REGISTRY}, func="infeasible")) == []


def test_a_changed_read_is_reported_once_the_level_restores_nothing() -> None:
    states = StartStates()
    first = _task("first", {"type": "vm_command_line", "command": REGISTRY})
    second = _task("second", {"type": "vm_command_line", "command": REGISTRY})
    assert states.check("http://vm", first, "setup", lambda: {"execute 01": "'0'"}) is None
    states.ran("http://vm", "first")
    problem = states.check("http://vm", second, "setup", lambda: {"execute 01": "'1'"})
    assert problem is not None and "reset level setup" in problem and "when first started" in problem
    assert "tasks run on it since: first" in problem
    # Another VM, a restoring level, or a VM made clean again: nothing to compare.
    assert states.check("http://other", second, "setup", lambda: {"execute 01": "'1'"}) is None
    assert states.check("http://vm", second, "snapshot", lambda: {"execute 01": "'2'"}) is None
    states.fresh("http://vm")
    assert states.check("http://vm", second, "setup", lambda: {"execute 01": "'1'"}) is None


def test_the_desktop_and_waas_own_window_are_not_leftovers() -> None:
    names = ("Program Manager\nAdministrator: C:\\Windows\\System32\\WindowsPowerShell\\v1.0\\powershell.exe\n"
             "Untitled - Notepad\nNotepad\n")
    assert leftover_windows(names) == ["Untitled - Notepad", "Notepad"]
