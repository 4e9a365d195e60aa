"""The noisy-scripted TEST AGENT: its known per-task probabilities become real outcomes on the
local WAA environment, its draws are seeded per (seed, task, trial), and it is labelled as a test
agent."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.agents import AGENT_NAMES, AgentOptions, build_agent
from adapters.agents.noisy_scripted import NoisyScriptedAgent, ProbabilityFileError, load_probabilities, trial_draw
from adapters.agents.scripted import load_plans
from adapters.benchmark import ActionType
from adapters.episode import EpisodeLimits, run_episode
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.client import WAAClient
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter
from adapters.waa.localenv.launcher import LocalEnvHandle
from adapters.waa.settle import SettlePolicy

CATALOG = WAATaskCatalog(bundled_suite_dir())
PLANS = load_plans(bundled_suite_dir() / "solutions.json")
FEASIBLE, INFEASIBLE = "notepad-append-line", "INF-notepad-font-comic-papyrus"


def _play(sim: LocalEnvHandle, tmp_path: Path, agent: NoisyScriptedAgent, task_id: str) -> str:
    client = WAAClient(sim.base_url)
    client._session.post(sim.base_url + "/sim/snapshot/load", json={"name": "initial"}, timeout=10)
    adapter = WAALiveAdapter(client, CATALOG, tmp_path, LiveAdapterSettings(settle=SettlePolicy.fixed(0)))
    task = CATALOG.load(task_id)
    observation = adapter.reset(task)
    run_episode(adapter, agent, task, EpisodeLimits(), first_observation=observation)
    return adapter.evaluate(task).outcome.value


def test_known_probabilities_become_outcomes_on_the_local_environment(sim: LocalEnvHandle, tmp_path: Path) -> None:
    always = NoisyScriptedAgent(PLANS, {FEASIBLE: 1.0, INFEASIBLE: 1.0}, trial=1)
    never = NoisyScriptedAgent(PLANS, {FEASIBLE: 0.0, INFEASIBLE: 0.0}, trial=1)
    assert _play(sim, tmp_path, always, FEASIBLE) == "success"
    assert _play(sim, tmp_path, never, FEASIBLE) == "agent_failure"
    # An infeasible task is solved by FAIL: a failing trial must stop with DONE instead.
    assert _play(sim, tmp_path, always, INFEASIBLE) == "success"
    assert _play(sim, tmp_path, never, INFEASIBLE) == "agent_failure"
    # p = 0.5: each trial's outcome is its seeded draw.
    outcomes = []
    for trial in range(1, 7):
        agent = NoisyScriptedAgent(PLANS, default_probability=0.5, seed=4, trial=trial)
        outcomes.append(_play(sim, tmp_path, agent, FEASIBLE))
    expected = ["success" if trial_draw(4, FEASIBLE, t) < 0.5 else "agent_failure" for t in range(1, 7)]
    assert outcomes == expected and len(set(outcomes)) == 2


def test_draws_are_seeded_per_trial_and_match_the_probability() -> None:
    task = CATALOG.load(FEASIBLE)
    follows = []
    for trial in range(1, 2001):
        agent = NoisyScriptedAgent(PLANS, default_probability=0.3, seed=9, trial=trial)
        agent.reset(task)
        follows.append(agent._follow)
    assert 0.27 < sum(follows) / len(follows) < 0.33  # 2000 draws at 0.3: sd 0.01
    again = NoisyScriptedAgent(PLANS, default_probability=0.3, seed=9, trial=17)
    again.reset(task)
    assert again._follow == follows[16]
    # Without a trial number, episodes of a task in one process take trials 1, 2, 3, ...
    counted = NoisyScriptedAgent(PLANS, default_probability=0.3, seed=12345)
    draws = []
    for _ in range(3):
        counted.reset(task)
        draws.append(counted._drawn[0])
    assert draws == [1, 2, 3]


def test_a_failing_trial_stops_with_done_and_says_it_is_a_test_agent() -> None:
    task = CATALOG.load(INFEASIBLE)
    agent = NoisyScriptedAgent(PLANS, default_probability=0.0, trial=1)
    agent.reset(task)
    action = agent.act(task, None, [])  # type: ignore[arg-type]  # a failing trial reads nothing
    assert action.type == ActionType.DONE and "TEST AGENT" in (action.reasoning or "")
    assert agent.config()["test_agent"] is True and "trial" not in agent.config()


def test_registered_with_probabilities_from_json_or_toml(tmp_path: Path) -> None:
    assert "noisy-scripted" in AGENT_NAMES
    plans = bundled_suite_dir() / "solutions.json"
    (tmp_path / "p.json").write_text('{"notepad-append-line": 0.9}')
    (tmp_path / "p.toml").write_text('[probabilities]\n"notepad-append-line" = 0.25\n')
    agent = build_agent("noisy-scripted", AgentOptions(plans_path=plans, success_probabilities_path=tmp_path / "p.json",
                                                       success_probability=0.1, seed=3))
    assert isinstance(agent, NoisyScriptedAgent)
    assert (agent.probability(FEASIBLE), agent.probability("other"), agent.seed) == (0.9, 0.1, 3)
    assert load_probabilities(tmp_path / "p.toml") == {FEASIBLE: 0.25}
    (tmp_path / "bad.json").write_text('{"notepad-append-line": 1.5}')
    with pytest.raises(ProbabilityFileError, match=r"bad.json: task 'notepad-append-line': .* from 0 to 1, got 1.5"):
        load_probabilities(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="needs a plans file"):
        build_agent("noisy-scripted", AgentOptions())
