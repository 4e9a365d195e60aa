"""Comparing two runs: per-domain success rates, the tasks that flipped, and a noise-aware verdict.

    compare_runs(baseline_rows, new_rows, baseline_run_id, new_run_id)   pure, from result rows
    compare_stored_runs(source, baseline_run_id, new_run_id)             from a DuckDB file/store
    comparison_markdown(comparison, title)                               report (Prefect artifact)
    render_comparison_text(comparison)                                   report (terminal)

Rules, all over each task's *final* attempt (the `latest_task_results` view):

- Each run's headline rate is the success rate over its tasks whose environment was sound
  (`*_rate_sound`: infrastructure errors and setup failures left out of the denominator, one
  definition for every report: adapters/results/rates.py), with a Wilson 95% interval; the raw
  rate over all its tasks (`*_rate`, as the run summary's "rate") and the tasks left out are
  shown beside it.
- A task whose final outcome is an infrastructure error or a setup failure in either run says
  nothing about the agent: it is left out of the flips, the paired delta and the test, and
  listed on its own.
- A task id both runs have whose definition differs (its `task_fingerprint`: the hash of the
  exact task file's content, e.g. WAA v1 against WAA-V2) is two different tasks under one name:
  never paired, listed with both fingerprints. Rows without a fingerprint (older stores) pair.
- Each run's status (runs.status) and how many of its selected tasks (runs.task_count) have no
  final result are shown with the rates, and a warning line names a run that is not complete.
- The remaining tasks both runs have are *paired*: the delta is the paired difference over them
  with Newcombe's paired interval, and the verdict comes from the exact McNemar test on their
  discordant pairs (fixed vs broken). A domain whose runs share no such task, but where both
  runs have tasks, gets an unpaired delta over each run's tasks (those tasks left
  out) with Newcombe's interval for independent proportions. `delta_method` says which.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from adapters.results.attempts import keep_final_attempt
from adapters.results.trials.paired import TrialComparison, render_trial_comparison
from adapters.results.trials.report import has_repeated_trials
from adapters.results.rates import RunStatus, is_final, is_sound, rate
from adapters.store.lease import shown_status
from adapters.results.report_text import incomplete_text, left_out_text
from adapters.results.stats import (
    Interval,
    mcnemar_exact,
    paired_difference_interval,
    unpaired_difference_interval,
    wilson_interval,
)
from adapters.results.source import (
    ResultsSource,
    require_runs,
    results_connection,
    source_path,
)

Verdict = Literal["improved", "regressed", "no significant difference", "insufficient data", "no verdict",
                  "equivalent", "undecided"]
# The adaptive model-update design's decisions as the comparison's verdict (flows/baselines.py).
DESIGN_VERDICTS: dict[str, Verdict] = {"better": "improved", "worse": "regressed", "equivalent": "equivalent",
                                       "budget_exhausted": "undecided", "continue": "undecided"}
DeltaMethod = Literal["paired", "unpaired"]

DEFAULT_ALPHA = 0.05
ALL = "ALL"
_REQUIRED = ("task_id", "success", "outcome")


class DomainComparison(BaseModel):
    """One domain (or "ALL") of a comparison: both runs' rates and the change between them."""

    domain: str
    baseline_total: int
    baseline_successes: int
    baseline_rate: float | None
    baseline_ci95: Interval | None  # Wilson
    # Tasks whose final outcome is an infrastructure error or a setup failure (not compared).
    baseline_left_out: int = 0
    # The headline rate: successes over the tasks whose environment was sound (rates.py).
    baseline_total_sound: int = 0
    baseline_successes_sound: int = 0
    baseline_rate_sound: float | None = None
    baseline_ci95_sound: Interval | None = None  # Wilson
    baseline_outcomes: dict[str, int] = Field(default_factory=dict)  # final outcome -> tasks
    new_total: int
    new_successes: int
    new_rate: float | None
    new_ci95: Interval | None  # Wilson
    new_left_out: int = 0
    new_total_sound: int = 0
    new_successes_sound: int = 0
    new_rate_sound: float | None = None
    new_ci95_sound: Interval | None = None  # Wilson
    new_outcomes: dict[str, int] = Field(default_factory=dict)
    # Tasks in both runs with a sound environment in both: the paired delta's tasks.
    paired_tasks: int = 0
    delta: float | None  # new minus baseline; see delta_method for over which tasks
    delta_ci95: Interval | None = None
    delta_method: DeltaMethod | None = None
    # The tasks and successes of each run that the delta is computed over: the paired tasks,
    # or for an unpaired delta each run's tasks with a sound environment.
    delta_baseline_tasks: int = 0
    delta_baseline_successes: int = 0
    delta_new_tasks: int = 0
    delta_new_successes: int = 0

    @property
    def delta_basis(self) -> str:
        """Over which tasks the delta was computed, for reports ("paired, 5 tasks: 5 -> 4 solved")."""
        if self.delta_method == "paired":
            plural = "s" if self.paired_tasks != 1 else ""
            return (
                f"paired, {self.paired_tasks} task{plural}: "
                f"{self.delta_baseline_successes} -> {self.delta_new_successes} solved"
            )
        if self.delta_method == "unpaired":
            return (
                f"unpaired: {self.delta_baseline_successes}/{self.delta_baseline_tasks} vs "
                f"{self.delta_new_successes}/{self.delta_new_tasks} solved"
            )
        return "no tasks to compare"


