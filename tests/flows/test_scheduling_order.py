"""Which task a lane starts next (flows/scheduling.py `WorkQueue`, `longest_first`): plain Python,
no Prefect, no VMs.

The order is deliberately plain longest-first, handed out as given to the very end of a run
(the reasons, measured, are in `longest_first`'s docstring); these tests pin that contract.
"""

from __future__ import annotations

from adapters.benchmark import BenchmarkTask
from flows.scheduling import WorkQueue, longest_first


def _tasks(*ids: str) -> list[BenchmarkTask]:
    return [BenchmarkTask(task_id=i, instruction="", domain="notepad") for i in ids]


def _ids(tasks: list[BenchmarkTask]) -> list[str]:
    return [t.task_id for t in tasks]


def test_longest_first_puts_untimed_tasks_first_then_the_longest_keeping_the_given_order_of_ties() -> None:
    tasks = _tasks("short", "untimed-1", "long", "tie-a", "untimed-2", "tie-b")
    expected = {"short": 60.0, "long": 900.0, "tie-a": 300.0, "tie-b": 300.0}
    assert _ids(longest_first(tasks, expected)) == ["untimed-1", "untimed-2", "long", "tie-a", "tie-b", "short"]


def test_the_queue_hands_out_its_order_to_the_last_task_counting_each_as_running_until_done() -> None:
    """At the end of a run the queue does not pick a shorter task that would fit better: the next
    one is always the next in order (what bench/pool_efficiency.py measured as best)."""
    work = WorkQueue(longest_first(_tasks("a", "b", "c"), {"a": 60.0, "b": 600.0, "c": 120.0}))
    taken = [work.take() for _ in range(4)]
    assert [t.task_id if t else None for t in taken] == ["b", "c", "a", None]
    assert work.running == 3
    work.done()
    assert work.running == 2 and work.take() is None


def test_a_closed_queue_starts_nothing_more_and_lets_running_tasks_finish() -> None:
    work = WorkQueue(_tasks("a", "b"))
    first = work.take()
    work.close()
    assert first is not None and first.task_id == "a"
    assert work.take() is None and work.running == 1 and not work.abandoned
    work.done()
    assert work.running == 0
