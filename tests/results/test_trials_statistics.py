"""The trial statistics checked offline against simulated outcomes with known per-task success
probabilities (adapters/results/trials/simulation.py): the intervals cover the true rate and the
true difference about 95 % of the time, the sequential verdict's false-positive rate stays at or
under alpha when the two models are equal, and the adaptive design finds a 10-point improvement.

Each check uses a fixed seed and enough simulated runs that a wrong method fails it: beside each
one, the method it replaces (trials treated as independent, a fixed-sample interval looked at
after every batch) is shown to miss on the same simulations.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from adapters.results.stats import wilson_interval
from adapters.results.trials import compare_trials, suite_rate
from adapters.results.trials.simulation import (
    ALWAYS_SOLVED,
    NEVER_SOLVED,
    improved_independently,
    population_improvement,
    run_adaptive,
    shifted,
    task_probabilities,
    trials_of,
)

POPULATION_MEAN = ALWAYS_SOLVED + (1 - NEVER_SOLVED - ALWAYS_SOLVED) / 2  # of task_probabilities
SIMS = 400
# 400 runs at a true 95 %: the observed coverage is within 0.95 +/- 0.022 (2 sd) by chance alone.
LOW, HIGH = 0.925, 0.975


def _covered(interval: tuple[float, float] | None, truth: float) -> bool:
    assert interval is not None
    return interval[0] <= truth <= interval[1]


@pytest.mark.parametrize("trials", [3, "1-5"])
def test_rate_intervals_cover_both_estimands(trials: int | str) -> None:
    rng = np.random.default_rng(20261)
    tasks = 60
    fixed_p = task_probabilities(tasks, rng)
    fixed = population = naive = 0
    for _ in range(SIMS):
        counts = rng.integers(1, 6, tasks) if trials == "1-5" else trials
        # These tasks: the same tasks every run, new trials.
        rate = suite_rate(trials_of(fixed_p, counts, rng))
        fixed += _covered(rate.these_tasks.interval, float(fixed_p.mean()))
        # Tasks like these: new tasks from the population every run.
        sample = trials_of(task_probabilities(tasks, rng), counts, rng)
        rate = suite_rate(sample)
        population += _covered(rate.tasks_like_these.interval, POPULATION_MEAN)
        # The wrong method: every trial an independent draw (Wilson over all trials).
        naive += _covered(wilson_interval(rate.successes, rate.sound_trials), POPULATION_MEAN)
    assert LOW <= population / SIMS <= HIGH
    assert naive / SIMS < 0.85  # ignoring that trials are grouped by task misses often
    if trials == 3:
        assert LOW <= fixed / SIMS <= HIGH
    else:
        # Tasks with one trial get the binomial bound of p(1 - p): conservative, never short.
        assert fixed / SIMS >= LOW


def test_difference_intervals_cover_both_estimands() -> None:
    rng = np.random.default_rng(7)
    tasks, trials = 60, 3
    p = task_probabilities(tasks, rng)
    q = shifted(p, 0.1, rng)
    fixed = population = 0
    for _ in range(SIMS):
        comparison = compare_trials(trials_of(p, trials, rng), trials_of(q, trials, rng))
        fixed += _covered(comparison.these_tasks.interval, float(np.mean(q - p)))
        # Tasks like these: a new task set every run, each task improved independently, so the
        # truth is the population's mean improvement.
        p2 = task_probabilities(tasks, rng)
        q2 = improved_independently(p2, 0.3, rng)
        comparison = compare_trials(trials_of(p2, trials, rng), trials_of(q2, trials, rng))
        population += _covered(comparison.tasks_like_these.interval, population_improvement(0.3))
    assert LOW <= fixed / SIMS <= HIGH
    assert LOW <= population / SIMS <= HIGH


def test_sequential_verdict_keeps_false_positives_under_alpha_when_models_are_equal() -> None:
    rng = np.random.default_rng(11)
    sims, alpha = 200, 0.05
    false_verdicts = peeking = covered = 0
    for k in range(sims):
        p = task_probabilities(60, rng)
        run = run_adaptive(p, p.copy(), rng, budget=800, batch_size=40, alpha=alpha, seed=k)
        assert run.report.decision in ("equivalent", "budget_exhausted", "better", "worse")
        false_verdicts += run.report.decision in ("better", "worse")
        covered += run.report.interval[0] <= 0 <= run.report.interval[1]
        # The wrong method: a fixed-sample 95 % interval looked at after every batch.
        peeking += any(abs(s.estimate) > 1.96 * s.standard_error for s in run.report.history)
    # At most alpha, with room for chance: 200 runs at exactly 5 % give <= 16 false verdicts
    # with probability 0.98.
    assert false_verdicts <= 16
    assert covered / sims >= 1 - alpha - 0.03
    assert peeking > 2 * false_verdicts and peeking / sims > alpha  # peeking inflates them


def test_adaptive_design_finds_a_ten_point_improvement_on_154_tasks() -> None:
    rng = np.random.default_rng(3)
    decisions, episodes = [], []
    for k in range(20):
        p = task_probabilities(154, rng)
        q = shifted(p, 0.10, rng)
        run = run_adaptive(p, q, rng, budget=3 * 2 * 154, batch_size=40, seed=k)
        decisions.append(run.report.decision)
        episodes.append(run.report.episodes)
        assert run.report.history[-1].episodes == run.report.episodes
        widths = [s.upper - s.lower for s in run.report.history]
        assert widths == sorted(widths, reverse=True)  # the running intersection only narrows
    assert decisions.count("better") >= 18 and "worse" not in decisions
    assert math.fsum(episodes) / len(episodes) < 3 * 2 * 154  # fewer than a fixed 3-trial design
