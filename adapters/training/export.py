"""Recorded episodes out as training data: `arena export --format sft|trajectories|inspect`.

Formats (docs/training.md has the full schemas):

- ``trajectories``: ``trajectories.jsonl``, one record per episode with every step, its timings,
  outcome and score (schema ``waa-arena.trajectory``, version `TRAJECTORY_SCHEMA_VERSION`), and
  the screenshots under ``images/``.
- ``sft``: one chat sample per step for supervised fine-tuning of a vision-language model. With
  images as files (default) the directory is a Hugging Face *imagefolder* dataset
  (``metadata.jsonl`` + ``images/``; ``datasets.load_dataset("imagefolder", data_dir=DIR)``
  loads it, one ``image`` and its ``messages`` per row); with ``images="embed"`` it is one
  ``train.jsonl`` in the OpenAI chat fine-tuning format, the screenshot a PNG data URL.
  Each sample: the system prompt with the action grammar the prompted agents use, the task's
  instruction with the active window and the previous actions, the screenshot, and the model's
  reasoning with its action written in that grammar (the target).
- ``inspect``: an inspect_ai eval log (``<name>.eval``), one sample per episode scored by WAA's
  evaluator; inspect_ai's own writer and reader (the ``inspect`` extra).

Every export writes ``manifest.json``: the format, schema version, the filter, the runs (suite
path and fingerprint, agent, model), every exported task id, and whether held-out tasks were
allowed. Tasks of held-out suites (adapters/training/suites.py) are refused unless allowed.
Output goes to a temporary sibling directory renamed into place at the end, so an interrupted
export leaves nothing half-written; it holds the marker ``.waa-arena-output`` too, and
`overwrite` replaces only a directory that marker (or an earlier export's manifest) shows this
product wrote (adapters/training/output.py). Episodes and steps stream: memory stays flat.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from adapters.agents.action_grammar import ActionGrammarError, format_action, format_grammar_help
from adapters.agents.prompting import PROMPT_VERSION, SYSTEM_PROMPT, history_text
from adapters.benchmark import POINTER_ACTIONS, BenchmarkAction, StepRecord
from adapters.results.source import ResultsSource
from adapters.training.selection import Episode, EpisodeFilter, StepRow, iter_episodes
from adapters.training.output import OutputExists, OutputKind, read_json_file, replaced_directory, usable_output_dir
from adapters.training.suites import LeakageError, SuiteTexts

Format = Literal["sft", "trajectories", "inspect"]
ImageMode = Literal["files", "embed", "none"]
FORMATS: tuple[str, ...] = ("sft", "trajectories", "inspect")
TRAJECTORY_SCHEMA = "waa-arena.trajectory"
TRAJECTORY_SCHEMA_VERSION = 1
SFT_SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _earlier_export(manifest: Path) -> str | None:
    """None when `manifest` is that of an export written before the output marker (it names one
    of this product's schemas and formats), else why not."""
    try:
        parsed = read_json_file(manifest)
    except ValueError as exc:
        return str(exc)
    if not isinstance(parsed, dict) or parsed.get("format") not in FORMATS \
            or parsed.get("schema") != _schema(str(parsed.get("format"))) \
            or not isinstance(parsed.get("schema_version"), int):
        return f"its {MANIFEST} is not one this product writes: it names no waa-arena.* schema and format"
    return None


TRAINING_EXPORT = OutputKind(kind="training-export", title="training export", files=MANIFEST, earlier=_earlier_export)


class TrainingExportError(ValueError):
    """The export cannot be written as asked; the message names what and why."""


class TrainingOutputExists(OutputExists, TrainingExportError):
    """The export's directory holds something already."""


def system_prompt() -> str:
    """The system prompt (with the action grammar) that prompted agents get: the SFT samples'."""
    return SYSTEM_PROMPT.format(grammar=format_grammar_help())


@dataclass
class ExportSummary:
    """What an export wrote."""

    out_dir: Path
    format: str
    episodes: int = 0
    steps: int = 0
    samples: int = 0
    images: int = 0
    skipped_steps: list[str] = field(default_factory=list)  # why a step gave no sample (first 20)
    files: list[Path] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{self.format}: {self.episodes} episode(s), {self.steps} step(s)"
               + (f", {self.samples} sample(s)" if self.format == "sft" else "")
               + f", {self.images} image(s) -> {self.out_dir}"]
        out += [f"  {p}" for p in self.files]
        if self.skipped_steps:
            out.append(f"  skipped {len(self.skipped_steps)} step(s), e.g. {self.skipped_steps[0]}")
        return out


