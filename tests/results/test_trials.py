"""Repeated trials: grouping, the suite rate and its two estimands, pass@k / pass^k, the paired
comparison (and that it gives compare.py's answers for single-trial runs), planning, flaky tasks
and the adaptive design's bookkeeping. Pure logic: no server."""

from __future__ import annotations

import json
import math

import pytest
from scipy import stats as scipy_stats

from adapters.results.compare import compare_runs
from adapters.results.stats import wilson_interval
from adapters.results.trials import (
    TrialRowError,
    compare_trial_rows,
    flaky_tasks,
    group_trials,
    pass_at_k,
    pass_hat_k,
    plan_mde,
    suite_rate,
    task_stability,
    trial_variance,
)
from adapters.results.trials.paired import render_trial_comparison
from adapters.results.trials.adaptive import (
    AdaptiveState,
    decide,
    fixed_design_cost,
    fixed_design_width,
    next_batch,
    record,
    record_unsound,
)

Z = scipy_stats.norm.ppf(0.975)


def rows(spec: dict[str, list[str]], fingerprint: str | None = "fp", domain: str = "notepad") -> list[dict]:
    """Rows from {task: [outcome of trial 1, trial 2, ...]} ("success" succeeds)."""
    return [
        {"task_id": task, "task_fingerprint": fingerprint, "domain": domain, "trial": i + 1, "outcome": outcome,
         "success": outcome == "success", "score": float(outcome == "success")}
        for task, outcomes in spec.items() for i, outcome in enumerate(outcomes)
    ]


S, F, INFRA, SETUP = "success", "agent_failure", "infrastructure_error", "setup_failure"


# --- grouping ---------------------------------------------------------------------------------


def test_grouping_counts_sound_trials_and_keeps_each_trials_final_attempt() -> None:
    data = rows({"a": [S, F, INFRA], "b": [SETUP, INFRA]})
    data += [{**data[1], "attempt": 2, "outcome": S, "success": True}]  # trial 2 of a, retried
    data[1] = {**data[1], "attempt": 1}
    a, b = group_trials(data)
    assert (a.task_id, a.trials, a.sound, a.sound_successes, a.fraction) == ("a", [1, 2, 3], 2, 2, 1.0)
    assert (b.sound, b.fraction) == (0, None)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"task_id": "a", "outcome": S, "success": True}, "lacks trial"),
        ({"task_id": "a", "trial": "two", "outcome": S, "success": True}, "trial must be a whole number"),
        ({"task_id": "a", "trial": -1, "outcome": S, "success": True}, "trial must be >= 0"),
    ],
)
def test_bad_rows_name_the_row_and_the_problem(bad: dict, message: str) -> None:
    with pytest.raises(TrialRowError, match=message) as info:
        group_trials([bad], "run-x")
    assert "row #1 of run 'run-x'" in str(info.value)


def test_a_trial_given_twice_without_attempts_is_refused() -> None:
    with pytest.raises(TrialRowError, match="trial 1 appears more than once"):
        group_trials(rows({"a": [S]}) * 2)


# --- the suite rate ---------------------------------------------------------------------------


def test_every_task_weighs_the_same_however_many_trials_it_got() -> None:
    # a: 4/4, b: 0/1 -> the mean over tasks is 0.5, not 4/5.
    rate = suite_rate(group_trials(rows({"a": [S, S, S, S], "b": [F]})))
    assert rate.rate == 0.5 and (rate.tasks, rate.sound_trials, rate.min_trials, rate.max_trials) == (2, 5, 1, 4)


def test_single_trial_runs_reduce_to_the_wilson_interval() -> None:
    spec = {f"t{i}": [S if i % 3 else F] for i in range(30)}
    rate = suite_rate(group_trials(rows(spec)))
    successes = sum(1 for o in spec.values() if o == [S])
    assert rate.rate == successes / 30
    assert rate.these_tasks.interval == pytest.approx(wilson_interval(successes, 30, z=Z), abs=1e-12)
    assert rate.these_tasks.effective_trials == pytest.approx(30)
    # Tasks like these: the tasks are a sample; their sample variance has T - 1 degrees of freedom
    # (n_eff = T - 1, shrunk by (z / t_29)^2).
    assert rate.tasks_like_these.effective_trials == pytest.approx(29 * (Z / scipy_stats.t.ppf(0.975, 29)) ** 2)
    assert rate.tasks_like_these.degrees_of_freedom == 29 and rate.these_tasks.degrees_of_freedom is None
    low, high = rate.tasks_like_these.interval
    assert low < rate.these_tasks.interval[0] and high > rate.these_tasks.interval[1]


