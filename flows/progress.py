"""Progress of a run in the Prefect UI (a progress artifact) and in a side file other processes
can read while the controller holds the DuckDB file."""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from adapters.benchmark import BenchmarkResult, OutcomeKind
from adapters.results.stats import wilson_interval
from adapters.whole_files import replace_text
from flows.bookkeeping import best_effort, slug, warn


class RunProgress:
    """Tasks done so far, shown as a Prefect progress artifact (one per run) and a side file.

    Both say what a person watching wants to know while the run goes: tasks done of selected
    (a task is done when its last attempt is final or its retries are used up; in a run with
    repeated trials, trials done of selected and tasks with every trial done), success so far
    with its Wilson interval (with repeated trials: the mean over tasks of their success so far,
    with an interval that groups trials by task, trials/estimates.py `tasks_like_these`; none
    without SciPy), infrastructure errors by task (and by attempt), cost so far (model
    and VM) and tokens, and an estimate of the time left from this invocation's pace, cleared
    once the run ends. The artifact is updated from a background thread (lanes never wait on the
    Prefect API; updates queued behind a slow one collapse into the newest), and its failures are
    logged, never raised: progress reporting must not fail or stall a run.
    """

    ARTIFACT_PREFIX = "waa-progress"

    def __init__(self, run_id: str, selected: int, final: int, side_file: Path | None, scoring: str = "strict",
                 cost: Callable[[], float] | None = None, trials_per_task: dict[str, int] | None = None,
                 done_per_task: dict[str, int] | None = None) -> None:
        """`selected` and `final` count units of work: tasks, or in a run with trials
        (`trials_per_task`, the trials wanted of each task) trials of tasks; `done_per_task` is
        how many trials of each task had a final result before this invocation."""
        self.run_id = run_id
        self.scoring = scoring  # shown beside the rate when it is not the strict default
        self.selected = selected
        self.final = final  # units (tasks, or trials) whose last attempt is final
        self._trials_per_task = dict(trials_per_task or {})
        self._done_per_task = dict(done_per_task or {})
        self._tasks_done = sum(1 for t, k in self._trials_per_task.items() if self._done_per_task.get(t, 0) >= k)
        self._max_attempts: int | None = None
        self._infra_attempts: dict[tuple[str, int], int] = {}  # per (task, trial), this invocation
        self.retries_exhausted = 0  # tasks whose retries are used up (no final result)
        self.attempts = 0
        self.successes = 0  # among `scored`
        self.scored = 0  # results of this invocation whose environment was sound (rates.py)
        self._sound_by_task: dict[str, list[int]] = {}  # task -> [successes, sound results], this invocation
        # With repeated trials the interval groups trials by task: SciPy's quantiles, imported
        # here (in the flow's thread) rather than on the recorder's first result.
        self._by_task_interval = _grouped_interval() if self.with_trials else None
        self.infrastructure_errors = 0  # attempts
        self.infrastructure_tasks: set[str] = set()  # tasks with at least one such attempt
        self.model_cost_usd = 0.0
        self.unpriced = False  # a model without a known price was called: the cost is not known
        self.tokens = 0
        self.side_file = side_file
        self.status = "running"
        self._cost = cost  # the run's cost so far, model and VM (the budget's reckoning)
        self._started = time.monotonic()
        self._done_at_start = final  # a resumed run's earlier results do not set the pace
        self._lock = threading.Lock()
        self._artifact_id: Any = None
        self._publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="progress-artifact")
        # The Prefect settings (the API URL of the run's server) live in context variables of the
        # flow's thread; `recorded` is called from the recorder's thread, which has none, and a
        # Prefect call without them starts a temporary server of its own.
        self._context = contextvars.copy_context()
        self._publish_queued = False
        try:
            self._artifact_id = create_progress_artifact(
                progress=self._percent(), key=self.artifact_key(), description=self._description()
            )
        except Exception as exc:  # noqa: BLE001 - see class docstring
            warn(f"progress artifact not created: {exc}")
        self._write_side_file()

    def artifact_key(self) -> str:
        """The progress artifact's key: one series per run (keys allow lowercase, digits, '-')."""
        return f"{self.ARTIFACT_PREFIX}-{slug(self.run_id)}"

    def expect_attempts(self, max_attempts: int) -> None:
        """Attempts each trial of a task gets in this invocation: after that many infrastructure
        errors it is done (its retries are used up)."""
        with self._lock:
            self._max_attempts = max_attempts

    @property
    def with_trials(self) -> bool:
        """Whether the run repeats tasks (then progress counts trials and tasks)."""
        return any(k > 1 for k in self._trials_per_task.values())

    @property
    def done(self) -> int:
        """Tasks that have ended: a final result, or retries used up."""
        return self.final + self.retries_exhausted

    def _percent(self) -> float:
        return 100.0 * self.done / self.selected if self.selected else 100.0

    def eta_seconds(self) -> float | None:
        """Seconds left at this invocation's pace so far; None before the first task ended and
        once the run has ended."""
        done = self.done - self._done_at_start
        if done <= 0 or self.status != "running":
            return None
        return (time.monotonic() - self._started) / done * max(0, self.selected - self.done)

    def cost_usd(self) -> float:
        """Cost so far: the run's reckoning of model and VM cost when given, else the model's."""
        if self._cost is not None:
            try:
                return float(self._cost())
            except Exception:  # noqa: BLE001 - progress must not fail the run
                pass
        return self.model_cost_usd

    def _description(self) -> str:
        # The UI's card shows about the first 40 characters: what matters comes first.
        return progress_line(self.snapshot())

    def _success_interval(self) -> tuple[float | None, tuple[float, float] | None]:
        """The success rate so far and its 95 % interval: over results (Wilson), or with repeated
        trials the mean over tasks of their fractions with an interval that groups trials by task
        (no interval without SciPy)."""
        if not self.with_trials:
            return (self.successes / self.scored if self.scored else None), wilson_interval(self.successes, self.scored)
        fractions = [s / n for s, n in self._sound_by_task.values() if n]
        if not fractions:
            return None, None
        rate = sum(fractions) / len(fractions)
        if self._by_task_interval is None:
            return rate, None
        return rate, self._by_task_interval(fractions).interval

    def snapshot(self) -> dict[str, Any]:
        """The numbers of the side file (and of the artifact's description)."""
        rate, ci = self._success_interval()
        eta = self.eta_seconds()
        return {
            "run_id": self.run_id,
            "status": self.status,
            "selected": self.selected,
            "done": self.done,
            "final": self.final,
            "retries_exhausted": self.retries_exhausted,
            **({"tasks_selected": len(self._trials_per_task), "tasks_done": self._tasks_done} if self.with_trials else {}),
            "attempts_recorded": self.attempts,
            "successes": self.successes,
            "scored": self.scored,
            "success_ci95": list(ci) if ci else None,
            # With repeated trials: the mean over tasks of their success so far (what the interval is of).
            **({"success_rate_by_task": None if rate is None else round(rate, 4)} if self.with_trials else {}),
            "scoring": self.scoring,
            "infrastructure_errors": self.infrastructure_errors,
            "infrastructure_error_tasks": len(self.infrastructure_tasks),
            "cost_usd": round(self.cost_usd(), 6),
            "model_cost_usd": round(self.model_cost_usd, 6),
            "cost_unpriced": self.unpriced,
            "tokens": self.tokens,
            "eta_seconds": None if eta is None else round(eta, 1),
            "updated_at": datetime.now(timezone.utc).isoformat(),
        }

    def recorded(self, result: BenchmarkResult) -> None:
        """Count one recorded attempt: one more task done when its outcome is final or it was the
        task's last attempt."""
        with self._lock:
            self.attempts += 1
            if result.outcome is OutcomeKind.INFRASTRUCTURE_ERROR:
                self.infrastructure_errors += 1
                self.infrastructure_tasks.add(result.task_id)
            unit = (result.task_id, result.trial)
            finished = not result.outcome.is_retryable
            if finished:
                self.final += 1
            else:
                self._infra_attempts[unit] = self._infra_attempts.get(unit, 0) + 1
                if self._max_attempts is not None and self._infra_attempts[unit] >= self._max_attempts:
                    self.retries_exhausted += 1
                    finished = True
            if finished and result.task_id in self._trials_per_task:
                done = self._done_per_task.get(result.task_id, 0) + 1
                self._done_per_task[result.task_id] = done
                self._tasks_done += int(done == self._trials_per_task[result.task_id])
            if result.outcome.environment_was_sound:  # the headline rate's denominator (rates.py)
                self.scored += 1
                self.successes += int(result.success)
                counts = self._sound_by_task.setdefault(result.task_id, [0, 0])
                counts[0] += int(result.success)
                counts[1] += 1
            if result.usage is not None:
                self.model_cost_usd += result.usage.cost_usd
                self.unpriced = self.unpriced or bool(result.usage.unpriced)
                self.tokens += result.usage.input_tokens + result.usage.output_tokens
            self._write_side_file()
            if self._artifact_id is None or self._publish_queued or self.status != "running":
                return  # nothing to publish to, an update already queued, or the run has ended
            self._publish_queued = True
        self._publisher.submit(self._context.copy().run, self._publish)

    def _publish(self) -> None:
        with self._lock:
            self._publish_queued = False
            percent, description = self._percent(), self._description()
        best_effort(
            "updating the progress artifact",
            lambda: update_progress_artifact(self._artifact_id, progress=percent, description=description),
            retry_for=20.0,
        )

    def finish(self, status: str) -> None:
        """Record the run's final status (the ETA goes) and publish the last update with it."""
        with self._lock:
            self.status = status
            self._write_side_file()
            self._publish_queued = False
        self._publisher.shutdown(wait=True)
        if self._artifact_id is not None:
            self._context.copy().run(self._publish)

    def _write_side_file(self) -> None:
        if self.side_file is None:
            return
        try:
            self.side_file.parent.mkdir(parents=True, exist_ok=True)
            replace_text(self.side_file, json.dumps(self.snapshot()))
        except OSError as exc:
            warn(f"progress file {self.side_file} not written: {exc}")


