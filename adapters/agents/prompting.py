"""A prompted model agent: observation -> prompt -> one action in the text grammar.

`PromptingAgent` talks to any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, SGLang,
...) through the `openai` SDK, or to Claude through the `anthropic` SDK (``backend`` setting).
Each step is one fresh conversation: a system prompt with the action grammar, then the task,
the previous actions and the observation (a screenshot, the accessibility tree as text with
element ids, or a Set-of-Marks screenshot plus the id list). A reply without a parsable action is
answered with a clarification, up to ``max_reasks`` times, then UnparseableReplyError (the
agent's failure, scored). Rate limits (429) and server errors (5xx) are retried by the SDK itself
(``max_retries``; both SDKs wait what a Retry-After / retry-after-ms header says); what still
fails becomes AgentInfrastructureError (retried by the pipeline, never scored), naming the
endpoint and status and never the API key.

The API key is read from the environment variable NAMED by ``api_key_env`` when the agent is
built; it is never stored in settings, config(), repr() or error messages. The helpers shared
with the computer-use agent (key lookup, error mapping, screenshot scaling, tree text) live here.
"""

from __future__ import annotations

import base64
import importlib
import io
import logging
import math
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Literal, TypeVar

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from adapters.agents.action_grammar import ActionGrammarError, format_grammar_help, parse_action
from adapters.agents.pricing import PriceTable
from adapters.benchmark import (
    AgentInfrastructureError,
    BenchmarkAction,
    BenchmarkAgent,
    BenchmarkObservation,
    BenchmarkTask,
    ModelUsage,
    ObservationNeeds,
    StepRecord,
    UIElement,
    UnparseableReplyError,
)
from adapters.waa.accessibility import visible_elements
from adapters.waa.grounding import Marks, draw_marks

log = logging.getLogger(__name__)

PROMPT_VERSION = "prompting-v1"
"""Changes whenever the prompt text changes, so stored results say which prompt produced them."""

DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
NO_KEY_PLACEHOLDER = "EMPTY"
"""Sent as the key to OpenAI-compatible servers that need none (vLLM, SGLang) when no key is set."""

ObservationMode = Literal["screenshot", "a11y_tree", "screenshot_a11y_tree", "som"]
T = TypeVar("T")


class AgentConfigError(ValueError):
    """An agent's settings cannot work (e.g. no API key where one is required)."""


MODELS_EXTRA = "models"
"""The install extra that brings the model APIs' SDKs (anthropic, openai): the main job needs neither."""


def model_sdk(name: Literal["openai", "anthropic"]) -> ModuleType:
    """The SDK of a model API; AgentConfigError naming the extra that installs it when it is missing."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise AgentConfigError(
            f"the {name} SDK is not installed; the model agents need the {MODELS_EXTRA!r} extra: "
            f"pip install -e '.[{MODELS_EXTRA}]'"
        ) from None


# -- shared helpers ------------------------------------------------------------------------


def read_api_key(env_name: str | None) -> str | None:
    """The key from the environment variable of that name; None when unnamed, unset or empty."""
    if not env_name:
        return None
    return os.environ.get(env_name) or None


def redact(text: str, secret: str | None) -> str:
    """`text` with every occurrence of the secret replaced (defence in depth for error messages)."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "[REDACTED]")
    return text


def call_backend(fn: Callable[[], T], *, backend: str, endpoint: str, secret: str | None, max_retries: int) -> T:
    """Run one SDK call; SDK errors (after the SDK's own retries) become AgentInfrastructureError.

    The message names the backend, the endpoint and the HTTP status, and is scrubbed of the key.
    """
    sdk = model_sdk("anthropic" if backend == "anthropic" else "openai")
    try:
        return fn()
    except sdk.APIStatusError as exc:
        detail = getattr(exc, "api_message", None) or getattr(exc, "message", "") or ""
        message = (
            f"{backend} endpoint {endpoint} answered HTTP {exc.status_code} "
            f"(after up to {max_retries} SDK retries): {str(detail)[:300]}"
        )
        raise AgentInfrastructureError(redact(message, secret)) from None
    except sdk.APIConnectionError as exc:
        kind = "timed out" if isinstance(exc, sdk.APITimeoutError) else "unreachable"
        message = f"{backend} endpoint {endpoint} {kind} (after up to {max_retries} SDK retries): {type(exc).__name__}"
        raise AgentInfrastructureError(redact(message, secret)) from None