def test_these_tasks_counts_only_trial_noise_and_tasks_like_these_the_spread_of_tasks() -> None:
    # Deterministic-looking tasks (3/3 or 0/3) and one noisy task (1/3).
    spec = {"a": [S, S, S], "b": [F, F, F], "c": [S, F, F], "d": [S, S, S]}
    rate = suite_rate(group_trials(rows(spec)))
    fractions = [1, 0, 1 / 3, 1]
    assert rate.rate == pytest.approx(sum(fractions) / 4)
    within = (1 * 2 / (3 * 2)) / 3 / 16  # only c varies: s(n-s)/(n(n-1)) / n, over T^2
    assert rate.these_tasks.standard_error == pytest.approx(math.sqrt(within))
    between = sum((f - rate.rate) ** 2 for f in fractions) / (4 * 3)
    assert rate.tasks_like_these.standard_error == pytest.approx(math.sqrt(between))
    # Satterthwaite's df of one estimated component is its own: 3 - 1.
    assert rate.these_tasks.degrees_of_freedom == pytest.approx(2)
    shrink = (Z / scipy_stats.t.ppf(0.975, 2)) ** 2
    assert rate.these_tasks.effective_trials == pytest.approx(rate.rate * (1 - rate.rate) / within * shrink)
    # Unsound trials and tasks never count.
    more = rows({**spec, "e": [INFRA, SETUP]})
    assert suite_rate(group_trials(more)).rate == rate.rate
    assert suite_rate(group_trials(more)).tasks_without_sound_trial == ["e"]


def test_trials_that_never_varied_fall_back_to_one_draw_per_trial() -> None:
    rate = suite_rate(group_trials(rows({"a": [S, S, S], "b": [F, F, F]})))
    assert rate.these_tasks.effective_trials == 6 and rate.these_tasks.interval[0] > 0
    assert suite_rate(group_trials(rows({"a": [INFRA]}))).rate is None


def test_pass_at_k_and_pass_hat_k_use_the_unbiased_estimators() -> None:
    tasks = group_trials(rows({"a": [S, F, F, F], "b": [S, S, S, F], "c": [F, F], "d": [S]}))
    at2, hat2 = pass_at_k(tasks, 2), pass_hat_k(tasks, 2)
    # a: 1 - C(3,2)/C(4,2) = 0.5; b: 1 - 0 = 1; c: 0. d has fewer than 2 trials.
    assert (at2.tasks, at2.tasks_with_fewer_trials) == (3, 1)
    assert at2.value == pytest.approx((0.5 + 1 + 0) / 3)
    # a: C(1,2)/C(4,2) = 0; b: C(3,2)/C(4,2) = 0.5; c: 0.
    assert hat2.value == pytest.approx(0.5 / 3)
    # k = 1: both are the mean success fraction.
    assert pass_at_k(tasks, 1).value == pass_hat_k(tasks, 1).value == pytest.approx(suite_rate(tasks).rate)
    low, high = at2.interval
    assert low <= at2.value <= high
    with pytest.raises(ValueError, match="k must be a whole number >= 1"):
        pass_at_k(tasks, 0)


# --- paired comparison ------------------------------------------------------------------------


def _single(spec: dict[str, str]) -> list[dict]:
    return rows({t: [o] for t, o in spec.items()})


def test_single_trial_runs_get_the_same_answers_as_compare_py() -> None:
    base = {f"t{i}": S if i < 12 else F for i in range(30)}
    new = {**base, **{f"t{i}": S for i in range(12, 20)}, "t0": F, "t29": INFRA}
    old = compare_runs(_single(base), _single(new), "b", "n")
    trials = compare_trial_rows(_single(base), _single(new))
    assert trials.single_trial and len(trials.paired) == old.test.paired_tasks == 29
    assert trials.difference == pytest.approx(old.overall.delta)
    assert trials.these_tasks.interval == pytest.approx(old.overall.delta_ci95, abs=1e-7)
    assert trials.these_tasks.p_value == old.p_value
    assert trials.verdict == old.verdict == "improved"
    assert [u.task_id for u in trials.unpaired] == ["t29"]