def progress_line(p: dict[str, Any]) -> str:
    """One line of progress from a snapshot: done/total and success first (the UI's card shows
    about 40 characters), then infrastructure errors by task, cost, and the ETA or the status."""
    done = p.get("done", p.get("final", 0))
    if "tasks_selected" in p:  # a run with repeated trials: "32/48 trials, 10/16 tasks done"
        parts = [f"{done}/{p.get('selected', 0)} trials, {p.get('tasks_done', 0)}/{p['tasks_selected']} tasks done"]
    else:
        parts = [f"{done}/{p.get('selected', 0)} done"]
    scored = p.get("scored") or 0
    if scored:
        ci = p.get("success_ci95")
        interval = f" [{100 * ci[0]:.0f}-{100 * ci[1]:.0f}%]" if ci else ""
        scoring = "" if p.get("scoring", "strict") == "strict" else f" (scoring {p['scoring']})"
        if "tasks_selected" in p:  # repeated trials: the mean over tasks, its interval grouping trials by task
            rate = p.get("success_rate_by_task") or 0.0
            parts.append(f"success {p.get('successes', 0)}/{scored} trials, {100 * rate:.0f}% by task{interval}{scoring}")
        else:
            parts.append(
                f"success {p.get('successes', 0)}/{scored} {100 * p.get('successes', 0) / scored:.0f}%{interval}{scoring}"
            )
    attempts = p.get("infrastructure_errors", 0)
    tasks = p.get("infrastructure_error_tasks", attempts)
    parts.append(f"infra errors: {tasks} task(s), {attempts} attempt(s)" if attempts else "infra errors: 0")
    if p.get("retries_exhausted"):
        parts.append(f"{p['retries_exhausted']} out of retries")
    if p.get("cost_usd") or p.get("tokens"):
        tokens = f", {p['tokens']:,} tokens" if p.get("tokens") else ""
        cost = "unpriced" if p.get("cost_unpriced") else f"${p.get('cost_usd', 0.0):.4f}"
        parts.append(f"cost {cost}{tokens}")
    eta = p.get("eta_seconds")
    if p.get("status", "running") != "running":
        parts.append(str(p["status"]))
    elif eta is not None:
        parts.append(f"ETA {int(eta // 60)}m{int(eta % 60):02d}s")
    return ", ".join(parts)


def _grouped_interval() -> Callable[[list[float]], Any] | None:
    """The interval of a mean of per-task fractions for tasks like these
    (adapters/results/trials/estimates.py `tasks_like_these`), or None without SciPy (the `stats`
    extra): the progress line then shows no interval rather than one that treats trials as
    independent."""
    from adapters.extras import ExtraMissing

    try:
        from adapters.results.trials._scipy import scipy_stats
        from adapters.results.trials.estimates import tasks_like_these

        scipy_stats()
    except (ImportError, ExtraMissing):
        return None
    return tasks_like_these
