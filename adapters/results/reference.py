"""Reference trajectories, and how closely an agent's steps follow one.

A *reference trajectory* is a known way of solving one task. Two sources give them:

* **solution plans** (the scripted agent's ``solutions.json``, format in
  ``adapters/agents/scripted.py``): exact steps, pointer steps naming the element by
  accessibility role and name;
* **demonstrations** (``adapters/agents/demos.py``) whose ``source_task_id`` names the task they
  were recorded on: plain-text steps such as ``CLICK the "Save" button`` or
  ``PRESS Ctrl+S``, parsed into steps here (pointer steps then name the element by its visible
  name only). Demos without ``source_task_id`` are neighbours of a task, not a solution of it,
  and give no reference.

``wait`` steps are dropped from every reference: they pace a UI, they are not progress.

Step accuracy and grounding accuracy (``score_against_reference``)
-------------------------------------------------------------------

Inputs: the reference's steps R (no waits) and the agent's steps A of the task's final attempt,
in order, without ``wait`` actions. Steps whose action failed on the VM still count: the metric
judges what the agent chose, not what the VM did.

* Two steps are *the same operation* when their action types are equal (``click``,
  ``double_click`` and ``right_click`` are three different operations; so are ``done`` and
  ``fail``).
* A pair of the same operation is a *match* when additionally: ``type`` -- the typed texts are
  identical; ``key`` -- the same keys are pressed (key names normalised as the WAA translation
  does, ``Ctrl+S`` == ``s`` with modifier ``ctrl``, modifiers compared as a set); ``scroll`` --
  the same direction (any, when the reference names none); pointer operations -- the agent *hit*
  the reference element (below); ``done`` / ``fail`` -- always.
* A pointer step *hits* the reference element when (first rule that can be checked):
  1. the reference names an element and the action names one: the names are equal (case and
     runs of whitespace ignored) and, when both give a role, the roles are equal too;
  2. the reference gives a box (``target_bbox``-style) and the action's click point lies in it;
  3. the reference gives a point (a plan's ``click_at``): it lies inside the action's target box,
     or the action's click point is within ``POINT_TOLERANCE_PX`` pixels of it.
  When none of these can be checked (e.g. a coordinates-only click against a plan step that
  names an element but has no box), the hit is *unverifiable*: not a match, and left out of
  grounding accuracy.
* The *alignment* pairs reference and agent steps in order (each step used at most once, no
  crossing pairs, only same-operation pairs), chosen to maximise first the number of matches and
  then the number of pairs (a longest-common-subsequence dynamic programme; ties are broken
  towards earlier agent steps, so it is deterministic).

**Step accuracy** of a task = matches / |R|: the share of the reference's steps the agent
reproduced, in order (extra agent steps are not penalised). Over several tasks it is pooled:
all matches / all reference steps.

**Grounding accuracy** of a task = hits / verifiable pointer pairs: of the aligned pairs whose
reference step is a pointer step and whose hit could be checked, the share on the reference
element. None when there is no such pair. Pooled over tasks the same way.

Not counted: tasks without a reference; tasks whose final attempt was an infrastructure error or
a setup failure (the agent never had a fair go; ``adapters/results/metrics.py`` leaves them out);
``wait`` steps on either side; the ``window`` a plan step names (actions do not record it);
element ids (they differ between runs).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from adapters.agents.demos import Demo, load_demo_library
from adapters.agents.scripted import PlanError, load_plans
from adapters.benchmark import BBox, BenchmarkAction
from adapters.waa.actions import ActionTranslationError, normalize_key

POINT_TOLERANCE_PX = 10.0
"""How far (pixels) a click may land from a reference point and still hit it."""

ReferenceKind = Literal["click", "double_click", "right_click", "type", "key", "scroll", "done", "fail"]
Direction = Literal["up", "down", "left", "right"]
POINTER_KINDS: frozenset[str] = frozenset({"click", "double_click", "right_click"})
_KINDS: dict[str, ReferenceKind] = {kind: kind for kind in get_args(ReferenceKind)}
_DIRECTIONS: dict[str, Direction] = {direction: direction for direction in get_args(Direction)}

# Left/right variants of a modifier count as the modifier.
_MODIFIERS = {
    "ctrl": "ctrl", "ctrlleft": "ctrl", "ctrlright": "ctrl", "alt": "alt", "altleft": "alt",
    "altright": "alt", "shift": "shift", "shiftleft": "shift", "shiftright": "shift", "win": "win",
    "winleft": "win", "winright": "win", "command": "win",
}


class ReferenceLoadError(ValueError):
    """A reference source is unreadable or malformed; the message names the file, task and step."""


class ReferenceStep(BaseModel):
    """One step of a reference trajectory (never a wait)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ReferenceKind
    role: str | None = None
    name: str | None = None
    window: str | None = None
    bbox: BBox | None = None
    point: tuple[float, float] | None = None
    text: str | None = None
    key: str | None = None
    modifiers: tuple[str, ...] = ()
    direction: Direction | None = None
    description: str = ""
    """The step as written in its source (a plan step's JSON or a demo sentence), for reports."""

    @model_validator(mode="after")
    def _complete(self) -> ReferenceStep:
        if self.kind in POINTER_KINDS and self.name is None and self.bbox is None and self.point is None:
            raise ValueError(f"{self.kind} needs an element name, a box or a point")
        if self.kind == "type" and self.text is None:
            raise ValueError("type needs text")
        if self.kind == "key" and not self.key:
            raise ValueError("key needs a key name")
        return self

    @property
    def is_pointer(self) -> bool:
        """True for click, double_click and right_click."""
        return self.kind in POINTER_KINDS