@dataclass(frozen=True)
class ScaledScreenshot:
    """A screenshot as sent to a model, and how its pixels map back to the screen."""

    png: bytes
    width: int
    height: int
    screen_width: int
    screen_height: int

    @property
    def base64(self) -> str:
        return base64.b64encode(self.png).decode("ascii")

    def to_screen(self, x: float, y: float) -> tuple[int, int]:
        """Image pixel -> screen pixel, clamped into the screen."""
        sx = x * self.screen_width / self.width
        sy = y * self.screen_height / self.height
        return (
            int(min(max(round(sx), 0), self.screen_width - 1)),
            int(min(max(round(sy), 0), self.screen_height - 1)),
        )

    def to_image(self, x: float, y: float) -> tuple[int, int]:
        """Screen pixel -> image pixel (for telling the model where the pointer is)."""
        return round(x * self.width / self.screen_width), round(y * self.height / self.screen_height)


def fit_size(width: int, height: int, max_long_edge: int | None, max_pixels: int | None) -> tuple[int, int]:
    """The largest size with the same aspect ratio within both limits (never upscaled)."""
    scale = 1.0
    if max_long_edge:
        scale = min(scale, max_long_edge / max(width, height))
    if max_pixels:
        scale = min(scale, math.sqrt(max_pixels / (width * height)))
    if scale >= 1.0:
        return width, height
    # floor, so both limits hold after rounding
    return max(1, math.floor(width * scale)), max(1, math.floor(height * scale))


def scale_screenshot(
    png: bytes, screen: tuple[int, int] | None, max_long_edge: int | None, max_pixels: int | None
) -> ScaledScreenshot:
    """The screenshot scaled down (aspect kept) to fit the limits; PNG bytes unchanged when it fits."""
    image = Image.open(io.BytesIO(png))
    width, height = image.size
    screen_w, screen_h = screen or (width, height)
    new_w, new_h = fit_size(width, height, max_long_edge, max_pixels)
    if (new_w, new_h) != (width, height):
        out = io.BytesIO()
        image.convert("RGB").resize((new_w, new_h), Image.LANCZOS).save(out, format="PNG")
        png = out.getvalue()
    return ScaledScreenshot(png, new_w, new_h, screen_w, screen_h)


def tree_text(tree: UIElement | None, max_lines: int = 400) -> str:
    """A compact indented outline: `[id] Role "name" value="..." (focused)`, visible elements only.

    Containers without a box are kept when they hold visible elements; the outline is cut after
    max_lines lines with a note saying how many were left out.
    """
    if tree is None:
        return "(no accessibility tree)"
    visible = {id(node) for node in visible_elements(tree)}
    lines: list[str] = []

    def keep(node: UIElement) -> bool:
        return id(node) in visible or any(keep(c) for c in node.children)

    def walk(node: UIElement, depth: int) -> None:
        if not keep(node):
            return
        shown = id(node) in visible or node.name
        if shown:
            parts = [f"[{node.node_id}] {node.role}"]
            if node.name:
                parts.append(f'"{node.name}"')
            value = node.attributes.get("value")
            if value:
                parts.append(f"value={value[:200]!r}")
            if node.attributes.get("focused") == "true":
                parts.append("(focused)")
            lines.append("  " * depth + " ".join(parts))
        for child in node.children:
            walk(child, depth + 1 if shown else depth)

    walk(tree, 0)
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more elements not shown)"]
    return "\n".join(lines) if lines else "(no visible elements)"


