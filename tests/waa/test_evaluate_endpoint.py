"""The /evaluate endpoint, run as its own process beside a local WAA environment, scores the
bundled suite exactly as the local engine does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from adapters.agents.scripted import ScriptedAgent, load_plans
from adapters.episode import EpisodeLimits, run_episode
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.client import WAAClient
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter
from adapters.waa.localenv.launcher import LocalEnvHandle
from adapters.waa.settle import SettlePolicy

CATALOG = WAATaskCatalog(bundled_suite_dir())
PLANS = load_plans(bundled_suite_dir() / "solutions.json")
TOKEN = "test-token-not-a-secret"


@pytest.fixture(scope="module")
def endpoint(sim: LocalEnvHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port_file = tmp_path_factory.mktemp("ep") / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapters.waa.evaluate_server", "--waa-url", sim.base_url, "--port", "0",
         "--port-file", str(port_file), "--devtools-url", sim.base_url],
        env={**__import__("os").environ, "ARENA_EVALUATE_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "evaluate endpoint did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port_file.read_text()}"
    proc.terminate()
    proc.wait(10)


def _play(sim: LocalEnvHandle, tmp_path: Path, task_id: str, settings: LiveAdapterSettings) -> tuple[float, str]:
    client = WAAClient(sim.base_url)
    client._session.post(sim.base_url + "/sim/snapshot/load", json={"name": "initial"}, timeout=10)
    adapter = WAALiveAdapter(client, CATALOG, tmp_path, settings)
    task = CATALOG.load(task_id)
    observation = adapter.reset(task)
    run_episode(adapter, ScriptedAgent(PLANS), task, EpisodeLimits(), first_observation=observation)
    result = adapter.evaluate(task)
    return result.score, result.outcome.value


def test_endpoint_scores_like_the_local_engine(sim: LocalEnvHandle, endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARENA_EVALUATE_TOKEN", TOKEN)
    local = LiveAdapterSettings(settle=SettlePolicy.fixed(0))
    remote = LiveAdapterSettings(settle=SettlePolicy.fixed(0), evaluator="endpoint", evaluate_url=endpoint)
    for task_id in CATALOG.task_ids():
        assert _play(sim, tmp_path, task_id, local) == _play(sim, tmp_path, task_id, remote) == (1.0, "success")


def test_endpoint_answers_the_documented_shape_and_refuses_bad_input(endpoint: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert requests.get(endpoint + "/health", timeout=10).status_code == 401
    assert requests.get(endpoint + "/health", headers=headers, timeout=10).json()["status"] == "ok"
    task = {"evaluator": {"func": "exact_match", "result": {"type": "rule", "rules": 7}, "expected": {"type": "rule", "rules": {"expected": "7"}}}}
    body = requests.post(endpoint + "/evaluate", json={"task": task, "last_action": "DONE"}, headers=headers, timeout=30).json()
    assert body["success"] is False and body["score"] == 0.0 and body["kind"] == "scored"
    assert set(body) >= {"success", "score", "reason", "actual", "expected"}
    bad = requests.post(endpoint + "/evaluate", json={"nope": 1}, headers=headers, timeout=30)
    assert bad.status_code == 400 and "'task'" in bad.json()["message"]
    unknown = {"evaluator": {"func": "no_such_metric", "result": {"type": "rule", "rules": 1}, "expected": {"type": "rule", "rules": 1}}}
    body = requests.post(endpoint + "/evaluate", json={"task": unknown, "last_action": None}, headers=headers, timeout=30).json()
    assert body["kind"] == "evaluation_error" and "no_such_metric" in body["reason"]


# -- the endpoint's trust boundary ---------------------------------------------------------------


def _start(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "adapters.waa.evaluate_server", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_endpoint_refuses_to_start_open() -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != "ARENA_EVALUATE_TOKEN"}
    no_token = _start(["--waa-url", "http://127.0.0.1:9", "--port", "0"], env)
    assert no_token.returncode == 2 and "ARENA_EVALUATE_TOKEN" in no_token.stderr
    wide = _start(["--waa-url", "http://127.0.0.1:9", "--port", "0", "--insecure-no-token", "--host", "0.0.0.0"], env)
    assert wide.returncode == 2 and "--host 0.0.0.0 without ARENA_EVALUATE_TOKEN" in wide.stderr


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_endpoint_removes_its_own_cache_and_keeps_an_operators(tmp_path: Path, stop: signal.Signals) -> None:
    """Its default cache (a folder of its own in the temporary folder) goes when it stops, by a
    service manager's SIGTERM or Ctrl-C alike; a `--cache-dir` the operator gave stays."""
    temp, given = tmp_path / "tmp", tmp_path / "given-cache"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "ARENA_EVALUATE_TOKEN": TOKEN}
    for extra, cache in (([], None), (["--cache-dir", str(given)], given)):
        port_file = tmp_path / "port"
        port_file.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-m", "adapters.waa.evaluate_server", "--waa-url", "http://127.0.0.1:9",
                                 "--port", "0", "--port-file", str(port_file), *extra], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "evaluate endpoint did not start"
            time.sleep(0.05)
        made = cache or next(temp.glob("waa-evaluate-*"))
        assert made.is_dir()
        proc.send_signal(stop)
        assert proc.wait(10) == 0, proc.stderr.read() if proc.stderr else ""
        assert list(temp.iterdir()) == []
        assert given.is_dir() == (cache is not None)


