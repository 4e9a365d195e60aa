"""Getters against the in-memory VM, cloud_file against a real loopback HTTP server."""

from __future__ import annotations

import http.server
import json
import threading
from datetime import datetime
from pathlib import Path

import pytest

from adapters.waa.client import ExecuteResult
from adapters.waa.errors import WAAHTTPError
from adapters.waa.evaluator import GETTERS, unsupported_names
from adapters.waa.evaluator.getters import GetterContext, registry_query_command


G = GETTERS


@pytest.fixture
def ctx(vm, tmp_path) -> GetterContext:
    return GetterContext(vm=vm, cache_dir=tmp_path / "cache")


def test_rule_returns_rules_unchanged(ctx):
    rules = {"expected": [1, "a"]}
    assert G["rule"](ctx, {"type": "rule", "rules": rules}) is rules


def test_vm_file_single_multi_and_gives(ctx, vm):
    vm.files["C:\\a.txt"] = b"A"
    vm.files["C:\\b.txt"] = b"B"
    local = G["vm_file"](ctx, {"path": "C:\\a.txt", "dest": "a.txt"})
    assert Path(local).read_bytes() == b"A" and Path(local).parent == ctx.cache_dir
    assert G["vm_file"](ctx, {"path": "C:\\zz.txt", "dest": "zz.txt"}) is None
    multi = {"multi": True, "path": ["C:\\a.txt", "C:\\nope", "C:\\b.txt"], "dest": ["a", "n", "b"]}
    assert G["vm_file"](ctx, multi) == str(ctx.cache_dir / "a")  # gives defaults to [0]
    got = G["vm_file"](ctx, {**multi, "gives": [0, 1, 2]})
    assert got == [str(ctx.cache_dir / "a"), None, str(ctx.cache_dir / "b")]
    assert G["vm_file"](ctx, {**multi, "gives": [7]}) == []  # WAA: empty list, not None


def test_vm_file_time_suffix(ctx, vm):
    stamp = datetime.now().strftime("%Y%m%d")
    vm.files[f"C:\\report{stamp}.txt"] = b"R"
    local = G["vm_file"](ctx, {"path": "C:\\report.txt", "dest": "r.txt", "time_suffix": True, "time_format": "%Y%m%d"})
    assert local == str(ctx.cache_dir / f"r{stamp}.txt")


def test_vm_file_exists_in_vm_folder_floats(ctx, vm):
    vm.files["C:\\D\\x.txt"] = b"data"
    vm.files["C:\\D\\empty.txt"] = b""
    f = G["vm_file_exists_in_vm_folder"]
    assert f(ctx, {"folder_name": "C:\\D", "file_name": "x.txt"}) == 1.0
    assert f(ctx, {"folder_name": "C:\\D", "file_name": "y.txt"}) == 0.0
    assert f(ctx, {"folder_name": "C:\\D", "file_name": "empty.txt"}) == 0.0  # WAA quirk
    assert f(ctx, {"folder_name": "", "file_name": "x.txt"}) == 0.0
    assert isinstance(f(ctx, {"folder_name": "C:\\D", "file_name": "x.txt"}), float)


def test_yes_no_getters_return_bools(ctx, vm):
    vm.existing.add(vm.documents + "|MyFolder")
    vm.existing.add(vm.desktop + "|a.lnk")
    assert G["vm_folder_exists_in_documents"](ctx, {"folder_name": "MyFolder"}) is True
    assert G["vm_folder_exists_in_documents"](ctx, {"folder_name": "Other"}) is False
    assert G["vm_file_exists_in_desktop"](ctx, {"file_name": "a.lnk"}) is True
    assert G["vm_file_exists_in_desktop"](ctx, {"file_name": "b.lnk"}) is False


def test_yes_no_getter_http_error_is_false(ctx, vm):
    def broken(folder, name):
        raise WAAHTTPError("/folder_exists", 500, "boom")

    vm.folder_exists = broken
    assert G["vm_folder_exists_in_documents"](ctx, {"folder_name": "X"}) is False
    assert ctx.notes


