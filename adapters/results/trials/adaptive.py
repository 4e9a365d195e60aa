"""The adaptive model-update design: spend further trials where they change the answer most, and
stop as soon as the answer is known, without peeking inflating false verdicts.

    state = AdaptiveState.start(task_ids, budget=..., margin=...)
    while (decision := decide(state).decision) == "continue":
        for task_id, model in next_batch(state, batch_size):
            ... run one trial of `model` ("baseline" or "candidate") on `task_id` ...
            record(state, task_id, model, success)          # or record_unsound(...) when unsound
    report = decide(state)      # the decision, the interval as it narrowed, the episodes spent

The estimand is "these tasks" (docs/statistics.md): theta = mean over the T tasks of
q_i - p_i, the candidate's minus the baseline's success probability on task i.

Phase 1, a fixed design: every task `initial_trials` times with each model (trials handed in at
the start, e.g. the baseline run's K trials, count towards it and are not spent again).
Its estimate theta_0 (mean of the per-task differences) is unbiased for theta; its variance V_0 is
the conservative these-tasks variance of adapters/results/trials/paired.py.

Phase 2, batches of single trials: each trial's (task, model) "arm" is drawn at random with a
probability pi_a fixed at the batch's start: proportional to the arm's estimated outcome standard
deviation (Neyman allocation: arms whose outcome varies, and tasks where the two models disagree,
whose pooled success estimate sits near 1/2, get the trials; arms that always gave the same
outcome get almost none), mixed with a uniform share `floor` so every arm keeps a chance.
Each trial gives an augmented inverse-probability-weighted (AIPW) pseudo-outcome

    X = m + sign(model) (y - mu_a) / (T pi_a),   m = mean_i (mu_candidate,i - mu_baseline,i)

where mu_a is the arm's smoothed success estimate at the batch's start. Whatever the allocation,
E[X | everything before the batch] = theta exactly, so the sum of the centred pseudo-outcomes
(with predictable inverse-variance weights) and theta_0 - theta is a martingale, and adaptive
allocation introduces no bias.

The interval is an anytime-valid confidence sequence on that martingale: Robbins' normal mixture
boundary (Robbins 1970; Howard, Ramdas, McAuliffe & Sekhon 2021, "Time-uniform, nonparametric,
nonasymptotic confidence sequences", Ann. Statist. 49(2)) with the variance process estimated
from the data, i.e. the asymptotic confidence sequence of Waudby-Smith, Arbour, Sinha, Kennedy &
Ramdas 2024 ("Time-uniform central limit theory and asymptotic confidence sequences", Ann.
Statist. 52(6)), which they apply to AIPW pseudo-outcomes in adaptive experiments. Its coverage
holds simultaneously over every look, so the design may look after every batch and stop at
any one of them: the running intersection of the intervals is reported. The mixture is tuned
(rho) to be tightest when the information reaches `tune_information` times the first pass's.

`decide(state)` after the first pass and after each completed batch:
    better       the interval lies above 0
    worse        the interval lies below 0
    equivalent   the interval lies within [-margin, +margin]
    budget_exhausted   the episode budget is spent (less than a batch of MIN_BATCH_SIZE left) and
                       none of the above holds
    continue     otherwise
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr

from adapters.results.rates import is_sound
from adapters.results.trials.adaptive_limits import MIN_BATCH_SIZE, check_batch_size
from adapters.results.trials._scipy import STATS_EXTRA_HINT, StatsExtraMissing, normal_quantile, scipy_optimize

try:
    import numpy as np
except ImportError as exc:  # pragma: no cover - numpy comes with SciPy (the `stats` extra)
    raise StatsExtraMissing(STATS_EXTRA_HINT) from exc

Model = Literal["baseline", "candidate"]
MODELS: tuple[Model, Model] = ("baseline", "candidate")
Decision = Literal["better", "worse", "equivalent", "continue", "budget_exhausted"]
METHOD = (
    "anytime-valid asymptotic confidence sequence (Robbins' normal mixture; Waudby-Smith et al. 2024, "
    "Ann. Statist.) over AIPW pseudo-outcomes of randomly allocated trials"
)


class Draw(BaseModel):
    """One phase-2 trial: the arm drawn, what was predictable when it was drawn, its outcome."""

    batch: int
    task: int  # index into AdaptiveState.task_ids
    model: Model
    probability: float  # pi of this arm for the batch
    prediction: float  # mu of this arm at the batch's start
    centre: float  # m at the batch's start
    weight: float  # the batch's predictable weight
    variance: float  # the batch's predicted pseudo-outcome variance
    success: bool | None = None  # None until recorded
    dropped: bool = False  # the trial's environment was not sound: not counted


class IntervalSnapshot(BaseModel):
    """The interval at one look (after the first pass, then after each completed batch)."""

    look: int
    episodes: int  # trials spent by the design so far (unsound ones included)
    estimate: float
    standard_error: float  # of the estimate at this look (sqrt of the variance process / weights)
    lower: float  # running intersection
    upper: float


class AdaptiveState(BaseModel):
    """Everything the design knows: settings, the first pass, the drawn trials (JSON-serialisable,
    so a flow can keep it across a resume)."""

    task_ids: list[str]
    alpha: float = 0.05
    margin: float = 0.05
    budget: int  # the most trials this design may spend (first-pass trials it requests included)
    initial_trials: int = 1
    floor: float = 0.2  # share of each batch's allocation spread uniformly over the arms
    tune_information: float = 3.0
    seed: int = 0
    # First-pass outcomes per model, per task (index as task_ids).
    first_pass: dict[str, list[list[bool]]]
    pending_first_pass: list[tuple[int, Model]] = Field(default_factory=list)
    given_trials: int = 0  # handed in at the start: not spent by this design
    spent_trials: int = 0  # requested by this design and recorded (sound or not)
    draws: list[Draw] = Field(default_factory=list)
    batches: int = 0
    # Every draw before this index has its outcome (or was dropped): recording an outcome looks
    # for its draw from here on, not through every draw of the design. Not kept across a
    # resume; 0 is always right, only slower.
    _settled_before: int = PrivateAttr(default=0)
    # The looks so far (`_looks`), extended as batches complete; rebuilt after a resume.
    _look_memo: Any = PrivateAttr(default=None)

    @classmethod
    def start(
        cls,
        task_ids: list[str],
        *,
        budget: int,
        margin: float = 0.05,
        alpha: float = 0.05,
        initial_trials: int = 1,
        baseline_trials: dict[str, list[bool]] | None = None,
        candidate_trials: dict[str, list[bool]] | None = None,
        seed: int = 0,
        floor: float = 0.2,
        tune_information: float = 3.0,
    ) -> AdaptiveState:
        """A new design over `task_ids` (the tasks both models can be compared on). Sound trial
        outcomes already known (e.g. the baseline run's) count towards the first pass."""
        if len(set(task_ids)) != len(task_ids) or not task_ids:
            raise ValueError("task_ids must be a non-empty list of distinct task ids")
        checks = (("alpha", alpha, 0, 1), ("margin", margin, 0, 1), ("floor", floor, 0, 1))
        for name, value, low, high in checks:
            if not (isinstance(value, (int, float)) and low < value < high):
                raise ValueError(f"{name} must be between {low} and {high} (exclusive), got {value!r}")
        if isinstance(initial_trials, bool) or not isinstance(initial_trials, int) or initial_trials < 1:
            raise ValueError(f"initial_trials must be a whole number >= 1, got {initial_trials!r}")
        if not (tune_information > 1):
            raise ValueError(f"tune_information must be > 1, got {tune_information!r}")
        index = {t: i for i, t in enumerate(task_ids)}
        first: dict[str, list[list[bool]]] = {m: [[] for _ in task_ids] for m in MODELS}
        given = 0
        for model, known in (("baseline", baseline_trials), ("candidate", candidate_trials)):
            for task_id, outcomes in (known or {}).items():
                if task_id not in index:
                    raise ValueError(f"{model} trials name task {task_id!r}, which is not in task_ids")
                first[model][index[task_id]].extend(bool(o) for o in outcomes)
                given += len(outcomes)
        first_pass_trials = 2 * len(task_ids) * initial_trials - given
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < max(0, first_pass_trials):
            raise ValueError(f"budget must be a whole number of trials >= the first pass's {first_pass_trials}, "
                             f"got {budget!r}")
        return cls(task_ids=task_ids, alpha=alpha, margin=margin, budget=budget, initial_trials=initial_trials,
                   floor=floor, tune_information=tune_information, seed=seed, first_pass=first, given_trials=given)

    # --- bookkeeping ----------------------------------------------------------------------

    @property
    def tasks(self) -> int:
        return len(self.task_ids)

    def first_pass_missing(self) -> list[tuple[int, Model]]:
        """(task, model) arms still short of `initial_trials`, counting pending requests."""
        pending: dict[tuple[int, Model], int] = {}
        for arm in self.pending_first_pass:
            pending[arm] = pending.get(arm, 0) + 1
        missing = []
        for i in range(self.tasks):
            for model in MODELS:
                short = self.initial_trials - len(self.first_pass[model][i]) - pending.get((i, model), 0)
                missing += [(i, model)] * max(0, short)
        return missing

    @property
    def first_pass_complete(self) -> bool:
        return not self.pending_first_pass and all(
            len(self.first_pass[m][i]) >= self.initial_trials for m in MODELS for i in range(self.tasks)
        )

    @property
    def requested_trials(self) -> int:
        """Trials spent, plus those requested and not yet recorded."""
        open_draws = sum(1 for d in self.draws if d.success is None and not d.dropped)
        return self.spent_trials + len(self.pending_first_pass) + open_draws

    def _counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Sound trials and successes per (model, task), first pass and recorded draws."""
        n = np.array([[len(o) for o in self.first_pass[m]] for m in MODELS], dtype=float)
        s = np.array([[sum(o) for o in self.first_pass[m]] for m in MODELS], dtype=float)
        for d in self.draws:
            if d.success is not None and not d.dropped:
                row = MODELS.index(d.model)
                n[row, d.task] += 1
                s[row, d.task] += d.success
        return n, s


# --- allocation ------------------------------------------------------------------------------


def _smoothed(n: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Each arm's success estimate, shrunk by one pseudo-trial towards its task's pooled rate
    (itself shrunk towards 1/2), so a single trial never reads as certainty and a task where
    the models disagree reads as uncertain."""
    pooled = (s.sum(axis=0) + 0.5) / (n.sum(axis=0) + 1.0)
    return (s + pooled) / (n + 1.0)


def _allocation(state: AdaptiveState) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(pi, mu, m, predicted pseudo-outcome variance) for the next batch."""
    n, s = state._counts()
    mu = _smoothed(n, s)
    spread = np.sqrt(mu * (1 - mu))
    arms = spread.size
    pi = (1 - state.floor) * spread / spread.sum() + state.floor / arms
    centre = float(np.mean(mu[1] - mu[0]))
    variance = float(np.sum(mu * (1 - mu) / pi)) / state.tasks**2
    return pi, mu, centre, variance


def next_batch(state: AdaptiveState, batch_size: int) -> list[tuple[str, Model]]:
    """The next trials to run, as (task_id, model), and records them as requested in `state`.

    While the first pass is incomplete: its missing trials (a fixed design). After it: up to
    `batch_size` (at least MIN_BATCH_SIZE) arms drawn at random (with replacement) by the
    batch's allocation, seeded by (seed, batch number). Never more than the budget allows, and
    never a batch of one; empty once the budget is spent or while a first-pass trial is still
    awaited.
    """
    check_batch_size(batch_size)
    room = state.budget - state.requested_trials
    missing = state.first_pass_missing()
    if missing or state.pending_first_pass:
        chosen = missing[: max(0, min(batch_size, room))]
        state.pending_first_pass.extend(chosen)
        return [(state.task_ids[i], m) for i, m in chosen]
    size = min(batch_size, room)
    if size < MIN_BATCH_SIZE:
        return []  # a last trial of budget is left unspent rather than drawn as a batch of one
    pi, mu, centre, variance = _allocation(state)
    v0 = first_pass_variance(state)
    weight = v0 / variance
    state.batches += 1
    rng = np.random.default_rng([state.seed, state.batches])
    flat = rng.choice(pi.size, size=size, p=pi.ravel() / pi.sum())
    batch: list[tuple[str, Model]] = []
    for arm in flat:
        row, task = divmod(int(arm), state.tasks)
        model = MODELS[row]
        state.draws.append(Draw(batch=state.batches, task=task, model=model, probability=float(pi[row, task]),
                                prediction=float(mu[row, task]), centre=centre, weight=weight, variance=variance))
        batch.append((state.task_ids[task], model))
    return batch


def _task_index(state: AdaptiveState, task_id: str) -> int:
    try:
        return state.task_ids.index(task_id)
    except ValueError:
        raise ValueError(f"task {task_id!r} is not in this design") from None


def _model(model: str) -> Model:
    if model not in MODELS:
        raise ValueError(f"model must be 'baseline' or 'candidate', got {model!r}")
    return model  # type: ignore[return-value]


def record(state: AdaptiveState, task_id: str, model: str, success: bool) -> None:
    """Record a requested trial's outcome (its environment was sound)."""
    _settle(state, _task_index(state, task_id), _model(model), bool(success))


def record_unsound(state: AdaptiveState, task_id: str, model: str) -> None:
    """A requested trial ended without a sound environment (after its infrastructure retries):
    it is spent but not counted. A first-pass trial is requested again by the next batch; a drawn
    trial is dropped, which leaves the estimate unbiased since an environment failure does not
    depend on what the agent would have done."""
    _settle(state, _task_index(state, task_id), _model(model), None)


def _settle(state: AdaptiveState, task: int, model: Model, success: bool | None) -> None:
    arm = (task, model)
    if arm in state.pending_first_pass:
        state.pending_first_pass.remove(arm)
        if success is not None:
            state.first_pass[model][task].append(success)
        state.spent_trials += 1
        return
    draws, start = state.draws, state._settled_before
    for draw in draws[start:]:
        if draw.task == task and draw.model == model and draw.success is None and not draw.dropped:
            if success is None:
                draw.dropped = True
            else:
                draw.success = success
            state.spent_trials += 1
            while start < len(draws) and (draws[start].success is not None or draws[start].dropped):
                start += 1
            state._settled_before = start
            return
    raise ValueError(f"no trial of {model} on task {state.task_ids[task]!r} is awaiting an outcome")


# --- the confidence sequence ------------------------------------------------------------------


def _first_pass_counts(state: AdaptiveState) -> tuple[np.ndarray, np.ndarray]:
    n = np.array([[len(o) for o in state.first_pass[m]] for m in MODELS], dtype=float)
    s = np.array([[sum(o) for o in state.first_pass[m]] for m in MODELS], dtype=float)
    return n, s


def first_pass_variance(state: AdaptiveState) -> float:
    """V_0: the these-tasks variance of the first pass's estimate (paired.py's rule), floored at
    one discordant task's worth (1 / T^2) so a first pass where the models never disagreed does
    not claim certainty."""
    n, s = _first_pass_counts(state)
    (nb, nc), (sb, sc) = n, s
    both = (nb >= 2) & (nc >= 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        separate = sb * (nb - sb) / (nb * (nb - 1) * nb) + sc * (nc - sc) / (nc * (nc - 1) * nc)
        m, total = nb + nc, sb + sc
        pooled = total * (m - total) / (m * (m - 1)) * (1 / nb + 1 / nc)
    per_task = np.where(both, separate, pooled)
    return max(float(np.sum(per_task)) / state.tasks**2, 1.0 / state.tasks**2)


def _rho2(state: AdaptiveState, v0: float) -> float:
    """The mixture's rho^2, tightest at information `tune_information` x the first pass's."""
    return _tightest_ratio(state.alpha) / (state.tune_information * v0)


@functools.lru_cache(maxsize=16)
def _tightest_ratio(alpha: float) -> float:
    """The rho^2 V* that minimises the boundary at V* relative to sqrt(V*): it depends on alpha
    alone, so it is found once per alpha, not at every look."""

    def margin(r: float) -> float:  # the boundary at V* relative to sqrt(V*), for rho^2 V* = r
        return (r + 1) / r * math.log(math.sqrt(r + 1) / alpha)

    return float(scipy_optimize().minimize_scalar(margin, bounds=(1e-3, 1e4), method="bounded").x)


def _boundary(v: float, rho2: float, alpha: float) -> float:
    """Robbins' two-sided normal mixture boundary for a martingale with variance process v."""
    return math.sqrt(2 * (v * rho2 + 1) / rho2 * math.log(math.sqrt(v * rho2 + 1) / alpha))


class AdaptiveReport(BaseModel):
    """What the comparison artifact shows."""

    decision: Decision
    estimate: float | None
    interval: tuple[float, float] | None  # the running intersection, at the last look
    history: list[IntervalSnapshot]  # the interval as it narrowed
    episodes: int  # trials this design spent (unsound ones included)
    given_trials: int  # trials handed in at the start (not spent here)
    budget: int
    margin: float
    alpha: float
    method: str = METHOD

    def summary(self) -> str:
        """The decision in one line: the estimate, the anytime-valid interval, the trials spent."""
        if self.interval is None or self.estimate is None:
            return f"decision: {self.decision} (the first pass is not complete; {self.episodes} trials spent)"
        return (f"decision: {self.decision} (difference {100 * self.estimate:+.1f} points, "
                f"{100 * (1 - self.alpha):.0f} % anytime-valid interval [{100 * self.interval[0]:+.1f}, "
                f"{100 * self.interval[1]:+.1f}], margin +/-{100 * self.margin:.1f}; {self.episodes} of "
                f"{self.budget} trials spent)")

    def render(self) -> str:
        """Plain text: the decision, then the interval look by look."""
        if self.interval is None or self.estimate is None:
            return self.summary()
        lines = [self.summary(), f"{'look':>5} {'trials':>7} {'estimate':>9} {'interval':>18}"]
        lines += [f"{s.look:>5} {s.episodes:>7} {100 * s.estimate:>+8.1f} "
                  f"{f'[{100 * s.lower:+.1f}, {100 * s.upper:+.1f}]':>18}" for s in self.history]
        return "\n".join(lines)


Look = tuple[float, float, float, float, int]  # estimate, standard error, lower, upper, trials spent


class _LookMemo:
    """The looks computed so far and the sums after the last completed batch: a completed
    batch's draws never change, so each look adds only the batches completed since."""

    def __init__(self, looks: list[Look], rho2: float, numerator: float, variance: float, spent: int) -> None:
        self.looks, self.rho2 = looks, rho2
        self.numerator, self.weights, self.variance, self.spent = numerator, 1.0, variance, spent
        self.shortfall = 1.0  # the largest ratio of a batch's sample variance to its prediction
        self.next_draw = 0  # index of the first draw of the next batch to add


def _looks(state: AdaptiveState) -> list[Look]:
    """(estimate, standard error, lower, upper, trials spent) at every look, before intersecting."""
    if not state.first_pass_complete:
        return []
    memo = state._look_memo
    if memo is None or memo.next_draw > len(state.draws):
        n, s = _first_pass_counts(state)
        theta0 = float(np.mean(s[1] / n[1] - s[0] / n[0]))
        v0 = first_pass_variance(state)
        rho2 = _rho2(state, v0)
        first_pass_spent = state.spent_trials - sum(1 for d in state.draws if d.success is not None or d.dropped)
        half = _boundary(v0, rho2, state.alpha)
        memo = _LookMemo([(theta0, math.sqrt(v0), theta0 - half, theta0 + half, first_pass_spent)], rho2, theta0, v0,
                         first_pass_spent)
        state._look_memo = memo
    draws = state.draws
    while memo.next_draw < len(draws):
        end = memo.next_draw
        while end < len(draws) and draws[end].batch == draws[memo.next_draw].batch:
            end += 1
        batch = draws[memo.next_draw:end]
        if any(d.success is None and not d.dropped for d in batch):
            break  # looks happen at completed batches only (module docstring)
        memo.next_draw = end
        memo.spent += len(batch)
        counted = [d for d in batch if not d.dropped]
        xs = [d.centre + (1.0 if d.model == "candidate" else -1.0) * (float(d.success) - d.prediction)
              / (state.tasks * d.probability) for d in counted]
        if counted:
            # The batch's pseudo-outcomes are independent given the past: their sample variance
            # estimates Var(X | past). The prediction made at the batch's start is the floor (a
            # small batch's sample variance can be 0 by chance). A batch left with one counted
            # trial (the others' environments unsound) has no sample variance: its prediction is
            # scaled by the largest shortfall seen in earlier batches (MIN_BATCH_SIZE's reason).
            batch_variance = counted[0].variance
            if len(xs) >= 2:
                mean = sum(xs) / len(xs)
                sample = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
                memo.shortfall = max(memo.shortfall, sample / batch_variance)
                batch_variance = max(batch_variance, sample)
            else:
                batch_variance *= memo.shortfall
            weight = counted[0].weight
            memo.numerator += weight * sum(xs)
            memo.weights += weight * len(xs)
            memo.variance += weight**2 * batch_variance * len(xs)
        half = _boundary(memo.variance, memo.rho2, state.alpha)
        estimate = memo.numerator / memo.weights
        memo.looks.append((estimate, math.sqrt(memo.variance) / memo.weights, estimate - half / memo.weights,
                           estimate + half / memo.weights, memo.spent))
    return list(memo.looks)


def decide(state: AdaptiveState) -> AdaptiveReport:
    """The decision at the last look, with the interval's history (module docstring)."""
    history: list[IntervalSnapshot] = []
    lower, upper = -1.0, 1.0
    for look, (estimate, se, low, high, spent) in enumerate(_looks(state)):
        lower, upper = max(lower, low), min(upper, high)
        history.append(IntervalSnapshot(look=look, episodes=spent, estimate=estimate, standard_error=se,
                                        lower=lower, upper=upper))
    common = {"history": history, "episodes": state.spent_trials, "given_trials": state.given_trials,
              "budget": state.budget, "margin": state.margin, "alpha": state.alpha}
    if not history:
        # The first pass is incomplete: its unsound trials are asked for again, and may use up
        # the budget before every task has a sound trial with each model.
        stuck = state.requested_trials >= state.budget and not state.pending_first_pass
        return AdaptiveReport(decision="budget_exhausted" if stuck else "continue", estimate=None, interval=None,
                              **common)
    last = history[-1]
    decision: Decision
    if last.lower > 0:
        decision = "better"
    elif last.upper < 0:
        decision = "worse"
    elif -state.margin <= last.lower and last.upper <= state.margin:
        decision = "equivalent"
    elif (state.budget - state.requested_trials < MIN_BATCH_SIZE
          and not any(d.success is None and not d.dropped for d in state.draws)):
        decision = "budget_exhausted"
    else:
        decision = "continue"
    return AdaptiveReport(decision=decision, estimate=last.estimate, interval=(last.lower, last.upper), **common)


# --- what a fixed design would have cost ---------------------------------------------------------


class FixedDesignCost(BaseModel):
    """A fixed design (every task K times with each model, one look) reaching a given width."""

    width: float  # the width it must reach (its fixed-sample interval at the same level)
    trials_per_task: int  # K, for each model
    episodes: int  # 2 x tasks x K
    trial_variance_sum: float  # the sum over tasks of both models' estimated p(1 - p)


def _variance_sum(state: AdaptiveState) -> float:
    """Sum over tasks of the baseline's and the candidate's estimated p(1 - p), from every
    sound trial (the unbiased estimate with 2 trials or more, else the task's pooled one)."""
    n, s = state._counts()
    with np.errstate(divide="ignore", invalid="ignore"):
        own = s * (n - s) / (n * (n - 1))
        m, total = n.sum(axis=0), s.sum(axis=0)
        pooled = np.where(m >= 2, total * (m - total) / (m * (m - 1)), 0.25)
    return float(np.sum(np.where(n >= 2, own, pooled)))


def fixed_design_width(state: AdaptiveState, trials_per_task: int) -> float:
    """The width of a fixed design's interval (level 1 - alpha, these tasks) with K trials per task
    and model, at the trial-to-trial variances this design observed."""
    z = normal_quantile(1 - state.alpha / 2)
    return 2 * z * math.sqrt(_variance_sum(state) / trials_per_task) / state.tasks


def fixed_design_cost(state: AdaptiveState, width: float | None = None) -> FixedDesignCost:
    """The smallest fixed design (K trials per task and model) whose interval is at most `width`
    wide (default: the adaptive design's current interval width) at the variances observed."""
    if width is None:
        report = decide(state)
        if report.interval is None:
            raise ValueError("the first pass is not complete: there is no interval width to match yet")
        width = report.interval[1] - report.interval[0]
    if not width > 0:
        raise ValueError(f"width must be > 0, got {width!r}")
    z = normal_quantile(1 - state.alpha / 2)
    total = _variance_sum(state)
    k = max(1, math.ceil((2 * z) ** 2 * total / (state.tasks**2 * width**2)))
    return FixedDesignCost(width=width, trials_per_task=k, episodes=2 * state.tasks * k, trial_variance_sum=total)


# --- driving runs: batches as more trials of stored runs ---------------------------------------------


def batch_trials(batch: list[tuple[str, Model]]) -> dict[Model, dict[str, int]]:
    """A batch from `next_batch` as the further trials each model's run needs, per task."""
    wanted: dict[Model, dict[str, int]] = {"baseline": {}, "candidate": {}}
    for task_id, model in batch:
        wanted[_model(model)][task_id] = wanted[model].get(task_id, 0) + 1
    return wanted


def record_trial_rows(state: AdaptiveState, model: str, task_id: str, requested: int,
                      rows: list[dict[str, object]]) -> None:
    """Record the outcomes of the `requested` further trials of `model` on `task_id`: `rows` are
    those trials' final attempts (latest_task_results rows, any order). A trial with an unsound
    environment, or with no row at all (the run stopped before it), is spent and not counted."""
    ordered = sorted(rows, key=lambda row: int(str(row["trial"])))[:requested]
    for row in ordered:
        if is_sound(str(row["outcome"])):
            record(state, task_id, model, bool(row["success"]))
        else:
            record_unsound(state, task_id, model)
    for _ in range(requested - len(ordered)):
        record_unsound(state, task_id, model)


def sound_outcomes(rows: list[dict[str, object]]) -> dict[str, list[bool]]:
    """Per task, the successes of a run's sound trials (its final attempt per task and trial), in
    trial order: what a design starts from (`AdaptiveState.start`)."""
    outcomes: dict[str, list[bool]] = {}
    for row in sorted(rows, key=lambda r: (str(r["task_id"]), int(str(r.get("trial") or 1)))):
        if is_sound(str(row["outcome"])):
            outcomes.setdefault(str(row["task_id"]), []).append(bool(row["success"]))
    return outcomes
