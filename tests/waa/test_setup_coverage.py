"""Every setup step of the 154 real WAA tasks is executed by the local environment or rejected
with a SetupStepError that names the step; nothing else escapes and nothing hangs."""

from __future__ import annotations

import collections
import json
from pathlib import Path, PureWindowsPath

import pytest

from adapters.waa.catalog import WAATaskCatalog
from adapters.waa.client import WAAClient
from adapters.waa.localenv.launcher import LocalEnvHandle
from adapters.waa.setup_steps import SetupRunner, SetupStepError


def _steps(task_raw: dict) -> list[dict]:
    return list(task_raw.get("config") or []) + list(task_raw["evaluator"].get("postconfig") or [])


@pytest.mark.parametrize("difficulty", ["normal"])
def test_every_real_setup_step_runs_or_is_rejected_by_name(
    waa_tasks_dir: Path, sim: LocalEnvHandle, tmp_path: Path, difficulty: str
) -> None:
    client = WAAClient(sim.base_url, read_retries=0)
    runner = SetupRunner(client, tmp_path, sleep=lambda s: None, launch_verify_seconds=0.05, devtools_url=sim.base_url)
    executed: collections.Counter[str] = collections.Counter()
    rejected: collections.Counter[str] = collections.Counter()
    reasons: dict[str, set[str]] = collections.defaultdict(set)
    catalog = WAATaskCatalog(waa_tasks_dir, difficulty=difficulty)
    for task in catalog.tasks():
        client._session.post(sim.base_url + "/sim/snapshot/load", json={"name": "initial"}, timeout=10)
        for step in _steps(task.raw_config):
            # The host's download cache already holds each file (the machine is offline).
            for entry in step.get("parameters", {}).get("files", []) if step["type"] == "download" else []:
                cached = runner.download_cache_path(entry["url"], PureWindowsPath(entry["path"]).name)
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_bytes(b"cached content of " + entry["url"].encode())
            try:
                runner.run([step])
            except SetupStepError as exc:
                assert f"({step['type']})" in str(exc), str(exc)
                rejected[step["type"]] += 1
                reasons[step["type"]].add(str(exc).split(": ", 1)[1][:70])
            else:
                executed[step["type"]] += 1
    report = {t: (executed[t], rejected[t]) for t in sorted(set(executed) | set(rejected))}
    print(f"\n{difficulty}: step type -> (executed, rejected): {json.dumps(report)}")
    for step_type, why in sorted(reasons.items()):
        print(f"  {step_type} rejected because: {sorted(why)[:4]}")
    real_types = {s["type"] for t in catalog.tasks() for s in _steps(t.raw_config)}
    assert set(report) == real_types
    assert sum(executed.values()) > 0 and sum(rejected.values()) > 0
    # What the simulation can honour is executed, never rejected.
    for always_runs in ("sleep", "create_folder", "recycle_file"):
        assert rejected[always_runs] == 0, reasons[always_runs]
    # Downloads fail only where WAA's own upload would: a target folder that does not exist yet,
    # or the one task that downloads to a Linux path (a WAA data bug).
    assert executed["download"] > 60
    assert all(r.startswith("WAA /setup/upload: HTTP 500") for r in reasons["download"]), reasons["download"]
    # What it cannot (a browser, programs it does not simulate) is rejected with a reason.
    assert rejected["chrome_open_tabs"] == executed["chrome_open_tabs"] + rejected["chrome_open_tabs"]
    assert rejected["launch"] > 0 and executed["launch"] > 0
