"""A suite's own settings: `arena-suite.toml` beside its index (test_all.json).

    held_out = true                        # evaluation only: never exported as training data
    flavor = "waa-v2"                      # whose evaluator semantics score it (default "waa")
    [lint]
    accept = ["infeasible-fail-only"]      # lint rules the suite breaks knowingly

A WAA-V2 checkout carries no such file; its task folder is recognised by WAA-V2's client beside
it (`check_setup.py`, which only WAA-V2 has), so `--suite .../evaluation_examples_windows` of a
V2 clone is scored as V2 without any setting.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUITE_FILE = "arena-suite.toml"
FLAVORS = ("waa", "waa-v2")
_V2_MARKER = "check_setup.py"  # WAA-V2's initial-state checker, in the client folder beside the tasks


@dataclass(frozen=True)
class SuiteSettings:
    """What a suite says about itself (defaults when it has no settings file)."""

    held_out: bool = False
    flavor: str | None = None  # None: not stated (see `suite_flavor`)
    lint_accept: frozenset[str] = field(default_factory=frozenset)


def read_suite_settings(suite_dir: Path) -> SuiteSettings:
    """The settings in `suite_dir/arena-suite.toml`; ValueError naming the file and the key when
    it is unreadable or a value has the wrong type."""
    marker = Path(suite_dir) / SUITE_FILE
    if not marker.is_file():
        return SuiteSettings()
    try:
        data: dict[str, Any] = tomllib.loads(marker.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{marker}: cannot read the suite settings: {exc}") from None
    held_out = data.get("held_out", False)
    if not isinstance(held_out, bool):
        raise ValueError(f"{marker}: held_out must be true or false, got {held_out!r}")
    flavor = data.get("flavor")
    if flavor is not None and flavor not in FLAVORS:
        raise ValueError(f"{marker}: flavor must be one of {', '.join(FLAVORS)}, got {flavor!r}")
    accept = (data.get("lint") or {}).get("accept", [])
    if not isinstance(accept, list) or not all(isinstance(r, str) for r in accept):
        raise ValueError(f"{marker}: [lint] accept must be a list of rule names")
    return SuiteSettings(held_out=held_out, flavor=flavor, lint_accept=frozenset(accept))


def suite_flavor(suite_dir: Path, override: str | None = None) -> str:
    """How the suite is scored: `override`, else its settings file's flavor, else "waa-v2" for a
    WAA-V2 checkout's task folder, else "waa"."""
    if override is not None:
        if override not in FLAVORS:
            raise ValueError(f"suite flavour {override!r} is not one of {', '.join(FLAVORS)}")
        return override
    stated = read_suite_settings(suite_dir).flavor
    if stated:
        return stated
    return "waa-v2" if (Path(suite_dir).resolve().parent / _V2_MARKER).is_file() else "waa"
