"""The suite's order for pytest-xdist's work stealing: the long modules first, spread over the
workers.

xdist's `worksteal` scheduler hands each worker one contiguous slice of the collected tests, of
nearly equal length in tests (not in time), and later moves the last half of a busy worker's queue
to an idle one. In the suite's own order the real-process scenarios sat together, so one worker's
slice held most of them and the run ended with one long scenario running alone (measured: the
last worker ended 77 s after the first, on 2 cores a minute of one core idle). Here each slice
is given its share of the long modules, longest first (the longest-processing-time rule the pool
uses for tasks), and the quick tests after them, so what is left to steal at the end is quick.

A module's tests stay together and in their order (module-scoped fixtures are set up once per
slice); only a quick module can be cut at a slice's end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

Item = TypeVar("Item")


def slice_sizes(count: int, workers: int) -> list[int]:
    """The lengths of the slices xdist's work stealing first sends to `workers` idle workers
    (xdist 3.x: each takes the pending tests divided by the workers still to be served)."""
    sizes = []
    for served in range(workers):
        sizes.append(count // (workers - served))
        count -= sizes[-1]
    return sizes


def longest_first(items: Sequence[Item], module_of: Callable[[Item], str], workers: int,
                  module_seconds: Mapping[str, float]) -> list[Item]:
    """`items` reordered so that each of xdist's `workers` slices starts with long modules
    (those in `module_seconds`, with their expected seconds), the heaviest module going to the
    slice with the least expected time; then the quick tests, in their order, fill every slice
    to its length (by count: each is short beside a long module)."""
    if workers < 2 or not items:
        return list(items)
    modules: dict[str, list[Item]] = {}
    for item in items:
        modules.setdefault(module_of(item), []).append(item)
    sizes = slice_sizes(len(items), workers)
    long_modules = sorted((m for m in modules if m in module_seconds), key=lambda m: -module_seconds[m])
    slices: list[list[Item]] = [[] for _ in range(workers)]
    seconds = [0.0] * workers
    for module in long_modules:
        tests = modules[module]
        fits = [i for i in range(workers) if sizes[i] - len(slices[i]) >= len(tests)] or list(range(workers))
        chosen = min(fits, key=lambda i: (seconds[i], i))
        slices[chosen].extend(tests)
        seconds[chosen] += module_seconds[module]
    quick = [item for module, tests in modules.items() if module not in module_seconds for item in tests]
    for i in range(workers):
        room = max(0, sizes[i] - len(slices[i]))
        slices[i].extend(quick[:room])
        del quick[:room]
    slices[-1].extend(quick)  # only when long modules overfilled a slice: nothing is dropped
    return [item for part in slices for item in part]
