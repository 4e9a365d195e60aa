"""A `sleep` setup or postconfig step waits at most MAX_SLEEP_SECONDS, one list of steps at most
MAX_TOTAL_SLEEP_SECONDS: more is refused before any step runs (a setup failure naming the step),
never a task that hangs until its stage's deadline. WAA's own sleeps (0.5-3 s) run as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adapters.benchmark import BenchmarkTask
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.client import WAAClient
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter
from adapters.waa.localenv.launcher import LocalEnvHandle
from adapters.waa.settle import SettlePolicy
from adapters.waa.setup_steps import MAX_SLEEP_SECONDS, MAX_TOTAL_SLEEP_SECONDS, SetupRunner, SetupStepError


def _sleep(seconds: Any) -> dict[str, Any]:
    return {"type": "sleep", "parameters": {"seconds": seconds}}


def _runner(tmp_path: Path, slept: list[float]) -> SetupRunner:
    # Sleep steps never call the VM: a client to a closed port shows that nothing else ran.
    return SetupRunner(WAAClient("http://127.0.0.1:9"), tmp_path, sleep=slept.append)


@pytest.mark.parametrize("steps, index, limit", [
    ([_sleep(1e9)], 0, "MAX_SLEEP_SECONDS"),
    ([_sleep(2), _sleep(MAX_SLEEP_SECONDS + 1)], 1, "MAX_SLEEP_SECONDS"),
    ([_sleep(float("inf"))], 0, "MAX_SLEEP_SECONDS"),
    ([_sleep(float("nan"))], 0, "MAX_SLEEP_SECONDS"),
    ([_sleep(-1)], 0, "must not be negative"),
    ([_sleep(MAX_SLEEP_SECONDS)] * 6, 5, "MAX_TOTAL_SLEEP_SECONDS"),
], ids=["1e9", "second-step", "inf", "nan", "negative", "total"])
def test_a_sleep_over_the_limit_is_refused_before_any_step_runs(
    tmp_path: Path, steps: list[dict[str, Any]], index: int, limit: str
) -> None:
    slept: list[float] = []
    with pytest.raises(SetupStepError, match=rf"setup step {index} \(sleep\): .*{limit}"):
        _runner(tmp_path, slept).run(steps)
    assert slept == []


def test_waas_own_sleeps_still_run(tmp_path: Path) -> None:
    slept: list[float] = []
    _runner(tmp_path, slept).run([_sleep(0.5), _sleep(2), _sleep(3.0), _sleep("1")])
    assert slept == [0.5, 2.0, 3.0, 1.0]
    assert MAX_TOTAL_SLEEP_SECONDS >= MAX_SLEEP_SECONDS > 3.0


def test_a_task_that_sleeps_1e9_seconds_is_a_setup_failure_at_once(sim: LocalEnvHandle, tmp_path: Path) -> None:
    task = BenchmarkTask(task_id="sleeps", instruction="-", domain="notepad",
                         raw_config={"config": [_sleep(1e9)]}, evaluation_spec={"func": "infeasible"})
    adapter = WAALiveAdapter(WAAClient(sim.base_url), WAATaskCatalog(bundled_suite_dir()), tmp_path,
                             LiveAdapterSettings(settle=SettlePolicy.fixed(0)))
    with pytest.raises(SetupStepError, match="setup step 0 \\(sleep\\): seconds must be at most 60 \\(MAX_SLEEP_SECONDS\\), got 1e\\+09"):
        adapter.reset(task)