class ReferenceTrajectory(BaseModel):
    """A known solution of one task."""

    model_config = ConfigDict(frozen=True)

    task_id: str = Field(min_length=1)
    source: Literal["solution_plan", "demo"]
    source_ref: str
    """Where it came from: the plans file, or the demo id."""
    steps: tuple[ReferenceStep, ...]
    waits_dropped: int = 0


class AgentStep(BaseModel):
    """One stored agent step, as the metrics see it."""

    step_index: int
    action: BenchmarkAction | None
    """None when the stored action JSON is not a valid action (never a match)."""
    click: tuple[float, float] | None = None
    """The screen point a pointer action aimed at, in pixels, when known."""


class StepPair(BaseModel):
    """One aligned (reference step, agent step) pair."""

    reference_index: int
    step_index: int
    matched: bool
    hit: bool | None = None
    """Pointer pairs: whether the agent hit the reference element; None when unverifiable."""


class ReferenceCounts(BaseModel):
    """The counts step and grounding accuracy are ratios of (one task, or pooled over tasks)."""

    reference_steps: int
    matched_steps: int
    pointer_pairs: int
    """Aligned pointer pairs whose hit could be checked (grounding's denominator)."""
    pointer_hits: int
    pointer_unverifiable: int

    @property
    def step_accuracy(self) -> float | None:
        """matched_steps / reference_steps (None without reference steps)."""
        return self.matched_steps / self.reference_steps if self.reference_steps else None

    @property
    def grounding_accuracy(self) -> float | None:
        """pointer_hits / pointer_pairs (None when no pointer pair could be checked)."""
        return self.pointer_hits / self.pointer_pairs if self.pointer_pairs else None


class ReferenceScore(ReferenceCounts):
    """Step and grounding accuracy of one task's final attempt against its reference."""

    task_id: str
    source: str
    agent_steps: int
    pairs: list[StepPair] = Field(default_factory=list)


# --- solution plans ----------------------------------------------------------------------------


def reference_from_plan(task_id: str, plan: Sequence[Any], source_ref: str = "") -> ReferenceTrajectory:
    """A reference from one scripted-agent plan; ReferenceLoadError naming the task and step if malformed."""
    steps: list[ReferenceStep] = []
    waits = 0
    for index, raw in enumerate(plan):
        where = f"{source_ref or 'plan'}: task {task_id!r}, step {index}"
        if not isinstance(raw, Mapping) or not raw:
            raise ReferenceLoadError(f"{where}: not a step object: {raw!r}")
        kind = next(iter(raw))
        if kind == "wait":
            waits += 1
            continue
        try:
            steps.append(_plan_step(kind, raw))
        except (ValueError, TypeError, KeyError) as exc:
            raise ReferenceLoadError(f"{where}: cannot read {raw!r}: {exc}") from exc
    return ReferenceTrajectory(
        task_id=task_id, source="solution_plan", source_ref=source_ref, steps=tuple(steps), waits_dropped=waits
    )