def test_unequal_trials_pair_by_fingerprint_and_test_with_permutation_variance() -> None:
    base = rows({"a": [S, F, F], "b": [F], "c": [S, S], "d": [F, F]})
    new = rows({"a": [S, S, F, S], "b": [S, S], "c": [S], "d": [F, S, F]})
    new += rows({"e": [S]}, fingerprint="other")
    base += rows({"e": [F]}, fingerprint="fp")
    result = compare_trial_rows(base, new)
    assert [t.task_id for t in result.paired] == ["a", "b", "c", "d"]
    assert [u.reason[:23] for u in result.unpaired] == ["different task versions"]
    diffs = [3 / 4 - 1 / 3, 1.0 - 0.0, 0.0, 1 / 3 - 0.0]
    assert result.difference == pytest.approx(sum(diffs) / 4)
    # The test's null variance: each task's exact permutation variance S(m-S)/((m-1) n_b n_c).
    null = [4 * 3 / (6 * 3 * 4), 2 * 1 / (2 * 1 * 2), 0.0, 1 * 4 / (4 * 2 * 3)]
    z = sum(diffs) / math.sqrt(sum(null))
    assert result.these_tasks.statistic == pytest.approx(z)
    assert result.these_tasks.p_value == pytest.approx(2 * scipy_stats.norm.sf(z))
    # Tasks like these: the one-sample t test on the per-task differences.
    t = scipy_stats.ttest_1samp(diffs, 0.0)
    assert result.tasks_like_these.p_value == pytest.approx(t.pvalue)
    # These tasks: simulated for this verdict when shown (planning.design_mde), not the textbook formula.
    assert result.tasks_like_these.mde is not None and result.these_tasks.mde is None
    planned = result.detectable_difference()
    assert planned is not None and planned.tasks == 4 and planned.verdict == "stratified permutation z test"
    assert not result.single_trial
    text = render_trial_comparison(result)
    assert text.startswith(f"verdict: {result.verdict} (these fixed tasks")
    assert "detectable difference at 80 % power" in text and "8 baseline / 10 candidate sound trials" in text


def test_permutation_variance_is_exact_for_one_task() -> None:
    # Every split of a task's 5 trials (2 successes) into 2 baseline + 3 candidate trials.
    import itertools

    outcomes = [1, 1, 0, 0, 0]
    diffs = [sum(outcomes[i] for i in range(5) if i not in b) / 3 - sum(outcomes[i] for i in b) / 2
             for b in itertools.combinations(range(5), 2)]
    mean = sum(diffs) / len(diffs)
    exact = sum((d - mean) ** 2 for d in diffs) / len(diffs)
    result = compare_trial_rows(rows({"a": ["success", F]}), rows({"a": [S, F, F]}))
    assert result.these_tasks.statistic ** 2 == pytest.approx((1 / 3 - 1 / 2) ** 2 / exact)


def test_no_paired_task_is_insufficient_data() -> None:
    result = compare_trial_rows(rows({"a": [INFRA]}), rows({"a": [S]}))
    assert result.verdict == "insufficient data" and result.difference is None
    assert "no trial with a sound environment in the baseline" in result.unpaired[0].reason


# --- planning ---------------------------------------------------------------------------------


def test_plan_mde_shrinks_with_trials_and_uses_earlier_variance() -> None:
    one, three = plan_mde(154, 1, 0.5), plan_mde(154, 3, 0.5)
    assert one.mde is not None and three.mde is not None and three.mde < one.mde
    # The default variance is its bound rate (1 - rate); the verdict is the one compare_trials runs.
    assert one.within_variance == three.within_variance == 0.25
    assert "exact McNemar" in one.render() and "stratified permutation z test" in three.render()
    assert plan_mde(154, 3, 0.5).mde == three.mde  # seeded: the same plan every time it is asked
    earlier = trial_variance(group_trials(rows({"a": [S, F, S, F], "b": [S, S, S, S], "c": [F]})))
    assert earlier is not None and earlier.tasks == 2
    assert earlier.variance == pytest.approx((2 * 2 / (4 * 3) + 0) / 2)
    planned = plan_mde(154, 3, 0.5, earlier)
    assert planned.mde is not None and planned.mde < three.mde and "earlier runs (2 tasks" in planned.render()
    # A baseline that never succeeds: its tasks never vary; 10 tasks cannot show 80 % power.
    hopeless = plan_mde(10, 1, 0.0)
    assert hopeless.within_variance == 0 and hopeless.mde is None and hopeless.largest == 0.5
    assert "detectable difference: none at 80 % power" in hopeless.render()
    with pytest.raises(ValueError, match="trials must be a whole number >= 1"):
        plan_mde(10, 0, 0.5)


# --- flaky tasks ------------------------------------------------------------------------------


