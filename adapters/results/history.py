"""A baseline's nights over time: each run's rate with its interval, per domain, cost, duration and
infrastructure errors; the tasks that flipped; and the nights that differ from their recent past
by more than noise.

    baseline_history(source, baseline, nights=30, window=7) -> BaselineHistory

A night is a run of the baseline (`runs.baseline`: the nightly's runs and on-demand runs of it),
oldest first. What is compared is each task's final attempt of each trial (`latest_task_results`)
whose environment was sound (adapters/results/rates.py), and only the same task version: a task
whose fingerprint differs between two nights is not paired (and is named).

**The change test.** Is night N's result what its recent past would give? Under "nothing
changed", each task's sound trials in N and in the window's nights (up to `window` earlier
nights, leaving out nights already flagged, so one bad night does not become the standard the
next ones are held to) are exchangeable: N's successes on a task are a draw without replacement
from all of that task's trials (hypergeometric given their total), independently across tasks.
Night N's total of successes T is then the sum of independent hypergeometrics, computed exactly;
the night is a **regression** when P(T <= t) <= alpha/2 and an **improvement** when
P(T >= t) <= alpha/2. It is a conditional permutation test: valid whatever each task's
probability, for single trials and repeated ones, for deterministic agents (for which any real
change is evidence) and noisy ones, and it says how many nights it looked at. A night that is
flagged again in the same direction right after a flagged one, and is no different from it, is
the same change **continuing**, not a new one.

Each night's interval is trial-aware and the run summary's headline one: Wilson's over its tasks
for single trials, the "tasks like these" interval of adapters/results/trials/estimates.py where
trials were run (it needs SciPy).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from adapters.results.rates import is_sound
from adapters.results.source import ResultsSource, results_connection, source_path
from adapters.results.stats import Interval, wilson_interval
from adapters.store.errors import StoreError

DEFAULT_WINDOW = 7
DEFAULT_NIGHTS = 30
DEFAULT_ALPHA = 0.05

ChangeKind = Literal["regression", "improvement"]


class UnknownBaselineError(StoreError):
    """No run of the baseline is in the store; the message names the baselines it has."""


class TaskNight(BaseModel):
    """One task in one night: its version, and its sound trials' successes."""

    task_id: str
    domain: str
    fingerprint: str | None = None
    trials: int  # sound trials (their final attempts)
    successes: int

    @property
    def fraction(self) -> float:
        return self.successes / self.trials


class DomainNight(BaseModel):
    """One domain's rate in one night (mean of its tasks' fractions)."""

    domain: str
    tasks: int
    rate: float | None
    interval: Interval | None = None


class Change(BaseModel):
    """A night that differs from its recent past by more than noise."""

    kind: ChangeKind
    continuing_since: str | None = None  # the run id of the night it started, when this one continues it
    p_value: float  # one-sided, in the direction of `kind`
    looked_at: list[str]  # the window's run ids
    tasks_compared: int
    expected: float  # successes the window's rates would give this night's trials
    observed: int

    def describe(self) -> str:
        """"regression: 9 of 16 solved where its last 7 nights give 15.4 (p = 0.0001)"."""
        head = f"{self.kind} continuing since {self.continuing_since}" if self.continuing_since else self.kind
        nights = f"{len(self.looked_at)} night{'s' if len(self.looked_at) != 1 else ''}"
        return (f"{head}: {self.observed} solved where its last {nights} give {self.expected:.1f} "
                f"over {self.tasks_compared} task(s) (p = {self.p_value:.2g})")


class Night(BaseModel):
    """One run of the baseline."""

    run_id: str
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    status: str | None
    trigger: str | None
    agent: str | None
    model_id: str | None
    agent_config_hash: str | None
    selected: int | None
    trials_per_task: int  # the most sound trials a task got
    tasks: list[TaskNight] = Field(default_factory=list)
    left_out: int = 0  # tasks with no sound trial (infrastructure errors, setup failures)
    rate: float | None = None  # mean of the per-task fractions
    interval: Interval | None = None
    interval_method: str = ""
    domains: list[DomainNight] = Field(default_factory=list)
    cost_usd: float | None = None  # None: not priced (a model without a price)
    cost_note: str = ""
    duration_seconds: float | None = None
    infrastructure_errors: int = 0  # attempts, retried ones included
    change: Change | None = None

    @property
    def solved(self) -> int:
        return sum(t.successes for t in self.tasks)