class TaskFlip(BaseModel):
    """A task both runs have, with its final outcome in each."""

    task_id: str
    domain: str
    baseline_outcome: str
    new_outcome: str


class TaskVersionChange(BaseModel):
    """A task id both runs have whose definitions differ (different task fingerprints): two
    different tasks under one name, never paired."""

    task_id: str
    domain: str
    baseline_fingerprint: str
    new_fingerprint: str


class PairedTest(BaseModel):
    """The exact McNemar test over the paired tasks (both runs, sound environment in both)."""

    method: str = "exact McNemar (two-sided binomial on the discordant pairs)"
    alpha: float
    paired_tasks: int
    both_succeeded: int
    both_failed: int
    fixed: int  # failed in the baseline run, succeeded in the new run
    broken: int  # succeeded in the baseline run, failed in the new run
    p_value: float | None  # None when there are no paired tasks
    verdict: Verdict


class RunComparison(BaseModel):
    """Two runs side by side; `verdict` says whether the new run is better, worse or the same."""

    baseline_run_id: str
    new_run_id: str
    domains: list[DomainComparison]  # sorted by domain, plus a final "ALL" row
    fixed: list[TaskFlip]  # failed in the baseline run, succeeded in the new run
    broken: list[TaskFlip]  # succeeded in the baseline run, failed in the new run
    # Tasks in both runs whose final outcome is an infrastructure error or a setup failure in
    # either run: not evidence about the agent, so neither flips nor part of the test.
    left_out: list[TaskFlip] = Field(default_factory=list)
    # Tasks whose definition differs between the runs (e.g. WAA v1 against WAA-V2): not paired.
    changed: list[TaskVersionChange] = Field(default_factory=list)
    # Each run's status and how many of its selected tasks have no final result (from the runs
    # table; None when compared from bare rows).
    baseline_status: RunStatus | None = None
    new_status: RunStatus | None = None

    only_in_baseline: list[str]
    only_in_new: list[str]
    test: PairedTest
    # Why no verdict may be drawn although tasks pair (the new run did not finish, or never reached
    # its model: the model update flow); None when the test's verdict stands.
    withheld: str | None = None
    # When either run has repeated trials: per-task means over trials compared (adapters/results/
    # trials/paired.py), whose verdict is the comparison's; the table, flips and McNemar test above
    # then describe each run's first trial only. None for two single-trial runs.
    trials: TrialComparison | None = None
    # The adaptive model-update design's decision (better / worse / equivalent / budget_exhausted),
    # set by the model-update flow when the baseline asks for it (flows/baselines.py). It is then
    # the comparison's one verdict: no fixed-sample test is applied to the trials it collected.
    design_decision: str | None = None
    design_summary: str | None = None  # its decision line: the estimate and anytime-valid interval

    def warnings(self) -> list[str]:
        """A line per run that is not complete (its rates leave tasks out)."""
        lines = [
            f"{role} run {status.run_id}: {text}"
            for role, status in (("baseline", self.baseline_status), ("new", self.new_status))
            if status is not None and (text := incomplete_text(status))
        ]
        scorings = [s.scoring for s in (self.baseline_status, self.new_status) if s is not None]
        if len(scorings) == 2 and scorings[0] != scorings[1]:
            lines.append(f"the runs scored server failures during evaluation differently (baseline "
                         f"{scorings[0] or 'not recorded'}, new {scorings[1] or 'not recorded'}): their rates "
                         "are not measured the same way")
        if self.changed:
            shown = ", ".join(c.task_id for c in self.changed[:5])
            lines.append(f"{len(self.changed)} task(s) have a different definition in each run (task fingerprints "
                         f"differ) and are not paired: {shown}{' ...' if len(self.changed) > 5 else ''}")
        return lines

    @property
    def verdict(self) -> Verdict:
        """improved / regressed / no significant difference / insufficient data, or no verdict
        when it is withheld."""
        if self.withheld:
            return "no verdict"
        if self.design_decision is not None:
            return DESIGN_VERDICTS[self.design_decision]
        return self.trials.verdict if self.trials is not None else self.test.verdict

    @property
    def p_value(self) -> float | None:
        """The exact McNemar p-value over the paired tasks (None without paired tasks); with
        trials, the trial comparison's test's; None after an adaptive design (no fixed-sample test)."""
        if self.design_decision is not None:
            return None
        return self.trials.estimate().p_value if self.trials is not None else self.test.p_value

    @property
    def overall(self) -> DomainComparison:
        """The "ALL" row."""
        return self.domains[-1]