def test_flaky_tasks_group_by_agent_model_settings_and_task_version() -> None:
    def row(run: str, task: str, outcome: str, agent: str = "scripted", trial: int | None = None, **extra: str) -> dict:
        return {"run_id": run, "task_id": task, "task_fingerprint": "fp", "outcome": outcome,
                "success": outcome == S, "agent": agent, "model_id": None, "agent_config_hash": "h1",
                **({"trial": trial} if trial else {}), **extra}

    data = [
        row("r1", "a", S), row("r2", "a", F),  # scripted, two runs: flaky -> the environment
        row("r1", "b", S), row("r2", "b", INFRA),  # an unsound trial does not make a task flaky
        row("r3", "c", S, agent="openai", trial=1), row("r3", "c", F, agent="openai", trial=2),
        row("r1", "d", S), row("r2", "d", F, agent_config_hash="h2"),  # other settings: not comparable
    ]
    flaky = flaky_tasks(data)
    assert [(f.task_id, f.agent, f.points_at_environment) for f in flaky] == [("a", "scripted", True),
                                                                             ("c", "openai", False)]
    assert flaky[0].outcomes_text() == "r1#1 success, r2#1 agent_failure"
    stability = {(s.task_id, s.settings_hash): s for s in task_stability(data)}
    assert stability[("b", "h1")].sound_trials == 1 and not stability[("b", "h1")].flaky
    assert len(stability) == 5
    # Earlier runs' trials of the same agent and settings give the plan its trial-to-trial
    # variance: a (1 of 2) and c (1 of 2) vary, b and d have one sound trial per group.
    variance = trial_variance(task_stability(data))
    assert variance is not None and (variance.tasks, variance.variance) == (2, pytest.approx(0.5))


# --- the adaptive design's bookkeeping --------------------------------------------------------


def test_adaptive_design_runs_the_first_pass_then_random_batches_within_budget() -> None:
    ids = [f"t{i}" for i in range(6)]
    state = AdaptiveState.start(ids, budget=30, baseline_trials={"t0": [True]}, seed=3)
    first = next_batch(state, 100)
    assert len(first) == 11 and ("t0", "baseline") not in first  # the given trial counts
    assert next_batch(state, 5) == []  # nothing new while the first pass is awaited
    for task, model in first[:-1]:
        record(state, task, model, task in ("t1", "t2") and model == "candidate")
    record_unsound(state, *first[-1])
    assert decide(state).decision == "continue"
    again = next_batch(state, 5)
    assert again == [first[-1]]  # the unsound first-pass trial is asked for again
    record(state, *again[0], False)
    report = decide(state)
    assert report.interval is not None and len(report.history) == 1 and report.episodes == 12
    batch = next_batch(state, 10)
    assert len(batch) == 10 and {m for _, m in batch} <= {"baseline", "candidate"}
    # Drawn again from the same state and seed: the same batch.
    copy = AdaptiveState.model_validate(json.loads(state.model_dump_json()))
    copy.draws = copy.draws[:-10]
    copy.batches -= 1
    assert next_batch(copy, 10) == batch
    for task, model in batch:
        record(state, task, model, True)
    assert next_batch(state, 100) and len(state.draws) == 18  # the budget caps the batch at 8
    with pytest.raises(ValueError, match="no trial of baseline on task 'zz'|not in this design"):
        record(state, "zz", "baseline", True)


def test_a_first_pass_that_spends_the_budget_on_unsound_trials_ends_the_design() -> None:
    state = AdaptiveState.start(["a"], budget=3)
    for task, model in next_batch(state, 10):
        record_unsound(state, task, model)
    assert decide(state).decision == "continue"
    (arm,) = next_batch(state, 10)  # one trial of the budget left
    record_unsound(state, *arm)
    assert next_batch(state, 10) == [] and decide(state).decision == "budget_exhausted"


def test_adaptive_design_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="budget must be a whole number of trials >= the first pass's 4"):
        AdaptiveState.start(["a", "b"], budget=3)
    with pytest.raises(ValueError, match="margin must be between 0 and 1"):
        AdaptiveState.start(["a"], budget=10, margin=0)
    with pytest.raises(ValueError, match="not in task_ids"):
        AdaptiveState.start(["a"], budget=10, candidate_trials={"b": [True]})


def test_fixed_design_cost_matches_its_own_width() -> None:
    ids = [f"t{i}" for i in range(20)]
    state = AdaptiveState.start(ids, budget=400, initial_trials=2, seed=1)
    for i, (task, model) in enumerate(next_batch(state, 100)):
        record(state, task, model, (i * 7) % 3 == 0)
    cost = fixed_design_cost(state)
    assert cost.episodes == 2 * 20 * cost.trials_per_task
    assert fixed_design_width(state, cost.trials_per_task) <= cost.width
    if cost.trials_per_task > 1:
        assert fixed_design_width(state, cost.trials_per_task - 1) > cost.width