def marks_text(marks: Marks, max_lines: int = 400) -> str:
    """The Set-of-Marks id list: one `[id] Role "name"` line per labelled element."""
    lines = [f'[{e.node_id}] {e.role} "{e.name}"' if e.name else f"[{e.node_id}] {e.role}" for e in marks.elements]
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more)"]
    return "\n".join(lines) if lines else "(no labelled elements)"


def history_text(history: list[StepRecord], last: int) -> str:
    """The previous actions, most recent last, with their errors."""
    if not history:
        return "(none yet)"
    shown = history[-last:] if last > 0 else []
    lines = [f"... ({len(history) - len(shown)} earlier actions not shown)"] if len(shown) < len(history) else []
    for step in shown:
        line = f"{step.index + 1}. {step.action.describe()}"
        if step.error:
            line += f"  -> FAILED: {step.error[:200]}"
        lines.append(line)
    return "\n".join(lines)


# -- the agent -----------------------------------------------------------------------------


class PromptingAgentSettings(BaseModel):
    """Everything that configures a PromptingAgent. Holds the key's variable NAME, never the key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["openai", "anthropic"] = "openai"
    model: str = "gpt-4o"
    base_url: str | None = None
    """None: the SDK's default (or OPENAI_BASE_URL / ANTHROPIC_BASE_URL). For vLLM: http://host:8000/v1."""
    api_key_env: str | None = None
    """Name of the environment variable with the key; None: OPENAI_API_KEY / ANTHROPIC_API_KEY."""
    require_api_key: bool | None = None
    """None: required for Anthropic and for OpenAI's own API (no base_url), not for other servers."""
    observation: ObservationMode = "a11y_tree"
    max_tokens: int = Field(default=1024, ge=1)
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    """OpenAI backend: newer OpenAI models accept only max_completion_tokens."""
    temperature: float | None = None
    """None: the server's default. anthropic SDK 2.x has no temperature parameter (the current
    Messages API does not list one), so for that backend a set value is sent raw in the body."""
    max_reasks: int = Field(default=2, ge=0)
    max_retries: int = Field(default=2, ge=0)
    timeout_seconds: float = Field(default=120.0, gt=0)
    history_steps: int = Field(default=10, ge=0)
    max_tree_lines: int = Field(default=400, ge=1)
    max_image_long_edge: int | None = 1568
    max_image_pixels: int | None = 1_150_000
    image_detail: Literal["auto", "low", "high"] = "high"
    prices: dict[str, Any] | str | None = None
    """Price overrides for pricing.PriceTable (dict, JSON string or JSON file path)."""
    extra_system_prompt: str = ""


SYSTEM_PROMPT = (
    "You are an agent operating a Windows desktop to complete a task for the user. "
    "Each turn you see the current state of the screen and the actions taken so far, and you choose "
    "the single next action.\n\n"
    "{grammar}\n\n"
    "Use DONE() only when the task is fully complete, and FAIL() only when it cannot be done."
)

CLARIFICATION = (
    "I could not find a valid action in your reply ({error}). "
    "Reply again with exactly one action from the grammar on the last line, for example CLICK([12]), "
    'TYPE("hello"), KEY("Enter") or DONE().'
)


