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

Captures are compared on a coarse grid (4x4-pixel cells). A real desktop is never still: a caret
blinks every 530 ms, a progress ring turns, a clock shows seconds; together they change tens of
cells between any two captures, more than typed text does. Those *live regions* are learned and
left out of every comparison (`LiveRegions`, `_Watch`):

- before the action: the cells that moved between frames with no action between them (the
  frames the adapter takes while the agent thinks) and the cells earlier waits of the episode
  saw moving on their own;
- while waiting: cells that change more than once in small changes (a window's repaint changes
  hundreds of cells at once and is never taken for a live region).

A cell still counts for the effect only once it has held still for the quiet time, and for
LIVE_HOLD_SECONDS (longer than a blink, a turn or a second) while regions the episode had not
learned are moving: a live region changes again within that time, the effect does not. A real
effect as small as a live region costs only the change wait (WAA's pause stays the ceiling), never
a stale observation. Typed text is expected to change about two grid cells per character, so
typing a line shows its effect at once and returns fast, while a single character
(indistinguishable from a caret blink) waits the change wait. Where nothing moves but the effect,
this is the same wait as without live regions. The last capture is returned so the observation
that follows can use it instead of taking another screenshot.

Limit: an effect that starts after the change wait (a window that appears 4 s after a click that
drew nothing at first) cannot be told from "no effect"; the fixed pause stays available
(`SettlePolicy.fixed`).
"""

from __future__ import annotations

import io
import threading
import time
from collections import deque
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

# Live regions (LiveRegions, _Watch): changes of fewer cells than this between two captures may
# be live regions (a caret, a spinner, a clock: tens of cells); more is a window repainting.
LIVE_MAX_CELLS = 256
# While regions not learned before the action are seen moving (at least this many cells: more
# than a caret and the stragglers at a learned region's edge), the effect's cells must hold still
# this long: longer than a caret's blink (530 ms), a spinner's turn and a clock's second, so none
# of them passes for the effect.
LIVE_EVIDENCE_CELLS = 16
LIVE_HOLD_SECONDS = 1.1
# Steps whose live cells an episode remembers.
LIVE_KEEP_STEPS = 8

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
    """What a settle wait saw: the last capture (None for a fixed pause) and how it ended;
    `live_cells` is how many grid cells it left out as live regions."""

    screenshot: bytes | None
    seconds: float
    captures: int = 0
    changed: bool = False
    capped: bool = False
    live_cells: int = 0


Mask = Image.Image
"""A set of grid cells: an "L" image the size of the grid, 255 where a cell is in the set."""


class ScreenSignature:
    """A capture reduced to the coarse grey grid the comparison uses."""

    def __init__(self, png: bytes) -> None:
        with Image.open(io.BytesIO(png)) as image:
            self.grid = image.convert("L").reduce(CELL)

    def changed_cells(self, other: "ScreenSignature") -> int:
        """How many grid cells differ noticeably (every cell, when the screen size changed)."""
        if self.grid.size != other.grid.size:
            return self.grid.size[0] * self.grid.size[1]
        return _count(self.moved(other))

    def moved(self, other: "ScreenSignature") -> Mask:
        """The cells that differ noticeably from `other`'s (of the same size)."""
        return ImageChops.difference(self.grid, other.grid).point(_CHANGED)


def _count(mask: Mask) -> int:
    return mask.histogram()[255]


def _empty(size: tuple[int, int]) -> Mask:
    return Image.new("L", size, 0)


class LiveRegions:
    """Where the screen changes without any action (a blinking caret, a spinner, a clock with
    seconds), learned over an episode: the cells seen moving on their own during the last `keep`
    steps. Thread-safe: frames taken while the agent thinks are learned from another thread."""

    def __init__(self, keep: int = LIVE_KEEP_STEPS) -> None:
        self._masks: deque[Mask] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def mask(self, size: tuple[int, int]) -> Mask | None:
        """Every cell learned as live, on a grid of `size` (None when none is known for it)."""
        with self._lock:
            masks = [m for m in self._masks if m.size == size]
        if not masks:
            return None
        union = masks[0]
        for mask in masks[1:]:
            union = ImageChops.lighter(union, mask)
        return union

    def learn(self, mask: Mask | None) -> None:
        """Remember one step's live cells (older steps' are forgotten after `keep` steps)."""
        if mask is not None and _count(mask):
            with self._lock:
                self._masks.append(mask)

    def learn_frames(self, earlier: bytes, later: bytes) -> None:
        """Learn from two frames taken with no action between them: what moved is live, unless
        so much moved that it is a late repaint (LIVE_MAX_CELLS), not a live region."""
        a, b = ScreenSignature(earlier), ScreenSignature(later)
        if a.grid.size == b.grid.size:
            moved = b.moved(a)
            if _count(moved) < LIVE_MAX_CELLS:
                self.learn(moved)

    def clear(self) -> None:
        """Forget everything (a new episode, a new screen)."""
        with self._lock:
            self._masks.clear()


def settle(
    capture: Callable[[], bytes],
    before: bytes | None,
    action: ActionType,
    policy: SettlePolicy,
    *,
    text: str | None = None,
    live: LiveRegions | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Settled:
    """Wait after an `action` until the screen has settled, per `policy`.

    `capture` takes a screenshot (PNG bytes); `before` is the last screenshot taken before the
    action, if there is one (without it, every action waits its change wait); `text` is what a
    TYPE action typed (it sets the effect size); `live` holds the live regions learned before
    this action, and learns the ones this wait sees. Capture errors propagate: the caller
    decides whose fault they are.
    """
    start = clock()
    if policy.fixed_seconds is not None:
        if policy.fixed_seconds:
            sleep(policy.fixed_seconds)
        return Settled(None, clock() - start)
    sleep(policy.floors.get(action, 0.1))
    watch = _Watch(ScreenSignature(before) if before is not None else None, live, policy.effect_cells(action, text),
                   policy)
    change_wait = policy.change_waits.get(action, 2.0)
    captures = 0
    while True:
        # The change wait counts from when a capture was asked for: a capture started before it
        # ends may show the screen from before a repaint that lands right at its end.
        asked_at = clock() - start
        png = capture()
        now = clock()
        captures += 1
        watch.add(ScreenSignature(png), now)
        elapsed = now - start
        quiet = now - watch.stable_since >= policy.quiet_seconds
        shown = watch.effect_shown(now)
        if quiet and (shown or asked_at >= change_wait):
            return watch.done(Settled(png, elapsed, captures, shown, live_cells=watch.live_cells()))
        if elapsed >= policy.cap_seconds:
            return watch.done(Settled(png, elapsed, captures, shown, capped=True, live_cells=watch.live_cells()))
        sleep(policy.poll_seconds)


class _Watch:
    """The captures of one settle wait, and what they say (see the module docstring).

    Cells are compared with the screen before the action (`reference`). Live cells are left
    out: those learned before the action (`prior`) and those seen changing more than once in
    this wait (`twice`; only from changes small enough to be live regions, LIVE_MAX_CELLS, so a
    window's repaint or transition is never taken for one). The action's effect has shown when
    enough other cells differ from the reference and have held still for the hold time: the
    quiet time, or LIVE_HOLD_SECONDS while regions the prior did not know are moving (a region
    that moves on its own changes again within that time, a caret or a clock's seconds
    included, so it cannot pass for the effect). The screen is quiet when no change as large
    as `min_changed_cells`, the prior's cells left out, happened for the quiet time (cells seen
    moving only in this wait still count there: a window's transition is waited out).
    """

    def __init__(self, reference: ScreenSignature | None, live: LiveRegions | None, effect_cells: int,
                 policy: SettlePolicy) -> None:
        self.reference = reference
        self.live = live
        self.effect_cells = effect_cells
        self.policy = policy
        self.previous = reference
        self.current: ScreenSignature | None = None
        self.prior: Mask | None = None
        self.once: Mask | None = None
        self.twice: Mask | None = None
        self.recent: deque[tuple[float, Mask]] = deque()  # (when, cells that moved then)
        self.stable_since = 0.0
        self.first = True

    def add(self, current: ScreenSignature, now: float) -> None:
        """One more capture, taken at `now`."""
        size = current.grid.size
        if self.prior is None or self.prior.size != size:
            self.prior = (self.live.mask(size) if self.live is not None else None) or _empty(size)
            self.once, self.twice = _empty(size), _empty(size)
        previous, self.previous, self.current = self.previous, current, current
        first, self.first = self.first, False
        if previous is None or previous.grid.size != size:
            self.stable_since = now
            if self.reference is not None and self.reference.grid.size != size:
                self.reference = None  # the screen's size changed: no cell compares
            return
        moved = ImageChops.subtract(current.moved(previous), self.prior)
        changed = _count(moved)
        if first or changed >= self.policy.min_changed_cells:
            self.stable_since = now
        if changed < LIVE_MAX_CELLS:  # live regions move a little; a repaint moves a window
            self.twice = ImageChops.lighter(self.twice, ImageChops.darker(self.once, moved))
            self.once = ImageChops.lighter(self.once, moved)
        self.recent.append((now, moved))

    def hold_seconds(self) -> float:
        """How long the effect's cells must have stood still (class docstring)."""
        unknown_live = _count(self.twice) if self.twice is not None else 0
        return LIVE_HOLD_SECONDS if unknown_live >= LIVE_EVIDENCE_CELLS else self.policy.quiet_seconds

    def effect_shown(self, now: float) -> bool:
        """Whether the action's effect has shown (class docstring)."""
        if self.reference is None or self.current is None or self.prior is None:
            return False
        hold = self.hold_seconds()
        while self.recent and self.recent[0][0] <= now - max(hold, LIVE_HOLD_SECONDS):
            self.recent.popleft()
        effect = ImageChops.subtract(ImageChops.subtract(self.current.moved(self.reference), self.prior), self.twice)
        for when, moved in self.recent:
            if when > now - hold:  # moved too recently to count as held
                effect = ImageChops.subtract(effect, moved)
        return _count(effect) >= self.effect_cells

    def live_cells(self) -> int:
        """The cells this wait left out as live."""
        if self.prior is None or self.twice is None:
            return 0
        return _count(ImageChops.lighter(self.prior, self.twice))

    def done(self, settled: Settled) -> Settled:
        """Hand what this wait learned to the episode's live regions, and the result back."""
        if self.live is not None:
            self.live.learn(self.twice)
        return settled