def export_training(
    source: ResultsSource,
    selection: EpisodeFilter,
    fmt: Format,
    out_dir: Path,
    *,
    images: ImageMode = "files",
    held_out: list[Path] | None = None,
    allow_held_out: bool = False,
    overwrite: bool = False,
    log_name: str | None = None,
) -> ExportSummary:
    """Write the selected episodes in format `fmt` to `out_dir` (see the module docstring).

    Refuses (LeakageError, nothing written) when a selected task belongs to a held-out suite,
    unless `allow_held_out`. TrainingExportError for an existing non-empty `out_dir` without
    `overwrite`, an empty selection, or a format/image combination that does not exist.
    """
    if fmt not in FORMATS:
        raise TrainingExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "sft" and images == "none":
        raise TrainingExportError("sft samples need their screenshots: use images 'files' or 'embed'")
    out_dir = usable_output_dir(out_dir, overwrite, TrainingOutputExists, refused=TrainingExportError,
                                kind=TRAINING_EXPORT)
    texts = SuiteTexts(held_out=list(held_out or []))
    task_ids, runs, leaked = _survey(source, selection, texts)
    if not task_ids:
        raise TrainingExportError(f"no episode of run(s) {', '.join(selection.run_ids)} matches the filter")
    if leaked and not allow_held_out:
        shown = "; ".join(f"{task} ({why})" for task, why in leaked[:3])
        raise LeakageError(
            f"refusing to export {len(leaked)} held-out task(s) as training data: {shown}"
            f"{' ...' if len(leaked) > 3 else ''}. Filter them out (--domain / --task) or pass --allow-held-out"
        )
    summary = ExportSummary(out_dir=out_dir, format=fmt)
    with replaced_directory(out_dir, TRAINING_EXPORT) as work:
        episodes = iter_episodes(source, selection)
        if fmt == "trajectories":
            _write_trajectories(episodes, work, images, texts, summary)
        elif fmt == "sft":
            _write_sft(episodes, work, images, texts, summary)
        else:
            from adapters.training.inspect_log import write_inspect_log

            write_inspect_log(episodes, work, texts, summary, log_name or f"waa-{selection.run_ids[0]}",
                              copy_image=lambda step, ep: _copy_image(step, ep, work, summary))
        manifest = _manifest(fmt, images, selection, runs, task_ids, leaked, allow_held_out, summary)
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
    summary.files = sorted(out_dir / p.relative_to(work) for p in summary.files) + [out_dir / MANIFEST]
    return summary


def _survey(source: ResultsSource, selection: EpisodeFilter,
            texts: SuiteTexts) -> tuple[list[str], dict[str, dict[str, Any]], list[tuple[str, str]]]:
    """(exported task ids, run descriptions, held-out (task, why)) without reading any step."""
    task_ids: dict[str, None] = {}
    runs: dict[str, dict[str, Any]] = {}
    leaked: dict[str, str] = {}
    for episode in iter_episodes(source, selection, with_steps=False):
        task_ids[episode.task_id] = None
        run = episode.run
        runs.setdefault(run.run_id, {"run_id": run.run_id, "agent": run.agent, "model": run.model_id,
                                     "model_checkpoint": run.model_checkpoint, "suite": run.suite,
                                     "suite_fingerprint": run.suite_hash, "started_at": run.started_at})
        why = texts.held_out_reason(run.suite, episode.task_id)
        if why:
            leaked.setdefault(episode.task_id, why)
    return list(task_ids), runs, list(leaked.items())


