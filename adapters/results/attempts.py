"""Each task's (or each trial's) final attempt, when rows carry every attempt."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, MutableMapping
from typing import Any


def keep_final_attempt(
    chosen: MutableMapping[Hashable, Mapping[str, Any]],
    key: Hashable,
    row: Mapping[str, Any],
    duplicate: Callable[[], Exception],
) -> None:
    """Put `row` under `key` unless a row with a higher `attempt` is there already.

    Two rows for one key need distinct attempt numbers; otherwise `duplicate()` is raised (the
    caller words the error for its rows).
    """
    earlier = chosen.get(key)
    if earlier is None:
        chosen[key] = row
        return
    if row.get("attempt") is None or earlier.get("attempt") is None or row["attempt"] == earlier["attempt"]:
        raise duplicate()
    if int(row["attempt"]) > int(earlier["attempt"]):
        chosen[key] = row