# --- the comparison (pure) -------------------------------------------------------------------


def _final_rows(rows: Iterable[Mapping[str, Any]], run_id: str) -> dict[str, Mapping[str, Any]]:
    """Rows by task id, one per task. Several attempts of a task are allowed when every row has
    an `attempt`: the highest one is the task's final attempt."""
    by_task: dict[str, Mapping[str, Any]] = {}
    for index, row in enumerate(rows):
        missing = [key for key in _REQUIRED if key not in row]
        if missing:
            raise ValueError(
                f"result row #{index + 1} of run {run_id!r} lacks {', '.join(missing)}; rows need "
                f"{', '.join(_REQUIRED)} (and domain), as in the latest_task_results view"
            )
        task_id = str(row["task_id"])
        keep_final_attempt(by_task, task_id, row, lambda task_id=task_id: ValueError(
            f"run {run_id!r} has task {task_id!r} more than once without distinct attempt "
            "numbers; pass one row per task (latest_task_results) or rows with `attempt`"
        ))
    return by_task


def _trial(row: Mapping[str, Any]) -> int:
    return int(row.get("trial") or 1)


def _with_trial(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """A row with its trial number (rows from before trials are trial 1)."""
    return row if "trial" in row else {**row, "trial": 1}


def _domain(row: Mapping[str, Any]) -> str:
    return str(row.get("domain") or "")


def _left_out(row: Mapping[str, Any]) -> bool:
    return not is_sound(str(row["outcome"]))


def _domain_row(
    domain: str,
    base: list[Mapping[str, Any]],
    new: list[Mapping[str, Any]],
    pairs: list[tuple[Mapping[str, Any], Mapping[str, Any]]],
) -> DomainComparison:
    """One row of the table; `pairs` are this domain's paired tasks (baseline row, new row)."""
    row: dict[str, Any] = {"domain": domain, "paired_tasks": len(pairs), "delta": None}
    for side, rows in (("baseline", base), ("new", new)):
        successes = sum(bool(r["success"]) for r in rows)
        sound = [r for r in rows if not _left_out(r)]
        sound_successes = sum(bool(r["success"]) for r in sound)
        outcomes: dict[str, int] = {}
        for r in rows:
            outcomes[str(r["outcome"])] = outcomes.get(str(r["outcome"]), 0) + 1
        row.update({
            f"{side}_total": len(rows),
            f"{side}_successes": successes,
            f"{side}_rate": rate(successes, len(rows)),
            f"{side}_ci95": wilson_interval(successes, len(rows)),
            f"{side}_left_out": len(rows) - len(sound),
            f"{side}_total_sound": len(sound),
            f"{side}_successes_sound": sound_successes,
            f"{side}_rate_sound": rate(sound_successes, len(sound)),
            f"{side}_ci95_sound": wilson_interval(sound_successes, len(sound)),
            f"{side}_outcomes": outcomes,
        })
    if pairs:
        both = sum(bool(b["success"]) and bool(n["success"]) for b, n in pairs)
        fixed = sum(not b["success"] and bool(n["success"]) for b, n in pairs)
        broken = sum(bool(b["success"]) and not n["success"] for b, n in pairs)
        neither = len(pairs) - both - fixed - broken
        # Newcombe's first proportion is the new run's: delta = new - baseline = (fixed - broken) / n.
        row.update(
            delta=(fixed - broken) / len(pairs),
            delta_ci95=paired_difference_interval(both, fixed, broken, neither),
            delta_method="paired",
            delta_baseline_tasks=len(pairs),
            delta_baseline_successes=both + broken,
            delta_new_tasks=len(pairs),
            delta_new_successes=both + fixed,
        )
        return DomainComparison(**row)
    base_clean = [r for r in base if not _left_out(r)]
    new_clean = [r for r in new if not _left_out(r)]
    if base_clean and new_clean:
        # Both runs have tasks here but share none: compare them as independent samples.
        b_clean = sum(bool(r["success"]) for r in base_clean)
        n_clean = sum(bool(r["success"]) for r in new_clean)
        row.update(
            delta=n_clean / len(new_clean) - b_clean / len(base_clean),
            delta_ci95=unpaired_difference_interval(n_clean, len(new_clean), b_clean, len(base_clean)),
            delta_method="unpaired",
            delta_baseline_tasks=len(base_clean),
            delta_baseline_successes=b_clean,
            delta_new_tasks=len(new_clean),
            delta_new_successes=n_clean,
        )
    return DomainComparison(**row)


def _verdict(fixed: int, broken: int, paired: int, alpha: float) -> tuple[float | None, Verdict]:
    if paired == 0:
        return None, "insufficient data"
    p_value = mcnemar_exact(broken, fixed)
    if p_value >= alpha:
        return p_value, "no significant difference"
    return p_value, "improved" if fixed > broken else "regressed"


def compare_runs(
    baseline_rows: Iterable[Mapping[str, Any]],
    new_rows: Iterable[Mapping[str, Any]],
    baseline_run_id: str,
    new_run_id: str,
    *,
    alpha: float = DEFAULT_ALPHA,
    baseline_status: RunStatus | None = None,
    new_status: RunStatus | None = None,
) -> RunComparison:
    """Compare two runs from their result rows (see the module docstring for the rules).

    Rows need task_id, success and outcome (domain and task_fingerprint are used when present):
    one per task, as in
    DuckDB's `latest_task_results` view, or every attempt when each row has `attempt` (the
    highest counts). The verdict is "improved" / "regressed" when the exact McNemar test on the
    paired tasks gives p < `alpha`, "no significant difference" otherwise, and "insufficient
    data" when the runs have no paired task. `baseline_status` / `new_status` (e.g. from
    `stored_run_status`) put each run's status and missing tasks in the reports.
    """
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ValueError(f"alpha must be between 0 and 1 (exclusive), got {alpha!r}")
    baseline_rows, new_rows = list(baseline_rows), list(new_rows)
    trials: TrialComparison | None = None
    if has_repeated_trials(baseline_rows) or has_repeated_trials(new_rows):
        # Per-task means over trials decide; the classic table below shows each run's first trial.
        from adapters.results.trials.paired import compare_trial_rows

        trials = compare_trial_rows([_with_trial(r) for r in baseline_rows], [_with_trial(r) for r in new_rows],
                                    alpha=alpha, confidence=1 - alpha)
        baseline_rows = [r for r in baseline_rows if _trial(r) == 1]
        new_rows = [r for r in new_rows if _trial(r) == 1]
    base = _final_rows(baseline_rows, baseline_run_id)
    new = _final_rows(new_rows, new_run_id)

    fixed: list[TaskFlip] = []
    broken: list[TaskFlip] = []
    left_out: list[TaskFlip] = []
    changed: list[TaskVersionChange] = []
    pairs: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []
    for task_id in sorted(base.keys() & new.keys()):
        b, n = base[task_id], new[task_id]
        old_version, new_version = b.get("task_fingerprint"), n.get("task_fingerprint")
        if old_version and new_version and old_version != new_version:
            changed.append(TaskVersionChange(task_id=task_id, domain=_domain(n) or _domain(b),
                                             baseline_fingerprint=str(old_version), new_fingerprint=str(new_version)))
            continue
        flip = TaskFlip(
            task_id=task_id,
            domain=_domain(n) or _domain(b),
            baseline_outcome=str(b["outcome"]),
            new_outcome=str(n["outcome"]),
        )
        if _left_out(b) or _left_out(n):
            left_out.append(flip)
            continue
        pairs.append((b, n))
        if bool(b["success"]) != bool(n["success"]):
            (fixed if n["success"] else broken).append(flip)

    def pair_domain(pair: tuple[Mapping[str, Any], Mapping[str, Any]]) -> str:
        return _domain(pair[1]) or _domain(pair[0])

    domains = sorted({_domain(r) for r in (*base.values(), *new.values())})
    rows = [
        _domain_row(
            d,
            [r for r in base.values() if _domain(r) == d],
            [r for r in new.values() if _domain(r) == d],
            [p for p in pairs if pair_domain(p) == d],
        )
        for d in domains
    ]
    rows.append(_domain_row(ALL, list(base.values()), list(new.values()), pairs))

    both = sum(bool(b["success"]) and bool(n["success"]) for b, n in pairs)
    p_value, verdict = _verdict(len(fixed), len(broken), len(pairs), alpha)
    return RunComparison(
        baseline_run_id=baseline_run_id,
        new_run_id=new_run_id,
        domains=rows,
        fixed=fixed,
        broken=broken,
        left_out=left_out,
        changed=changed,
        only_in_baseline=sorted(base.keys() - new.keys()),
        only_in_new=sorted(new.keys() - base.keys()),
        baseline_status=baseline_status,
        new_status=new_status,
        trials=trials,
        test=PairedTest(
            alpha=alpha,
            paired_tasks=len(pairs),
            both_succeeded=both,
            both_failed=len(pairs) - both - len(fixed) - len(broken),
            fixed=len(fixed),
            broken=len(broken),
            p_value=p_value,
            verdict=verdict,
        ),
    )


# --- reading from DuckDB ---------------------------------------------------------------------

# The final attempt of each task of one run, as the latest_task_results view defines it.
# Filtering by run before numbering attempts keeps the work proportional to the run without
# relying on DuckDB to push the filter through the view's window.
_FINAL_ATTEMPTS_SQL = """
    SELECT task_id, domain, attempt, success, outcome, task_fingerprint, trial
    FROM task_results
    WHERE run_id = ?
    QUALIFY row_number() OVER (PARTITION BY task_id, trial ORDER BY attempt DESC) = 1
    ORDER BY task_id, trial
"""


def final_attempts(source: ResultsSource, run_id: str) -> list[dict[str, Any]]:
    """task_id, domain, attempt, success, outcome, task_fingerprint, trial of the final attempt
    of each (task, trial) of a run (one row per task in a single-trial run).

    Raises `UnknownRunError` when the run is not in the database.
    """
    with results_connection(source, [run_id]) as conn:
        require_runs(conn, [run_id], source_path(source))
        cursor = conn.execute(_FINAL_ATTEMPTS_SQL, [run_id])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, values)) for values in cursor.fetchall()]


