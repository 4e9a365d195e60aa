"""Python's cyclic garbage collector paused while a process imports what it runs.

Importing Prefect (and its server, or the project's flows) creates some hundreds of thousands of
long-lived objects and almost no garbage. The collector runs every 700 new objects all the same,
and each of its full passes walks the whole heap built so far: about a fifth of the CPU of
importing Prefect and its server (2.6 s against 2.05 s measured, docs/benchmarks.md). So the
processes that import that much (the `arena` command, the local Prefect server, the simulations'
fork server) pause it for their imports. Afterwards what the imports built is frozen
(`gc.freeze`: left out of every later pass, as it would survive them anyway) and the collector
runs again, over only what the process allocates from then on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def pause() -> None:
    """Pause the collector until `resume` (call it first thing, before the heavy imports)."""
    gc.disable()


def resume() -> None:
    """Freeze what exists now (the imports) out of later passes and run the collector again."""
    gc.freeze()
    gc.enable()


@contextmanager
def paused_for_imports() -> Iterator[None]:
    """The collector paused for the block, then `resume`d; a no-op where it is already paused
    (whoever paused it resumes it)."""
    if not gc.isenabled():
        yield
        return
    pause()
    try:
        yield
    finally:
        resume()