class TaskFlip(BaseModel):
    """A task whose success fraction differs between two nights (the same task version)."""

    task_id: str
    domain: str
    before: float
    after: float

    @property
    def broken(self) -> bool:
        return self.after < self.before


class Flips(BaseModel):
    """The tasks that changed between night `since` and the latest night."""

    since: str
    broken: list[TaskFlip] = Field(default_factory=list)
    fixed: list[TaskFlip] = Field(default_factory=list)
    changed_versions: list[str] = Field(default_factory=list)  # different fingerprints: not compared


class BaselineHistory(BaseModel):
    """A baseline's nights, oldest first, with what changed."""

    baseline: str
    store: str
    window: int
    alpha: float
    nights: list[Night]
    since_previous: Flips | None = None
    since_last_good: Flips | None = None
    notes: list[str] = Field(default_factory=list)  # configuration changes between nights

    @property
    def changes(self) -> list[Night]:
        """The nights flagged as a new regression or improvement (not the ones continuing it)."""
        return [n for n in self.nights if n.change is not None and n.change.continuing_since is None]


# --- reading the store -----------------------------------------------------------------------


def stored_baselines(source: ResultsSource) -> dict[str, int]:
    """Every baseline with runs in the store, and how many."""
    with results_connection(source) as conn:
        rows = conn.execute("SELECT baseline, count(*) FROM runs WHERE baseline IS NOT NULL GROUP BY baseline "
                            "ORDER BY baseline").fetchall()
    return {str(name): int(count) for name, count in rows}


def baseline_history(source: ResultsSource, baseline: str, *, nights: int = DEFAULT_NIGHTS,
                     window: int = DEFAULT_WINDOW, alpha: float = DEFAULT_ALPHA,
                     until: str | None = None) -> BaselineHistory:
    """The last `nights` runs of `baseline` (up to run `until` when given), each tested against
    up to `window` earlier ones (see the module docstring). `UnknownBaselineError` when the store
    has no run of it."""
    if nights < 1 or window < 1:
        raise ValueError(f"nights and window must be at least 1, got {nights} and {window}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, got {alpha}")
    with results_connection(source) as conn:
        runs = _query(conn, """
            SELECT run_id, started_at, finished_at, status, agent, model_id, agent_config_hash, task_count,
                   json_extract_string(run_config, '$.trigger') AS trigger,
                   json_extract_string(run_config, '$.vm_hour_price_usd') AS vm_price
            FROM runs WHERE baseline = ? ORDER BY started_at, run_id""", [baseline])
    if until is not None:
        ids = [r["run_id"] for r in runs]
        if until not in ids:
            raise UnknownBaselineError(f"{source_path(source)}: run {until!r} is not a run of baseline {baseline!r}")
        runs = runs[: ids.index(until) + 1]
    if not runs:
        known = stored_baselines(source)
        have = ", ".join(f"{name} ({count})" for name, count in known.items()) or "none"
        raise UnknownBaselineError(f"{source_path(source)}: no run of baseline {baseline!r}; baselines with runs: {have}")
    # The window of the oldest night shown is read too, so it is tested like the others.
    runs = runs[-(nights + window):]
    run_ids = [r["run_id"] for r in runs]
    with results_connection(source, run_ids) as conn:
        finals = _query(conn, """
            SELECT run_id, task_id, domain, trial, outcome, success, task_fingerprint FROM latest_task_results
            WHERE run_id IN (SELECT unnest(?::VARCHAR[]))""", [run_ids])
        spent = _query(conn, """
            SELECT run_id, count(*) FILTER (WHERE outcome = 'infrastructure_error') AS infra,
                   sum(cost_usd) AS model_cost, count(*) FILTER (WHERE model_calls > 0 AND cost_usd IS NULL) AS unpriced,
                   sum(vm_seconds) AS vm_seconds
            FROM task_results WHERE run_id IN (SELECT unnest(?::VARCHAR[])) GROUP BY run_id""", [run_ids])
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in finals:
        by_run[row["run_id"]].append(row)
    costs = {row["run_id"]: row for row in spent}
    all_nights = [_night(run, by_run.get(run["run_id"], []), costs.get(run["run_id"])) for run in runs]
    flag_changes(all_nights, window, alpha)
    shown = all_nights[-nights:]
    history = BaselineHistory(baseline=baseline, store=str(source_path(source)), window=window, alpha=alpha,
                              nights=shown, notes=_configuration_notes(shown))
    if len(shown) >= 2:
        latest = shown[-1]
        history.since_previous = flips(shown[-2], latest)
        good = last_good_night(shown[:-1])
        if good is not None:
            history.since_last_good = flips(good, latest)
    return history


