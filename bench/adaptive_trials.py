"""The model-update verdicts on simulated outcomes with known per-task success probabilities
(adapters/results/trials/simulation.py; no agent, no VM), at the model-update flow's own
defaults (flows/baselines.py `ModelUpdates`: batches of 16, a budget of 2 x 3 x T further
trials, margin 5 points; the first pass is the two runs' `--trials` K trials per task, handed
in as the flow hands them in), and the numbers `arena plan` and the run summary print.

Conditions (printed): T tasks (default 154, WAA's size) whose baseline probabilities mix tasks
never solved (35 %), always solved (25 %) and in between (uniform); a candidate whose mean is
`--difference` points higher (moved on randomly chosen tasks, each by up to 50 points).

It prints, over `--runs` simulated comparisons:
1. the adaptive design's decisions, its power and the trials it spent (first pass included),
   beside fixed designs of 1-6 trials per task and model compared once by the product's verdict
   (paired.py): their power and trials, the cheapest fixed design at least as powerful as the
   adaptive one, and the fixed design whose interval is as narrow as the adaptive final one;
2. the trials the adaptive design needs for an interval as narrow as the fixed 3-trial
   design's (run past its decision), against that design's trials;
3. equal models: the adaptive design's false verdicts (better / worse), and those of the
   fixed-sample test applied to the trials the design collected (what the model update's
   headline was before issue 64), with how often the two disagreed;
4. coverage of 95 % intervals with 3 trials per task: the rate (both estimands), the difference
   (these tasks), the run's headline (tasks like these) against a Wilson interval over every
   trial, and pass@3 / pass^3 on suites whose values sit near 0 and near 1;
5. `arena plan`'s detectable difference on this suite with 1 and 3 trials: the printed
   difference and how often the product's verdict detects it (and the textbook 2.80 x SE the
   plan printed before, for comparison).
With `--null-batches 2,3,...`, also the false verdicts of equal models at each of those batch
sizes (the allowed sizes start at 2).

It prints numbers; it asserts nothing.

    python bench/adaptive_trials.py [--runs 100] [--tasks 154] [--difference 0.10] [--trials 1] [--seed 1]
                                    [--suite waa|uniform] [--null-batches 2,3,4,8,16,40,1000]

With `--local`, one comparison on the local WAA environment instead of simulated outcomes: the
`noisy-scripted` TEST agent on the bundled suite's tasks with the same kind of known
probabilities (baseline) and `--difference` points more (candidate), each a real run (Prefect,
local simulation VMs, the evaluator, a DuckDB file in a temporary folder); then the model-update
flow's adaptive design (flows/baselines.py `run_adaptive_design`) resumes both runs in batches
at the flow's defaults until it decides. It prints the decision, the trials spent and the
interval look by look, beside a fixed 3-trial design's episodes and the fixed design as narrow
as the final interval, and the wall time.

    python bench/adaptive_trials.py --local [--difference 0.10] [--seed 1] [--pool-size 4]
"""

from __future__ import annotations

import argparse
import collections
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.results.stats import wilson_interval  # noqa: E402
from adapters.results.trials import compare_trials, pass_at_k, pass_hat_k, plan_mde, suite_rate  # noqa: E402
from adapters.results.trials.adaptive import fixed_design_cost  # noqa: E402
from adapters.results.trials.planning import TrialVariance, mde_from_standard_error, simulated_improved  # noqa: E402
from adapters.results.trials.simulation import (  # noqa: E402
    ALWAYS_SOLVED,
    NEVER_SOLVED,
    run_adaptive,
    shifted,
    task_probabilities,
    trials_of,
)
from flows.baselines import ModelUpdates, default_budget_trials  # noqa: E402

FLOW = ModelUpdates(models=["bench"], adaptive=True)  # the flow's defaults
FIXED_TRIALS = (1, 2, 3, 4, 5, 6)
SUITE = {"waa": task_probabilities, "uniform": lambda tasks, rng: rng.random(tasks)}


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"mean {statistics.fmean(values):7.1f}  median {statistics.median(values):7.1f}  p90 {p90:7.1f}"


def _fixed_power(p: np.ndarray, q: np.ndarray, trials: int, rng: np.random.Generator, replicates: int) -> float:
    """The share of `replicates` fixed designs (every task `trials` times with each model) the
    product's verdict calls "improved" (planning.simulated_improved, checked against compare_trials)."""
    base = rng.binomial(trials, np.broadcast_to(p, (replicates, p.size)))
    new = rng.binomial(trials, np.broadcast_to(q, (replicates, q.size)))
    return float(np.mean(simulated_improved(base, new, trials, trials)))


