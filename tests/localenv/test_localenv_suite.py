"""Every bundled task is solvable through the HTTP API by its scripted plan, and unsolved when
the agent does nothing. Setup steps and evaluation run over HTTP exactly as WAA's controller
would (a tiny test-local evaluator with WAA's getter and metric semantics)."""

from __future__ import annotations

import json
import ntpath
import time
from pathlib import Path

import pytest

from localenv_helpers import bbox, find

SUITE = Path(__file__).resolve().parents[2] / "adapters" / "waa" / "bundled_suite"
INDEX = json.loads((SUITE / "test_all.json").read_text())
SOLUTIONS = json.loads((SUITE / "solutions.json").read_text())
TASKS = [(d, t) for d, ids in INDEX.items() for t in ids]


def load(domain: str, tid: str) -> dict:
    return json.loads((SUITE / "examples" / domain / f"{tid}.json").read_text())


def run_setup(c, steps: list[dict]) -> None:
    for step in steps:
        t, p = step["type"], step.get("parameters", {})
        if t == "launch":
            c.post("/setup/launch", json={"command": p["command"], "shell": p.get("shell", False)})
        elif t == "open":
            c.post("/setup/open_file", json={"path": p["path"]})
        elif t == "activate_window":
            c.post("/setup/activate_window", json={"window_name": p["window_name"], "strict": p.get("strict", False),
                                                   "by_class": p.get("by_class", False)})
        elif t == "sleep":
            time.sleep(min(p["seconds"], 0.05))  # the simulation is synchronous
        elif t == "create_folder":
            c.post("/setup/create_folder", json={"path": p["path"]})
        elif t == "create_file":
            c.post("/setup/create_file", json={"path": p["path"], "content": p.get("content", "")})
        elif t in ("execute", "command"):
            c.post("/setup/execute", json={"command": p["command"], "shell": p.get("shell", False)})
        else:
            raise AssertionError(f"unsupported setup step {t}")


def replay(c, plan: list[dict]) -> str | None:
    """Turn each plan step into pyautogui code sent to /execute; returns "DONE"/"FAIL"."""
    for step in plan:
        if "done" in step:
            return "DONE"
        if "fail" in step:
            return "FAIL"
        if "wait" in step:
            time.sleep(min(step["wait"], 0.05))
            continue
        if "type" in step:
            code = f"pyautogui.write({step['type']!r})"
        elif "key" in step:
            mods = step.get("modifiers", [])
            keys = [*mods, step["key"]]
            code = f"pyautogui.hotkey({', '.join(repr(k) for k in keys)})" if mods else f"pyautogui.press({step['key']!r})"
        elif "click_at" in step:
            x, y = step["click_at"]
            code = f"pyautogui.click({x!r}, {y!r})"
        else:
            kind = next(k for k in ("click", "double_click", "right_click") if k in step)
            spec = step[kind]
            el = find(c.tree(), spec["role"], spec["name"], spec.get("window"))
            assert el is not None, f"no element {spec}"
            x0, y0, x1, y1 = bbox(el)
            x, y = (x0 + x1) // 2, (y0 + y1) // 2
            fn = {"click": "click", "double_click": "doubleClick", "right_click": "rightClick"}[kind]
            code = f"pyautogui.{fn}({x!r}, {y!r})"
        out = c.pyautogui(code)
        assert out["returncode"] == 0, out
    return None


