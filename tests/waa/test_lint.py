"""`arena tasks lint`: the known problems of WAA's 154 tasks, nothing on the bundled suite, and
each rule on a crafted suite (URLs against a real HTTP server on 127.0.0.1 and a real cache)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from adapters.waa.catalog import bundled_suite_dir
from adapters.waa.downloads import cached_download_path
from adapters.waa.lint import lint_suite

WIN_DOWNLOADS = "C:\\Users\\Docker\\Downloads"


def _rules(report: Any) -> Counter[str]:
    return Counter(f.rule for f in report.problems)


def test_the_known_problems_of_the_154_waa_tasks(waa_tasks_dir: Path) -> None:
    report = lint_suite(waa_tasks_dir)
    rules = _rules(report)
    assert report.tasks == 154
    assert rules["missing-program"] == 23  # socat
    assert all("'socat'" in f.message for f in report.problems if f.rule == "missing-program")
    assert rules["infeasible-fail-only"] == 13
    linux = [f for f in report.problems if f.rule in ("non-windows-path", "upload-into-missing-folder")]
    assert {f.task_id for f in linux} == {"INF-bb8ccc78-479f-4a2f-a71e-d565e439436b-WOS"}
    assert {f.rule for f in linux} == {"non-windows-path", "upload-into-missing-folder"}
    assert any(f.field == "config[0].parameters.files[0].path" and "/home/user/Downloads" in f.message for f in linux)
    assert not rules["unknown-setup-type"] and not rules["unknown-metric"] and not rules["unknown-getter"]
    assert "URL(s) not checked" in report.notes[0]


def test_the_bundled_suite_has_no_problem() -> None:
    report = lint_suite(bundled_suite_dir())
    assert report.problems == []
    assert {f.rule for f in report.accepted} == {"infeasible-fail-only"}  # acknowledged in arena-suite.toml
    assert report.lines()[0].startswith("0 problem(s) in 0 of 16 task file(s)")


class Files:
    """A tiny file host: /ok/<name> answers 200, anything else 404."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: bool) -> None:
                ok = self.path.startswith("/ok/")
                self.send_response(200 if ok else 404)
                self.send_header("Content-Length", "2")
                self.end_headers()
                if body:
                    self.wfile.write(b"ok")

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
                self._answer(False)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(True)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _task(task_id: str, config: list[dict[str, Any]], evaluator: dict[str, Any] | None = None, **extra: Any) -> dict:
    return {"id": task_id, "snapshot": "notepad", "instruction": f"do {task_id}", "source": "test",
            "config": config, "trajectory": "", "related_apps": [], **extra,
            "evaluator": evaluator or {"func": "exact_match", "result": {"type": "vm_file", "path": "C:\\a.txt",
                                                                          "dest": "a.txt"},
                                       "expected": {"type": "rule", "rules": {"expected": "x"}}}}


def _suite(root: Path, tasks: dict[str, dict], index: dict[str, list[str]] | None = None,
           raw_files: dict[str, str] | None = None) -> Path:
    (root / "examples" / "notepad").mkdir(parents=True)
    for name, data in tasks.items():
        (root / "examples" / "notepad" / f"{name}.json").write_text(json.dumps(data))
    for name, text in (raw_files or {}).items():
        (root / "examples" / "notepad" / f"{name}.json").write_text(text)
    (root / "test_all.json").write_text(json.dumps(index or {"notepad": [*tasks, *(raw_files or {})]}))
    return root