def _plan_step(kind: str, raw: Mapping[str, Any]) -> ReferenceStep:
    """One non-wait plan step (the kinds ScriptedAgent understands)."""
    description = json.dumps(raw, ensure_ascii=False)
    value = raw[kind]
    if kind in POINTER_KINDS:
        if not isinstance(value, Mapping):
            raise ValueError(f"{kind} needs an object with role and name")
        return ReferenceStep(
            kind=_KINDS[kind], role=value.get("role"), name=value.get("name"), window=value.get("window"),
            description=description,
        )
    if kind == "click_at":
        x, y = value
        return ReferenceStep(kind="click", point=(float(x), float(y)), description=description)
    if kind == "type":
        return ReferenceStep(kind="type", text=str(value), description=description)
    if kind == "key":
        return ReferenceStep(
            kind="key", key=str(value), modifiers=tuple(str(m).lower() for m in raw.get("modifiers", [])),
            description=description,
        )
    if kind in ("done", "fail"):
        return ReferenceStep(kind=_KINDS[kind], description=description)
    raise ValueError(f"unknown step kind {kind!r}")


def load_solution_references(path: Path) -> dict[str, ReferenceTrajectory]:
    """References by task id from a solutions file (``solutions.json``); ReferenceLoadError naming it."""
    path = Path(path)
    try:
        plans = load_plans(path)
    except PlanError as exc:
        raise ReferenceLoadError(str(exc)) from exc
    return {task_id: reference_from_plan(task_id, plan, str(path)) for task_id, plan in plans.items()}


# --- demonstrations ----------------------------------------------------------------------------

# Upper-case verbs outside double quotes start a clause; quoted text is skipped so a TYPE "DONE"
# does not end the step.
_DEMO_TOKEN = re.compile(r'"[^"]*"|\b(DOUBLE_CLICK|RIGHT_CLICK|CLICK|TYPE|PRESS|SCROLL|DONE|FAIL|WAIT)\b')
_QUOTED = re.compile(r'"([^"]*)"')
_KEY_COMBO = re.compile(r'^\s*"?([A-Za-z0-9]+(?:\s*\+\s*[A-Za-z0-9]+)*)"?')
_DIRECTION = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)


def parse_demo_step(text: str) -> tuple[list[ReferenceStep], int]:
    """The reference steps one demo sentence describes, and how many WAITs it had.

    A sentence may hold several clauses ("CLICK the "Name Box" and TYPE "A11", then PRESS
    Enter"). ValueError when it has no verb or a clause lacks its argument.
    """
    clauses: list[tuple[str, str]] = []
    verb: str | None = None
    start = 0
    for match in _DEMO_TOKEN.finditer(text):
        if match.group(1) is None:
            continue
        if verb is not None:
            clauses.append((verb, text[start:match.start()]))
        verb, start = match.group(1), match.end()
    if verb is None:
        raise ValueError(f"no action verb (CLICK, TYPE, PRESS, SCROLL, DONE, FAIL) in {text!r}")
    clauses.append((verb, text[start:]))
    steps = [_demo_clause(v, rest, text) for v, rest in clauses if v != "WAIT"]
    return steps, sum(1 for v, _ in clauses if v == "WAIT")


