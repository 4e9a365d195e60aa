"""The canonical benchmark schema shared by every adapter, agent, store and flow.

Everything that crosses a module border is one of these pydantic models, so a task loaded from
WAA's JSON, an action chosen by a model and a result written to DuckDB all have one shape.
Nothing here knows about Prefect, HTTP or a particular benchmark.
"""

from __future__ import annotations

import abc
import enum
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Part of the schema, defined apart so that command lines list the kinds without pydantic.
from adapters.outcome_kind import UNSOUND_OUTCOMES as UNSOUND_OUTCOMES
from adapters.outcome_kind import OutcomeKind as OutcomeKind

BBox = tuple[int, int, int, int]
"""A screen rectangle in pixels: (left, top, right, bottom)."""


class UIElement(BaseModel):
    """One node of an accessibility tree, with the id an agent can target."""

    node_id: str
    role: str
    name: str = ""
    bbox: BBox | None = None
    text: str = ""
    children: list[UIElement] = Field(default_factory=list)
    attributes: dict[str, str] = Field(default_factory=dict)

    def iter(self) -> Iterator[UIElement]:
        """Depth-first walk over this node and all its descendants."""
        yield self
        for child in self.children:
            yield from child.iter()

    def find(
        self, *, role: str | None = None, name: str | None = None, node_id: str | None = None
    ) -> UIElement | None:
        """The first descendant (or self) matching every given criterion, case-insensitively."""
        for node in self.iter():
            if node_id is not None and node.node_id != node_id:
                continue
            if role is not None and node.role.lower() != role.lower():
                continue
            if name is not None and node.name.lower() != name.lower():
                continue
            return node
        return None

    @property
    def center(self) -> tuple[int, int] | None:
        """Pixel centre of the bounding box, or None when the element has no box."""
        if self.bbox is None:
            return None
        left, top, right, bottom = self.bbox
        return (left + right) // 2, (top + bottom) // 2


def task_fingerprint(definition: Mapping[str, Any]) -> str:
    """sha256 (hex, first 16 characters) of a task definition as canonical JSON (sorted keys,
    no whitespace): the same definition gives the same fingerprint on any machine."""
    canonical = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


class BenchmarkTask(BaseModel):
    """A task as the pipeline sees it, independent of the benchmark's file format."""

    task_id: str
    instruction: str
    domain: str
    initial_state_ref: str | None = None
    time_limit_steps: int = Field(default=15, ge=1)
    raw_config: dict[str, Any] = Field(default_factory=dict)
    evaluation_spec: dict[str, Any] = Field(default_factory=dict)

    @property
    def setup_steps(self) -> list[dict[str, Any]]:
        """The task's setup steps (WAA's `config` list)."""
        return list(self.raw_config.get("config") or [])

    @property
    def fingerprint(self) -> str:
        """The hash of this exact task definition (its file's content: a changed instruction,
        setup step or evaluator changes it; re-indenting the file does not). Results carry it,
        so comparisons pair only results of the same task version."""
        return task_fingerprint(self.raw_config)

    @property
    def infeasible(self) -> bool:
        """True when the task can only be solved by declaring it infeasible (WAA's FAIL)."""
        func = self.evaluation_spec.get("func")
        return func == "infeasible" or (isinstance(func, list) and "infeasible" in func)


