"""Progress of a run in the Prefect UI (a progress artifact) and in a side file other processes
can read while the controller holds the DuckDB file."""

from __future__ import annotations

import contextvars
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from adapters.benchmark import BenchmarkResult, OutcomeKind
from adapters.results.stats import wilson_interval
from flows.bookkeeping import best_effort, warn


class RunProgress:
    """Final results so far, shown as a Prefect progress artifact and a side file.

    Both say what a person watching wants to know while the run goes: tasks done of selected,
    success so far with its Wilson interval, infrastructure errors, model cost and tokens, and
    an estimate of the time left (from this invocation's pace). The artifact is updated from a
    background thread (lanes never wait on the Prefect API; updates queued behind a slow one
    collapse into the newest), and its failures are logged, never raised: progress reporting
    must not fail or stall a run.
    """

    ARTIFACT_KEY = "waa-run-progress"

    def __init__(self, run_id: str, selected: int, final: int, side_file: Path | None, scoring: str = "strict") -> None:
        self.run_id = run_id
        self.scoring = scoring  # shown beside the rate when it is not the strict default
        self.selected = selected
        self.final = final
        self.attempts = 0
        self.successes = 0  # among `scored`
        self.scored = 0  # results of this invocation whose environment was sound (rates.py)
        self.infrastructure_errors = 0  # attempts, retried or not
        self.cost_usd = 0.0
        self.tokens = 0
        self.side_file = side_file
        self.status = "running"
        self._started = time.monotonic()
        self._final_at_start = final  # a resumed run's earlier results do not set the pace
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
                progress=self._percent(), key=self.ARTIFACT_KEY, description=self._description()
            )
        except Exception as exc:  # noqa: BLE001 - see class docstring
            warn(f"progress artifact not created: {exc}")
        self._write_side_file()

    def _percent(self) -> float:
        return 100.0 * self.final / self.selected if self.selected else 100.0

    def eta_seconds(self) -> float | None:
        """Seconds left at this invocation's pace so far; None before the first final result."""
        done = self.final - self._final_at_start
        if done <= 0:
            return None
        return (time.monotonic() - self._started) / done * max(0, self.selected - self.final)

    def _description(self) -> str:
        return f"WAA run {self.run_id}: " + progress_line(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        """The numbers of the side file (and of the artifact's description)."""
        ci = wilson_interval(self.successes, self.scored)
        eta = self.eta_seconds()
        return {
            "run_id": self.run_id,
            "status": self.status,
            "selected": self.selected,
            "final": self.final,
            "attempts_recorded": self.attempts,
            "successes": self.successes,
            "scored": self.scored,
            "success_ci95": list(ci) if ci else None,
            "scoring": self.scoring,
            "infrastructure_errors": self.infrastructure_errors,
            "cost_usd": round(self.cost_usd, 6),
            "tokens": self.tokens,
            "eta_seconds": None if eta is None else round(eta, 1),
            "updated_at": datetime.now(timezone.utc).isoformat(),
        }

    def recorded(self, result: BenchmarkResult) -> None:
        """Count one recorded attempt (and one more final result if its outcome is final)."""
        with self._lock:
            self.attempts += 1
            if result.outcome is OutcomeKind.INFRASTRUCTURE_ERROR:
                self.infrastructure_errors += 1
            if not result.outcome.is_retryable:
                self.final += 1
            if result.outcome.environment_was_sound:  # the headline rate's denominator (rates.py)
                self.scored += 1
                self.successes += int(result.success)
            if result.usage is not None:
                self.cost_usd += result.usage.cost_usd
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
        """Record the run's final status and wait for the last artifact update."""
        with self._lock:
            self.status = status
            self._write_side_file()
        self._publisher.shutdown(wait=True)

    def _write_side_file(self) -> None:
        if self.side_file is None:
            return
        try:
            self.side_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.side_file.with_name(self.side_file.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.snapshot()))
            os.replace(tmp, self.side_file)
        except OSError as exc:
            warn(f"progress file {self.side_file} not written: {exc}")


def progress_line(p: dict[str, Any]) -> str:
    """One line of progress from a snapshot: done/total, success so far, errors, cost, ETA."""
    parts = [f"{p.get('final', 0)}/{p.get('selected', 0)} done"]
    scored = p.get("scored") or 0
    if scored:
        ci = p.get("success_ci95")
        interval = f" [{100 * ci[0]:.0f}-{100 * ci[1]:.0f}%]" if ci else ""
        scoring = "" if p.get("scoring", "strict") == "strict" else f" (scoring {p['scoring']})"
        parts.append(
            f"success {p.get('successes', 0)}/{scored} {100 * p.get('successes', 0) / scored:.0f}%{interval}{scoring}"
        )
    parts.append(f"infra errors {p.get('infrastructure_errors', 0)}")
    if p.get("tokens"):
        parts.append(f"cost ${p.get('cost_usd', 0.0):.4f} ({p['tokens']:,} tokens)")
    eta = p.get("eta_seconds")
    if eta is not None and p.get("status") == "running":
        parts.append(f"ETA {int(eta // 60)}m{int(eta % 60):02d}s")
    return ", ".join(parts)
