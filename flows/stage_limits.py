"""The stages of an attempt and their wall-clock limits: the names, the defaults, the check of a
configured limit and the error a stage past its limit raises (flows/attempt.py enforces them).

Kept apart from flows/attempt.py, which imports Prefect: a run's configuration checks its stage
limits before Prefect is imported, so `arena run` can start the local Prefect server while it
imports Prefect (flows/local_server.py `start_shared_api`).
"""

from __future__ import annotations

from collections.abc import Mapping

STAGES: tuple[str, ...] = ("reset", "setup", "episode", "evaluate")
# Hard wall-clock limits per stage, in seconds. Real VMs: a snapshot reset or a slow setup step
# (downloads, app launches) can take minutes; evaluation may fetch files and walk the tree.
DEFAULT_STAGE_TIMEOUTS: dict[str, float] = {"reset": 600.0, "setup": 900.0, "evaluate": 900.0}
# Without an explicit "episode" limit, the episode stage's hard limit is its two soft limits (the
# agent's time and the environment's, adapters/episode.py) plus this.
EPISODE_HARD_LIMIT_GRACE = 30.0


class StageTimeout(Exception):
    """A stage did not return within its wall-clock limit (its worker thread was abandoned)."""

    def __init__(self, stage: str, limit: float) -> None:
        super().__init__(
            f"{stage} stage exceeded its wall-clock limit of {limit:g} s "
            "(blocked; VM marked unhealthy, worker thread abandoned)"
        )
        self.stage = stage
        self.limit = limit


def validate_stage_timeouts(timeouts: Mapping[str, float]) -> dict[str, float]:
    """The given limits, checked: known stage names and positive numbers only."""
    unknown = sorted(set(timeouts) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown} in stage timeouts; known: {list(STAGES)}")
    bad = {k: v for k, v in timeouts.items() if not v > 0}
    if bad:
        raise ValueError(f"stage timeouts must be positive seconds, got {bad}")
    return {k: float(v) for k, v in timeouts.items()}
