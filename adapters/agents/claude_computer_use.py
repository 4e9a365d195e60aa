"""Claude with Anthropic's computer-use tool as a BenchmarkAgent.

The agent keeps one Messages-API conversation per episode: the task and first screenshot, then
for every tool call Claude makes, a `tool_result` carrying the screenshot taken after the action
ran (marked `is_error` with the VM's message when it failed). The tool is declared with the size
of the screenshot as sent: screenshots are scaled down (aspect kept) to fit the API's image limits
(long edge <= 1568 px and <= ~1.15 megapixels for current models; both are settings) and Claude's
coordinates are scaled back to screen pixels and clamped into the screen.

Tool actions map to BenchmarkActions: left_click / right_click / double_click (with held keys from
`text`), type, key (xdotool names such as "Return", "ctrl+s", "ctrl+a ctrl+c"; `repeat`),
scroll (direction, amount, position), left_click_drag, left_mouse_down + left_mouse_up (a click or
a drag), wait. `screenshot`, `cursor_position` and `mouse_move` are answered at once without an
action (the pointer position is tracked; there is no hover action in the benchmark), and so are
actions the benchmark cannot express (middle_click, triple_click, hold_key, zoom), with an error
result naming them. Claude ending its turn without a tool call ends the episode: FAIL when its
text contains the infeasibility marker (default "INFEASIBLE"), DONE otherwise.

Tool versions and the beta flag each needs (settings `tool_version`, `beta`):
computer_20241022 -> computer-use-2024-10-22, computer_20250124 -> computer-use-2025-01-24,
computer_20251124 -> computer-use-2025-11-24. Requests go through `client.beta.messages.create`
(POST /v1/messages?beta=true with an `anthropic-beta` header).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adapters.agents.prompting import (
    AgentConfigError,
    ScaledScreenshot,
    anthropic_input_output_tokens,
    call_backend,
    model_sdk,
    read_api_key,
    scale_screenshot,
)
from adapters.agents.pricing import PriceTable
from adapters.benchmark import (
    ActionType,
    BenchmarkAction,
    BenchmarkAgent,
    BenchmarkObservation,
    BenchmarkTask,
    ModelUsage,
    ObservationNeeds,
    StepRecord,
    UnparseableReplyError,
)

log = logging.getLogger(__name__)

PROMPT_VERSION = "computer-use-v1"

TOOL_BETAS = {
    "computer_20241022": "computer-use-2024-10-22",
    "computer_20250124": "computer-use-2025-01-24",
    "computer_20251124": "computer-use-2025-11-24",
}

# xdotool key names (as the computer tool uses them) -> the benchmark's key names (pyautogui's).
XDOTOOL_KEYS = {
    "return": "enter", "kp_enter": "enter", "enter": "enter", "escape": "esc", "esc": "esc",
    "backspace": "backspace", "tab": "tab", "iso_left_tab": "tab", "delete": "delete", "kp_delete": "delete",
    "insert": "insert", "home": "home", "end": "end", "page_up": "pageup", "prior": "pageup",
    "page_down": "pagedown", "next": "pagedown", "up": "up", "down": "down", "left": "left", "right": "right",
    "kp_up": "up", "kp_down": "down", "kp_left": "left", "kp_right": "right", "space": "space",
    "print": "printscreen", "caps_lock": "capslock", "num_lock": "numlock", "scroll_lock": "scrolllock",
    "pause": "pause", "menu": "apps", "super": "win", "super_l": "win", "super_r": "win", "meta": "win",
    "win": "win", "cmd": "win", "minus": "-", "plus": "+", "equal": "=", "comma": ",", "period": ".",
    "slash": "/", "backslash": "\\", "semicolon": ";", "apostrophe": "'", "grave": "`",
    "bracketleft": "[", "bracketright": "]", "asterisk": "*", "underscore": "_",
}
XDOTOOL_MODIFIERS = {
    "ctrl": "ctrl", "control": "ctrl", "control_l": "ctrl", "control_r": "ctrl", "ctrl_l": "ctrl",
    "alt": "alt", "alt_l": "alt", "alt_r": "alt", "shift": "shift", "shift_l": "shift", "shift_r": "shift",
    "super": "win", "super_l": "win", "super_r": "win", "win": "win", "meta": "win", "cmd": "win",
}
_NO_ACTION = {"screenshot", "cursor_position", "mouse_move", "left_mouse_down"}
_UNSUPPORTED = {"middle_click", "triple_click", "hold_key", "zoom"}
MAX_KEY_REPEAT = 20


def xdotool_key(name: str) -> str:
    """One xdotool key name -> ours ("Return" -> "enter", "KP_3" -> "num3", "F5" -> "f5", "a" -> "a")."""
    raw = name.strip()
    low = raw.lower()
    if low in XDOTOOL_KEYS:
        return XDOTOOL_KEYS[low]
    if low.startswith("kp_") and low[3:].isdigit():
        return f"num{low[3:]}"
    if len(raw) == 1:
        return raw
    return low


def xdotool_combo(combo: str) -> tuple[str, list[str]]:
    """"ctrl+shift+Escape" -> ("esc", ["ctrl", "shift"]); a lone modifier is the key itself."""
    parts = [p for p in combo.strip().split("+")]
    if combo.strip().endswith("++"):
        parts = [p for p in parts if p] + ["plus"]
    parts = [p.strip() for p in parts if p.strip()]
    if not parts:
        raise ValueError(f"empty key combination {combo!r}")
    *mods, key = parts
    modifiers = []
    for m in mods:
        if m.lower() not in XDOTOOL_MODIFIERS:
            raise ValueError(f"{m!r} is not a modifier key (in {combo!r})")
        modifiers.append(XDOTOOL_MODIFIERS[m.lower()])
    if key.lower() in XDOTOOL_MODIFIERS and key.lower() not in XDOTOOL_KEYS:
        return XDOTOOL_MODIFIERS[key.lower()], modifiers
    return xdotool_key(key), modifiers


class ClaudeComputerUseSettings(BaseModel):
    """Everything that configures a ClaudeComputerUseAgent. Holds the key's variable NAME only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = "claude-sonnet-4-5"
    tool_version: str = "computer_20250124"
    beta: str | None = None
    """The anthropic-beta flag; None: the one TOOL_BETAS names for tool_version."""
    base_url: str | None = None
    api_key_env: str = "ANTHROPIC_API_KEY"
    max_tokens: int = Field(default=1024, ge=1)
    temperature: float | None = None
    max_retries: int = Field(default=2, ge=0)
    timeout_seconds: float = Field(default=120.0, gt=0)
    max_long_edge: int | None = 1568
    max_pixels: int | None = 1_150_000
    max_images_in_context: int = Field(default=4, ge=1)
    """Older screenshots in the conversation are replaced by a short note to bound its size."""
    max_calls_per_step: int = Field(default=6, ge=1)
    """Model calls one act() may make (screenshot requests, unsupported actions) before giving up."""
    infeasible_marker: str = "INFEASIBLE"
    prices: dict[str, Any] | str | None = None
    extra_system_prompt: str = ""