def _schema(fmt: str) -> str:
    """The schema a manifest names for format `fmt`."""
    return TRAJECTORY_SCHEMA if fmt == "trajectories" else f"waa-arena.{fmt}"


def _manifest(fmt: str, images: str, selection: EpisodeFilter, runs: dict[str, dict[str, Any]], task_ids: list[str],
              leaked: list[tuple[str, str]], allowed: bool, summary: ExportSummary) -> dict[str, Any]:
    return {
        "format": fmt,
        "schema": _schema(fmt),
        "schema_version": TRAJECTORY_SCHEMA_VERSION if fmt == "trajectories" else SFT_SCHEMA_VERSION,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "images": images,
        "filter": selection.model_dump(mode="json"),
        "runs": list(runs.values()),
        "task_ids": task_ids,
        "held_out_tasks_included": [{"task_id": t, "why": why} for t, why in leaked] if allowed else [],
        "counts": {"episodes": summary.episodes, "steps": summary.steps, "samples": summary.samples,
                   "images": summary.images},
        "prompt_version": PROMPT_VERSION,
    }


# -- shared pieces ------------------------------------------------------------------------------


def _safe(part: str) -> str:
    return _UNSAFE.sub("_", part)[:120] or "_"


def image_name(episode: Episode, step: StepRow) -> str:
    """Where a step's screenshot goes inside an export (relative, safe on every filesystem)."""
    return f"images/{_safe(episode.run.run_id)}/{_safe(episode.task_id)}/a{episode.attempt}_s{step.index:03d}.png"


def _copy_image(step: StepRow, episode: Episode, work: Path, summary: ExportSummary) -> str | None:
    """Copy (hard-link when possible) the step's screenshot into the export; its relative name."""
    if step.screenshot is None or not step.screenshot.is_file():
        return None
    name = image_name(episode, step)
    target = work / name
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(step.screenshot, target)
    except OSError:
        shutil.copyfile(step.screenshot, target)
    summary.images += 1
    return name


