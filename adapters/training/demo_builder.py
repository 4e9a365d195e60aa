"""`arena demos build --from-run RUN`: successful episodes become a demo library.

One demo per task (the shortest successful final attempt across the runs given), in the format
of the bundled library (adapters/agents/demos.py): the task's instruction, its domain, and the
steps as short readable lines a model can follow on another screen::

    CLICK the MenuItem "View"        (an element action: its role and name, not a stale id)
    CLICK at (640, 400)              (a point, when no element is known)
    TYPE "Holidays"   PRESS ctrl+s   SCROLL down 3   DRAG from (1, 2) to (3, 4)   WAIT   DONE

`source_task_id` names the task, so retrievers never hand a task its own recording unless told
to; provenance (run, attempt, agent, model, suite fingerprint) goes in each demo's notes and in
`provenance.jsonl`; the library's marker ``.waa-arena-output`` lets `overwrite` replace only a
library this product built (adapters/training/output.py). Tasks of held-out suites are left out (adapters/training/suites.py) unless
allowed, so their demos can never be retrieved; infeasible tasks are left out unless asked for
(a demo that ends in FAIL teaches a model to give up on look-alike tasks).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from adapters.agents.demos import Demo, load_demo_library
from adapters.benchmark import POINTER_ACTIONS, ActionType, BenchmarkAction
from adapters.results.source import ResultsSource
from adapters.training.selection import Episode, EpisodeFilter, StepRow, iter_episodes
from adapters.training.output import OutputExists, OutputKind, read_json_file, replaced_directory, usable_output_dir
from adapters.training.suites import SuiteTexts

PROVENANCE = "provenance.jsonl"
_UNSAFE = re.compile(r"[^a-z0-9-]+")
_POINTER_WORDS = {ActionType.CLICK: "CLICK", ActionType.DOUBLE_CLICK: "DOUBLE_CLICK",
                  ActionType.RIGHT_CLICK: "RIGHT_CLICK"}


# Every provenance record of a library built before the output marker has these fields.
_PROVENANCE_FIELDS = frozenset({"demo_id", "source_task_id", "run_id", "attempt", "suite_fingerprint"})


def _earlier_library(provenance: Path) -> str | None:
    """None when `provenance` is that of a library built before the output marker (its first
    record has this product's provenance fields), else why not."""
    try:
        first = read_json_file(provenance, lines=True)
    except ValueError as exc:
        return str(exc)
    if not isinstance(first, dict) or not _PROVENANCE_FIELDS <= first.keys():
        return (f"its {PROVENANCE} is not one this product writes: its first record lacks "
                f"{', '.join(sorted(_PROVENANCE_FIELDS))}")
    return None


DEMO_LIBRARY = OutputKind(kind="demo-library", title="demo library", files=PROVENANCE, earlier=_earlier_library)


class DemoBuildError(ValueError):
    """The library cannot be built as asked; the message says why."""


class DemoLibraryExists(OutputExists, DemoBuildError):
    """The library's directory holds something already."""


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:.4g}"


def demo_step_text(action: BenchmarkAction, click: tuple[float, float] | None = None) -> str:
    """One recorded action as a demo step line (see the module docstring)."""
    kind = action.type
    if kind in POINTER_ACTIONS:
        word = _POINTER_WORDS[kind]
        if action.target_role and action.target_name:
            return f"{word} the {action.target_role} {json.dumps(action.target_name, ensure_ascii=False)}"
        point = (action.x, action.y) if action.x is not None and action.y is not None else click
        if point is None:
            raise DemoBuildError(f"a {kind.value} with neither an element nor a point cannot be shown")
        return f"{word} at ({_number(point[0])}, {_number(point[1])})"
    if kind is ActionType.TYPE:
        return f"TYPE {json.dumps(action.text or '', ensure_ascii=False)}"
    if kind is ActionType.KEY:
        return "PRESS " + "+".join([*action.modifiers, action.key or ""])
    if kind is ActionType.SCROLL:
        return f"SCROLL {action.scroll_direction or 'down'} {action.scroll_amount}"
    if kind is ActionType.DRAG:
        return (f"DRAG from ({_number(action.x or 0)}, {_number(action.y or 0)}) "
                f"to ({_number(action.end_x or 0)}, {_number(action.end_y or 0)})")
    if kind is ActionType.ANSWER:
        return f"ANSWER {json.dumps(action.answer or '', ensure_ascii=False)}"
    return kind.value.upper()  # WAIT, DONE, FAIL