def _design_rows(state, model: str) -> list:
    """The trials a simulated design collected of one model, as TaskTrials (first pass, then draws)."""
    from adapters.results.trials.estimates import TaskTrials

    tasks = []
    for i, task_id in enumerate(state.task_ids):
        outcomes = list(state.first_pass[model][i]) + [
            bool(d.success) for d in state.draws if d.task == i and d.model == model and d.success is not None]
        tasks.append(TaskTrials(task_id=task_id, trials=list(range(1, len(outcomes) + 1)),
                                outcomes=["success"] * len(outcomes), successes=outcomes))
    return tasks


def improvement(args: argparse.Namespace, rng: np.random.Generator) -> None:
    """Sections 1 and 2."""
    tasks, k, budget = args.tasks, args.trials, default_budget_trials(args.tasks)
    decisions: collections.Counter[str] = collections.Counter()
    spent, widths, matched, race = [], [], [], []
    power = {K: [] for K in FIXED_TRIALS}
    fixed3_widths = []
    for run in range(args.runs):
        p = SUITE[args.suite](tasks, rng)
        q = shifted(p, args.difference, rng)
        result = run_adaptive(p, q, rng, budget=budget, batch_size=FLOW.batch_size, margin=FLOW.margin, seed=run,
                              given_trials=k)
        decisions[result.report.decision] += 1
        spent.append(2 * tasks * k + result.report.episodes)
        width = result.report.interval[1] - result.report.interval[0]
        widths.append(width)
        matched.append(fixed_design_cost(result.state, width).episodes)
        for K in FIXED_TRIALS:
            power[K].append(_fixed_power(p, q, K, rng, 20))
        fixed = compare_trials(trials_of(p, 3, rng), trials_of(q, 3, rng))
        low, high = fixed.these_tasks.interval
        fixed3_widths.append(high - low)
        raced = run_adaptive(p, q, rng, budget=8 * budget, batch_size=FLOW.batch_size, margin=FLOW.margin, seed=run,
                             given_trials=k, until_width=high - low)
        reached = raced.report.interval[1] - raced.report.interval[0] <= high - low
        race.append(2 * tasks * k + raced.report.episodes if reached else math.nan)
    adaptive_power = decisions["better"] / args.runs
    mean_spent = statistics.fmean(spent)
    print(f"\n1. {100 * args.difference:+.0f}-point improvement, {args.runs} comparisons")
    print(f"   adaptive decisions: {dict(decisions)}; power (decided 'better') {100 * adaptive_power:.0f} %")
    print(f"   adaptive trials, first pass ({2 * tasks * k}) included: {_summary(spent)}")
    print(f"   adaptive final interval width (points):   {_summary([100 * w for w in widths])}")
    print(f"   fixed design as narrow as that (trials):  {_summary(matched)}  (one look, no anytime validity)")
    fixed_power = {K: statistics.fmean(v) for K, v in power.items()}
    for K in FIXED_TRIALS:
        print(f"   fixed {K} trial(s) per task and model: {2 * tasks * K:5d} trials, power {100 * fixed_power[K]:.0f} %")
    # Powers of 99 % and more are taken as equal: this many runs cannot tell them apart.
    target = min(adaptive_power, 0.99)
    equal = next((K for K in FIXED_TRIALS if fixed_power[K] >= target), None)
    if equal is None:
        print(f"   no fixed design up to {FIXED_TRIALS[-1]} trials is as powerful as the adaptive design")
    else:
        # Between whole numbers of trials, the trials a fixed design of exactly that power would
        # take, by linear interpolation of power in trials (from no trials and no power).
        below = fixed_power.get(equal - 1, 0.0)
        share = (target - below) / max(1e-9, fixed_power[equal] - below)
        interpolated = 2 * tasks * (equal - 1 + min(1.0, share))
        print(f"   cheapest fixed design with power >= {100 * target:.0f} %: {equal} trial(s), {2 * tasks * equal} "
              f"trials (interpolated to that power: {interpolated:.0f}); adaptive mean {mean_spent:.0f}: "
              f"{100 * (1 - mean_spent / interpolated):+.0f} % saving against equal power "
              f"({100 * (1 - mean_spent / (2 * tasks * 3)):+.0f} % against the fixed 3-trial design)")
    reached = [r for r in race if r == r]
    fixed3 = 2 * tasks * 3
    ratio = statistics.fmean(reached) / fixed3 if reached else math.nan
    print(f"2. trials until the adaptive interval is as narrow as the fixed 3-trial design's "
          f"({_summary([100 * w for w in fixed3_widths])} points): {_summary(reached) if reached else 'never'} "
          f"({len(reached)}/{len(race)} reached it within {8 * budget} further trials), {ratio:.2f}x the fixed "
          f"design's {fixed3}")


