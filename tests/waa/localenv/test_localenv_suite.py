"""Every bundled task is solved by its plan and unsolved when the agent does nothing, using the
project's own pieces end to end over HTTP: catalog, setup runner, scripted agent, episode loop,
action translation and the WAA evaluator (no Prefect)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.agents.scripted import ScriptedAgent, load_plans
from adapters.benchmark import ActionType, OutcomeKind
from adapters.episode import EpisodeLimits, run_episode
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.client import WAAClient
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter
from adapters.waa.settle import SettlePolicy

CATALOG = WAATaskCatalog(bundled_suite_dir())
PLANS = load_plans(bundled_suite_dir() / "solutions.json")
FEASIBLE = [t.task_id for t in CATALOG.tasks() if not t.infeasible]
INFEASIBLE = [t.task_id for t in CATALOG.tasks() if t.infeasible]
SETUP_TYPES = {"launch", "open", "activate_window", "sleep", "create_folder", "create_file", "execute", "command"}


@pytest.fixture()
def adapter(client, tmp_path: Path) -> WAALiveAdapter:
    return WAALiveAdapter(WAAClient(client.base), CATALOG, tmp_path, LiveAdapterSettings(settle=SettlePolicy.fixed(0)))


def test_suite_shape() -> None:
    assert len(CATALOG) >= 12
    assert set(CATALOG.domains()) == {"notepad", "file_explorer", "settings"}
    assert len(INFEASIBLE) == 2 and all(t.startswith("INF-") for t in INFEASIBLE)
    for task in CATALOG.tasks():
        assert set(task.raw_config) >= {"id", "snapshot", "instruction", "source", "config", "trajectory", "related_apps", "evaluator"}
        assert {s["type"] for s in task.setup_steps} <= SETUP_TYPES
        plan = PLANS[task.task_id]
        assert ("fail" in plan[-1]) == task.infeasible and ("done" in plan[-1]) != task.infeasible


@pytest.mark.parametrize("task_id", FEASIBLE)
def test_plan_solves_task_and_idle_does_not(adapter: WAALiveAdapter, client, task_id: str) -> None:
    task = CATALOG.load(task_id)
    observation = adapter.reset(task)
    episode = run_episode(adapter, ScriptedAgent(PLANS), task, EpisodeLimits(), first_observation=observation)
    assert episode.final_outcome is None, episode.error
    assert episode.last_action is not None and episode.last_action.type is ActionType.DONE
    assert [s.error for s in episode.steps if s.error] == []
    result = adapter.evaluate(task)
    assert (result.outcome, result.score) == (OutcomeKind.SUCCESS, 1.0), result.reason

    client.reset()
    idle = WAALiveAdapter(adapter.client, CATALOG, adapter.cache_dir, adapter.settings)
    idle.reset(task)
    result = idle.evaluate(task)
    assert (result.outcome, result.score) == (OutcomeKind.AGENT_FAILURE, 0.0), result.reason


@pytest.mark.parametrize("task_id", INFEASIBLE)
def test_infeasible_plans_end_in_fail_and_score_one(adapter: WAALiveAdapter, task_id: str) -> None:
    task = CATALOG.load(task_id)
    observation = adapter.reset(task)
    episode = run_episode(adapter, ScriptedAgent(PLANS), task, EpisodeLimits(), first_observation=observation)
    assert episode.last_action is not None and episode.last_action.type is ActionType.FAIL
    assert adapter.evaluate(task).score == 1.0
