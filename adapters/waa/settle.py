"""Waiting after an action until the screen has settled, before the next observation.

WAA's own runner sleeps a fixed 3 s after every action. That is too long when the effect shows
at once (a keystroke in a fast application) and too short when it does not (an application that
takes 4 s to open is observed half-drawn). The adaptive policy watches the screen instead:

1. wait the action type's *floor* (nothing useful can be seen sooner);
2. capture the screen repeatedly; a capture that differs from the one before the action by at
   least the action's *effect size* means the action's effect has shown;
3. settled = the effect has shown and the screen has then stayed the same for `quiet_seconds`;
   when no effect shows, the wait goes on until a capture *started* after the action type's
   *change wait* (an action whose effect must be visible: typing, a click, a key: WAA's own 3 s
   pause, so an application that repaints late is never observed before WAA would have looked);
4. give up waiting at `cap_seconds` and observe anyway (a playing video never stands still).

Captures are compared on a coarse grid so a blinking caret, a moving or hidden pointer or a
clock ticking do not count as an effect (they stay below the effect size); a real effect that
small costs only the change wait, never a stale observation. Typed text is expected to change
about two grid cells per character, so typing a line shows its effect at once and returns fast,
while a single character (indistinguishable from a caret blink) waits the change wait. The last
capture is returned so the observation that follows can use it instead of taking another
screenshot.

Limit: an effect that starts after the change wait (a window that appears 4 s after a click that
drew nothing at first) cannot be told from "no effect"; the fixed pause stays available
(`SettlePolicy.fixed`).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated

from PIL import Image, ImageChops
from pydantic import BeforeValidator

from adapters.benchmark import ActionType

# Coarse grid: captures are compared as grey cells of CELL x CELL pixels; a cell counts as changed
# when its mean grey level moved by more than CELL_THRESHOLD.
CELL = 4
CELL_THRESHOLD = 16
_CHANGED = [0] * (CELL_THRESHOLD + 1) + [255] * (255 - CELL_THRESHOLD)

# WAA's runner pauses this long after every action before it observes.
WAA_PAUSE_SECONDS = 3.0
# Changes below this many grid cells are noise when waiting for typed text: a caret (about 5
# cells) and a pointer hidden or shown while typing (10-20 cells) stay below it.
MIN_TEXT_CELLS = 24

# How long after each action type nothing can have changed yet, and how long to wait for its
# effect before concluding there is none: WAA's own pause for every action whose effect must be
# visible (an application under load may repaint seconds late); a WAIT action is the agent's own
# pause and needs no more.
DEFAULT_FLOORS: Mapping[ActionType, float] = MappingProxyType({
    ActionType.CLICK: 0.1, ActionType.DOUBLE_CLICK: 0.1, ActionType.RIGHT_CLICK: 0.1, ActionType.KEY: 0.1,
    ActionType.DRAG: 0.1, ActionType.TYPE: 0.05, ActionType.SCROLL: 0.05, ActionType.WAIT: 0.0,
})
DEFAULT_CHANGE_WAITS: Mapping[ActionType, float] = MappingProxyType({
    **{kind: WAA_PAUSE_SECONDS for kind in (
        ActionType.CLICK, ActionType.DOUBLE_CLICK, ActionType.RIGHT_CLICK, ActionType.KEY, ActionType.DRAG,
        ActionType.TYPE, ActionType.SCROLL,
    )},
    ActionType.WAIT: 0.0,
})


@dataclass(frozen=True)
class SettlePolicy:
    """How to wait after an action: a fixed pause (`fixed_seconds`) or adaptive (None)."""

    fixed_seconds: float | None = None
    quiet_seconds: float = 0.5
    cap_seconds: float = 6.0
    poll_seconds: float = 0.1
    # Changes covering fewer grid cells than this are noise (a 4x4-pixel cell: about a mouse
    # pointer or a short word of text); typed text uses `effect_cells`.
    min_changed_cells: int = 48
    floors: Mapping[ActionType, float] = field(default_factory=lambda: DEFAULT_FLOORS, hash=False)
    change_waits: Mapping[ActionType, float] = field(default_factory=lambda: DEFAULT_CHANGE_WAITS, hash=False)

    def __post_init__(self) -> None:
        if self.fixed_seconds is not None and self.fixed_seconds < 0:
            raise ValueError(f"settle: a fixed pause must be >= 0 s, got {self.fixed_seconds}")
        for name in ("quiet_seconds", "cap_seconds", "poll_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"settle: {name} must be >= 0, got {getattr(self, name)}")

    @classmethod
    def fixed(cls, seconds: float) -> "SettlePolicy":
        """Always pause `seconds` (WAA's runner: 3 s; 0 for environments that act synchronously)."""
        return cls(fixed_seconds=seconds)

    @property
    def adaptive(self) -> bool:
        return self.fixed_seconds is None

    def effect_cells(self, action: ActionType, text: str | None = None) -> int:
        """How many grid cells must change before an action's effect counts as shown: for
        typed text about two per visible character, at least MIN_TEXT_CELLS (above a caret or
        a pointer); `min_changed_cells` for everything else."""
        if action is ActionType.TYPE and text:
            visible = sum(1 for ch in text if not ch.isspace())
            return min(self.min_changed_cells, max(MIN_TEXT_CELLS, 2 * visible))
        return self.min_changed_cells

    def describe(self) -> str:
        """For logs and provenance: "fixed 3 s" or "adaptive (quiet 0.5 s, cap 6 s)"."""
        if self.fixed_seconds is not None:
            return f"fixed {self.fixed_seconds:g} s"
        return f"adaptive (quiet {self.quiet_seconds:g} s, cap {self.cap_seconds:g} s)"


def settle_choice(value: object) -> float | str:
    """A user's settle setting: "adaptive", or a fixed pause in seconds (a number or its text,
    >= 0). ValueError names what is wrong. The CLI, run configurations and baselines use it."""
    if value == "adaptive":
        return "adaptive"
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"expected 'adaptive' or a number of seconds, got {value!r}") from None
    if not seconds >= 0:  # also refuses NaN
        raise ValueError(f"a fixed pause must be >= 0 seconds, got {value!r}")
    return seconds