def compare_stored_runs(
    source: ResultsSource, baseline_run_id: str, new_run_id: str, *, alpha: float = DEFAULT_ALPHA
) -> RunComparison:
    """Compare two runs stored in one results database (a `ResultStore` or its file's path).

    Raises `UnknownRunError` naming every run id that is not in the database.
    """
    with results_connection(source, [baseline_run_id, new_run_id]) as conn:
        require_runs(conn, [baseline_run_id, new_run_id], source_path(source))
        rows: list[list[dict[str, Any]]] = []
        for run_id in (baseline_run_id, new_run_id):
            cursor = conn.execute(_FINAL_ATTEMPTS_SQL, [run_id])
            names = [d[0] for d in cursor.description]
            rows.append([dict(zip(names, values)) for values in cursor.fetchall()])
        statuses = [
            _run_status(conn, run_id, run_rows) for run_id, run_rows in zip((baseline_run_id, new_run_id), rows)
        ]
    return compare_runs(
        rows[0], rows[1], baseline_run_id, new_run_id, alpha=alpha,
        baseline_status=statuses[0], new_status=statuses[1],
    )


def _run_status(conn: Any, run_id: str, rows: list[dict[str, Any]]) -> RunStatus:
    """The run's status and task count (its `runs` row) and how many of `rows` are final."""
    row = conn.execute("SELECT * FROM runs WHERE run_id = ?", [run_id])
    values = dict(zip([d[0] for d in row.description], row.fetchone()))  # older files lack later columns
    status = shown_status(values.get("status"), values.get("controller"), values.get("heartbeat_at"))
    # A task is final once every one of its trials is (rows: final attempt per task and trial).
    finals: dict[str, bool] = {}
    for r in rows:
        finals[str(r["task_id"])] = finals.get(str(r["task_id"]), True) and is_final(str(r["outcome"]))
    return RunStatus(run_id=run_id, status=status, selected=values.get("task_count"),
                     final=sum(finals.values()), scoring=values.get("scoring"))


