"""Simulated outcomes with known per-task success probabilities, for checking the statistics
(tests/results/test_trials_statistics.py) and measuring the adaptive design (bench/adaptive_trials.py).

Nothing here runs an agent: a "trial" is a Bernoulli draw with the task's probability.

    task_probabilities(tasks, rng)             a WAA-like mix: tasks always failed, always solved, in between
    shifted(p, difference, rng)                a candidate whose mean is `difference` above p's
    run_adaptive(p, q, rng, budget=...)        the adaptive design played to its decision (given_trials=K:
                                               the first pass handed in, as the model-update flow does)
    run_fixed(p, q, trials, rng)               a fixed design's comparison (paired.py)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from adapters.results.trials.adaptive import AdaptiveReport, AdaptiveState, decide, next_batch, record
from adapters.results.trials.estimates import TaskTrials
from adapters.results.trials.paired import TrialComparison, compare_trials

NEVER_SOLVED, ALWAYS_SOLVED = 0.35, 0.25
"""Shares of tasks an agent never or always solves in `task_probabilities` (the rest in between,
uniform): published WAA agents solve some tasks reliably and many never."""


def task_probabilities(tasks: int, rng: np.random.Generator) -> np.ndarray:
    """Per-task success probabilities: 35 % at 0, 25 % at 1, the rest uniform on (0, 1)."""
    kind = rng.random(tasks)
    return np.where(kind < NEVER_SOLVED, 0.0, np.where(kind < NEVER_SOLVED + ALWAYS_SOLVED, 1.0, rng.random(tasks)))


def shifted(p: np.ndarray, difference: float, rng: np.random.Generator) -> np.ndarray:
    """A candidate's probabilities: p moved up on randomly chosen tasks (by up to 0.5 each, capped
    at 1) until the mean over tasks is exactly `difference` above p's (a negative difference
    moves down). Tasks are independent of how the change is spread."""
    q = p.astype(float).copy()
    target = float(np.mean(p)) + difference
    order = rng.permutation(len(p))
    step = np.sign(difference)
    for i in order:
        if abs(float(np.mean(q)) - target) < 1e-12:
            break
        room = (1.0 - q[i]) if step > 0 else q[i]
        needed = abs(target - float(np.mean(q))) * len(p)
        q[i] += step * min(room, 0.5, needed)
    if abs(float(np.mean(q)) - target) > 1e-9:
        raise ValueError(f"cannot move the mean by {difference}: not enough room in p")
    return q


def improved_independently(p: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
    """A candidate improving each task independently: with probability `share` a task's p rises
    by min(0.5, 1 - p). For tasks like these: the mean difference varies from task set to task
    set around its population value `population_improvement(share)`."""
    return p + np.where(rng.random(len(p)) < share, np.minimum(0.5, 1.0 - p), 0.0)


def population_improvement(share: float) -> float:
    """The population mean of `improved_independently`'s difference for `task_probabilities`'
    tasks: share x E[min(0.5, 1 - p)] (0.5 for never-solved tasks, 0 for always-solved ones,
    0.375 for p uniform on (0, 1))."""
    return share * (NEVER_SOLVED * 0.5 + (1 - NEVER_SOLVED - ALWAYS_SOLVED) * 0.375)


def trials_of(p: np.ndarray, trials: np.ndarray | int, rng: np.random.Generator, prefix: str = "task") -> list[TaskTrials]:
    """One TaskTrials per task with `trials` sound trials drawn with probabilities p."""
    counts = np.broadcast_to(np.asarray(trials), p.shape)
    successes = rng.binomial(counts, p)
    return [
        TaskTrials(task_id=f"{prefix}-{i}", trials=list(range(1, int(k) + 1)), outcomes=["success"] * int(k),
                   successes=[True] * int(s) + [False] * int(k - s))
        for i, (s, k) in enumerate(zip(successes, counts))
    ]


def run_fixed(p: np.ndarray, q: np.ndarray, trials: int, rng: np.random.Generator, **options: object) -> TrialComparison:
    """A fixed design: every task `trials` times with each model, compared once."""
    return compare_trials(trials_of(p, trials, rng), trials_of(q, trials, rng), **options)  # type: ignore[arg-type]


@dataclass(frozen=True)
class AdaptiveRun:
    report: AdaptiveReport
    state: AdaptiveState


def run_adaptive(
    p: np.ndarray,
    q: np.ndarray,
    rng: np.random.Generator,
    *,
    budget: int,
    batch_size: int = 16,
    margin: float = 0.05,
    alpha: float = 0.05,
    seed: int = 0,
    initial_trials: int = 1,
    given_trials: int | None = None,
    until_width: float | None = None,
) -> AdaptiveRun:
    """The adaptive design played until it decides, outcomes drawn with p (baseline) and q; with
    `until_width`, until its interval is at most that wide (or the budget is spent), whatever
    it decided on the way.

    With `given_trials` K the first pass is handed in, as the model-update flow does (the two
    runs' K trials per task), and `budget` counts the further trials only (the flow's default
    is 2 x 3 x tasks); without it the design requests its first pass (`initial_trials` per task
    and model) from `budget`."""
    ids = [f"task-{i}" for i in range(len(p))]
    index = {t: i for i, t in enumerate(ids)}
    handed_in: dict[str, dict[str, list[bool]]] = {}
    if given_trials is not None:
        initial_trials = given_trials
        handed_in = {name: {t: [bool(u < probs[i]) for u in rng.random(given_trials)] for i, t in enumerate(ids)}
                     for name, probs in (("baseline_trials", p), ("candidate_trials", q))}
    state = AdaptiveState.start(ids, budget=budget, margin=margin, alpha=alpha, seed=seed,
                                initial_trials=initial_trials, **handed_in)  # type: ignore[arg-type]
    probability = {"baseline": p, "candidate": q}
    while True:
        report = decide(state)
        if until_width is None and report.decision != "continue":
            return AdaptiveRun(report, state)
        if until_width is not None and report.interval and report.interval[1] - report.interval[0] <= until_width:
            return AdaptiveRun(report, state)
        batch = next_batch(state, batch_size)
        if not batch:
            return AdaptiveRun(decide(state), state)
        draws = rng.random(len(batch))
        for (task_id, model), u in zip(batch, draws):
            record(state, task_id, model, bool(u < probability[model][index[task_id]]))