@pytest.fixture(scope="module")
def internal_service() -> Iterator[tuple[str, list[str]]]:
    """A service on this host's loopback (as the Prefect API is), recording every request it gets."""
    import http.server
    import threading

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            seen.append(self.path)
            body = b"internal secret"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", seen
    server.shutdown()


@pytest.fixture(scope="module")
def default_endpoint(sim: LocalEnvHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The endpoint as an operator starts it (token set, no fetch allow-list), and its cache root."""
    import os

    folder = tmp_path_factory.mktemp("ep-default")
    port_file, cache = folder / "port", folder / "cache"
    env = {k: v for k, v in os.environ.items() if k != "ARENA_FETCH_ALLOW"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapters.waa.evaluate_server", "--waa-url", sim.base_url, "--port", "0",
         "--port-file", str(port_file), "--cache-dir", str(cache)],
        env={**env, "ARENA_EVALUATE_TOKEN": TOKEN}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "evaluate endpoint did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port_file.read_text()}", cache
    proc.terminate()
    proc.wait(10)


def _evaluate(endpoint: str, evaluator: dict[str, object]) -> requests.Response:
    return requests.post(endpoint + "/evaluate", json={"task": {"evaluator": evaluator}, "last_action": "DONE"},
                         headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)


@pytest.mark.parametrize("dest", ["../../../../tmp/arena-planted", "/tmp/arena-planted", "a/../../../arena-planted"])
def test_a_caller_cannot_write_outside_the_cache(default_endpoint: tuple[str, Path], dest: str) -> None:
    endpoint, _ = default_endpoint
    planted = Path("/tmp/arena-planted")
    planted.unlink(missing_ok=True)
    evaluator = {"func": "exact_match", "result": {"type": "vm_file", "path": r"C:\Users\Docker\Desktop\notes.txt",
                                                   "dest": dest}, "expected": {"type": "rule", "rules": {"expected": 1}}}
    answer = _evaluate(endpoint, evaluator)
    assert answer.status_code == 400 and "task.evaluator.result.dest" in answer.json()["message"]
    assert not planted.exists()


@pytest.mark.parametrize("evaluator", [
    {"func": "file_contains", "result": {"type": "cache_file", "path": "/etc/passwd"},
     "expected": {"type": "rule", "rules": {"expected": ["root"]}}},
    {"func": "compare_text_file", "result": {"type": "rule", "rules": "/etc/hostname"},
     "expected": {"type": "rule", "rules": "/etc/hostname"}},
    {"func": ["exact_match", "diff_text_file"], "result": [{"type": "rule", "rules": 1}, {"type": "rule", "rules": "/etc/passwd"}],
     "expected": [{"type": "rule", "rules": {"expected": 1}}, {"type": "cache_file", "path": "../../etc/passwd"}]},
], ids=["cache_file", "rule-as-file", "multi"])
def test_a_caller_cannot_probe_host_files(default_endpoint: tuple[str, Path], evaluator: dict[str, object]) -> None:
    answer = _evaluate(default_endpoint[0], evaluator)
    assert answer.status_code == 400, answer.text
    assert "refused" in answer.json()["message"]


@pytest.mark.parametrize("getter", ["page_info", "cloud_file", "pdf_from_url"])
def test_a_caller_cannot_make_the_host_fetch_its_own_services(
    default_endpoint: tuple[str, Path], internal_service: tuple[str, list[str]], getter: str
) -> None:
    base, seen = internal_service
    before = len(seen)
    url = base + "/api/flow_runs/filter"
    spec = {"page_info": {"type": "page_info", "url": url},
            "cloud_file": {"type": "cloud_file", "path": url, "dest": "x.txt"},
            "pdf_from_url": {"type": "pdf_from_url", "path": url, "dest": "x.pdf"}}[getter]
    answer = _evaluate(default_endpoint[0], {"func": "exact_match", "result": spec,
                                             "expected": {"type": "rule", "rules": {"expected": "internal secret"}}})
    body = answer.json()
    assert answer.status_code == 200 and body["kind"] == "evaluation_error", body
    assert "not a public address" in body["reason"] and "internal secret" not in answer.text
    assert len(seen) == before  # nothing reached the internal service


def test_a_caller_cannot_reach_the_metadata_service_or_other_schemes(default_endpoint: tuple[str, Path]) -> None:
    for url in ("http://169.254.169.254/latest/meta-data/", "file:///etc/passwd", "http://[::1]:4200/api/health"):
        body = _evaluate(default_endpoint[0], {"func": "exact_match", "result": {"type": "page_info", "url": url},
                                               "expected": {"type": "rule", "rules": {"expected": 1}}}).json()
        assert body["kind"] == "evaluation_error" and ("public address" in body["reason"] or "only http" in body["reason"])


def test_postconfig_downloads_follow_the_fetch_policy(
    default_endpoint: tuple[str, Path], internal_service: tuple[str, list[str]]
) -> None:
    base, seen = internal_service
    before = len(seen)
    step = {"type": "download", "parameters": {"files": [{"url": base + "/secret", "path": r"C:\Users\Docker\x.txt"}]}}
    body = _evaluate(default_endpoint[0], {"func": "exact_match", "postconfig": [step],
                                           "result": {"type": "rule", "rules": 1},
                                           "expected": {"type": "rule", "rules": {"expected": 1}}}).json()
    assert body["kind"] == "evaluation_error" and "not a public address" in body["reason"]
    assert len(seen) == before


# -- limits: body, idle connections, sleeps, token, bombs, host paths in answers ------------------------


def test_endpoint_refuses_a_token_shorter_than_16_characters() -> None:
    env = {**os.environ, "ARENA_EVALUATE_TOKEN": "s3cret-but-15ch"}
    short = _start(["--waa-url", "http://127.0.0.1:9", "--port", "0"], env)
    assert short.returncode == 2 and len(short.stderr.strip().splitlines()) == 1
    assert "ARENA_EVALUATE_TOKEN is 15 characters long; use at least 16" in short.stderr
    assert "s3cret" not in short.stderr  # the token itself is never echoed


def test_a_request_body_over_the_cap_is_answered_413(default_endpoint: tuple[str, Path]) -> None:
    endpoint, _ = default_endpoint
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    padded = b'{"task": {"evaluator": {}}, "pad": "' + b"x" * (1 << 20) + b'"}'
    sized = requests.post(endpoint + "/evaluate", data=padded, headers=headers, timeout=30)
    assert sized.status_code == 413 and sized.json() == {
        "status": "error", "message": "request body of 1,048,576 bytes or more (MAX_REQUEST_BYTES); refused"}
    # Without a Content-Length (chunked), the server stops reading at the cap too.
    chunked = requests.post(endpoint + "/evaluate", data=iter([padded[i:i + 65536] for i in range(0, len(padded), 65536)]),
                            headers=headers, timeout=30)
    assert chunked.status_code == 413 and chunked.json()["status"] == "error"
    # A large body under the cap (a long last action) is read as usual.
    task = {"evaluator": {"func": "exact_match", "result": ONE_RULE, "expected": {"type": "rule", "rules": {"expected": 1}}}}
    under = requests.post(endpoint + "/evaluate", json={"task": task, "last_action": "x" * 900_000}, headers=headers, timeout=30)
    assert under.status_code == 200 and under.json()["score"] == 1.0


def test_a_body_nested_too_deeply_is_answered_400(default_endpoint: tuple[str, Path]) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    nested = b'{"task": {"evaluator": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    answer = requests.post(default_endpoint[0] + "/evaluate", data=nested, headers=headers, timeout=30)
    assert answer.status_code == 400 and answer.json() == {"status": "error", "message": "body nests too deeply to read; refused"}


@pytest.fixture(scope="module")
def quick_timeout_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An endpoint that closes a connection idle for 1 s (--read-timeout 1)."""
    port_file = tmp_path_factory.mktemp("ep-timeout") / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapters.waa.evaluate_server", "--waa-url", "http://127.0.0.1:9", "--port", "0",
         "--port-file", str(port_file), "--read-timeout", "1"],
        env={**os.environ, "ARENA_EVALUATE_TOKEN": TOKEN}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "evaluate endpoint did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port_file.read_text()}"
    proc.terminate()
    proc.wait(10)


