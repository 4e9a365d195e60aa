"""Errors the evaluator raises itself, classified by the outcome they must produce.

Getter and metric code raises ordinary Python exceptions where WAA's code would; the engine
decides, following WAA's own evaluate(), whether such an exception scores 0 or ends the
evaluation. The classes here are different: they are never swallowed into a score.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from adapters.benchmark import OutcomeKind


class EvaluatorError(Exception):
    """Base class of the evaluator's own errors."""


class EvaluationConfigError(EvaluatorError):
    """The evaluation cannot be carried out as specified (bad spec, unknown name, offline cache
    miss, ...). Always ends as an `evaluation_error`, even where WAA would have scored 0."""

    outcome = OutcomeKind.EVALUATION_ERROR  # read by adapters/outcomes.py (rule R9)


class MissingDependencyError(EvaluationConfigError):
    """A getter or metric needs an optional package that is not installed."""

    def __init__(self, what: str, packages: str, extra: str = "text") -> None:
        super().__init__(
            f"{what} needs {packages}, which is not installed: install the extra {extra!r} "
            f"(pip install 'waa-arena[{extra}]')"
        )
        self.what = what
        self.packages = packages
        self.extra = extra


def require(module: str, *, what: str, packages: str, extra: str) -> ModuleType:
    """Import an optional package for a getter or metric, or say which extra to install."""
    try:
        # The top-level package first, as `from pkg import sub` does: a submodule already in
        # sys.modules must not hide that its package is unavailable.
        importlib.import_module(module.partition(".")[0])
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(what, packages, extra=extra) from exc


class HostNetworkError(EvaluatorError):
    """The evaluation host could not reach an outside server (e.g. a cloud_file URL): a transient
    infrastructure problem, so the outcome is an `infrastructure_error` and the task is retried."""

    outcome = OutcomeKind.INFRASTRUCTURE_ERROR  # read by adapters/outcomes.py (rule R9)
