"""Model prices, so a model agent can report what each step cost.

The default table below is a convenience, NOT a source of truth: prices change and differ by
contract, region and batch/caching discounts. They were copied from the providers' public list
prices as of ``DEFAULT_PRICES_AS_OF``; check them before relying on the numbers, and override
them with a setting (a dict, a JSON string or the path of a JSON file)::

    {"my-model": {"input_per_mtok": 0.5, "output_per_mtok": 1.5}, "other": [1.0, 2.0]}

A model without a price is "unpriced": its calls' usage names it (`ModelUsage.unpriced`, stored
as a NULL cost) and every place a cost is shown says "unpriced" with the reason, never $0 (a
warning is logged once per model too). An unknown price never crashes an evaluation run.

Only plain input and output tokens are priced. Prompt-cache reads and writes, long-context
surcharges and batch discounts are not modelled; the agents here do not use prompt caching.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from adapters.benchmark import ModelUsage

log = logging.getLogger(__name__)

DEFAULT_PRICES_AS_OF = "2026-03"
"""When the default table was copied from public list prices (USD per million tokens)."""


@dataclass(frozen=True)
class ModelPrice:
    """USD per million input and output tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def __post_init__(self) -> None:
        if self.input_per_mtok < 0 or self.output_per_mtok < 0:
            raise ValueError(f"prices must not be negative: {self}")

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1_000_000


# DEFAULTS -- check against the providers' current price lists (see DEFAULT_PRICES_AS_OF).
DEFAULT_PRICES: dict[str, ModelPrice] = {
    # Anthropic (standard, non-batch, no caching)
    "claude-opus-4-6": ModelPrice(5.0, 25.0),
    "claude-opus-4-5": ModelPrice(5.0, 25.0),
    "claude-sonnet-4-6": ModelPrice(3.0, 15.0),
    "claude-sonnet-4-5": ModelPrice(3.0, 15.0),
    "claude-sonnet-4": ModelPrice(3.0, 15.0),
    "claude-haiku-4-5": ModelPrice(1.0, 5.0),
    # OpenAI (standard tier)
    "gpt-4o": ModelPrice(2.5, 10.0),
    "gpt-4o-mini": ModelPrice(0.15, 0.6),
    "gpt-4.1": ModelPrice(2.0, 8.0),
    "gpt-4.1-mini": ModelPrice(0.4, 1.6),
}


class PriceSettingError(ValueError):
    """A price override could not be read; the message says what was wrong."""


def _to_price(model: str, value: Any) -> ModelPrice:
    try:
        if isinstance(value, ModelPrice):
            return value
        if isinstance(value, Mapping):
            return ModelPrice(float(value["input_per_mtok"]), float(value["output_per_mtok"]))
        if isinstance(value, (list, tuple)) and len(value) == 2:
            return ModelPrice(float(value[0]), float(value[1]))
    except (KeyError, TypeError, ValueError) as exc:
        raise PriceSettingError(f"price of {model!r} is malformed ({exc}): {value!r}") from exc
    raise PriceSettingError(
        f"price of {model!r} must be {{'input_per_mtok': x, 'output_per_mtok': y}} or [x, y], got {value!r}"
    )


def load_prices(setting: Mapping[str, Any] | str | Path | None) -> dict[str, ModelPrice]:
    """Prices from a dict, a JSON object string, or the path of a JSON file (None: no overrides)."""
    if setting is None:
        return {}
    if isinstance(setting, Path) or (isinstance(setting, str) and not setting.lstrip().startswith("{")):
        try:
            setting = Path(setting).read_text()
        except OSError as exc:
            raise PriceSettingError(f"cannot read prices file {setting}: {exc}") from exc
    if isinstance(setting, str):
        try:
            setting = json.loads(setting)
        except json.JSONDecodeError as exc:
            raise PriceSettingError(f"prices are not valid JSON: {exc}") from exc
    if not isinstance(setting, Mapping):
        raise PriceSettingError(f"prices must be an object mapping model names to prices, got {type(setting).__name__}")
    return {str(model): _to_price(str(model), value) for model, value in setting.items()}


class PriceTable:
    """Default prices plus overrides; looks models up exactly, then by their longest known prefix.

    The prefix rule lets a dated snapshot name ("claude-sonnet-4-5-20250929") use the price of
    its alias ("claude-sonnet-4-5"); the prefix must end where the name has a "-" or ":".
    """

    def __init__(self, overrides: Mapping[str, Any] | str | Path | None = None, *, include_defaults: bool = True) -> None:
        self.prices: dict[str, ModelPrice] = dict(DEFAULT_PRICES) if include_defaults else {}
        self.prices.update(load_prices(overrides))
        self._warned: set[str] = set()

    def lookup(self, model: str) -> ModelPrice | None:
        name = model.strip().lower()
        lowered = {k.lower(): v for k, v in self.prices.items()}
        if name in lowered:
            return lowered[name]
        best = None
        for known, price in lowered.items():
            if name.startswith(known) and name[len(known)] in "-:@" and (best is None or len(known) > len(best[0])):
                best = (known, price)
        return best[1] if best else None

    def known(self, model: str) -> bool:
        return self.lookup(model) is not None

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float:
        """USD for these tokens; 0.0 (and a one-time warning) when the model has no price."""
        price = self.lookup(model)
        if price is None:
            if model not in self._warned:
                self._warned.add(model)
                log.warning("no price known for model %r: its cost is reported as unpriced (set a price override)",
                            model)
            return 0.0
        return price.cost(input_tokens, output_tokens)

    def usage(self, model: str, input_tokens: int, output_tokens: int) -> ModelUsage:
        """One model call's usage, priced (or naming the model as unpriced)."""
        return ModelUsage(
            calls=1,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_usd=self.cost(model, input_tokens, output_tokens),
            unpriced=[] if self.known(model) else [model],
        )


_DEFAULT_TABLE = PriceTable()


def cost(model: str, input_tokens: int, output_tokens: int, prices: PriceTable | None = None) -> float:
    """USD for these tokens with the given table (the defaults when None); unknown model -> 0.0."""
    return (prices or _DEFAULT_TABLE).cost(model, input_tokens, output_tokens)


def price_known(model: str, prices: PriceTable | None = None) -> bool:
    """Whether `cost` has a real price for this model (False means its costs are reported as 0.0)."""
    return (prices or _DEFAULT_TABLE).known(model)