def _query(conn: Any, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, values)) for values in cursor.fetchall()]


def _night(run: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], spent: Mapping[str, Any] | None) -> Night:
    tasks: dict[str, TaskNight] = {}
    seen: set[str] = set()
    for row in rows:
        seen.add(row["task_id"])
        if not is_sound(row["outcome"]):
            continue
        task = tasks.get(row["task_id"])
        if task is None:
            task = tasks[row["task_id"]] = TaskNight(task_id=row["task_id"], domain=row["domain"] or "",
                                                     fingerprint=row["task_fingerprint"], trials=0, successes=0)
        task.trials += 1
        task.successes += bool(row["success"])
    ordered = sorted(tasks.values(), key=lambda t: t.task_id)
    night = Night(
        run_id=run["run_id"], started_at=run["started_at"], finished_at=run["finished_at"], status=run["status"],
        trigger=run["trigger"], agent=run["agent"], model_id=run["model_id"],
        agent_config_hash=run["agent_config_hash"], selected=run["task_count"],
        trials_per_task=max((t.trials for t in ordered), default=0), tasks=ordered,
        left_out=len(seen) - len(ordered),
    )
    night.rate, night.interval, night.interval_method = _rate_and_interval(ordered, rows)
    night.domains = _domains(ordered, rows)
    if run["started_at"] is not None and run["finished_at"] is not None:
        night.duration_seconds = (run["finished_at"] - run["started_at"]).total_seconds()
    if spent is not None:
        night.infrastructure_errors = int(spent["infra"] or 0)
        night.cost_usd, night.cost_note = _cost(spent, run["vm_price"])
    else:
        night.cost_usd = 0.0
    return night


def _rate_and_interval(tasks: Sequence[TaskNight], rows: Sequence[Mapping[str, Any]]
                       ) -> tuple[float | None, Interval | None, str]:
    """The mean of the per-task fractions and its 95 % interval, trial-aware."""
    if not tasks:
        return None, None, ""
    rate = sum(t.fraction for t in tasks) / len(tasks)
    if all(t.trials == 1 for t in tasks):
        return rate, wilson_interval(sum(t.successes for t in tasks), len(tasks)), "Wilson over tasks"
    from adapters.extras import ExtraMissing
    from adapters.results.trials.estimates import group_trials, suite_rate

    try:
        estimate = suite_rate(group_trials([r for r in rows if is_sound(r["outcome"])]))
    except ExtraMissing:
        return rate, None, "trials: interval needs the stats extra"
    return rate, estimate.tasks_like_these.interval, "trials, tasks like these"


def _domains(tasks: Sequence[TaskNight], rows: Sequence[Mapping[str, Any]]) -> list[DomainNight]:
    by_domain: dict[str, list[TaskNight]] = defaultdict(list)
    for task in tasks:
        by_domain[task.domain].append(task)
    out = []
    for domain in sorted({r["domain"] or "" for r in rows}):
        members = by_domain.get(domain, [])
        rate, interval, _ = _rate_and_interval(members, [r for r in rows if (r["domain"] or "") == domain])
        out.append(DomainNight(domain=domain, tasks=len(members), rate=rate, interval=interval))
    return out


def _cost(spent: Mapping[str, Any], vm_price: str | None) -> tuple[float | None, str]:
    """The night's cost (model plus VM-hours at the run's price), or None with why when a model
    it called has no price (its calls were recorded at $0)."""
    if int(spent["unpriced"] or 0):
        return None, f"unpriced: {int(spent['unpriced'])} attempt(s) called a model without a known price"
    price = float(vm_price) if vm_price not in (None, "") else 0.0
    return float(spent["model_cost"] or 0.0) + float(spent["vm_seconds"] or 0.0) / 3600.0 * price, ""


# --- the change test ---------------------------------------------------------------------------