class PromptingAgent(BenchmarkAgent):
    """A model prompted with the action grammar; see the module docstring."""

    name = "prompting"

    def __init__(self, settings: PromptingAgentSettings | None = None, **overrides: Any) -> None:
        base = settings or PromptingAgentSettings()
        self.settings = base.model_copy(update=overrides) if overrides else base
        if overrides:
            self.settings = PromptingAgentSettings(**self.settings.model_dump())  # re-validate
        s = self.settings
        self.prices = PriceTable(s.prices)
        self._key_env = s.api_key_env or DEFAULT_KEY_ENV[s.backend]
        self._client = self._make_client()
        self._usage: ModelUsage | None = None
        self._prompt_context = ""

    # -- construction ----------------------------------------------------------------------

    def _key_required(self) -> bool:
        s = self.settings
        if s.require_api_key is not None:
            return s.require_api_key
        return s.backend == "anthropic" or s.base_url is None

    def _make_client(self) -> Any:
        s = self.settings
        key = read_api_key(self._key_env)
        if key is None and self._key_required():
            raise AgentConfigError(
                f"{s.backend} backend needs an API key in the environment variable {self._key_env} (it is unset)"
            )
        self._secret = key  # kept only to scrub error messages; never shown
        common = dict(base_url=s.base_url, max_retries=s.max_retries, timeout=s.timeout_seconds)
        if s.backend == "openai":
            return model_sdk("openai").OpenAI(api_key=key or NO_KEY_PLACEHOLDER, **common)
        return model_sdk("anthropic").Anthropic(api_key=key, **common)

    @property
    def endpoint(self) -> str:
        return str(self._client.base_url)

    def __repr__(self) -> str:
        s = self.settings
        return f"PromptingAgent(backend={s.backend!r}, model={s.model!r}, endpoint={self.endpoint!r}, observation={s.observation!r})"

    def config(self) -> dict[str, Any]:
        s = self.settings
        price = self.prices.lookup(s.model)
        return {
            "name": self.name,
            "backend": s.backend,
            "model": s.model,
            "base_url": self.endpoint,
            "observation": s.observation,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "max_reasks": s.max_reasks,
            "history_steps": s.history_steps,
            "prompt_version": PROMPT_VERSION,
            "price_per_mtok": [price.input_per_mtok, price.output_per_mtok] if price else None,
        }

    # -- BenchmarkAgent --------------------------------------------------------------------

    def reset(self, task: BenchmarkTask) -> None:
        self._usage = None

    def set_prompt_context(self, text: str) -> None:
        """Per-task context placed before the task in every prompt (e.g. a retrieved demo)."""
        self._prompt_context = text

    def last_usage(self) -> ModelUsage | None:
        return self._usage

    def observation_needs(self) -> ObservationNeeds:
        """The tree for the modes that show it or label elements from it; the active window's
        title is in every prompt."""
        return ObservationNeeds(accessibility_tree=self.settings.observation != "screenshot", window=True)

    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        self._usage = ModelUsage()
        system = SYSTEM_PROMPT.format(grammar=format_grammar_help())
        if self.settings.extra_system_prompt:
            system += "\n\n" + self.settings.extra_system_prompt
        text, image = self._observation_content(task, observation, history)
        conversation: list[tuple[str, str]] = []  # (role, text) turns after the first user turn
        reply = ""
        for attempt in range(self.settings.max_reasks + 1):
            reply = self._complete(system, text, image, conversation)
            try:
                action = parse_action(reply)
            except ActionGrammarError as exc:
                log.info("model reply had no valid action (attempt %d): %s", attempt + 1, exc)
                conversation += [("assistant", reply or "(empty reply)"), ("user", CLARIFICATION.format(error=exc))]
                continue
            return self._to_screen(action, image)
        raise UnparseableReplyError(
            f"no valid action in the model's reply after {self.settings.max_reasks} re-asks", raw_reply=reply
        )

    # -- prompt ----------------------------------------------------------------------------

    def _observation_content(
        self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]
    ) -> tuple[str, ScaledScreenshot | None]:
        s = self.settings
        mode = s.observation
        parts = [self._prompt_context, ""] if self._prompt_context else []
        parts += [f"Task: {task.instruction}", ""]
        if observation.window_title:
            parts.append(f"Active window: {observation.window_title}")
        if observation.viewport:
            parts.append(f"Screen size: {observation.viewport[0]}x{observation.viewport[1]} pixels")
        parts += ["Previous actions:", history_text(history, s.history_steps), ""]
        image = None
        if mode in ("screenshot", "screenshot_a11y_tree", "som"):
            if observation.screenshot is None:
                raise ValueError(f"observation mode {mode!r} needs screenshots, but the observation has none")
            png = observation.screenshot
            marks = Marks.from_tree(observation.accessibility_tree)
            if mode == "som":
                png = draw_marks(png, marks)
            image = scale_screenshot(png, observation.viewport, s.max_image_long_edge, s.max_image_pixels)
            parts.append(
                f"The screenshot is {image.width}x{image.height} pixels; give CLICK/DRAG coordinates in its pixels."
            )
            if mode == "som":
                parts += ["Elements labelled in the screenshot (use their ids, e.g. CLICK([id])):", marks_text(marks, s.max_tree_lines)]
        if mode in ("a11y_tree", "screenshot_a11y_tree"):
            parts += ["Accessibility tree (element ids in square brackets; use e.g. CLICK([id])):",
                      tree_text(observation.accessibility_tree, s.max_tree_lines)]
        parts += ["", "What is the next action?"]
        return "\n".join(parts), image

    # -- model calls -----------------------------------------------------------------------

    def _complete(self, system: str, text: str, image: ScaledScreenshot | None, conversation: list[tuple[str, str]]) -> str:
        s = self.settings
        if s.backend == "openai":
            content: list[dict[str, Any]] = [{"type": "text", "text": text}]
            if image is not None:
                content.append({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image.base64}", "detail": s.image_detail}})
            messages = [{"role": "system", "content": system}, {"role": "user", "content": content}]
            messages += [{"role": role, "content": t} for role, t in conversation]
            kwargs: dict[str, Any] = {"model": s.model, "messages": messages, s.max_tokens_param: s.max_tokens}
            if s.temperature is not None:
                kwargs["temperature"] = s.temperature
            response = self._call(lambda: self._client.chat.completions.create(**kwargs))
            usage = getattr(response, "usage", None)
            self._add_usage(getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0)
            choices = response.choices or []
            return (choices[0].message.content or "") if choices else ""
        content = [{"type": "text", "text": text}]
        if image is not None:
            content.append({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image.base64}})
        messages = [{"role": "user", "content": content}] + [{"role": role, "content": t} for role, t in conversation]
        kwargs = {"model": s.model, "system": system, "messages": messages, "max_tokens": s.max_tokens}
        if s.temperature is not None:
            kwargs["extra_body"] = {"temperature": s.temperature}
        response = self._call(lambda: self._client.messages.create(**kwargs))
        self._add_usage(*anthropic_input_output_tokens(response.usage))
        return "".join(getattr(block, "text", "") for block in response.content if block.type == "text")

    def _call(self, fn: Callable[[], T]) -> T:
        return call_backend(fn, backend=self.settings.backend, endpoint=self.endpoint, secret=self._secret,
                            max_retries=self.settings.max_retries)

    def _add_usage(self, input_tokens: int, output_tokens: int) -> None:
        self._usage = (self._usage or ModelUsage()) + self.prices.usage(self.settings.model, input_tokens, output_tokens)

    def _to_screen(self, action: BenchmarkAction, image: ScaledScreenshot | None) -> BenchmarkAction:
        """Pixel coordinates given in a scaled screenshot's pixels -> screen pixels."""
        if image is None or action.normalized or action.x is None or action.y is None:
            return action
        if (image.width, image.height) == (image.screen_width, image.screen_height):
            return action
        x, y = image.to_screen(action.x, action.y)
        update: dict[str, Any] = {"x": x, "y": y}
        if action.end_x is not None and action.end_y is not None:
            update["end_x"], update["end_y"] = image.to_screen(action.end_x, action.end_y)
        return action.model_copy(update=update)


def anthropic_input_output_tokens(usage: Any) -> tuple[int, int]:
    """(input, output) tokens of an Anthropic usage object; cache tokens are counted as input."""
    if usage is None:
        return 0, 0
    input_tokens = sum(
        getattr(usage, name, 0) or 0 for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    return input_tokens, getattr(usage, "output_tokens", 0) or 0