def test_vm_command_line_and_error(ctx, vm):
    vm.commands["cmd /c dir"] = ExecuteResult("success", "out\n", "err\n", 1)
    spec = {"command": ["cmd", "/c", "dir"]}
    assert G["vm_command_line"](ctx, spec) == "out\n"  # stdout even when returncode != 0
    assert G["vm_command_error"](ctx, spec) == "err\n"

    def broken(command, shell=False):
        raise WAAHTTPError("/execute", 500, "timeout")

    vm.execute = broken
    assert G["vm_command_line"](ctx, spec) is None
    assert G["vm_command_error"](ctx, spec) is None


KEY = r"HKCU:\Software\Microsoft\Windows\CurrentVersion\StorageSense\Parameters\StoragePolicy"


def test_registry_command_is_wAAs_exact_powershell_line():
    assert registry_query_command(KEY, "01") == (
        "powershell -Command \"Get-ItemPropertyValue -Path '" + KEY + "' -Name '01'\""
    )


def test_storage_sense_run_frequency(ctx, vm):
    on = registry_query_command(KEY, "01")
    freq = registry_query_command(KEY, "2048")
    vm.commands[on] = ExecuteResult("success", "1\n", "", 0)
    vm.commands[freq] = ExecuteResult("success", "7\n", "", 0)
    assert G["storage_sense_run_frequency"](ctx, {}) == "7"
    assert ("execute", on) in vm.calls  # sent as one string, exactly
    vm.commands[on] = ExecuteResult("success", "0\n", "", 0)
    assert G["storage_sense_run_frequency"](ctx, {}) is None
    vm.commands[on] = ExecuteResult("success", "1\r\n", "", 0)
    assert G["storage_sense_run_frequency"](ctx, {}) is None  # WAA compares with "1\n" exactly


def test_system_notifications(ctx, vm):
    cmd = registry_query_command(r"HKCU:Software\Microsoft\Windows\CurrentVersion\PushNotifications", "ToastEnabled")
    f = G["system_notifications"]
    assert f(ctx, {}) == "False"  # value missing: empty stdout
    vm.commands[cmd] = ExecuteResult("success", "0\n", "", 0)
    assert f(ctx, {}) == "True"
    vm.commands[cmd] = ExecuteResult("success", "1\n", "", 0)
    assert f(ctx, {}) is None  # WAA falls through its branches


def test_accessibility_tree_uses_servers_default_backend(ctx, vm):
    assert G["accessibility_tree"](ctx, {}) == "<root/>"
    assert ("accessibility", "win32") in vm.calls


def test_cache_file(ctx):
    ctx.cache_dir.mkdir(parents=True)
    (ctx.cache_dir / "g.txt").write_text("g")
    assert G["cache_file"](ctx, {"path": "g.txt"}) == str(ctx.cache_dir / "g.txt")
    with pytest.raises(AssertionError):
        G["cache_file"](ctx, {"path": "missing.txt"})


