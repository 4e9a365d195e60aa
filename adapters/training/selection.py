"""Which recorded episodes leave the product as training data, read as a stream.

An episode is one attempt at one task in one run, with its steps. `EpisodeFilter` selects them
(runs, outcome kinds, success only, domains, models, a date range, final attempts only) and
`iter_episodes` yields them one at a time: the episodes' rows are read once (small), the steps
are read in batches in episode order and grouped as they arrive, so memory stays flat however
many steps a selection holds.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from adapters.benchmark import OutcomeKind
from adapters.results.source import ResultsSource, require_runs, results_connection, source_path
from adapters.store import connections

STEP_BATCH = 500  # steps fetched per round trip


class EpisodeFilter(BaseModel):
    """What to export. Empty lists mean "any"; dates compare with the run's start (UTC)."""

    model_config = ConfigDict(extra="forbid")

    run_ids: list[str] = Field(min_length=1)
    outcomes: list[OutcomeKind] = Field(default_factory=list)
    success_only: bool = False
    domains: list[str] = Field(default_factory=list)
    task_ids: list[str] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)  # runs.model_id or runs.model_checkpoint
    since: dt.date | None = None
    until: dt.date | None = None  # inclusive
    final_attempts_only: bool = True  # False: every attempt, retries included

    def where(self) -> tuple[str, list[Any]]:
        """The SQL condition over task_results `t` joined with runs `r`, and its parameters."""
        clauses = [f"t.run_id IN ({', '.join('?' for _ in self.run_ids)})"]
        params: list[Any] = list(self.run_ids)
        if self.outcomes:
            clauses.append(f"t.outcome IN ({', '.join('?' for _ in self.outcomes)})")
            params += [o.value for o in self.outcomes]
        if self.success_only:
            clauses.append("t.success")
        if self.domains:
            clauses.append(f"t.domain IN ({', '.join('?' for _ in self.domains)})")
            params += self.domains
        if self.task_ids:
            clauses.append(f"t.task_id IN ({', '.join('?' for _ in self.task_ids)})")
            params += self.task_ids
        if self.models:
            marks = ", ".join("?" for _ in self.models)
            clauses.append(f"(r.model_id IN ({marks}) OR r.model_checkpoint IN ({marks}))")
            params += self.models + self.models
        if self.since:
            clauses.append("r.started_at >= ?")
            params.append(dt.datetime.combine(self.since, dt.time()))
        if self.until:
            clauses.append("r.started_at < ?")
            params.append(dt.datetime.combine(self.until + dt.timedelta(days=1), dt.time()))
        return " AND ".join(clauses), params


@dataclass(frozen=True)
class RunMeta:
    """What an export says about the run an episode comes from."""

    run_id: str
    agent: str | None
    model_id: str | None
    model_checkpoint: str | None
    suite: str | None
    suite_hash: str | None
    started_at: dt.datetime | None
    agent_config: dict[str, Any]


@dataclass
class StepRow:
    """One stored step, as exports need it."""

    index: int
    action: dict[str, Any]
    action_type: str | None
    screenshot: Path | None  # absolute, when one was stored
    window_title: str | None
    reasoning: str | None
    agent_seconds: float | None
    env_seconds: float | None
    error: str | None
    observation_error: str | None
    click: tuple[float, float] | None


@dataclass
class Episode:
    """One attempt at one task, with its steps in order."""

    run: RunMeta
    task_id: str
    domain: str | None
    attempt: int
    outcome: str
    success: bool
    score: float | None
    infeasible: bool | None
    reason: str | None
    error: str | None
    timings: dict[str, float | None]
    steps: list[StepRow] = field(default_factory=list)
    trial: int = 1  # which of the run's repeated trials of the task (task_results.trial)


_EPISODE_COLUMNS = ("t.run_id, t.task_id, t.domain, t.attempt, t.outcome, t.success, t.score, t.infeasible, "
                    "t.reason, t.error, t.total_time_seconds, t.reset_seconds, t.setup_seconds, "
                    "t.episode_seconds, t.evaluate_seconds, t.agent_seconds, t.env_seconds, t.trial")
_TIMING_NAMES = ("total", "reset", "setup", "episode", "evaluate", "agent", "env")