SettleChoice = Annotated[float | str, BeforeValidator(settle_choice)]
"""A pydantic field type for a settle setting (see `settle_choice`)."""


def choose_policy(choice: float | str | None, default: SettlePolicy) -> SettlePolicy:
    """The policy for a settle setting; None means `default` (the provider's)."""
    if choice is None:
        return default
    return SettlePolicy() if choice == "adaptive" else SettlePolicy.fixed(float(choice))


@dataclass(frozen=True)
class Settled:
    """What a settle wait saw: the last capture (None for a fixed pause) and how it ended."""

    screenshot: bytes | None
    seconds: float
    captures: int = 0
    changed: bool = False
    capped: bool = False


class ScreenSignature:
    """A capture reduced to the coarse grey grid the comparison uses."""

    def __init__(self, png: bytes) -> None:
        with Image.open(io.BytesIO(png)) as image:
            self.grid = image.convert("L").reduce(CELL)

    def changed_cells(self, other: "ScreenSignature") -> int:
        """How many grid cells differ noticeably (every cell, when the screen size changed)."""
        if self.grid.size != other.grid.size:
            return self.grid.size[0] * self.grid.size[1]
        return ImageChops.difference(self.grid, other.grid).point(_CHANGED).histogram()[255]


def settle(
    capture: Callable[[], bytes],
    before: bytes | None,
    action: ActionType,
    policy: SettlePolicy,
    *,
    text: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Settled:
    """Wait after an `action` until the screen has settled, per `policy`.

    `capture` takes a screenshot (PNG bytes); `before` is the screenshot the agent acted on, if
    there is one (without it, every action waits its change wait); `text` is what a TYPE action
    typed (it sets the effect size). Capture errors propagate: the caller decides whose fault
    they are.
    """
    start = clock()
    if policy.fixed_seconds is not None:
        if policy.fixed_seconds:
            sleep(policy.fixed_seconds)
        return Settled(None, clock() - start)
    sleep(policy.floors.get(action, 0.1))
    change_wait = policy.change_waits.get(action, 2.0)
    effect_cells = policy.effect_cells(action, text)
    reference = ScreenSignature(before) if before is not None else None
    changed = False
    previous: ScreenSignature | None = None
    stable_since = start
    captures = 0
    while True:
        # The change wait counts from when a capture was asked for: a capture started before it
        # ends may show the screen from before a repaint that lands right at its end.
        asked_at = clock() - start
        png = capture()
        now = clock()
        captures += 1
        current = ScreenSignature(png)
        if previous is None or current.changed_cells(previous) >= policy.min_changed_cells:
            stable_since = now
        if not changed and reference is not None and current.changed_cells(reference) >= effect_cells:
            changed = True
            stable_since = now  # the effect itself is a change: quiet counts from here
        previous = current
        elapsed = now - start
        effect_seen = changed or asked_at >= change_wait
        if effect_seen and now - stable_since >= policy.quiet_seconds:
            return Settled(png, elapsed, captures, changed)
        if elapsed >= policy.cap_seconds:
            return Settled(png, elapsed, captures, changed, capped=True)
        sleep(policy.poll_seconds)