def equal_models(args: argparse.Namespace, rng: np.random.Generator, batch: int, runs: int,
                 headline: bool = True) -> None:
    """Section 3 (and --null-batches): false verdicts between equal models."""
    tasks, budget = args.tasks, default_budget_trials(args.tasks)
    null: collections.Counter[str] = collections.Counter()
    fixed_false = disagree = 0
    spent = []
    for run in range(runs):
        p = SUITE[args.suite](tasks, rng)
        result = run_adaptive(p, p.copy(), rng, budget=budget, batch_size=batch, margin=FLOW.margin,
                              seed=10_000 + run, given_trials=args.trials)
        null[result.report.decision] += 1
        spent.append(2 * tasks * args.trials + result.report.episodes)
        if headline:
            verdict = compare_trials(_design_rows(result.state, "baseline"), _design_rows(result.state, "candidate")).verdict
            fixed_false += verdict in ("improved", "regressed")
            disagree += (verdict in ("improved", "regressed")) != (result.report.decision in ("better", "worse"))
    false = null["better"] + null["worse"]
    line = (f"equal models, batches of {batch}, {runs} comparisons: decisions {dict(null)}; false verdicts {false} = "
            f"{100 * false / runs:.1f} % (alpha 5 %); trials {_summary(spent)}")
    print(("3. " if headline else "   ") + line)
    if headline:
        print(f"   the fixed-sample test on the same adaptively collected trials (the old headline): false verdicts "
              f"{fixed_false} = {100 * fixed_false / runs:.1f} %; it disagreed with the design's decision in "
              f"{disagree} of {runs}")


def _hard(tasks: int, rng: np.random.Generator) -> np.ndarray:
    return np.where(rng.random(tasks) < 0.85, 0.0, 0.4 * rng.random(tasks))


def _easy(tasks: int, rng: np.random.Generator) -> np.ndarray:
    return np.where(rng.random(tasks) < 0.85, 1.0, 0.6 + 0.4 * rng.random(tasks))


def coverage(args: argparse.Namespace, rng: np.random.Generator) -> None:
    """Section 4."""
    tasks, k = args.tasks, 3
    sims = 4 * args.runs
    fixed_p = task_probabilities(tasks, rng)
    fixed_q = shifted(fixed_p, args.difference, rng)
    population_mean = ALWAYS_SOLVED + (1 - NEVER_SOLVED - ALWAYS_SOLVED) / 2
    big = np.random.default_rng(0)
    truths = {}
    for name, suite in (("hard", _hard), ("easy", _easy)):
        p = suite(2_000_000, big)
        truths[name] = {"pass@3": float(np.mean(1 - (1 - p) ** k)), "pass^3": float(np.mean(p**k))}
    covered: collections.Counter[str] = collections.Counter()

    def hit(name: str, interval, truth: float) -> None:
        covered[name] += interval is not None and interval[0] <= truth <= interval[1]

    for _ in range(sims):
        rate = suite_rate(trials_of(fixed_p, k, rng))
        hit("rate, these tasks", rate.these_tasks.interval, float(fixed_p.mean()))
        sample = trials_of(task_probabilities(tasks, rng), k, rng)
        rate = suite_rate(sample)
        hit("rate, tasks like these (the headline)", rate.tasks_like_these.interval, population_mean)
        hit("Wilson over every trial (the old headline)", wilson_interval(rate.successes, rate.sound_trials),
            population_mean)
        comparison = compare_trials(trials_of(fixed_p, k, rng), trials_of(fixed_q, k, rng))
        hit("difference, these tasks", comparison.these_tasks.interval, float(np.mean(fixed_q - fixed_p)))
        for name, suite in (("hard", _hard), ("easy", _easy)):
            sample = trials_of(suite(tasks, rng), k, rng)
            hit(f"pass@3 {name} ({100 * truths[name]['pass@3']:.1f} %)", pass_at_k(sample, k).interval,
                truths[name]["pass@3"])
            hit(f"pass^3 {name} ({100 * truths[name]['pass^3']:.1f} %)", pass_hat_k(sample, k).interval,
                truths[name]["pass^3"])
    print(f"4. coverage of 95 % intervals, {sims} simulated runs of {k} trials on {tasks} tasks: "
          + "; ".join(f"{name} {100 * count / sims:.1f} %" for name, count in covered.items()))