# -- a tiny evaluator with WAA's semantics for the getters and metrics the suite uses -----
def get(c, spec: dict, tmp: Path):
    t = spec["type"]
    if t == "rule":
        return spec["rules"]
    if t == "vm_file":
        data = c.read(spec["path"])
        if data is None:
            return None
        dest = tmp / spec["dest"]
        dest.write_bytes(data)
        return str(dest)
    if t == "vm_file_exists_in_vm_folder":
        return 1.0 if c.read(ntpath.join(spec["folder_name"], spec["file_name"])) else 0.0
    if t == "vm_folder_exists_in_documents":
        docs = c.post("/documents_path").json()["documents_path"]
        return c.post("/folder_exists", json={"folder_name": spec["folder_name"], "path": docs}).status_code == 200
    if t == "vm_file_exists_in_desktop":
        desk = c.post("/desktop_path").json()["desktop_path"]
        return c.post("/file_exists", json={"file_name": spec["file_name"], "path": desk}).status_code == 200
    if t == "vm_command_line":
        r = c.post("/execute", json={"command": spec["command"], "shell": spec.get("shell", False)})
        return r.json()["output"] if r.status_code == 200 else None
    if t == "storage_sense_run_frequency":
        key = r"HKCU:\Software\Microsoft\Windows\CurrentVersion\StorageSense\Parameters\StoragePolicy"
        on = c.registry(key, "01")
        if on["status"] == "success" and on["output"] == "1\n":
            freq = c.registry(key, "2048")
            if freq["status"] == "success":
                return freq["output"].split("\n")[0]
        return None
    raise AssertionError(t)


def metric(name: str, result, rules) -> float:
    if name == "exact_match":
        return 1.0 if result == rules["expected"] else 0.0
    if name == "is_in_list":
        return 1.0 if rules["expected"] in result else 0.0
    if name == "check_include_exclude":
        if result is None:
            return 0.0
        ok = all(r in result for r in rules.get("include", [])) and all(r not in result for r in rules.get("exclude", []))
        return 1.0 if ok else 0.0
    if name == "file_contains":
        if not result:
            return 0.0
        text = Path(result).read_text()  # universal newlines, as open(..., "r") in WAA
        return 0.0 if any(t not in text for t in rules["expected"]) else 1.0
    raise AssertionError(name)


def evaluate(c, task: dict, tmp: Path) -> float:
    ev = task["evaluator"]
    run_setup(c, ev.get("postconfig", []))
    funcs = ev["func"] if isinstance(ev["func"], list) else [ev["func"]]
    results = ev["result"] if isinstance(ev["func"], list) else [ev["result"]]
    expected = ev["expected"] if isinstance(ev["func"], list) else [ev["expected"]]
    scores = []
    for f, r, e in zip(funcs, results, expected):
        score = metric(f, get(c, r, tmp), get(c, e, tmp))
        if score == 0:
            return 0.0
        scores.append(score)
    return sum(scores) / len(scores)


def test_suite_shape():
    assert sum(len(v) for v in INDEX.values()) >= 12
    assert set(INDEX) == {"notepad", "file_explorer", "settings"}
    inf = [t for _, t in TASKS if t.startswith("INF-")]
    assert len(inf) == 2
    for domain, tid in TASKS:
        task = load(domain, tid)
        assert set(task) >= {"id", "snapshot", "instruction", "source", "config", "trajectory", "related_apps", "evaluator"}
        assert task["id"] == tid
        assert (task["evaluator"]["func"] == "infeasible") == tid.startswith("INF-")
        plan = SOLUTIONS[tid]
        assert ("fail" in plan[-1]) == tid.startswith("INF-") and ("done" in plan[-1]) != tid.startswith("INF-")
        for step in task["config"]:
            assert step["type"] in {"launch", "open", "activate_window", "sleep", "create_folder", "create_file", "execute", "command"}


@pytest.mark.parametrize("domain,tid", [t for t in TASKS if not t[1].startswith("INF-")])
def test_plan_solves_task_and_idle_does_not(client, domain, tid, tmp_path):
    task = load(domain, tid)
    run_setup(client, task["config"])
    assert replay(client, SOLUTIONS[tid]) == "DONE"
    assert evaluate(client, task, tmp_path) == 1.0

    client.reset()
    run_setup(client, task["config"])
    assert evaluate(client, task, tmp_path) < 1.0


@pytest.mark.parametrize("domain,tid", [t for t in TASKS if t[1].startswith("INF-")])
def test_infeasible_plans_end_in_fail(client, domain, tid):
    task = load(domain, tid)
    run_setup(client, task["config"])
    assert replay(client, SOLUTIONS[tid]) == "FAIL"