def stored_run_status(source: ResultsSource, run_id: str) -> RunStatus:
    """A stored run's status and its selected tasks without a final result, for `compare_runs`
    when the two runs are in different files. Raises `UnknownRunError` for an unknown run."""
    with results_connection(source, [run_id]) as conn:
        require_runs(conn, [run_id], source_path(source))
        cursor = conn.execute(_FINAL_ATTEMPTS_SQL, [run_id])
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, values)) for values in cursor.fetchall()]
        return _run_status(conn, run_id, rows)


# --- rendering -------------------------------------------------------------------------------


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.1f}%"


def _pts(delta: float | None) -> str:
    return "n/a" if delta is None else f"{100 * delta:+.1f} pts"


def _interval_pct(ci: Interval | None) -> str:
    # The same "[56.6%, 100.0%]" form as the run reports (adapters/results/report_text.py).
    return "n/a" if ci is None else f"[{100 * ci[0]:.1f}%, {100 * ci[1]:.1f}%]"


def _interval_pts(ci: Interval | None) -> str:
    return "n/a" if ci is None else f"[{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}] pts"


def format_p_value(p_value: float | None) -> str:
    """A p-value for people: 3 decimals, scientific notation below 0.001, n/a when absent."""
    if p_value is None:
        return "n/a"
    return f"{p_value:.2e}" if p_value < 0.001 else f"{p_value:.3f}"


