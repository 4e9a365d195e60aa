"""WAA's evaluator, re-implemented: getters read the VM's final state, metrics score it.

    outcome = evaluate_task(task.evaluation_spec, client, last_action="DONE", cache_dir=tmp)

The default behaviour is WAA's own (see engine.KNOWN_DEVIATIONS for what we report
differently). Getters and metrics live in registries so a coverage command can list what a
task suite needs that is not implemented yet (`unsupported_names`).
"""

from __future__ import annotations

from typing import Any

from adapters.waa.evaluator.engine import KNOWN_DEVIATIONS, EvaluationOutcome, evaluate_task
from adapters.waa.evaluator.getters import GETTERS, GetterContext, getter
from adapters.waa.evaluator.metrics import METRICS, metric
from adapters.waa.evaluator.vm import VMConnection

# Domain modules register their getters and metrics on import (heavy packages load lazily).
from adapters.waa.evaluator import (  # noqa: E402,F401
    getters_browser,
    getters_system,
    metrics_browser,
    metrics_docs,
    metrics_media,
    metrics_system,
    metrics_table,
)

__all__ = [
    "GETTERS",
    "KNOWN_DEVIATIONS",
    "METRICS",
    "EvaluationOutcome",
    "GetterContext",
    "VMConnection",
    "evaluate_task",
    "getter",
    "known_deviations",
    "metric",
    "unsupported_names",
]


def known_deviations() -> dict[str, list[str]]:
    """Every documented difference from WAA's evaluator, and WAA quirks kept on purpose, by area."""
    return {
        "engine": list(KNOWN_DEVIATIONS),
        "browser getters": list(getters_browser.BROWSER_DEVIATIONS),
        "document metrics (WAA quirks kept)": list(metrics_docs.DOCS_KNOWN_QUIRKS),
        "media metrics": list(metrics_media.MEDIA_DEVIATIONS),
    }


def _getter_types(value: Any) -> list[Any]:
    entries = value if isinstance(value, list) else [value]
    return [entry["type"] for entry in entries if isinstance(entry, dict) and "type" in entry]


def unsupported_names(evaluator_spec: Any) -> list[str]:
    """Metric names (`func`) and getter types (`result`/`expected`) in a spec that are not
    registered, each once, in order of appearance. Never raises on a malformed spec: what
    cannot be read as a name is ignored (the engine reports it when the task is evaluated)."""
    if not isinstance(evaluator_spec, dict):
        return []
    func = evaluator_spec.get("func")
    names: list[Any] = list(func) if isinstance(func, list) else [func]
    missing: dict[str, None] = {}
    for name in names:
        if isinstance(name, str) and name not in METRICS:
            missing[name] = None
    for key in ("result", "expected"):
        for name in _getter_types(evaluator_spec.get(key)):
            if isinstance(name, str) and name not in GETTERS:
                missing[name] = None
    return list(missing)