def iter_episodes(source: ResultsSource, selection: EpisodeFilter, *, with_steps: bool = True) -> Iterator[Episode]:
    """The selected episodes in (run, task, attempt) order, each with its steps (streamed in
    batches; none when not `with_steps`). UnknownRunError when a run id is not stored."""
    where, params = selection.where()
    final = ("QUALIFY row_number() OVER (PARTITION BY t.run_id, t.task_id, t.trial ORDER BY t.attempt DESC) = 1"
             if selection.final_attempts_only else "")
    episode_sql = (f"SELECT {_EPISODE_COLUMNS} FROM task_results t JOIN runs r USING (run_id) "
                   f"WHERE {where} {final} ORDER BY t.run_id, t.task_id, t.attempt")
    with results_connection(source, selection.run_ids, with_steps=with_steps) as conn:
        require_runs(conn, selection.run_ids, source_path(source))
        runs = _runs(conn, selection.run_ids)
        episodes = conn.execute(episode_sql, params).fetchall()
        if not episodes:
            return
        if not with_steps:
            for row in episodes:
                yield _episode(runs, row, [])
            return
        wanted = {(row[0], row[1], row[3]) for row in episodes}
        base = _screenshot_base(source)
        cursor = connections.second_cursor(conn)  # the steps stream while the episodes are read
        cursor.execute(
            "SELECT s.run_id, s.task_id, s.attempt, s.step_index, s.action, s.action_type, s.screenshot_path, "
            "s.window_title, s.reasoning, s.agent_seconds, s.env_seconds, s.error, s.observation_error, "
            f"s.click_x, s.click_y FROM steps s WHERE s.run_id IN ({', '.join('?' for _ in selection.run_ids)}) "
            "ORDER BY s.run_id, s.task_id, s.attempt, s.step_index",
            list(selection.run_ids),
        )
        pending = _StepStream(cursor, wanted, base)
        for row in episodes:
            yield _episode(runs, row, pending.take((row[0], row[1], row[3])))


def _episode(runs: dict[str, RunMeta], row: tuple[Any, ...], steps: list[StepRow]) -> Episode:
    return Episode(
        run=runs[row[0]], task_id=row[1], domain=row[2], attempt=row[3], outcome=row[4], success=bool(row[5]),
        score=row[6], infeasible=row[7], reason=row[8], error=row[9],
        timings=dict(zip(_TIMING_NAMES, row[10:17])), steps=steps, trial=int(row[17] or 1),
    )


class _StepStream:
    """Steps in (run, task, attempt, index) order, handed out per episode in the same order."""

    def __init__(self, cursor: Any, wanted: set[tuple[str, str, int]], base: Path | None) -> None:
        self._cursor = cursor
        self._wanted = wanted
        self._base = base
        self._buffer: list[tuple[Any, ...]] = []
        self._done = False

    def _rows(self) -> Iterator[tuple[Any, ...]]:
        while True:
            if not self._buffer:
                if self._done:
                    return
                self._buffer = list(reversed(self._cursor.fetchmany(STEP_BATCH)))
                if not self._buffer:
                    self._done = True
                    return
            yield self._buffer[-1]

    def take(self, key: tuple[str, str, int]) -> list[StepRow]:
        steps = []
        for row in self._rows():
            row_key = (row[0], row[1], row[2])
            if row_key < key or row_key not in self._wanted:
                self._buffer.pop()  # before this episode, or of an episode not selected
                continue
            if row_key != key:
                break  # the next selected episode's
            self._buffer.pop()
            steps.append(self._step(row))
        return steps

    def _step(self, row: tuple[Any, ...]) -> StepRow:
        stored = row[6]
        screenshot = None
        if stored:
            path = Path(stored)
            screenshot = path if path.is_absolute() or self._base is None else self._base / path
        action = json.loads(row[4]) if isinstance(row[4], str) else (row[4] or {})
        return StepRow(
            index=row[3], action=action, action_type=row[5], screenshot=screenshot, window_title=row[7],
            reasoning=row[8], agent_seconds=row[9], env_seconds=row[10], error=row[11], observation_error=row[12],
            click=(row[13], row[14]) if row[13] is not None and row[14] is not None else None,
        )


def _runs(conn: Any, run_ids: list[str]) -> dict[str, RunMeta]:
    rows = conn.execute(
        "SELECT run_id, agent, model_id, model_checkpoint, suite, suite_hash, started_at, agent_config FROM runs "
        f"WHERE run_id IN ({', '.join('?' for _ in run_ids)})", list(run_ids),
    ).fetchall()
    return {
        r[0]: RunMeta(run_id=r[0], agent=r[1], model_id=r[2], model_checkpoint=r[3], suite=r[4], suite_hash=r[5],
                      started_at=r[6], agent_config=json.loads(r[7]) if isinstance(r[7], str) else (r[7] or {}))
        for r in rows
    }


def _screenshot_base(source: ResultsSource) -> Path | None:
    """The folder relative screenshot paths are stored against (the DuckDB file's)."""
    where = source_path(source)
    return where.parent if isinstance(where, Path) else None
