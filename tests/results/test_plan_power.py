"""`arena plan`'s detectable difference holds its power (issue 64): at the difference the plan
prints, the verdict the product runs (`compare_trials`: exact McNemar with one trial, the
stratified permutation z test with more) decides "improved" about 80 % of the time on WAA-like
suites, with one trial and with three. The textbook 2.80 x SE the plan printed before gives
about 40-70 % on the same suites.

Checked with the product's own verdict on simulated outcomes (adapters/results/trials/simulation.py),
fixed seeds; and the vectorised verdict the plan simulates is checked against compare_trials."""

from __future__ import annotations

import numpy as np
import pytest

from adapters.results.trials import compare_trials, plan_mde
from adapters.results.trials.paired import render_trial_comparison
from adapters.results.trials.planning import TrialVariance, simulated_improved
from adapters.results.trials.simulation import shifted, trials_of

SIMS = 400
# 400 comparisons at a true 80 %: the observed share is within 0.80 +/- 0.04 (2 sd) by chance alone.
LOW, HIGH = 0.75, 0.86


def _waa_like(tasks: int, rng: np.random.Generator) -> np.ndarray:
    """A WAA-like suite: 45 % of tasks never solved, 35 % always, the rest in between."""
    kind = rng.random(tasks)
    return np.where(kind < 0.45, 0.0, np.where(kind < 0.80, 1.0, rng.random(tasks)))


@pytest.mark.parametrize("trials", [(1, 1), (3, 3), (2, 3)])
def test_the_simulated_verdict_is_compare_trials_verdict(trials: tuple[int, int]) -> None:
    rng = np.random.default_rng(42)
    kb, kc = trials
    agree = improved = 0
    for _ in range(150):
        p = _waa_like(25, rng)
        room = float(np.minimum(1 - p, 0.5).mean())
        q = shifted(p, float(rng.uniform(0.0, min(0.25, room))), rng)  # from none to a large improvement
        base, new = trials_of(p, kb, rng), trials_of(q, kc, rng)
        product = compare_trials(base, new).verdict == "improved"
        simulated = simulated_improved(np.array([[t.sound_successes for t in base]]),
                                       np.array([[t.sound_successes for t in new]]), kb, kc)[0]
        agree += bool(simulated) == product
        improved += product
    assert agree == 150 and 20 < improved < 130  # and both verdicts occur


@pytest.mark.parametrize("trials", [1, 3])
def test_the_printed_detectable_difference_has_its_power_on_a_waa_like_suite(trials: int) -> None:
    rng = np.random.default_rng(7 + trials)
    tasks = 60
    p = _waa_like(tasks, rng)
    # What earlier runs of the agent would record: its rate and its trial-to-trial variance.
    variance = TrialVariance(variance=float(np.mean(p * (1 - p))), tasks=tasks)
    planned = plan_mde(tasks, trials, float(p.mean()), variance)
    assert planned.mde is not None
    assert f"detectable difference: {100 * planned.mde:.1f} points at 80 % power" in planned.render()
    detected = 0
    for _ in range(SIMS):
        q = shifted(p, planned.mde, rng)
        detected += compare_trials(trials_of(p, trials, rng), trials_of(q, trials, rng)).verdict == "improved"
    assert LOW <= detected / SIMS <= HIGH, (planned.render(), detected / SIMS)


def test_a_design_too_small_for_any_improvement_says_so() -> None:
    planned = plan_mde(3, 1, 0.5)
    assert planned.mde is None and planned.power_at_largest < 0.8
    assert "detectable difference: none at 80 % power" in planned.render()


def test_a_comparisons_detectable_difference_is_the_plans_for_its_design() -> None:
    """`arena compare` and a model update show the detectable difference of the design that was
    run, simulated as the plan is (not the textbook formula)."""
    from adapters.results.trials.planning import design_mde

    rng = np.random.default_rng(3)
    p = _waa_like(40, rng)
    comparison = compare_trials(trials_of(p, 3, rng), trials_of(p, 3, rng))
    shown = comparison.detectable_difference()
    assert shown is not None and shown.mde is not None
    base = [t.baseline_successes for t in comparison.paired]
    variance = sum(s * (3 - s) / 6 for s in base) / len(base)
    planned = plan_mde(40, 3, comparison.baseline_rate, TrialVariance(variance=variance, tasks=40))
    assert shown.mde == planned.mde
    assert design_mde([3] * 40, [3] * 40, 0.4, 0.1).mde == plan_mde(40, 3, 0.4, 0.1).mde
    text = render_trial_comparison(comparison)
    assert f"detectable difference at 80 % power: {100 * shown.mde:.1f} points (simulated for this verdict" in text