def test_idle_connections_are_closed_and_the_endpoint_keeps_answering(quick_timeout_endpoint: str) -> None:
    import socket

    host, port = quick_timeout_endpoint.removeprefix("http://").split(":")
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(40)]
    idle[0].sendall(b"POST /evaluate HTTP/1.1\r\nHost: x\r\n")  # a request that stops half-way
    health = requests.get(quick_timeout_endpoint + "/health", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert health.json()["status"] == "ok"
    for sock in idle:  # the server closes each one: recv sees the end of the stream, not our 10 s timeout
        with sock:
            assert sock.recv(65536) == b""


def test_a_postconfig_sleep_is_capped(default_endpoint: tuple[str, Path]) -> None:
    for steps, limit in (([{"type": "sleep", "parameters": {"seconds": 1e9}}], "MAX_SLEEP_SECONDS"),
                         ([{"type": "sleep", "parameters": {"seconds": 60}}] * 6, "MAX_TOTAL_SLEEP_SECONDS")):
        body = _evaluate(default_endpoint[0], {"func": "exact_match", "postconfig": steps, "result": ONE_RULE,
                                               "expected": {"type": "rule", "rules": {"expected": 1}}}).json()
        assert body["kind"] == "evaluation_error" and limit in body["reason"], body


ONE_RULE = {"type": "rule", "rules": 1}


def test_a_decompression_bomb_on_the_vm_is_an_evaluation_error(sim: LocalEnvHandle, default_endpoint: tuple[str, Path]) -> None:
    import io

    py7zr = pytest.importorskip("py7zr")
    bomb = io.BytesIO()
    with py7zr.SevenZipFile(bomb, "w") as archive:
        archive.writef(io.BytesIO(bytes(8 << 20)), "OldProjects/example.txt")
    path = "C:\\Users\\Docker\\Desktop\\OldProjects.7z"
    WAAClient(sim.base_url).setup_upload(path, bomb.getvalue())
    body = _evaluate(default_endpoint[0], {"func": "exact_match",
                                           "result": {"type": "zipped_folder_in_desktop", "filename": path, "password": "x"},
                                           "expected": {"type": "rule", "rules": {"expected": "true"}}}).json()
    assert body["kind"] == "evaluation_error" and "MAX_RATIO" in body["reason"] and path in body["reason"], body


def test_answers_name_files_not_host_paths(sim: LocalEnvHandle, default_endpoint: tuple[str, Path]) -> None:
    endpoint, cache = default_endpoint
    path = "C:\\Users\\Docker\\Desktop\\answer.txt"
    WAAClient(sim.base_url).setup_upload(path, b"forty-two\n")
    answer = _evaluate(endpoint, {"func": "compare_text_file", "result": {"type": "vm_file", "path": path, "dest": "ours.txt"},
                                  "expected": {"type": "vm_file", "path": path, "dest": "gold.txt"}})
    body = answer.json()
    assert body["kind"] == "scored" and body["score"] == 1.0, body
    assert "'ours.txt'" in body["reason"] and body["actual"] == ["'ours.txt'"] and body["expected"] == ["'gold.txt'"]
    # An error that names a file in the request's folder: still by its name only.
    failing = _evaluate(endpoint, {"func": "compare_text_file", "result": {"type": "vm_file", "path": path, "dest": "ours.txt"},
                                   "expected": {"type": "cache_file", "path": "never-written.txt"}})
    assert failing.json()["kind"] == "evaluation_error" and "cache_file: never-written.txt does not exist" in failing.text
    for text in (answer.text, failing.text):
        assert str(cache) not in text and str(cache.resolve()) not in text and "/tmp/" not in text
