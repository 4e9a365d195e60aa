"""A scripted agent that follows a per-task plan through the public action API only.

A plan is a list of steps (the bundled suite ships them in `solutions.json`):
`{"click": {"role": R, "name": N, "window": W?}}` (also double_click / right_click),
`{"click_at": [x, y]}`, `{"type": text}`, `{"key": k, "modifiers": [...]}`, `{"wait": s}`,
`{"done": true}`, `{"fail": true}`. Element steps are grounded in the current observation's
accessibility tree, so the agent sees exactly what any other agent sees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from adapters.benchmark import (
    ActionType,
    BenchmarkAction,
    BenchmarkAgent,
    BenchmarkObservation,
    BenchmarkTask,
    ObservationNeeds,
    StepRecord,
    UIElement,
)

_POINTER_STEPS = {"click": ActionType.CLICK, "double_click": ActionType.DOUBLE_CLICK, "right_click": ActionType.RIGHT_CLICK}


class PlanError(ValueError):
    """A plan step is malformed; the message names the task and the step."""


def load_plans(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Plans by task id from a JSON file, with a clear error naming the file when malformed."""
    try:
        plans = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: cannot read plans: {exc}") from exc
    if not isinstance(plans, dict) or not all(isinstance(v, list) for v in plans.values()):
        raise PlanError(f"{path}: expected an object mapping task ids to lists of steps")
    return plans


class ScriptedAgent(BenchmarkAgent):
    """Replays a known solution; waits (a bounded number of times) for elements to appear."""

    name = "scripted"

    def __init__(self, plans: dict[str, list[dict[str, Any]]], max_element_waits: int = 3) -> None:
        self.plans = plans
        self.max_element_waits = max_element_waits
        self._cursor = 0
        self._waits = 0

    def reset(self, task: BenchmarkTask) -> None:
        self._cursor = 0
        self._waits = 0

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "plans": len(self.plans)}

    def observation_needs(self) -> ObservationNeeds:
        """Plans find their elements in the accessibility tree (windows are its top level)."""
        return ObservationNeeds(window=False)

    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        plan = self.plans.get(task.task_id)
        if plan is None:
            return BenchmarkAction(type=ActionType.FAIL, reasoning=f"no plan for task {task.task_id}")
        if self._cursor >= len(plan):
            return BenchmarkAction(type=ActionType.DONE, reasoning="plan finished")
        step = plan[self._cursor]
        action = self._to_action(task, step, observation)
        if action is None:  # element not on screen yet: give the UI a moment
            self._waits += 1
            if self._waits > self.max_element_waits:
                return BenchmarkAction(type=ActionType.FAIL, reasoning=f"element never appeared: {step}")
            return BenchmarkAction(type=ActionType.WAIT, seconds=0.5, reasoning=f"waiting for {step}")
        self._cursor += 1
        self._waits = 0
        return action

    def _to_action(self, task: BenchmarkTask, step: dict[str, Any], observation: BenchmarkObservation) -> BenchmarkAction | None:
        where = f"plan of {task.task_id}, step {self._cursor}"
        if not isinstance(step, dict) or len(step) == 0:
            raise PlanError(f"{where}: not a step object: {step!r}")
        kind = next(iter(step))
        if kind in _POINTER_STEPS:
            target = step[kind]
            element = find_element(observation.accessibility_tree, target)
            if element is None:
                return None
            return BenchmarkAction(
                type=_POINTER_STEPS[kind],
                target_node_id=element.node_id,
                target_bbox=element.bbox,
                target_role=element.role,
                target_name=element.name,
                reasoning=f"{kind} {target}",
            )
        if kind == "click_at":
            x, y = step[kind]
            return BenchmarkAction(type=ActionType.CLICK, x=x, y=y)
        if kind == "type":
            return BenchmarkAction(type=ActionType.TYPE, text=str(step[kind]))
        if kind == "key":
            return BenchmarkAction(type=ActionType.KEY, key=str(step[kind]), modifiers=list(step.get("modifiers", [])))
        if kind == "wait":
            return BenchmarkAction(type=ActionType.WAIT, seconds=float(step[kind]))
        if kind == "done":
            return BenchmarkAction(type=ActionType.DONE)
        if kind == "fail":
            return BenchmarkAction(type=ActionType.FAIL)
        raise PlanError(f"{where}: unknown step kind {kind!r}")


def find_element(tree: UIElement | None, target: dict[str, Any]) -> UIElement | None:
    """The first element with the target's role and name, inside the window named by `window`."""
    if tree is None:
        return None
    scope = [tree]
    window = target.get("window")
    if window:
        scope = [w for w in tree.children if window.lower() in w.name.lower()]
    for root in scope:
        found = root.find(role=target.get("role"), name=target.get("name"))
        if found is not None and found.bbox is not None:
            return found
    return None