def plan_power(args: argparse.Namespace, rng: np.random.Generator) -> None:
    """Section 5."""
    tasks, sims = args.tasks, 4 * args.runs
    p = task_probabilities(tasks, rng)
    variance = TrialVariance(variance=float(np.mean(p * (1 - p))), tasks=tasks)
    for trials in (1, 3):
        planned = plan_mde(tasks, trials, float(p.mean()), variance)
        textbook = mde_from_standard_error(math.sqrt(2 * variance.variance / trials / tasks))
        found = {}
        for name, difference in (("printed", planned.mde), ("textbook", textbook)):
            if difference is None:
                continue
            found[name] = sum(
                compare_trials(trials_of(p, trials, rng), trials_of(shifted(p, difference, rng), trials, rng)).verdict
                == "improved" for _ in range(sims)) / sims
        printed = "none" if planned.mde is None else f"{100 * planned.mde:.1f} points"
        print(f"5. arena plan, {tasks} tasks x {trials} trial(s), rate {100 * p.mean():.1f} %, trial variance "
              f"{variance.variance:.3f}: detectable difference {printed}, detected by the product's verdict in "
              f"{100 * found.get('printed', math.nan):.1f} % of {sims}; the textbook 2.80 x SE "
              f"({100 * textbook:.1f} points) in {100 * found['textbook']:.1f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=154)
    parser.add_argument("--difference", type=float, default=0.10)
    parser.add_argument("--trials", type=int, default=1, help="the baseline's trials K (the first pass)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--suite", choices=sorted(SUITE), default="waa",
                        help="sections 1-3: WAA-like probabilities (default) or uniform on (0, 1), less deterministic")
    parser.add_argument("--null-batches", default="", help="comma-separated batch sizes (each at least 2)")
    parser.add_argument("--local", action="store_true", help="one comparison of real local runs (see above)")
    parser.add_argument("--pool-size", type=int, default=4, help="with --local: VMs per run")
    args = parser.parse_args()
    sizes = [int(b) for b in args.null_batches.split(",") if b.strip()]
    for size in sizes:
        ModelUpdates(models=["bench"], batch_size=size)  # refused below 2, saying why
    if args.local:
        local(args)
        return
    rng = np.random.default_rng(args.seed)
    started = time.monotonic()
    suite = (f"never solved {NEVER_SOLVED:.0%}, always {ALWAYS_SOLVED:.0%}, the rest uniform" if args.suite == "waa"
             else "every task's probability uniform on (0, 1) in sections 1-3")
    print(f"conditions: {args.tasks} tasks ({suite}), candidate {100 * args.difference:+.0f} points, {args.runs} simulated comparisons, seed "
          f"{args.seed}; the model-update flow's defaults: first pass {args.trials} trial(s) per task and model "
          f"handed in, batches of {FLOW.batch_size}, margin {100 * FLOW.margin:.0f} points, budget "
          f"{default_budget_trials(args.tasks)} further trials, alpha 0.05")
    improvement(args, rng)
    equal_models(args, rng, FLOW.batch_size, 2 * args.runs)
    for size in sizes:
        equal_models(args, rng, size, 2 * args.runs, headline=False)
    coverage(args, rng)
    plan_power(args, rng)
    print(f"(ran in {time.monotonic() - started:.1f} s)")


def local(args: argparse.Namespace) -> None:
    """One adaptive model-update comparison over real local runs, at the flow's defaults (module
    docstring)."""
    import json
    import tempfile

    from adapters.agents import AgentOptions
    from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
    from flows.baselines import run_adaptive_design
    from flows.evaluate_suite import run_suite
    from flows.local_server import configured_or_shared_api
    from flows.run_config import SuiteRunConfig

    rng = np.random.default_rng(args.seed)
    ids = WAATaskCatalog(bundled_suite_dir()).task_ids()
    p = task_probabilities(len(ids), rng)
    q = shifted(p, args.difference, rng)
    print(f"conditions: local environment, bundled suite ({len(ids)} tasks), noisy-scripted TEST agent, baseline "
          f"mean p {p.mean():.3f}, candidate {q.mean():.3f} (true difference {100 * float(np.mean(q - p)):+.1f} "
          f"points), seed {args.seed}; the flow's defaults: first pass 1 trial per task and model, batches of "
          f"{FLOW.batch_size}, margin {100 * FLOW.margin:.0f} points, budget {default_budget_trials(len(ids))} "
          f"further trials, alpha 0.05; pool {args.pool_size} VMs per run")
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
        design = run_adaptive_design(configs["base"], "adaptive-base", configs["cand"], "adaptive-cand", FLOW,
                                     run=run_suite)
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
