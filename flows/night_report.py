"""What the nightly shows on its Prefect page as it goes: how far the night has got over all its
baselines, each baseline's rate as it finishes, each baseline's history (adapters/results/
history.py) as an artifact, and an event when a night differs from its recent past.

    report = NightReport(["scripted-bundled-local", "plan-replay-local"])
    report.finished(name, config, outcome)     after each baseline's run
    report.failed(name, error)                 a baseline that raised

Events (a team alerts on them with an automation, docs/deployments.md):

    waa.baseline.regression / waa.baseline.improvement
        resource  waa.baseline.<name>   (prefect.resource.name: the baseline)
        payload   run_id, p_value, observed, expected, nights (the run ids looked at), tasks

Everything here is bookkeeping (flows/bookkeeping.py): it never changes how the night ends.
"""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact
from prefect.artifacts import update_progress_artifact
from prefect.events import emit_event

from adapters.results.history import BaselineHistory, baseline_history
from adapters.results.history_report import cost_text, history_markdown, interval_text, pct
from flows.bookkeeping import best_effort, slug
from flows.run_config import RunOutcome, SuiteRunConfig

EVENT_PREFIX = "waa.baseline"


class NightReport:
    """The night's progress artifact and table, updated baseline by baseline."""

    def __init__(self, baselines: list[str]) -> None:
        self.baselines = baselines
        self.rows: dict[str, dict[str, Any]] = {name: {"baseline": name, "result": "waiting", "rate": "", "95%": "",
                                                       "cost": "", "change": ""} for name in baselines}
        self._progress: Any = best_effort("publishing the night's progress", lambda: create_progress_artifact(
            progress=0.0, key="waa-night-progress",
            description=f"the night's {len(baselines)} baseline(s): {', '.join(baselines)}"))
        self._publish()

    def started(self, name: str) -> None:
        self.rows[name]["result"] = "running"
        self._publish()

    def finished(self, name: str, config: SuiteRunConfig, outcome: RunOutcome) -> None:
        """A baseline's run ended: its row, its history artifact, and an event when the night
        differs from its recent past."""
        row = self.rows[name]
        row["result"] = outcome.status
        history = best_effort(f"reading baseline {name}'s history",
                              lambda: baseline_history(config.store_location, name, until=outcome.run_id))
        if history is not None:
            night = history.nights[-1]
            row.update({"rate": pct(night.rate), "95%": interval_text(night), "cost": cost_text(night),
                        "change": night.change.describe() if night.change else ""})
            best_effort(f"publishing baseline {name}'s history", lambda: create_markdown_artifact(
                key=f"waa-history-{slug(name)}", markdown=history_markdown(history),
                description=f"baseline {name}: its nights, and the ones that differ from their recent past"))
            _announce_change(history)
        self._publish()

    def failed(self, name: str, error: str) -> None:
        self.rows[name]["result"] = f"failed ({error})"
        self._publish()

    def not_run(self, names: list[str]) -> None:
        """Baselines the night did not reach (it was cancelled)."""
        for name in names:
            self.rows[name]["result"] = "not run"
        if names:
            self._publish()

    def _publish(self) -> None:
        done = sum(1 for row in self.rows.values() if row["result"] not in ("waiting", "running"))
        if self._progress is not None:
            best_effort("updating the night's progress", lambda: update_progress_artifact(
                self._progress, progress=100.0 * done / max(1, len(self.baselines)),
                description=f"{done} of {len(self.baselines)} baseline(s) done"))
        best_effort("publishing the night's table", lambda: create_table_artifact(
            key="waa-nightly", table=list(self.rows.values()),
            description=f"The night's baselines as they finish ({done} of {len(self.baselines)} done), each linked "
                        "above"))


def _announce_change(history: BaselineHistory) -> None:
    """An event for the latest night's new regression or improvement (a continuing one was
    announced when it began)."""
    night = history.nights[-1]
    change = night.change
    if change is None or change.continuing_since is not None:
        return
    best_effort(f"announcing baseline {history.baseline}'s {change.kind}", lambda: emit_event(
        event=f"{EVENT_PREFIX}.{change.kind}",
        resource={"prefect.resource.id": f"{EVENT_PREFIX}.{history.baseline}",
                  "prefect.resource.name": history.baseline},
        payload={"run_id": night.run_id, "p_value": change.p_value, "observed": change.observed,
                 "expected": round(change.expected, 3), "nights": change.looked_at, "tasks": change.tasks_compared,
                 "summary": change.describe()},
    ))
