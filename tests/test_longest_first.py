"""The suite's order for xdist's work stealing (tests/longest_first.py)."""

from __future__ import annotations

import itertools

from longest_first import longest_first, slice_sizes


def _suite() -> list[str]:
    """Tests as "module::n": three long modules among quick ones, in a suite's order."""
    layout = [("quick_a", 40), ("long_x", 3), ("quick_b", 25), ("long_y", 5), ("long_z", 2), ("quick_c", 31)]
    return [f"{module}::{n}" for module, count in layout for n in range(count)]


def _module(test: str) -> str:
    return test.split("::")[0]


def _slices(order: list[str], workers: int) -> list[list[str]]:
    bounds = list(itertools.accumulate(slice_sizes(len(order), workers), initial=0))
    return [order[a:b] for a, b in itertools.pairwise(bounds)]


def test_slice_sizes_are_xdists_first_split() -> None:
    assert slice_sizes(1819, 4) == [454, 455, 455, 455]
    assert slice_sizes(3, 4) == [0, 1, 1, 1]
    assert sum(slice_sizes(1000, 3)) == 1000


def test_each_slice_starts_with_its_share_of_the_long_modules_heaviest_first() -> None:
    seconds = {"long_x": 300.0, "long_y": 120.0, "long_z": 100.0}
    order = longest_first(_suite(), _module, 2, seconds)
    assert sorted(order) == sorted(_suite())  # nothing lost or doubled
    first, second = _slices(order, 2)
    # The heaviest module leads one slice; the next two share the other (220 s against 300 s).
    assert {_module(t) for t in first[:3]} == {"long_x"}
    assert [_module(t) for t in second[:7]] == ["long_y"] * 5 + ["long_z"] * 2
    # A module's tests stay together and in their order.
    for module in seconds:
        tests = [t for t in order if _module(t) == module]
        start = order.index(tests[0])
        assert order[start:start + len(tests)] == sorted(tests, key=lambda t: int(t.split("::")[1]))
    # The quick tests follow, in the suite's order.
    quick = [t for t in order if _module(t) not in seconds]
    assert quick == [t for t in _suite() if _module(t) not in seconds]


def test_one_worker_or_no_long_module_keeps_the_suites_order() -> None:
    assert longest_first(_suite(), _module, 1, {"long_x": 300.0}) == _suite()
    assert longest_first(_suite(), _module, 4, {}) == _suite()


def test_long_modules_that_overfill_the_slices_still_run_every_test() -> None:
    tests = [f"long_{m}::{n}" for m in "abc" for n in range(4)]
    order = longest_first(tests, _module, 4, {f"long_{m}": 10.0 for m in "abc"})
    assert sorted(order) == sorted(tests)
