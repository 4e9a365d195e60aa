"""Episodes as inspect_ai eval logs (one `.eval` file per run), written by inspect_ai itself.

Each episode is a sample: its input the task's instruction, its messages the system prompt, then
per step the screen (window title and screenshot, the image copied into the export) and the
agent's reasoning with its action in the grammar; its score WAA's evaluator score with the
outcome as the answer and the evaluator's reason as the explanation. `inspect view` shows them;
`inspect_ai.log.read_eval_log` reads them back. Needs the `inspect` extra.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.training.selection import Episode, StepRow
from adapters.training.suites import SuiteTexts

if TYPE_CHECKING:
    from adapters.training.export import ExportSummary

SCORER = "waa_evaluator"


def write_inspect_log(episodes: Iterator[Episode], work: Path, texts: SuiteTexts, summary: ExportSummary,
                      name: str, copy_image: Callable[[StepRow, Episode], str | None]) -> None:
    """One inspect_ai log per run of `episodes` into `work` (files named `<name>[-<run>].eval`)."""
    try:
        from inspect_ai.log import write_eval_log
    except ImportError as exc:
        raise ImportError("the inspect format needs inspect_ai: pip install -e '.[inspect]'") from exc
    groups = [(run_id, list(group)) for run_id, group in groupby(episodes, key=lambda e: e.run.run_id)]
    for run_id, run_episodes in groups:
        target = work / (f"{name}.eval" if len(groups) == 1 else f"{name}-{run_id}.eval")
        write_eval_log(_log(run_episodes, texts, summary, copy_image), str(target), format="eval")
        summary.files.append(target)


def _log(episodes: list[Episode], texts: SuiteTexts, summary: ExportSummary,
         copy_image: Callable[[StepRow, Episode], str | None]) -> Any:
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalMetric, EvalResults, EvalSample, EvalScore, EvalSpec
    from inspect_ai.scorer import Score

    run = episodes[0].run
    samples = []
    for episode in episodes:
        instruction = texts.instruction(run.suite, episode.task_id) or f"(instruction of task {episode.task_id})"
        samples.append(EvalSample(
            id=f"{episode.task_id}#{episode.attempt}",
            epoch=1,
            input=instruction,
            target="",
            messages=_messages(episode, instruction, summary, copy_image),
            scores={SCORER: Score(value=float(episode.score or 0.0), answer=episode.outcome,
                                  explanation=episode.reason or episode.error or "")},
            metadata={"run_id": run.run_id, "task_id": episode.task_id, "attempt": episode.attempt,
                      "domain": episode.domain, "outcome": episode.outcome, "success": episode.success,
                      "timings": episode.timings, "suite_fingerprint": run.suite_hash},
        ))
        summary.episodes += 1
        summary.steps += len(episode.steps)
    solved = sum(1 for e in episodes if e.success)
    started = run.started_at.replace(tzinfo=dt.timezone.utc) if run.started_at else dt.datetime.now(dt.timezone.utc)
    return EvalLog(
        status="success",
        eval=EvalSpec(
            created=started.isoformat(timespec="seconds"),
            task="waa_arena",
            task_id=run.run_id,
            run_id=run.run_id,
            dataset=EvalDataset(name=Path(run.suite).name if run.suite else None, location=run.suite,
                                samples=len(episodes)),
            model=run.model_checkpoint or run.model_id or f"none/{run.agent}",
            config=EvalConfig(),
            metadata={"agent": run.agent, "suite_fingerprint": run.suite_hash},
        ),
        samples=samples,
        results=EvalResults(
            total_samples=len(episodes), completed_samples=len(episodes),
            scores=[EvalScore(name=SCORER, scorer=SCORER, metrics={
                "success_rate": EvalMetric(name="success_rate", value=solved / len(episodes))})],
        ),
    )


def _messages(episode: Episode, instruction: str, summary: ExportSummary,
              copy_image: Callable[[StepRow, Episode], str | None]) -> list[Any]:
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageUser, ContentImage, ContentText

    from adapters.training.export import action_text, system_prompt

    messages: list[Any] = [ChatMessageSystem(content=system_prompt()), ChatMessageUser(content=f"Task: {instruction}")]
    for step in episode.steps:
        content: list[Any] = [ContentText(text=f"Step {step.index + 1}. Active window: {step.window_title or '?'}")]
        image = copy_image(step, episode)
        if image:
            content.append(ContentImage(image=image))
        messages.append(ChatMessageUser(content=content))
        action = action_text(step) or f"({step.action_type})"
        messages.append(ChatMessageAssistant(content=f"{step.reasoning.strip()}\n{action}" if step.reasoning else action))
    return messages