def _demo_clause(verb: str, rest: str, sentence: str) -> ReferenceStep:
    """One clause of a demo sentence, e.g. ("PRESS", " Ctrl+S to open ...")."""
    quoted = _QUOTED.search(rest)
    if verb in ("CLICK", "DOUBLE_CLICK", "RIGHT_CLICK"):
        if quoted is None:
            raise ValueError(f"{verb} names no element in double quotes in {sentence!r}")
        return ReferenceStep(kind=_KINDS[verb.lower()], name=quoted.group(1), description=sentence)
    if verb == "TYPE":
        if quoted is None:
            raise ValueError(f"TYPE gives no text in double quotes in {sentence!r}")
        return ReferenceStep(kind="type", text=quoted.group(1), description=sentence)
    if verb == "PRESS":
        combo = _KEY_COMBO.match(rest)
        if combo is None:
            raise ValueError(f"PRESS names no key in {sentence!r}")
        parts = [p.strip() for p in combo.group(1).split("+")]
        return ReferenceStep(
            kind="key", key=parts[-1], modifiers=tuple(p.lower() for p in parts[:-1]), description=sentence
        )
    if verb == "SCROLL":
        direction = _DIRECTION.search(rest)
        return ReferenceStep(
            kind="scroll", direction=_DIRECTIONS[direction.group(1).lower()] if direction else None,
            description=sentence,
        )
    return ReferenceStep(kind=_KINDS[verb.lower()], description=sentence)


def reference_from_demo(demo: Demo) -> ReferenceTrajectory:
    """The reference a demo recorded on a task gives; ReferenceLoadError naming the demo and step."""
    if not demo.source_task_id:
        raise ReferenceLoadError(f"demo {demo.demo_id!r} has no source_task_id: it is not a recording of a task")
    steps: list[ReferenceStep] = []
    waits = 0
    for index, sentence in enumerate(demo.steps):
        try:
            parsed, step_waits = parse_demo_step(sentence)
        except ValueError as exc:
            raise ReferenceLoadError(f"demo {demo.demo_id!r}, step {index}: {exc}") from exc
        steps.extend(parsed)
        waits += step_waits
    return ReferenceTrajectory(
        task_id=demo.source_task_id, source="demo", source_ref=demo.demo_id, steps=tuple(steps), waits_dropped=waits
    )


def load_demo_references(directory: Path) -> dict[str, ReferenceTrajectory]:
    """References by task id from a demo library: one per task, from its demos with a source_task_id.

    When several demos were recorded on one task, the one with the smallest demo_id is used.
    Demos without source_task_id are skipped. ReferenceLoadError naming the file or demo on bad input.
    """
    try:
        demos = load_demo_library(Path(directory))
    except ValueError as exc:  # DemoLibraryError
        raise ReferenceLoadError(str(exc)) from exc
    references: dict[str, ReferenceTrajectory] = {}
    for demo in demos:  # sorted by demo_id
        if demo.source_task_id and demo.source_task_id not in references:
            references[demo.source_task_id] = reference_from_demo(demo)
    return references


def load_references(
    solutions: Path | None = None, demo_library: Path | None = None
) -> dict[str, ReferenceTrajectory]:
    """References from a solutions file and/or a demo library; a task's solution plan wins over a demo
    (plans name elements by role and name, demos by visible name only)."""
    references: dict[str, ReferenceTrajectory] = {}
    if demo_library is not None:
        references.update(load_demo_references(demo_library))
    if solutions is not None:
        references.update(load_solution_references(solutions))
    return references


# --- scoring -----------------------------------------------------------------------------------


def _norm_text(value: str) -> str:
    return " ".join(value.split()).casefold()


def _key_name(name: str) -> str:
    """The WAA translation's name for a key; unknown names are compared as written (lower case)."""
    try:
        return normalize_key(name)
    except ActionTranslationError:
        return name.strip().lower()


def canonical_keys(key: str, modifiers: Iterable[str] = ()) -> tuple[frozenset[str], tuple[str, ...]]:
    """(modifiers, other keys) of a key press: ``("s", ["ctrl"])`` and ``("Ctrl+S", [])`` are equal."""
    parts = [key] if len(key) == 1 else [p for p in key.split("+") if p.strip()]
    if len(key) > 1 and key.endswith("++"):  # "ctrl++": ctrl and the plus key
        parts.append("+")
    names = [_key_name(p) for p in [*modifiers, *parts]]
    mods = frozenset(_MODIFIERS[n] for n in names if n in _MODIFIERS)
    return mods, tuple(n for n in names if n not in _MODIFIERS)


def _inside(point: tuple[float, float], box: Sequence[float]) -> bool:
    left, top, right, bottom = box
    return left <= point[0] <= right and top <= point[1] <= bottom