def test_each_rule_names_the_file_field_and_fix(tmp_path: Path) -> None:
    files = Files()
    ok_url, gone_url = f"{files.url}/ok/input.txt", f"{files.url}/missing/gold.txt"
    tasks = {
        "missing-folder": _task("missing-folder", [{"type": "download", "parameters": {"files": [
            {"url": ok_url, "path": f"{WIN_DOWNLOADS}\\new folder\\input.txt"}]}}]),
        "created-folder": _task("created-folder", [
            {"type": "create_folder", "parameters": {"path": f"{WIN_DOWNLOADS}\\made"}},
            {"type": "download", "parameters": {"files": [{"url": ok_url, "path": f"{WIN_DOWNLOADS}\\made\\x.txt"}]}}]),
        "mkdir-folder": _task("mkdir-folder", [
            {"type": "execute", "parameters": {"command": ["cmd", "/c", "mkdir", f"{WIN_DOWNLOADS}\\viacmd"]}},
            {"type": "download", "parameters": {"files": [{"url": ok_url, "path": f"{WIN_DOWNLOADS}\\viacmd\\x.txt"}]}}]),
        "unknowns": _task("unknowns", [{"type": "teleport", "parameters": {}}],
                          {"func": ["no_such_metric", "exact_match"], "conj": "and",
                           "result": [{"type": "no_such_getter"}, {"type": "vm_file", "path": "/tmp/x", "dest": "x"}],
                           "expected": [{"type": "cloud_file", "path": gone_url, "dest": "gold.txt"},
                                        {"type": "rule", "rules": {"expected": "x"}}]}),
        "linuxy": _task("linuxy", [{"type": "launch", "parameters": {"command": ["xdotool", "key", "ctrl+s"]}}]),
        "mismatch": _task("other-id", []),
        "quits": _task("quits", [], {"func": "infeasible"}),
    }
    suite = _suite(tmp_path / "suite", tasks, raw_files={"broken": "{not json"})
    report = lint_suite(suite, check_urls=True)
    found = {(f.task_id or f.file, f.rule): f for f in report.problems}

    missing = found[("missing-folder", "upload-into-missing-folder")]
    assert missing.file == "examples/notepad/missing-folder.json"
    assert missing.field == "config[0].parameters.files[0].path"
    assert "new folder" in missing.message and '"type": "create_folder"' in missing.fix
    assert not any(t in ("created-folder", "mkdir-folder") for t, _ in found)
    assert found[("unknowns", "unknown-setup-type")].field == "config[0].type"
    assert found[("unknowns", "unknown-metric")].field == "evaluator.func[0]"
    assert found[("unknowns", "unknown-getter")].field == "evaluator.result[0].type"
    assert found[("unknowns", "non-windows-path")].field == "evaluator.result[1].path"
    gone = found[("unknowns", "unfetchable-file")]
    assert gone.field == "evaluator.expected[0].path" and "HTTP 404" in gone.message
    assert ("missing-folder", "unfetchable-file") not in found  # the reachable file is fine
    assert "'xdotool'" in found[("linuxy", "missing-program")].message
    assert found[("mismatch", "id-mismatch")].field == "id"
    assert found[("quits", "infeasible-fail-only")].field == "evaluator.func"
    assert found[("examples/notepad/broken.json", "unreadable-task")].field == "(file)"
    assert all(f.fix for f in report.problems)
    files.server.shutdown()


def test_offline_checks_the_download_cache(tmp_path: Path) -> None:
    cached_url, absent_url = "https://files.example/cached.docx", "https://files.example/absent.docx"
    suite = _suite(tmp_path / "suite", {"t": _task("t", [{"type": "download", "parameters": {"files": [
        {"url": cached_url, "path": f"{WIN_DOWNLOADS}\\cached.docx"},
        {"url": absent_url, "path": f"{WIN_DOWNLOADS}\\absent.docx"}]}}])})
    cache = tmp_path / "cache"
    copy = cached_download_path(cache, cached_url, f"{WIN_DOWNLOADS}\\cached.docx")
    copy.parent.mkdir(parents=True)
    copy.write_bytes(b"docx")
    report = lint_suite(suite, offline_cache=cache)
    assert [(f.field, f.rule) for f in report.problems] == [("config[0].parameters.files[1].url", "unfetchable-file")]
    assert "not in the download cache" in report.problems[0].message


def test_index_duplicates_are_findings_and_the_rest_is_still_linted(tmp_path: Path) -> None:
    suite = _suite(tmp_path / "suite", {"a": _task("a", []), "b": _task("b", [{"type": "teleport"}])},
                   index={"notepad": ["a", "b", "a"]})
    rules = _rules(lint_suite(suite))
    assert rules["duplicate-id"] == 1 and rules["unknown-setup-type"] == 1