def _data_url(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def action_text(step: StepRow) -> str | None:
    """The step's action in the grammar, or None when it cannot be written (a stored action
    that no longer validates).

    An element click is written at the point it aimed at (the centre of the element's box, as
    stored in steps.click_x/click_y) when known: an element id means nothing beside a screenshot.
    """
    try:
        action = BenchmarkAction.model_validate(step.action)
        if action.type in POINTER_ACTIONS and action.x is None and step.click is not None:
            action = action.model_copy(update={"x": step.click[0], "y": step.click[1], "normalized": False})
        return format_action(action)
    except (ActionGrammarError, ValueError):
        return None


def _jsonl(path: Path) -> IO[str]:
    return path.open("w", encoding="utf-8")


def _line(handle: IO[str], record: dict[str, Any]) -> None:
    handle.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")


# -- trajectories -------------------------------------------------------------------------------


def _write_trajectories(episodes: Iterator[Episode], work: Path, images: ImageMode, texts: SuiteTexts,
                        summary: ExportSummary) -> None:
    target = work / "trajectories.jsonl"
    with _jsonl(target) as handle:
        for episode in episodes:
            steps = []
            for step in episode.steps:
                shot: str | None = None
                if images == "files":
                    shot = _copy_image(step, episode, work, summary)
                elif images == "embed" and step.screenshot is not None and step.screenshot.is_file():
                    shot = _data_url(step.screenshot)
                    summary.images += 1
                steps.append({
                    "index": step.index, "action": step.action, "action_text": action_text(step),
                    "reasoning": step.reasoning, "screenshot": shot, "window_title": step.window_title,
                    "agent_seconds": step.agent_seconds, "env_seconds": step.env_seconds, "error": step.error,
                    "observation_error": step.observation_error,
                    "click": list(step.click) if step.click else None,
                })
            summary.episodes += 1
            summary.steps += len(steps)
            _line(handle, {
                "schema": TRAJECTORY_SCHEMA, "schema_version": TRAJECTORY_SCHEMA_VERSION,
                "run_id": episode.run.run_id, "task_id": episode.task_id, "attempt": episode.attempt,
                "trial": episode.trial,
                "domain": episode.domain, "instruction": texts.instruction(episode.run.suite, episode.task_id),
                "suite": episode.run.suite, "suite_fingerprint": episode.run.suite_hash,
                "agent": episode.run.agent, "model": episode.run.model_id,
                "model_checkpoint": episode.run.model_checkpoint,
                "outcome": episode.outcome, "success": episode.success, "score": episode.score,
                "infeasible": episode.infeasible, "reason": episode.reason, "error": episode.error,
                "timings": episode.timings, "steps": steps,
            })
    summary.files.append(target)


# -- sft ----------------------------------------------------------------------------------------


def user_prompt(instruction: str, window_title: str | None, previous: list[StepRecord]) -> str:
    """The user turn of a sample: as a prompted agent in screenshot mode is asked."""
    parts = [f"Task: {instruction}", ""]
    if window_title:
        parts.append(f"Active window: {window_title}")
    parts += ["Previous actions:", history_text(previous, len(previous)), "", "What is the next action?"]
    return "\n".join(parts)


def _write_sft(episodes: Iterator[Episode], work: Path, images: ImageMode, texts: SuiteTexts,
               summary: ExportSummary) -> None:
    target = work / ("metadata.jsonl" if images == "files" else "train.jsonl")
    system = system_prompt()
    with _jsonl(target) as handle:
        for episode in episodes:
            summary.episodes += 1
            instruction = texts.instruction(episode.run.suite, episode.task_id)
            previous: list[StepRecord] = []
            for step in episode.steps:
                summary.steps += 1
                why = _sft_skip_reason(step, instruction)
                action = action_text(step)
                if why is None and action is None:
                    why = "its stored action cannot be written in the grammar"
                if why:
                    if len(summary.skipped_steps) < 20:
                        summary.skipped_steps.append(f"{episode.task_id} step {step.index}: {why}")
                else:
                    answer = f"{step.reasoning.strip()}\n{action}" if step.reasoning else str(action)
                    user = user_prompt(str(instruction), step.window_title, previous)
                    meta = {"run_id": episode.run.run_id, "task_id": episode.task_id, "attempt": episode.attempt,
                            "trial": episode.trial,
                            "step_index": step.index, "domain": episode.domain, "success": episode.success,
                            "suite_fingerprint": episode.run.suite_hash}
                    if images == "files":
                        name = _copy_image(step, episode, work, summary)
                        _line(handle, {"file_name": name, "messages": [
                            {"role": "system", "content": [{"type": "text", "text": system}]},
                            {"role": "user", "content": [{"type": "image", "text": None},
                                                         {"type": "text", "text": user}]},
                            {"role": "assistant", "content": [{"type": "text", "text": answer}]},
                        ], **meta})
                    else:
                        summary.images += 1
                        _line(handle, {"messages": [
                            {"role": "system", "content": system},
                            {"role": "user", "content": [
                                {"type": "text", "text": user},
                                {"type": "image_url", "image_url": {"url": _data_url(step.screenshot)}}]},  # type: ignore[arg-type]
                            {"role": "assistant", "content": answer},
                        ], "metadata": meta})
                    summary.samples += 1
                previous.append(_as_record(step))
    summary.files.append(target)


def _sft_skip_reason(step: StepRow, instruction: str | None) -> str | None:
    if instruction is None:
        return "the task's suite is no longer on disk (its instruction is unknown)"
    if step.screenshot is None or not step.screenshot.is_file():
        return "no screenshot was stored for it"
    return None


def _as_record(step: StepRow) -> StepRecord:
    try:
        action = BenchmarkAction.model_validate(step.action)
    except ValueError:
        action = BenchmarkAction(type="wait")  # type: ignore[arg-type]
    return StepRecord(index=step.index, action=action, error=step.error)


def asdict_summary(summary: ExportSummary) -> dict[str, Any]:
    """The summary as plain data (for artifacts)."""
    data = asdict(summary)
    data["out_dir"] = str(summary.out_dir)
    data["files"] = [str(p) for p in summary.files]
    return data


CopyImage = Callable[[StepRow, Episode], str | None]