def verdict_sentence(comparison: RunComparison) -> str:
    """The verdict and the evidence behind it, in one sentence."""
    t = comparison.test
    if comparison.withheld:
        return f"no verdict: {comparison.withheld}"
    if comparison.design_decision is not None:
        return (f"{comparison.verdict} (the adaptive design's {comparison.design_summary or comparison.design_decision}; "
                "no fixed-sample test is applied to the trials it collected)")
    if comparison.trials is not None:
        c = comparison.trials
        chosen = c.estimate()
        interval = "n/a" if chosen.interval is None else f"[{_pts(chosen.interval[0])}, {_pts(chosen.interval[1])}]"
        return (f"{c.verdict} (per-task means over trials, {len(c.paired)} paired tasks: difference "
                f"{_pts(c.difference)}, {100 * c.confidence:.0f}% interval {interval}; {chosen.test_method}, "
                f"p = {format_p_value(chosen.p_value)}, alpha {c.alpha:g}; repeated trials below)")
    if t.verdict == "insufficient data":
        return (
            "insufficient data: the runs have no task in common with a sound environment in both, "
            "so there is nothing to pair"
        )
    relation = "<" if t.p_value is not None and t.p_value < t.alpha else ">="
    return (
        f"{t.verdict} (exact McNemar over {t.paired_tasks} paired tasks: {t.fixed} fixed, "
        f"{t.broken} broken, {t.both_succeeded} solved by both, {t.both_failed} by neither; "
        f"p = {format_p_value(t.p_value)} {relation} alpha {t.alpha:g})"
    )