def test_accept_list_is_checked(tmp_path: Path) -> None:
    suite = _suite(tmp_path / "suite", {"q": _task("q", [], {"func": "infeasible"})})
    (suite / "arena-suite.toml").write_text('[lint]\naccept = ["infeasible-fail-only"]\n')
    report = lint_suite(suite)
    assert report.problems == [] and len(report.accepted) == 1
    (suite / "arena-suite.toml").write_text('[lint]\naccept = ["no-such-rule"]\n')
    with pytest.raises(ValueError, match="unknown rule"):
        lint_suite(suite)


def test_cli_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    assert main(["tasks", "lint", str(bundled_suite_dir())]) == 0
    suite = _suite(tmp_path / "suite", {"q": _task("q", [], {"func": "infeasible"})})
    assert main(["tasks", "lint", str(suite)]) == 1
    assert "[infeasible-fail-only]" in capsys.readouterr().out
    assert main(["tasks", "lint", str(tmp_path / "nope")]) == 2
    assert main(["tasks", "lint", str(suite), "--offline"]) == 2


def test_a_sleep_a_run_would_refuse_is_found_without_a_vm(tmp_path: Path) -> None:
    """A sleep step over the run's cap (adapters/waa/setup_steps.py `check_sleeps`) is the task's
    data: a run refuses it as a setup failure, so lint names it before any VM."""
    from adapters.waa.lint import lint_suite

    root = _suite(tmp_path, {
        "long-nap": _task("long-nap", [{"type": "sleep", "parameters": {"seconds": 1e9}}]),
        "many-naps": _task("many-naps", [], {**_task("x", [])["evaluator"], "postconfig": [
            {"type": "sleep", "parameters": {"seconds": 59}} for _ in range(6)]}),
        "short-nap": _task("short-nap", [{"type": "sleep", "parameters": {"seconds": 3}}]),
    })
    found = {(f.task_id, f.field) for f in lint_suite(root).problems if f.rule == "sleep-too-long"}
    assert found == {("long-nap", "config[0].parameters.seconds"),
                     ("many-naps", "evaluator.postconfig[5].parameters.seconds")}


def test_a_getter_that_reads_a_folder_is_found_without_a_vm(tmp_path: Path) -> None:
    """WAA's /file answers 500 for a folder every time (a fault that repeats on every VM, R11):
    a vm_file path that is a folder whatever the VM holds is the task's data, named by lint."""
    def reads(path: Any) -> dict[str, Any]:
        return {"func": "exact_match", "result": {"type": "vm_file", "path": path, "dest": "x"},
                "expected": {"type": "rule", "rules": {"expected": "x"}}}

    root = _suite(tmp_path, {
        "profile-folder": _task("profile-folder", [], reads("C:\\Users\\Docker\\Desktop")),
        "made-folder": _task("made-folder", [{"type": "create_folder", "parameters": {
            "path": "C:\\Users\\Docker\\Documents\\Projects"}}], reads("C:\\Users\\Docker\\Documents\\Projects")),
        "trailing": _task("trailing", [], reads(["C:\\Users\\Docker\\a.txt", "C:\\Users\\Docker\\Reports\\"])),
        "a-file": _task("a-file", [{"type": "create_folder", "parameters": {"path": "C:\\Users\\Docker\\Projects"}}],
                        reads("C:\\Users\\Docker\\Projects\\plan.txt")),
    })
    found = {(f.task_id, f.field): f for f in lint_suite(root).problems if f.rule == "getter-reads-folder"}
    assert set(found) == {("profile-folder", "evaluator.result.path"), ("made-folder", "evaluator.result.path"),
                          ("trailing", "evaluator.result.path[1]")}
    finding = found[("made-folder", "evaluator.result.path")]
    assert "a folder an earlier setup step creates" in finding.message and "/file answers 500" in finding.message
    assert "list_directory" in finding.fix