def flag_changes(nights: Sequence[Night], window: int = DEFAULT_WINDOW, alpha: float = DEFAULT_ALPHA) -> None:
    """Set each night's `change` (see the module docstring), oldest first."""
    for index, night in enumerate(nights):
        night.change = None
        earlier = [n for n in nights[:index] if n.change is None][-window:]
        change = night_change(night, earlier, alpha)
        if change is None:
            continue
        previous = nights[index - 1] if index else None
        if previous is not None and previous.change is not None and previous.change.kind == change.kind \
                and night_change(night, [previous], alpha) is None:
            change.continuing_since = previous.change.continuing_since or previous.run_id
        night.change = change


def night_change(night: Night, window: Sequence[Night], alpha: float = DEFAULT_ALPHA) -> Change | None:
    """The change of `night` against the nights of `window`, or None when it is within noise (or
    nothing can be compared)."""
    past: dict[tuple[str, str | None], list[int]] = defaultdict(lambda: [0, 0])  # (task, version) -> [trials, successes]
    for earlier in window:
        for task in earlier.tasks:
            counts = past[(task.task_id, task.fingerprint)]
            counts[0] += task.trials
            counts[1] += task.successes
    draws: list[tuple[int, int, int]] = []  # (all trials, all successes, this night's trials)
    observed = 0
    expected = 0.0
    for task in night.tasks:
        trials, successes = past.get((task.task_id, task.fingerprint), (0, 0))
        if not trials:
            continue
        draws.append((trials + task.trials, successes + task.successes, task.trials))
        observed += task.successes
        expected += task.trials * successes / trials
    if not draws:
        return None
    distribution = _sum_of_hypergeometrics(draws)
    low = sum(distribution[: observed + 1])
    high = sum(distribution[observed:])
    kind: ChangeKind
    if low <= alpha / 2 and low <= high:
        kind, p_value = "regression", low
    elif high <= alpha / 2:
        kind, p_value = "improvement", high
    else:
        return None
    return Change(kind=kind, p_value=min(1.0, p_value), looked_at=[n.run_id for n in window],
                  tasks_compared=len(draws), expected=expected, observed=observed)


def _sum_of_hypergeometrics(draws: Iterable[tuple[int, int, int]]) -> list[float]:
    """The distribution of the sum of independent hypergeometric draws (population, successes in
    it, drawn), exactly: index k holds P(sum = k)."""
    total = [1.0]
    for population, successes, drawn in draws:
        denominator = math.comb(population, drawn)
        pmf = [math.comb(successes, k) * math.comb(population - successes, drawn - k) / denominator
               for k in range(drawn + 1)]
        combined = [0.0] * (len(total) + drawn)
        for i, p in enumerate(total):
            if p:
                for k, q in enumerate(pmf):
                    combined[i + k] += p * q
        total = combined
    return total


# --- flips and notes -----------------------------------------------------------------------------


def flips(before: Night, after: Night) -> Flips:
    """The tasks (same version, sound in both nights) whose success fraction differs."""
    earlier = {t.task_id: t for t in before.tasks}
    result = Flips(since=before.run_id)
    for task in after.tasks:
        old = earlier.get(task.task_id)
        if old is None:
            continue
        if old.fingerprint != task.fingerprint and None not in (old.fingerprint, task.fingerprint):
            result.changed_versions.append(task.task_id)
            continue
        if old.fraction != task.fraction:
            flip = TaskFlip(task_id=task.task_id, domain=task.domain, before=old.fraction, after=task.fraction)
            (result.broken if flip.broken else result.fixed).append(flip)
    return result


def last_good_night(nights: Sequence[Night]) -> Night | None:
    """The latest completed night that is not part of a regression."""
    for night in reversed(nights):
        if night.status == "completed" and (night.change is None or night.change.kind != "regression"):
            return night
    return None


def _configuration_notes(nights: Sequence[Night]) -> list[str]:
    """A line per night whose agent, model or agent configuration differs from the night before
    (its rates are then of another configuration), and per task whose version changed."""
    notes = []
    for before, after in zip(nights, nights[1:]):
        changed = [name for name in ("agent", "model_id", "agent_config_hash")
                   if getattr(before, name) != getattr(after, name)]
        if changed:
            notes.append(f"{after.run_id}: {', '.join(changed)} differ from {before.run_id}")
        versions = flips(before, after).changed_versions
        if versions:
            shown = ", ".join(versions[:5]) + (" ..." if len(versions) > 5 else "")
            notes.append(f"{after.run_id}: {len(versions)} task(s) changed version (not compared with "
                         f"{before.run_id}): {shown}")
    return notes
