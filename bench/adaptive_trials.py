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

With `--local`, one comparison on the local WAA environment instead of simulated outcomes: the
`noisy-scripted` TEST agent on the bundled suite's tasks with the same kind of known
probabilities (baseline) and `--difference` points more (candidate), each a real run (Prefect,
local simulation VMs, the evaluator, a DuckDB file in a temporary folder); then the model-update
flow's adaptive design (flows/baselines.py `run_adaptive_design`) resumes both runs in batches of
`--batch` until it decides. It prints the decision, the trials spent and the interval look by
look, beside a fixed 3-trial design's episodes and the fixed design as narrow as the final
interval, and the wall time.

    python bench/adaptive_trials.py --local [--difference 0.10] [--batch 32] [--seed 1] [--pool-size 4]
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
    parser.add_argument("--local", action="store_true", help="one comparison of real local runs (see above)")
    parser.add_argument("--pool-size", type=int, default=4, help="with --local: VMs per run")
    args = parser.parse_args()
    if args.local:
        local(args)
        return
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


def local(args: argparse.Namespace) -> None:
    """One adaptive model-update comparison over real local runs (module docstring)."""
    import json
    import tempfile

    from adapters.agents import AgentOptions
    from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
    from flows.baselines import ModelUpdates, run_adaptive_design
    from flows.evaluate_suite import run_suite
    from flows.local_server import configured_or_shared_api
    from flows.run_config import SuiteRunConfig

    rng = np.random.default_rng(args.seed)
    ids = WAATaskCatalog(bundled_suite_dir()).task_ids()
    p = task_probabilities(len(ids), rng)
    q = shifted(p, args.difference, rng)
    budget = 2 * 2 * len(ids) * 3 * 4  # room to decide: four times a fixed 3-trial design of both models
    print(f"conditions: local environment, bundled suite ({len(ids)} tasks), noisy-scripted TEST agent, baseline "
          f"mean p {p.mean():.3f}, candidate {q.mean():.3f} (true difference {100 * float(np.mean(q - p)):+.1f} "
          f"points), seed {args.seed}; first pass 1 trial per task and model, batches of {args.batch}, alpha 0.05, "
          f"margin 5 points, budget {budget} trials; pool {args.pool_size} VMs per run")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="adaptive-local-") as folder, configured_or_shared_api():
        root = Path(folder)
        configs = {}
        for name, probs in (("base", p), ("cand", q)):
            (root / f"{name}.json").write_text(json.dumps({t: float(v) for t, v in zip(ids, probs)}))
            configs[name] = SuiteRunConfig(
                agent="noisy-scripted", pool_size=args.pool_size, db_path=root / "arena.duckdb",
                artifacts_dir=root / "artifacts", run_id=f"adaptive-{name}",
                agent_options=AgentOptions(success_probabilities_path=root / f"{name}.json", seed=args.seed))
            run_suite(configs[name])
        first = time.monotonic() - started
        design = run_adaptive_design(configs["base"], "adaptive-base", configs["cand"], "adaptive-cand",
                                     ModelUpdates(models=["bench"], adaptive=True, batch_size=args.batch,
                                                  budget_trials=budget), run=run_suite)
    report = design.report
    print(report.render())
    fixed = design.fixed
    print(f"adaptive: {report.decision} after {report.episodes} further trials in {design.batches} batch(es) "
          f"(+{report.given_trials} first-pass trials = {report.episodes + report.given_trials} episodes)")
    print(f"fixed 3-trial design: {2 * 3 * len(ids)} episodes (one look)"
          + (f"; a fixed design as narrow as the final interval ({100 * fixed.width:.1f} points): "
             f"{fixed.trials_per_task} trials per task and model = {fixed.episodes} episodes" if fixed else ""))
    print(f"(first pass {first:.0f} s; ran in {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