# -- cloud_file over a real loopback server ------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    hits: dict[str, int] = {}

    def do_GET(self):  # noqa: N802
        type(self).hits[self.path] = type(self).hits.get(self.path, 0) + 1
        if self.path.startswith("/missing"):
            self.send_response(404)
            self.end_headers()
            return
        body = f"content of {self.path}".encode()
        self.send_response(200)
        # /cut...: the host stops after a tenth of what it promised, as a dropped download.
        self.send_header("Content-Length", str(len(body) * (10 if self.path.startswith("/cut") else 1)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def file_server():
    _Handler.hits = {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Handler.hits
    server.shutdown()
    server.server_close()


def test_cloud_file_downloads_once(evaluate, vm, tmp_path, file_server):
    base, hits = file_server
    url = base + "/gold.txt"
    downloads = tmp_path / "downloads"
    vm.files["C:\\draft.txt"] = b"content of /gold.txt"
    spec = {
        "func": "compare_text_file",
        "result": {"type": "vm_file", "path": "C:\\draft.txt", "dest": "draft.txt"},
        "expected": {"type": "cloud_file", "path": url, "dest": "gold.txt"},
    }
    for attempt in range(2):
        out = evaluate(spec, cache_dir=tmp_path / f"attempt{attempt}", download_dir=downloads)
        assert (out.score, out.kind) == (1.0, "scored"), out.reason
    assert hits == {"/gold.txt": 1}
    cached = list(downloads.rglob("gold.txt"))
    assert len(cached) == 1  # kept under sha256(url) with the dest file name


def test_cloud_file_multi_gives(ctx, file_server):
    base, hits = file_server
    spec = {"multi": True, "path": [base + "/a", base + "/b"], "dest": ["a.txt", "b.txt"], "gives": [0, 1]}
    paths = GETTERS["cloud_file"](ctx, spec)
    assert [Path(p).read_text() for p in paths] == ["content of /a", "content of /b"]


def test_cloud_file_offline_names_the_url(evaluate, tmp_path):
    url = "http://127.0.0.1:9/never-fetched.txt"
    spec = {"func": "exact_match", "result": {"type": "rule", "rules": 1},
            "expected": {"type": "cloud_file", "path": url, "dest": "x.txt"}}
    out = evaluate(spec, offline=True)
    assert out.kind == "evaluation_error" and url in out.reason
    # even as a single-metric *result* getter, where WAA would catch and score 0
    out = evaluate({"func": "exact_match", "result": spec["expected"], "expected": spec["result"]}, offline=True)
    assert out.kind == "evaluation_error" and url in out.reason


def test_cloud_file_http_error_and_unreachable(evaluate, file_server, tmp_path):
    base, _ = file_server
    spec = {"func": "exact_match", "result": {"type": "rule", "rules": 1},
            "expected": {"type": "cloud_file", "path": base + "/missing.txt", "dest": "m.txt"}}
    out = evaluate(spec)
    assert out.kind == "evaluation_error" and "404" in out.reason and "/missing.txt" in out.reason
    assert not list((tmp_path / "cache").rglob("m.txt"))  # nothing half-written cached
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spec["expected"]["path"] = f"http://127.0.0.1:{port}/x.txt"
    out = evaluate(spec)
    assert out.kind == "infrastructure_error"


def test_cloud_file_cut_short_by_the_host_is_infrastructure(evaluate, file_server, tmp_path):
    base, _ = file_server
    spec = {"func": "exact_match", "result": {"type": "rule", "rules": 1},
            "expected": {"type": "cloud_file", "path": base + "/cut.txt", "dest": "cut.txt"}}
    out = evaluate(spec, download_dir=tmp_path / "downloads")
    assert out.kind == "infrastructure_error" and "/cut.txt" in out.reason, out.reason
    assert not [p for p in (tmp_path / "downloads").rglob("*") if p.is_file()]  # nothing half-written kept


# -- coverage of the shipped task files -----------------------------------------------------------

EXAMPLES = Path("/work/shared/waa-tasks/examples")


def test_unsupported_names_basic():
    spec = {"func": ["exact_match", "no_such_metric"], "result": [{"type": "vm_file"}, {"type": "no_such_getter"}],
            "expected": [None, {"type": "rule"}]}
    assert unsupported_names(spec) == ["no_such_metric", "no_such_getter"]
    assert unsupported_names({"func": "infeasible", "result": {}, "expected": {}}) == []
    assert unsupported_names(None) == [] and unsupported_names({"func": 3, "result": "x"}) == []


def test_unsupported_names_on_every_task_file(capsys):
    files = sorted(EXAMPLES.glob("*/*.json")) if EXAMPLES.is_dir() else []
    if not files:
        pytest.skip(f"{EXAMPLES} not present")
    missing: dict[str, int] = {}
    fully = 0
    for path in files:
        spec = json.loads(path.read_text(encoding="utf-8"))["evaluator"]
        names = unsupported_names(spec)
        fully += not names
        for name in names:
            missing[name] = missing.get(name, 0) + 1
    with capsys.disabled():
        print(f"\n{len(files)} task files: {fully} fully supported, {len(missing)} unsupported names")
    assert fully > 0