class BenchmarkObservation(BaseModel):
    """What an agent sees after a reset or a step."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    screenshot: bytes | None = None
    screenshot_path: str | None = None
    viewport: tuple[int, int] | None = None
    accessibility_tree: UIElement | None = None
    dom_html: str | None = None
    url: str | None = None
    window_title: str | None = None
    focused_element: UIElement | None = None
    raw_observation: dict[str, Any] = Field(default_factory=dict)


class ObservationNeeds(BaseModel):
    """Which parts of an observation an agent reads; the environment fetches only those.

    The screenshot is always taken: reports show it and settling compares it. The accessibility
    tree is slow on real VMs (seconds) and the window information (WAA's /obs_winagent) renders a
    picture of the foreground window, so agents that do not read them should say so.
    """

    model_config = ConfigDict(frozen=True)

    accessibility_tree: bool = True
    window: bool = True  # the foreground window's title and the open windows' names


class ActionType(str, enum.Enum):
    """Every action an agent may take."""

    CLICK = "click"
    DOUBLE_CLICK = "double_click"
    RIGHT_CLICK = "right_click"
    TYPE = "type"
    KEY = "key"
    SCROLL = "scroll"
    DRAG = "drag"
    ANSWER = "answer"
    DONE = "done"
    FAIL = "fail"
    WAIT = "wait"

    @property
    def ends_episode(self) -> bool:
        return self in (ActionType.DONE, ActionType.FAIL, ActionType.ANSWER)


POINTER_ACTIONS = frozenset({ActionType.CLICK, ActionType.DOUBLE_CLICK, ActionType.RIGHT_CLICK})
"""Actions that aim at one screen point or element."""


class BenchmarkAction(BaseModel):
    """One agent action. Coordinates are pixels unless `normalized` is set (then in [0, 1])."""

    type: ActionType
    x: float | None = None
    y: float | None = None
    normalized: bool = False
    target_node_id: str | None = None
    target_bbox: BBox | None = None
    target_role: str | None = None
    target_name: str | None = None
    text: str | None = None
    key: str | None = None
    modifiers: list[str] = Field(default_factory=list)
    scroll_direction: Literal["up", "down", "left", "right"] | None = None
    scroll_amount: int = Field(default=3, ge=1, le=100)
    end_x: float | None = None
    end_y: float | None = None
    answer: str | None = None
    seconds: float = Field(default=1.0, ge=0, le=60)
    reasoning: str | None = None
    raw_action: Any = None

    def aim_point(self, screen: tuple[int, int] | None = None) -> tuple[float, float] | None:
        """Where a pointer action (or a drag's start) aims, in screenshot pixels, if known.

        Its x/y, else the centre of its target box. Normalised coordinates are placed on a
        `screen` of (width, height) pixels the way the WAA translation does (x * (width - 1));
        without one they cannot be placed. An element id alone has no position. None for those,
        and for actions that do not point.
        """
        if self.type not in POINTER_ACTIONS and self.type is not ActionType.DRAG:
            return None
        if self.x is not None and self.y is not None:
            if not self.normalized:
                return float(self.x), float(self.y)
            if screen is not None:
                return self.x * (screen[0] - 1), self.y * (screen[1] - 1)
        if self.target_bbox is not None:
            left, top, right, bottom = self.target_bbox
            return (left + right) / 2, (top + bottom) / 2
        return None

    @field_validator("modifiers")
    @classmethod
    def _modifier_names(cls, value: list[str]) -> list[str]:
        allowed = {"ctrl", "alt", "shift", "win"}
        lowered = [m.lower() for m in value]
        bad = [m for m in lowered if m not in allowed]
        if bad:
            raise ValueError(f"unknown modifier(s) {bad}; allowed: {sorted(allowed)}")
        return lowered

    @model_validator(mode="after")
    def _required_fields(self) -> BenchmarkAction:
        t = self.type
        has_point = self.x is not None and self.y is not None
        if t in POINTER_ACTIONS and not (has_point or self.target_node_id or self.target_bbox):
            raise ValueError(f"{t.value} needs x/y, target_node_id or target_bbox")
        if t is ActionType.TYPE and self.text is None:
            raise ValueError("type needs text")
        if t is ActionType.KEY and not self.key:
            raise ValueError("key needs a key name")
        if t is ActionType.SCROLL and self.scroll_direction is None:
            raise ValueError("scroll needs scroll_direction")
        if t is ActionType.DRAG and not (has_point and self.end_x is not None and self.end_y is not None):
            raise ValueError("drag needs x, y, end_x and end_y")
        if t is ActionType.ANSWER and self.answer is None:
            raise ValueError("answer needs answer text")
        if self.normalized:
            for name in ("x", "y", "end_x", "end_y"):
                value = getattr(self, name)
                if value is not None and not 0.0 <= value <= 1.0:
                    raise ValueError(f"normalized {name}={value} is outside [0, 1]")
        return self

    def describe(self) -> str:
        """A short human-readable form for logs and reports."""
        parts = [self.type.value]
        if self.target_node_id:
            parts.append(f"[{self.target_node_id}]")
        elif self.x is not None:
            parts.append(f"({self.x:g}, {self.y:g}{' norm' if self.normalized else ''})")
        if self.text is not None:
            parts.append(repr(self.text))
        if self.key:
            parts.append("+".join([*self.modifiers, self.key]))
        if self.scroll_direction:
            parts.append(f"{self.scroll_direction} x{self.scroll_amount}")
        if self.answer is not None:
            parts.append(repr(self.answer))
        return " ".join(parts)


class ModelUsage(BaseModel):
    """Tokens and money a model agent spent (one step, or summed over an episode)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0  # of the priced calls only
    # Models called without a known price: their calls cost something nobody knows, so the usage's
    # cost is "unpriced" (stored as NULL), never $0.
    unpriced: list[str] = Field(default_factory=list)

    def __add__(self, other: ModelUsage) -> ModelUsage:
        return ModelUsage(
            calls=self.calls + other.calls,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            unpriced=list(dict.fromkeys(self.unpriced + other.unpriced)),
        )


class AgentInfrastructureError(RuntimeError):
    """The agent's backend (a model API, a policy server) failed: retried, never scored."""


class UnparseableReplyError(ValueError):
    """A model kept answering with something that is not an action; carries the raw reply."""

    def __init__(self, message: str, raw_reply: str) -> None:
        super().__init__(message)
        self.raw_reply = raw_reply


class StepRecord(BaseModel):
    """One step of an episode, as stored for trajectories and reports."""

    index: int
    action: BenchmarkAction
    screenshot_path: str | None = None
    window_title: str | None = None
    agent_seconds: float = 0.0
    env_seconds: float = 0.0
    error: str | None = None
    usage: ModelUsage | None = None
    # Why the observation after this step lacks a part (e.g. the accessibility tree the agent's
    # own typing made unreadable, adapters/outcomes.py R5); None when it was complete.
    observation_error: str | None = None
    # How the environment delivered the action, e.g. "pyautogui.write through /execute: 40000
    # characters in 40 piece(s) of at most 1000"; None when it sent nothing.
    delivery: str | None = None


class BenchmarkResult(BaseModel):
    """The single stored result of one task attempt."""

    task_id: str
    domain: str = ""
    outcome: OutcomeKind
    success: bool = False
    score: float = Field(default=0.0, ge=0.0, le=1.0)
    infeasible: bool = False
    steps: list[StepRecord] = Field(default_factory=list)
    num_steps: int = 0
    error: str | None = None
    reason: str | None = None
    total_time_seconds: float = 0.0
    timings: dict[str, float] = Field(default_factory=dict)
    usage: ModelUsage = Field(default_factory=ModelUsage)
    agent_details: dict[str, Any] = Field(default_factory=dict)
    """The agent's configuration as it stood after this task (e.g. the demo it retrieved)."""
    attempt: int = 1
    # Which of the run's repeated trials of the task this attempt belongs to (each trial from a
    # fresh reset; `attempt` counts infrastructure retries and keeps counting across trials).
    trial: int = Field(default=1, ge=1)
    vm_id: str | None = None
    task_fingerprint: str | None = None  # BenchmarkTask.fingerprint of the task attempted

    @model_validator(mode="after")
    def _consistent(self) -> BenchmarkResult:
        if self.success != (self.outcome is OutcomeKind.SUCCESS):
            raise ValueError(f"success={self.success} contradicts outcome={self.outcome.value}")
        return self


class Trajectory(BaseModel):
    """A recorded episode from a static dataset."""

    task_id: str
    steps: list[StepRecord] = Field(default_factory=list)
    source: str = ""


class BenchmarkAdapter(abc.ABC):
    """An interactive benchmark: tasks can be reset, stepped through and evaluated."""

    @abc.abstractmethod
    def list_tasks(self, domain: str | None = None) -> list[BenchmarkTask]:
        """All tasks, optionally only those of one domain."""

    @abc.abstractmethod
    def load_task(self, task_id: str) -> BenchmarkTask:
        """One task by id; raises KeyError naming the id when unknown."""

    @abc.abstractmethod
    def reset(self, task: BenchmarkTask) -> BenchmarkObservation:
        """Bring the environment to the task's initial state and return the first observation."""

    @abc.abstractmethod
    def step(self, action: BenchmarkAction) -> tuple[BenchmarkObservation, bool, dict[str, Any]]:
        """Apply one action; returns (observation, episode done, info)."""

    @abc.abstractmethod
    def evaluate(self, task: BenchmarkTask) -> BenchmarkResult:
        """Score the environment's current state against the task."""

    def close(self) -> None:
        """Release any resources; the default holds none."""


class StaticDatasetAdapter(abc.ABC):
    """A benchmark made of recorded trajectories: nothing to reset or step."""

    @abc.abstractmethod
    def list_tasks(self, domain: str | None = None) -> list[BenchmarkTask]:
        """All tasks, optionally only those of one domain."""

    @abc.abstractmethod
    def load_trajectories(self, task_id: str) -> list[Trajectory]:
        """Every recorded trajectory for a task."""

    def reset(self, task: BenchmarkTask) -> BenchmarkObservation:
        raise NotImplementedError(f"{type(self).__name__} is a static dataset: it cannot be reset")

    def step(self, action: BenchmarkAction) -> tuple[BenchmarkObservation, bool, dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} is a static dataset: it cannot be stepped")


class BenchmarkAgent(abc.ABC):
    """Anything that chooses actions from observations."""

    name: str = "agent"

    @abc.abstractmethod
    def act(
        self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]
    ) -> BenchmarkAction:
        """The next action for this observation."""

    def reset(self, task: BenchmarkTask) -> None:
        """Forget per-episode state before a new task."""

    def config(self) -> dict[str, Any]:
        """The settings that identify this agent in stored results (never secrets)."""
        return {"name": self.name}

    def last_usage(self) -> ModelUsage | None:
        """What the last `act` call spent, for agents backed by a model; None otherwise."""
        return None

    def observation_needs(self) -> ObservationNeeds:
        """What this agent reads of an observation (default: everything)."""
        return ObservationNeeds()
