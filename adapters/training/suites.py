"""What exports need from task suites: each task's instruction, and which tasks are held out.

A suite is marked as held-out evaluation data with a file beside its index::

    <suite>/arena-suite.toml
        held_out = true          # never export these tasks as training data or demonstrations

and more held-out suites can be named per command (`--held-out DIR`) or in $ARENA_HELD_OUT_SUITES
(paths separated by the OS path separator). A task is held out when the run's own suite is
marked, or when its id belongs to any held-out suite: a copy of the tasks under another folder
does not launder them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from adapters.waa.catalog import TaskCatalogError, WAATaskCatalog
from adapters.waa.suite_settings import SUITE_FILE, read_suite_settings

HELD_OUT_ENV = "ARENA_HELD_OUT_SUITES"


class LeakageError(ValueError):
    """An export would put held-out evaluation tasks into training data."""


def is_marked_held_out(suite_dir: Path) -> bool:
    """Whether `suite_dir` carries `arena-suite.toml` with `held_out = true` (ValueError naming
    the file when it is unreadable or `held_out` is not a boolean)."""
    return read_suite_settings(suite_dir).held_out


def held_out_dirs(extra: Iterable[Path] = ()) -> list[Path]:
    """The suites named held out for this command: `extra` plus $ARENA_HELD_OUT_SUITES."""
    named = [Path(p) for p in os.environ.get(HELD_OUT_ENV, "").split(os.pathsep) if p.strip()]
    return [*extra, *named]


@dataclass
class SuiteTexts:
    """Instructions of the tasks of the suites runs were made on, and the held-out task ids.

    Suites are opened lazily and once; a suite folder that no longer exists gives no
    instructions (exports say so per episode) and cannot mark its tasks held out by itself.
    """

    held_out: list[Path] = field(default_factory=list)
    _catalogs: dict[str, WAATaskCatalog | None] = field(default_factory=dict)
    _held_ids: dict[str, str] | None = None  # task id -> the held-out suite that holds it

    def catalog(self, suite: str | None) -> WAATaskCatalog | None:
        if not suite:
            return None
        if suite not in self._catalogs:
            try:
                self._catalogs[suite] = WAATaskCatalog(suite)
            except TaskCatalogError:
                self._catalogs[suite] = None
        return self._catalogs[suite]

    def instruction(self, suite: str | None, task_id: str) -> str | None:
        """The task's instruction as its suite states it, or None when the suite is gone."""
        catalog = self.catalog(suite)
        if catalog is None:
            return None
        try:
            return catalog.load(task_id).instruction
        except TaskCatalogError:
            return None

    def held_out_reason(self, suite: str | None, task_id: str) -> str | None:
        """Why `task_id` (run on `suite`) is held out, or None when it may be trained on."""
        if suite and Path(suite).is_dir() and is_marked_held_out(Path(suite)):
            return f"its suite {suite} is marked held_out in {SUITE_FILE}"
        holder = self._held_task_ids().get(task_id)
        return f"it belongs to the held-out suite {holder}" if holder else None

    def _held_task_ids(self) -> dict[str, str]:
        if self._held_ids is None:
            self._held_ids = {}
            for directory in self.held_out:
                try:
                    ids = WAATaskCatalog(directory).select()
                except TaskCatalogError as exc:
                    raise ValueError(f"held-out suite {directory}: {exc}") from None
                for task_id in ids:
                    self._held_ids.setdefault(task_id, str(directory))
        return self._held_ids
