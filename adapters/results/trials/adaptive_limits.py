"""The adaptive design's batch size limit, without numpy (the `stats` extra): checked where a
baselines file is read (flows/baselines.py) as well as by the design (adaptive.py)."""

from __future__ import annotations

MIN_BATCH_SIZE = 2
BATCH_SIZE_REASON = (
    "a batch's variance is estimated from its own trials and one trial gives no estimate: with batches of 1 the "
    "design's false verdicts between equal models reached 15-19 % at alpha 5 % in simulation (docs/statistics.md)"
)
"""Why: a batch's pseudo-outcome variance is the larger of its prediction and the batch's sample
variance; a batch of one has no sample variance, so the prediction alone, which underestimates
it, would set the interval's width."""


def check_batch_size(batch_size: object, name: str | None = "batch_size") -> int:
    """`batch_size` when it is a whole number >= MIN_BATCH_SIZE, else a ValueError in one line
    naming `name` (None: the caller names it) and why."""
    subject = f"{name} must" if name else "must"
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise ValueError(f"{subject} be a whole number >= {MIN_BATCH_SIZE}, got {batch_size!r}")
    if batch_size < MIN_BATCH_SIZE:
        raise ValueError(f"{subject} be at least {MIN_BATCH_SIZE}, got {batch_size}: {BATCH_SIZE_REASON}")
    return batch_size