SYSTEM_PROMPT = (
    "You are operating a Windows 11 desktop through the computer tool to complete the user's task. "
    "After each action you receive a screenshot of the result. Prefer keyboard shortcuts where they "
    "are reliable. When the task is complete, reply with a short summary and no tool call. If the task "
    "cannot be done (it is infeasible), reply without a tool call and include the word {marker} in your reply."
)


@dataclass
class _ToolUse:
    """One tool_use block of Claude's last reply and what became of it."""

    id: str
    action: str
    result: str | None = None  # text for the tool_result
    is_error: bool = False
    actions: list[BenchmarkAction] = field(default_factory=list)


class ClaudeComputerUseAgent(BenchmarkAgent):
    """Claude driving the benchmark through the computer-use tool; see the module docstring."""

    name = "claude-computer-use"

    def __init__(self, settings: ClaudeComputerUseSettings | None = None, **overrides: Any) -> None:
        s = settings or ClaudeComputerUseSettings()
        if overrides:
            s = ClaudeComputerUseSettings(**{**s.model_dump(), **overrides})
        self.settings = s
        self.beta = s.beta or TOOL_BETAS.get(s.tool_version)
        if self.beta is None:
            raise AgentConfigError(
                f"unknown tool_version {s.tool_version!r}: set `beta` explicitly or use one of {sorted(TOOL_BETAS)}"
            )
        self.prices = PriceTable(s.prices)
        key = read_api_key(s.api_key_env)
        if key is None:
            raise AgentConfigError(f"the anthropic backend needs an API key in the environment variable {s.api_key_env} (it is unset)")
        self._secret = key
        self._client = model_sdk("anthropic").Anthropic(api_key=key, base_url=s.base_url, max_retries=s.max_retries, timeout=s.timeout_seconds)
        self._usage: ModelUsage | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        self._messages: list[dict[str, Any]] = []
        self._uses: list[_ToolUse] = []
        self._queue: list[tuple[_ToolUse, BenchmarkAction]] = []
        self._in_flight: _ToolUse | None = None
        self._cursor: tuple[int, int] | None = None  # screen pixels
        self._mouse_down_at: tuple[int, int] | None = None
        self._image: ScaledScreenshot | None = None

    # -- identity --------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return str(self._client.base_url)

    def __repr__(self) -> str:
        s = self.settings
        return f"ClaudeComputerUseAgent(model={s.model!r}, tool_version={s.tool_version!r}, endpoint={self.endpoint!r})"

    def config(self) -> dict[str, Any]:
        s = self.settings
        price = self.prices.lookup(s.model)
        return {
            "name": self.name,
            "backend": "anthropic",
            "model": s.model,
            "base_url": self.endpoint,
            "observation": "screenshot",
            "tool_version": s.tool_version,
            "beta": self.beta,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "max_long_edge": s.max_long_edge,
            "max_pixels": s.max_pixels,
            "infeasible_marker": s.infeasible_marker,
            "prompt_version": PROMPT_VERSION,
            "price_per_mtok": [price.input_per_mtok, price.output_per_mtok] if price else None,
        }

    # -- BenchmarkAgent --------------------------------------------------------------------

    def reset(self, task: BenchmarkTask) -> None:
        self._usage = None
        self._reset_state()

    def last_usage(self) -> ModelUsage | None:
        return self._usage

    def observation_needs(self) -> ObservationNeeds:
        """Claude sees the screenshot only."""
        return ObservationNeeds(accessibility_tree=False, window=False)

    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        self._usage = ModelUsage()
        if observation.screenshot is None:
            raise ValueError("the computer-use agent needs screenshots, but the observation has none")
        s = self.settings
        self._image = scale_screenshot(observation.screenshot, observation.viewport, s.max_long_edge, s.max_pixels)
        if self._in_flight is not None:
            self._record_outcome(self._in_flight, history)
            self._in_flight = None
        if self._queue:
            return self._next_from_queue()
        if not self._messages:
            self._messages.append({"role": "user", "content": [
                {"type": "text", "text": f"Task: {task.instruction}"},
                self._image_block(),
            ]})
        else:
            self._messages.append({"role": "user", "content": self._tool_results()})
        for _ in range(s.max_calls_per_step):
            response = self._call()
            content = [self._block_dict(b) for b in response.content]
            self._messages.append({"role": "assistant", "content": content})
            uses = [b for b in content if b.get("type") == "tool_use"]
            text = "\n".join(b.get("text", "") for b in content if b.get("type") == "text").strip()
            if not uses:
                if response.stop_reason == "max_tokens":
                    self._messages.append({"role": "user", "content": [{"type": "text", "text": "Your reply was cut off. Continue."}]})
                    continue
                return self._final_action(text)
            self._uses = [self._map_use(b) for b in uses]
            self._queue = [(use, a) for use in self._uses for a in use.actions]
            if self._queue:
                return self._next_from_queue(reasoning=text or None)
            self._messages.append({"role": "user", "content": self._tool_results()})
        raise UnparseableReplyError(
            f"the model made {s.max_calls_per_step} calls in one step without choosing an action",
            raw_reply=repr(self._messages[-2]["content"] if len(self._messages) >= 2 else "")[:4000],
        )

    # -- conversation ----------------------------------------------------------------------

    def _image_block(self) -> dict[str, Any]:
        assert self._image is not None
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": self._image.base64}}

    def _tool_results(self) -> list[dict[str, Any]]:
        """One tool_result per tool_use of the last reply; the last one carries the screenshot."""
        blocks = []
        for i, use in enumerate(self._uses):
            content: list[dict[str, Any]] = [{"type": "text", "text": use.result or "done"}]
            if i == len(self._uses) - 1:
                content.append(self._image_block())
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use.id, "content": content}
            if use.is_error:
                block["is_error"] = True
            blocks.append(block)
        self._uses = []
        return blocks

    @staticmethod
    def _block_dict(block: Any) -> dict[str, Any]:
        data = block.model_dump(mode="json", exclude_none=True) if hasattr(block, "model_dump") else dict(block)
        return data

    def _trim_images(self) -> None:
        """Replace all but the newest max_images_in_context screenshots with a short note."""
        limit = self.settings.max_images_in_context
        seen = 0
        for message in reversed(self._messages):
            if message["role"] != "user" or not isinstance(message["content"], list):
                continue
            blocks = message["content"]
            for bi in range(len(blocks) - 1, -1, -1):
                block = blocks[bi]
                if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                    inner = block["content"]
                    for ii in range(len(inner) - 1, -1, -1):
                        if inner[ii].get("type") == "image":
                            seen += 1
                            if seen > limit:
                                inner[ii] = {"type": "text", "text": "[older screenshot omitted]"}
                elif block.get("type") == "image":
                    seen += 1
                    if seen > limit:
                        blocks[bi] = {"type": "text", "text": "[older screenshot omitted]"}

    def _call(self) -> Any:
        s = self.settings
        assert self._image is not None
        self._trim_images()
        tool = {"type": s.tool_version, "name": "computer",
                "display_width_px": self._image.width, "display_height_px": self._image.height}
        system = SYSTEM_PROMPT.format(marker=s.infeasible_marker)
        if s.extra_system_prompt:
            system += "\n\n" + s.extra_system_prompt
        kwargs: dict[str, Any] = {"model": s.model, "max_tokens": s.max_tokens, "system": system,
                                  "messages": self._messages, "tools": [tool], "betas": [self.beta]}
        if s.temperature is not None:  # the SDK (2.x) has no temperature parameter: sent raw
            kwargs["extra_body"] = {"temperature": s.temperature}
        response = call_backend(lambda: self._client.beta.messages.create(**kwargs), backend="anthropic",
                                endpoint=self.endpoint, secret=self._secret, max_retries=s.max_retries)
        self._usage = (self._usage or ModelUsage()) + self.prices.usage(
            s.model, *anthropic_input_output_tokens(response.usage)
        )
        return response

    def _final_action(self, text: str) -> BenchmarkAction:
        marker = self.settings.infeasible_marker
        infeasible = bool(marker) and marker.lower() in text.lower()
        kind = ActionType.FAIL if infeasible else ActionType.DONE
        return BenchmarkAction(type=kind, reasoning=text[:2000] or None, raw_action={"end_turn": text[:2000]})

    def _next_from_queue(self, reasoning: str | None = None) -> BenchmarkAction:
        use, action = self._queue.pop(0)
        self._in_flight = use
        if reasoning and action.reasoning is None:
            action = action.model_copy(update={"reasoning": reasoning[:2000]})
        return action

    def _record_outcome(self, use: _ToolUse, history: list[StepRecord]) -> None:
        error = history[-1].error if history else None
        if error:
            use.is_error = True
            use.result = f"the action failed: {error}"[:1000]
            # the rest of this reply's actions assumed this one worked: drop them
            for other, _ in self._queue:
                if not other.is_error:
                    other.is_error = True
                    other.result = "not performed: an earlier action in the same reply failed"
            self._queue = []

    # -- tool input -> actions -------------------------------------------------------------

    def _point(self, value: Any) -> tuple[int, int]:
        if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value)):
            raise ValueError(f"coordinate must be [x, y], got {value!r}")
        assert self._image is not None
        return self._image.to_screen(float(value[0]), float(value[1]))

    def _map_use(self, block: dict[str, Any]) -> _ToolUse:
        data = block.get("input") or {}
        # classic tool: name "computer" with input.action; toolset members: the name is the action
        action = data.get("action") if block.get("name") == "computer" else block.get("name")
        use = _ToolUse(id=block.get("id", ""), action=str(action))
        try:
            use.actions = self._to_actions(str(action), data, use)
        except (ValueError, ValidationError) as exc:
            use.is_error, use.result, use.actions = True, f"invalid {action} call: {exc}"[:500], []
        return use

    def _to_actions(self, action: str, data: dict[str, Any], use: _ToolUse) -> list[BenchmarkAction]:
        raw = {"action": action, **{k: v for k, v in data.items() if k != "action"}}
        if action == "screenshot":
            use.result = "screenshot taken"
            return []
        if action == "cursor_position":
            if self._cursor is None:
                use.result = "the pointer position is unknown"
            else:
                assert self._image is not None
                x, y = self._image.to_image(*self._cursor)
                use.result = f"X={x},Y={y}"
            return []
        if action == "mouse_move":
            self._cursor = self._point(data.get("coordinate"))
            use.result = "pointer moved"
            return []
        if action == "left_mouse_down":
            if data.get("coordinate") is not None:
                self._cursor = self._point(data.get("coordinate"))
            if self._cursor is None:
                raise ValueError("left_mouse_down needs a coordinate or an earlier mouse_move")
            self._mouse_down_at = self._cursor
            use.result = "left button down"
            return []
        if action in _UNSUPPORTED:
            use.is_error = True
            use.result = f"{action} is not supported on this computer; use left_click, double_click, right_click, key or type"
            return []
        modifiers = self._held_keys(data.get("text")) if action in ("left_click", "right_click", "double_click", "scroll", "left_click_drag") else []
        if action in ("left_click", "right_click", "double_click"):
            point = self._point(data["coordinate"]) if data.get("coordinate") is not None else self._cursor
            if point is None:
                raise ValueError(f"{action} needs a coordinate (the pointer position is unknown)")
            self._cursor = point
            kind = {"left_click": ActionType.CLICK, "right_click": ActionType.RIGHT_CLICK, "double_click": ActionType.DOUBLE_CLICK}[action]
            return [BenchmarkAction(type=kind, x=point[0], y=point[1], modifiers=modifiers, raw_action=raw)]
        if action == "left_mouse_up":
            if data.get("coordinate") is not None:
                self._cursor = self._point(data.get("coordinate"))
            start, end = self._mouse_down_at, self._cursor
            self._mouse_down_at = None
            if start is None or end is None:
                raise ValueError("left_mouse_up without an earlier left_mouse_down")
            if start == end:
                return [BenchmarkAction(type=ActionType.CLICK, x=end[0], y=end[1], raw_action=raw)]
            return [BenchmarkAction(type=ActionType.DRAG, x=start[0], y=start[1], end_x=end[0], end_y=end[1], raw_action=raw)]
        if action == "left_click_drag":
            end = self._point(data.get("coordinate"))
            start = self._point(data["start_coordinate"]) if data.get("start_coordinate") is not None else self._cursor
            if start is None:
                raise ValueError("left_click_drag needs start_coordinate")
            self._cursor = end
            return [BenchmarkAction(type=ActionType.DRAG, x=start[0], y=start[1], end_x=end[0], end_y=end[1], raw_action=raw)]
        if action == "type":
            text = data.get("text")
            if not isinstance(text, str):
                raise ValueError("type needs text")
            return [BenchmarkAction(type=ActionType.TYPE, text=text, raw_action=raw)]
        if action == "key":
            text = data.get("text")
            if not isinstance(text, str) or not text.strip():
                raise ValueError("key needs text such as 'Return' or 'ctrl+s'")
            repeat = data.get("repeat") or 1
            if not isinstance(repeat, int) or not 1 <= repeat <= MAX_KEY_REPEAT:
                raise ValueError(f"repeat must be a whole number from 1 to {MAX_KEY_REPEAT}")
            actions = []
            for combo in text.split():  # xdotool: "ctrl+a ctrl+c" is two presses
                key, mods = xdotool_combo(combo)
                actions.append(BenchmarkAction(type=ActionType.KEY, key=key, modifiers=mods, raw_action=raw))
            return actions * repeat
        if action == "scroll":
            direction = data.get("scroll_direction")
            if direction not in ("up", "down", "left", "right"):
                raise ValueError("scroll_direction must be up, down, left or right")
            amount = data.get("scroll_amount", 3)
            if not isinstance(amount, int) or not 1 <= amount <= 100:
                raise ValueError("scroll_amount must be a whole number from 1 to 100")
            point = self._point(data["coordinate"]) if data.get("coordinate") is not None else self._cursor
            if point is not None:
                self._cursor = point
            fields: dict[str, Any] = {"x": point[0], "y": point[1]} if point is not None else {}
            return [BenchmarkAction(type=ActionType.SCROLL, scroll_direction=direction, scroll_amount=amount,
                                    modifiers=modifiers, raw_action=raw, **fields)]
        if action == "wait":
            duration = data.get("duration", 1)
            if not isinstance(duration, (int, float)) or duration < 0:
                raise ValueError("duration must be a number of seconds")
            return [BenchmarkAction(type=ActionType.WAIT, seconds=min(float(duration), 60.0), raw_action=raw)]
        raise ValueError(f"unknown action {action!r}")

    @staticmethod
    def _held_keys(text: Any) -> list[str]:
        """The `text` of a click/scroll: modifier keys to hold, e.g. "ctrl" or "ctrl+shift"."""
        if not text:
            return []
        if not isinstance(text, str):
            raise ValueError(f"held keys must be a string such as 'shift', got {text!r}")
        held = []
        for part in text.replace(" ", "+").split("+"):
            if not part:
                continue
            if part.lower() not in XDOTOOL_MODIFIERS:
                raise ValueError(f"only modifier keys can be held during a click, not {part!r}")
            held.append(XDOTOOL_MODIFIERS[part.lower()])
        return held
