"""One registry shape for everything chosen by name: evaluator getters and metrics, setup steps,
agents and VM providers.

A `Registry` is a dict from name to thing with a kind ("metric", "agent"...): registering a name
twice is an error, and looking up an unknown name raises `UnknownName` saying the kind, the name
and every known name. Modules register their things at import time with `@registry.register(name)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_F = TypeVar("_F")


class UnknownName(ValueError):
    """A name no registry entry has; the message lists the known ones."""


class Registry(dict[str, T]):
    """Names of one kind of thing, each registered once."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def add(self, name: str, item: T) -> T:
        """Register `item` under `name`; a second registration of a name is an error."""
        if name in self:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self[name] = item
        return item

    def register(self, name: str) -> Callable[[_F], _F]:
        """A decorator that registers the decorated function or class under `name`."""

        def decorate(item: _F) -> _F:
            self.add(name, item)  # type: ignore[arg-type]
            return item

        return decorate

    def lookup(self, name: str) -> T:
        """The entry for `name`, or UnknownName naming the kind and the known names."""
        try:
            return self[name]
        except (KeyError, TypeError):
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self))}") from None

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self)
