"""The /evaluate endpoint, run as its own process beside a local WAA environment, scores the
bundled suite exactly as the local engine does."""

from __future__ import annotations

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
