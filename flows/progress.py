"""Progress of a run in the Prefect UI (a progress artifact) and in a side file other processes
can read while the controller holds the DuckDB file."""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from adapters.benchmark import BenchmarkResult


def warn(message: str) -> None:
    try:
        get_run_logger().warning(message)
    except Exception:  # noqa: BLE001 - no run context (e.g. called outside a flow)
        pass


class RunProgress:
    """Final results so far, shown as a Prefect progress artifact and a side file.

    Artifact API failures are logged, never raised: progress reporting must not fail a run.
    """

    ARTIFACT_KEY = "waa-run-progress"

    def __init__(self, run_id: str, selected: int, final: int, side_file: Path | None) -> None:
        self.run_id = run_id
        self.selected = selected
        self.final = final
        self.attempts = 0
        self.side_file = side_file
        self.status = "running"
        self._lock = threading.Lock()
        self._artifact_id: Any = None
        try:
            self._artifact_id = create_progress_artifact(
                progress=self._percent(), key=self.ARTIFACT_KEY, description=self._description()
            )
        except Exception as exc:  # noqa: BLE001 - see class docstring
            warn(f"progress artifact not created: {exc}")
        self._write_side_file()

    def _percent(self) -> float:
        return 100.0 * self.final / self.selected if self.selected else 100.0

    def _description(self) -> str:
        return f"WAA run {self.run_id}: {self.final}/{self.selected} tasks have a final result"

    def recorded(self, result: BenchmarkResult) -> None:
        """Count one recorded attempt (and one more final result if its outcome is final)."""
        with self._lock:
            self.attempts += 1
            if not result.outcome.is_retryable:
                self.final += 1
            percent, description = self._percent(), self._description()
            self._write_side_file()
        if self._artifact_id is not None and not result.outcome.is_retryable:
            try:
                update_progress_artifact(self._artifact_id, progress=percent, description=description)
            except Exception as exc:  # noqa: BLE001 - see class docstring
                warn(f"progress artifact not updated: {exc}")

    def finish(self, status: str) -> None:
        with self._lock:
            self.status = status
            self._write_side_file()

    def _write_side_file(self) -> None:
        if self.side_file is None:
            return
        data = {
            "run_id": self.run_id,
            "status": self.status,
            "selected": self.selected,
            "final": self.final,
            "attempts_recorded": self.attempts,
            "updated_at": datetime.now(timezone.utc).isoformat(),
        }
        try:
            self.side_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.side_file.with_name(self.side_file.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.side_file)
        except OSError as exc:
            warn(f"progress file {self.side_file} not written: {exc}")