def run_lines(comparison: RunComparison) -> list[str]:
    """One line per run: its headline rate with interval, raw rate, what is left out, and its
    status with the selected tasks that have no final result."""
    overall = comparison.overall
    lines = []
    for role, run_id, status in (
        ("baseline", comparison.baseline_run_id, comparison.baseline_status),
        ("new", comparison.new_run_id, comparison.new_status),
    ):
        def get(name: str, role: str = role) -> Any:
            return getattr(overall, f"{role}_{name}")

        rates = (
            f"success rate (sound environment) {_pct(get('rate_sound'))} "
            f"({get('successes_sound')}/{get('total_sound')}) {_interval_pct(get('ci95_sound'))}, "
            f"raw {_pct(get('rate'))} ({get('successes')}/{get('total')}), "
            f"left out: {left_out_text(get('outcomes'))}"
        )
        if status is None:
            state = "status not known (compared from result rows)"
        else:
            selected = "?" if status.selected is None else str(status.selected)
            state = (
                f"status {status.status or 'unknown'}, {status.missing} of {selected} selected tasks "
                "without a final result"
            )
        scoring = "" if status is None else f"; {status.scoring_line()}"
        lines.append(f"{role} run {run_id}: {state}; {rates}{scoring}")
    return lines


def _trials_role(comparison: RunComparison) -> str:
    """What the repeated-trials section is to the verdict."""
    return "the verdict's basis" if comparison.trials is None or comparison.trials.tested else "described only"


