"""The adaptive model-update design against fixed designs, on simulated outcomes with known
per-task success probabilities (adapters/results/trials/simulation.py; no agent, no VM).

Conditions (printed): T tasks (default 154, WAA's size) whose baseline probabilities mix tasks
never solved (35 %), always solved (25 %) and in between (uniform); a candidate whose mean is
`--difference` points higher (moved on randomly chosen tasks). The adaptive design starts with
one trial per task and model, then draws batches of `--batch` trials; alpha 0.05, margin 5
points, a budget of 2 x 3 trials per task and model.

It prints, over `--runs` simulated comparisons:
1. the adaptive design's decisions and the trials it spent, beside a fixed 3-trial design
   (2 x 3 x T trials, one look: paired.py's test) and the fixed design (K trials per task and
   model) whose interval would be as narrow as the adaptive one's final interval;
2. the trials the adaptive design needs for an interval as narrow as the fixed 3-trial design's
   (run past its decision until its anytime-valid interval is that narrow);
3. equal models: the adaptive design's false verdicts (better / worse), against its alpha;
4. coverage of the 95 % intervals of the rate (both estimands) and of the difference (these
   tasks) over repeated simulated runs with 3 trials per task.

It prints numbers; it asserts nothing.

    python bench/adaptive_trials.py [--runs 50] [--tasks 154] [--difference 0.10] [--batch 40] [--seed 1]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.results.trials import compare_trials, suite_rate  # noqa: E402
from adapters.results.trials.adaptive import fixed_design_cost  # noqa: E402
from adapters.results.trials.simulation import (  # noqa: E402
    ALWAYS_SOLVED,
    NEVER_SOLVED,
    run_adaptive,
    shifted,
    task_probabilities,
    trials_of,
)


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"mean {statistics.fmean(values):7.1f}  median {statistics.median(values):7.1f}  p90 {p90:7.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--tasks", type=int, default=154)
    parser.add_argument("--difference", type=float, default=0.10)
    parser.add_argument("--batch", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    tasks, fixed_k = args.tasks, 3
    fixed_trials = 2 * tasks * fixed_k
    budget = 2 * fixed_trials
    started = time.monotonic()
    print(f"conditions: {tasks} tasks (never solved {NEVER_SOLVED:.0%}, always {ALWAYS_SOLVED:.0%}, the rest "
          f"uniform), candidate {100 * args.difference:+.0f} points, {args.runs} simulated comparisons, seed "
          f"{args.seed}; adaptive: 1 trial per task and model first, batches of {args.batch}, alpha 0.05, margin "
          f"5 points, budget {budget} trials; fixed: {fixed_k} trials per task and model = {fixed_trials} trials")

    decisions: collections.Counter[str] = collections.Counter()
    fixed_verdicts: collections.Counter[str] = collections.Counter()
    spent, matched, fixed_widths, adaptive_widths, race = [], [], [], [], []
    for k in range(args.runs):
        p = task_probabilities(tasks, rng)
        q = shifted(p, args.difference, rng)
        run = run_adaptive(p, q, rng, budget=budget, batch_size=args.batch, seed=k)
        decisions[run.report.decision] += 1
        spent.append(run.report.episodes)
        width = run.report.interval[1] - run.report.interval[0]
        adaptive_widths.append(width)
        matched.append(fixed_design_cost(run.state, width).episodes)
        fixed = compare_trials(trials_of(p, fixed_k, rng), trials_of(q, fixed_k, rng))
        fixed_verdicts[fixed.verdict] += 1
        low, high = fixed.these_tasks.interval
        fixed_widths.append(high - low)
        raced = run_adaptive(p, q, rng, budget=4 * budget, batch_size=args.batch, seed=k, until_width=high - low)
        race.append(raced.report.episodes if raced.report.interval[1] - raced.report.interval[0] <= high - low
                    else float("nan"))
    print()
    print(f"1. {100 * args.difference:+.0f}-point improvement")
    print(f"   adaptive decisions: {dict(decisions)}")
    print(f"   adaptive trials spent:                    {_summary(spent)}")
    print(f"   adaptive final interval width (points):   {_summary([100 * w for w in adaptive_widths])}")
    print(f"   fixed design as narrow as that (trials):  {_summary(matched)}  (one look, no anytime validity)")
    print(f"   fixed {fixed_k}-trial design: verdicts {dict(fixed_verdicts)}, {fixed_trials} trials, interval width "
          f"{_summary([100 * w for w in fixed_widths])} points")
    reached = [r for r in race if r == r]
    print(f"2. trials until the adaptive interval is as narrow as the fixed {fixed_k}-trial design's: "
          f"{_summary(reached) if reached else 'never'} ({len(reached)}/{len(race)} reached it within "
          f"{4 * budget} trials; the fixed design spends {fixed_trials})")

    null_runs = 2 * args.runs
    null: collections.Counter[str] = collections.Counter()
    null_spent = []
    for k in range(null_runs):
        p = task_probabilities(tasks, rng)
        run = run_adaptive(p, p.copy(), rng, budget=budget, batch_size=args.batch, seed=10_000 + k)
        null[run.report.decision] += 1
        null_spent.append(run.report.episodes)
    false = null["better"] + null["worse"]
    print(f"3. equal models, {null_runs} comparisons: decisions {dict(null)}; false verdicts {false} = "
          f"{100 * false / null_runs:.1f} % (alpha 5 %); trials spent {_summary(null_spent)}")

    sims = 4 * args.runs
    fixed_p = task_probabilities(tasks, rng)
    fixed_q = shifted(fixed_p, args.difference, rng)
    population_mean = ALWAYS_SOLVED + (1 - NEVER_SOLVED - ALWAYS_SOLVED) / 2
    covered = collections.Counter()
    for _ in range(sims):
        rate = suite_rate(trials_of(fixed_p, fixed_k, rng))
        low, high = rate.these_tasks.interval
        covered["rate, these tasks"] += low <= fixed_p.mean() <= high
        rate = suite_rate(trials_of(task_probabilities(tasks, rng), fixed_k, rng))
        low, high = rate.tasks_like_these.interval
        covered["rate, tasks like these"] += low <= population_mean <= high
        comparison = compare_trials(trials_of(fixed_p, fixed_k, rng), trials_of(fixed_q, fixed_k, rng))
        low, high = comparison.these_tasks.interval
        covered["difference, these tasks"] += low <= float(np.mean(fixed_q - fixed_p)) <= high
    print(f"4. coverage of 95 % intervals, {sims} simulated runs of {fixed_k} trials per task: "
          + ", ".join(f"{name} {100 * count / sims:.1f} %" for name, count in covered.items()))
    print(f"(ran in {time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()