@dataclass
class DemoBuildSummary:
    """What `build_demo_library` wrote and what it left out, with why."""

    out_dir: Path
    demos: list[Demo] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{len(self.demos)} demo(s) -> {self.out_dir}"]
        out += [f"  left out {line}" for line in self.skipped]
        return out


def build_demo_library(
    source: ResultsSource,
    run_ids: list[str],
    out_dir: Path,
    *,
    held_out: list[Path] | None = None,
    allow_held_out: bool = False,
    include_infeasible: bool = False,
    overwrite: bool = False,
) -> DemoBuildSummary:
    """Write one demo per successfully solved task of `run_ids` into `out_dir` (a new
    directory, or an existing one with `overwrite`); the result loads with `load_demo_library`."""
    out_dir = usable_output_dir(out_dir, overwrite, DemoLibraryExists, refused=DemoBuildError, kind=DEMO_LIBRARY)
    texts = SuiteTexts(held_out=list(held_out or []))
    summary = DemoBuildSummary(out_dir=out_dir)
    best: dict[str, Episode] = {}
    for episode in iter_episodes(source, EpisodeFilter(run_ids=run_ids, success_only=True)):
        why = _left_out(episode, texts, allow_held_out, include_infeasible)
        if why:
            summary.skipped.append(f"{episode.task_id}: {why}")
            continue
        kept = best.get(episode.task_id)
        if kept is None or len(episode.steps) < len(kept.steps):
            best[episode.task_id] = episode
    if not best:
        raise DemoBuildError(f"no successful episode of run(s) {', '.join(run_ids)} can become a demo"
                             + (f" ({len(summary.skipped)} left out: {summary.skipped[0]})" if summary.skipped else ""))
    with replaced_directory(out_dir, DEMO_LIBRARY) as work:
        with (work / PROVENANCE).open("w", encoding="utf-8") as provenance:
            used: set[str] = set()
            for task_id in sorted(best):
                demo, record = _demo(best[task_id], texts, used)
                (work / f"{demo.demo_id}.json").write_text(
                    json.dumps(demo.model_dump(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
                provenance.write(json.dumps(record, default=str) + "\n")
                summary.demos.append(demo)
        load_demo_library(work)  # the library's own loader accepts every file
    return summary


def _left_out(episode: Episode, texts: SuiteTexts, allow_held_out: bool, include_infeasible: bool) -> str | None:
    if not allow_held_out:
        why = texts.held_out_reason(episode.run.suite, episode.task_id)
        if why:
            return f"held out ({why})"
    if episode.infeasible and not include_infeasible:
        return "infeasible task (its demo would only say FAIL)"
    if texts.instruction(episode.run.suite, episode.task_id) is None:
        return f"its suite {episode.run.suite} is not on disk (instruction unknown)"
    if not episode.steps:
        return "no steps recorded"
    return None


def _demo(episode: Episode, texts: SuiteTexts, used: set[str]) -> tuple[Demo, dict[str, object]]:
    steps = [_step_line(step) for step in episode.steps]
    run = episode.run
    record = {"demo_id": _demo_id(episode.task_id, used), "source_task_id": episode.task_id, "run_id": run.run_id,
              "attempt": episode.attempt, "agent": run.agent, "model": run.model_id,
              "model_checkpoint": run.model_checkpoint, "suite": run.suite, "suite_fingerprint": run.suite_hash,
              "score": episode.score, "steps": len(steps)}
    demo = Demo(
        demo_id=str(record["demo_id"]),
        task_instruction=str(texts.instruction(run.suite, episode.task_id)),
        domain=episode.domain or "unknown",
        steps=steps,
        source_task_id=episode.task_id,
        notes=f"recorded by arena demos build from run {run.run_id} attempt {episode.attempt} "
              f"(agent {run.agent}, model {run.model_id or '-'}, suite fingerprint {(run.suite_hash or '-')[:12]})",
    )
    return demo, record


def _step_line(step: StepRow) -> str:
    try:
        action = BenchmarkAction.model_validate(step.action)
    except ValueError as exc:
        raise DemoBuildError(f"step {step.index}: stored action is not valid any more: {exc}") from None
    return demo_step_text(action, step.click)


def _demo_id(task_id: str, used: set[str]) -> str:
    """A readable id from the task id; two task ids that read alike get a hash suffix."""
    demo_id = "run-" + (_UNSAFE.sub("-", task_id.lower()).strip("-") or "task")
    if demo_id in used:
        demo_id += "-" + hashlib.sha256(task_id.encode()).hexdigest()[:8]
    used.add(demo_id)
    return demo_id