def comparison_markdown(comparison: RunComparison, title: str) -> str:
    """The comparison as a markdown report (the model-update artifact's body)."""
    lines = [
        f"# {title}",
        "",
        f"New run `{comparison.new_run_id}` vs baseline run `{comparison.baseline_run_id}` "
        "(success rate over each task's final attempt).",
        "",
        f"**Verdict: {verdict_sentence(comparison)}**",
        "",
        *[f"**Warning: {w}.**\n" for w in comparison.warnings()],
        *[f"- {line}" for line in run_lines(comparison)],
        "",
        "| domain | baseline (sound env.) | new (sound env.) | change | 95% CI of change | basis "
        "| baseline 95% CI | new 95% CI | baseline raw | new raw |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in comparison.domains:
        name = f"**{d.domain}**" if d.domain == ALL else d.domain
        lines.append(
            f"| {name} | {_pct(d.baseline_rate_sound)} ({d.baseline_successes_sound}/{d.baseline_total_sound}) "
            f"| {_pct(d.new_rate_sound)} ({d.new_successes_sound}/{d.new_total_sound}) "
            f"| {_pts(d.delta)} | {_interval_pts(d.delta_ci95)} | {d.delta_basis} "
            f"| {_interval_pct(d.baseline_ci95_sound)} | {_interval_pct(d.new_ci95_sound)} "
            f"| {_pct(d.baseline_rate)} ({d.baseline_successes}/{d.baseline_total}) "
            f"| {_pct(d.new_rate)} ({d.new_successes}/{d.new_total}) |"
        )
    lines += [
        "",
        "Headline rates (sound env.) leave out of the denominator the tasks whose final outcome is an "
        "infrastructure error or a setup failure, with Wilson 95% intervals; raw rates count every task "
        "of each run. The change is the paired difference over the tasks both runs have with a sound "
        "environment in both (Newcombe's paired interval), or, where the runs share no such task, the "
        "difference of independent proportions (Newcombe's interval for those).",
    ]
    for heading, flips in (("Fixed (failed before, succeed now)", comparison.fixed),
                           ("Broken (succeeded before, fail now)", comparison.broken)):
        lines += ["", f"## {heading}: {len(flips)}"]
        lines += [f"- `{f.task_id}` ({f.domain}): {f.baseline_outcome} -> {f.new_outcome}" for f in flips]
    if comparison.left_out:
        lines += ["", f"## Infrastructure errors and setup failures, not compared: {len(comparison.left_out)}"]
        lines += [
            f"- `{f.task_id}` ({f.domain}): {f.baseline_outcome} -> {f.new_outcome}"
            for f in comparison.left_out
        ]
    if comparison.changed:
        lines += ["", f"## Different task versions, not compared: {len(comparison.changed)}"]
        lines += [f"- `{c.task_id}` ({c.domain}): definition {c.baseline_fingerprint} -> {c.new_fingerprint}"
                  for c in comparison.changed]
    if comparison.only_in_baseline or comparison.only_in_new:
        lines += [
            "",
            f"Tasks only in the baseline run: {len(comparison.only_in_baseline)}; "
            f"only in the new run: {len(comparison.only_in_new)} (not counted as flips).",
        ]
    if comparison.trials is not None:
        lines += ["", f"## Repeated trials: per-task means ({_trials_role(comparison)}; the table above is each run's "
                  "first trial)", "", *[f"- {line.strip()}" for line in render_trial_comparison(comparison.trials).splitlines()]]
    return "\n".join(lines) + "\n"


def render_comparison_text(comparison: RunComparison) -> str:
    """The comparison as plain text for a terminal (what `arena compare` prints)."""
    header = (
        f"{'domain':<20} {'baseline sound env':>18} {'95% CI':>16} {'raw':>7} "
        f"{'new sound env':>18} {'95% CI':>16} {'raw':>7} "
        f"{'change':>11} {'95% CI of change':>20}  basis"
    )
    rule = "-" * len(header)
    lines = [
        f"Run comparison: new '{comparison.new_run_id}' vs baseline '{comparison.baseline_run_id}'",
        f"Verdict: {verdict_sentence(comparison)}",
        *[f"WARNING: {w}" for w in comparison.warnings()],
        *run_lines(comparison),
        "",
        header,
        rule,
    ]
    for d in comparison.domains:
        if d.domain == ALL:
            lines.append(rule)
        lines.append(
            f"{d.domain or '(none)':<20} "
            f"{f'{_pct(d.baseline_rate_sound)} ({d.baseline_successes_sound}/{d.baseline_total_sound})':>18} "
            f"{_interval_pct(d.baseline_ci95_sound):>16} {_pct(d.baseline_rate):>7} "
            f"{f'{_pct(d.new_rate_sound)} ({d.new_successes_sound}/{d.new_total_sound})':>18} "
            f"{_interval_pct(d.new_ci95_sound):>16} {_pct(d.new_rate):>7} "
            f"{_pts(d.delta):>11} {_interval_pts(d.delta_ci95):>20}  {d.delta_basis}"
        )
    lines.append(
        "sound env.: success over the tasks whose final outcome is not an infrastructure error or a "
        "setup failure; raw: over every task"
    )
    for heading, flips in (("fixed (failed before, succeed now)", comparison.fixed),
                           ("broken (succeeded before, fail now)", comparison.broken),
                           ("infrastructure errors and setup failures, not compared", comparison.left_out)):
        lines += ["", f"{heading}: {len(flips)}"]
        lines += [f"  {f.task_id} ({f.domain}): {f.baseline_outcome} -> {f.new_outcome}" for f in flips]
    if comparison.changed:
        lines += ["", f"different task versions, not compared: {len(comparison.changed)}"]
        lines += [f"  {c.task_id} ({c.domain}): definition {c.baseline_fingerprint} -> {c.new_fingerprint}"
                  for c in comparison.changed]
    if comparison.only_in_baseline:
        lines += ["", f"only in the baseline run: {', '.join(comparison.only_in_baseline)}"]
    if comparison.only_in_new:
        lines += ["", f"only in the new run: {', '.join(comparison.only_in_new)}"]
    if comparison.trials is not None:
        lines += ["", f"repeated trials: per-task means ({_trials_role(comparison)}; the table above is each run's first "
                  "trial)", render_trial_comparison(comparison.trials).rstrip("\n")]
    return "\n".join(lines) + "\n"