def pointer_hit(reference: ReferenceStep, action: BenchmarkAction, click: tuple[float, float] | None) -> bool | None:
    """Whether a pointer action hit the reference's element; None when that cannot be checked.

    Rules, first checkable one wins: element name (+ role when both give one); click point in
    the reference box; reference point in the action's box or within POINT_TOLERANCE_PX.
    """
    if reference.name is not None and action.target_name is not None:
        if _norm_text(reference.name) != _norm_text(action.target_name):
            return False
        if reference.role is not None and action.target_role is not None:
            return _norm_text(reference.role) == _norm_text(action.target_role)
        return True
    if reference.bbox is not None and click is not None:
        return _inside(click, reference.bbox)
    if reference.point is not None:
        if action.target_bbox is not None:
            return _inside(reference.point, action.target_bbox)
        if click is not None:
            return math.dist(reference.point, click) <= POINT_TOLERANCE_PX
    return None


def same_operation(reference: ReferenceStep, step: AgentStep) -> bool:
    """True when the agent step has the reference step's action type."""
    return step.action is not None and step.action.type.value == reference.kind


def step_matches(reference: ReferenceStep, step: AgentStep) -> bool:
    """True when the agent step reproduces the reference step (see the module docstring)."""
    action = step.action
    if action is None or not same_operation(reference, step):
        return False
    if reference.kind == "type":
        return action.text == reference.text
    if reference.kind == "key":
        assert reference.key is not None and action.key is not None  # both validated on creation
        return canonical_keys(reference.key, reference.modifiers) == canonical_keys(action.key, action.modifiers)
    if reference.kind == "scroll":
        return reference.direction is None or reference.direction == action.scroll_direction
    if reference.is_pointer:
        return pointer_hit(reference, action, step.click) is True
    return True  # done, fail


def _is_wait(step: AgentStep) -> bool:
    return step.action is not None and step.action.type.value == "wait"


def align(reference: Sequence[ReferenceStep], steps: Sequence[AgentStep]) -> list[StepPair]:
    """The in-order alignment that maximises (matches, pairs); see the module docstring."""
    n, m = len(reference), len(steps)
    # best[i][j]: (matches, pairs) achievable with reference[i:] and steps[j:].
    best = [[(0, 0)] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            options = [best[i + 1][j], best[i][j + 1]]
            if same_operation(reference[i], steps[j]):
                tail = best[i + 1][j + 1]
                options.append((tail[0] + step_matches(reference[i], steps[j]), tail[1] + 1))
            best[i][j] = max(options)
    pairs: list[StepPair] = []
    i = j = 0
    while i < n and j < m:
        ref, step = reference[i], steps[j]
        if same_operation(ref, step):
            matched = step_matches(ref, step)
            tail = best[i + 1][j + 1]
            if (tail[0] + matched, tail[1] + 1) == best[i][j]:
                hit = pointer_hit(ref, step.action, step.click) if ref.is_pointer and step.action else None
                pairs.append(StepPair(reference_index=i, step_index=step.step_index, matched=matched, hit=hit))
                i, j = i + 1, j + 1
                continue
        if best[i][j + 1] == best[i][j]:
            j += 1
        else:
            i += 1
    return pairs


def score_against_reference(reference: ReferenceTrajectory, steps: Sequence[AgentStep]) -> ReferenceScore:
    """Step and grounding accuracy of one attempt's steps against a reference (module docstring)."""
    agent_steps = [s for s in steps if not _is_wait(s)]
    pairs = align(reference.steps, agent_steps)
    pointer = [p for p in pairs if reference.steps[p.reference_index].is_pointer]
    return ReferenceScore(
        task_id=reference.task_id,
        source=reference.source,
        reference_steps=len(reference.steps),
        agent_steps=len(agent_steps),
        matched_steps=sum(p.matched for p in pairs),
        pointer_pairs=sum(p.hit is not None for p in pointer),
        pointer_hits=sum(p.hit is True for p in pointer),
        pointer_unverifiable=sum(p.hit is None for p in pointer),
        pairs=pairs,
    )
