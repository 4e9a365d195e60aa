"""The background recorder: lanes hand results over and go on; every result lands or is named."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from adapters.benchmark import BenchmarkAction, ActionType, BenchmarkResult, OutcomeKind, StepRecord
from adapters.store.duckdb_store import ResultStore, RunInfo
from adapters.store.recorder import ResultRecorder
from adapters.store.spool import ResultSpool, drain_spool


def _result(task_id: str, attempt: int = 1, steps: int = 3) -> BenchmarkResult:
    return BenchmarkResult(
        task_id=task_id, domain="notepad", outcome=OutcomeKind.SUCCESS, success=True, score=1.0, attempt=attempt,
        steps=[StepRecord(index=i, action=BenchmarkAction(type=ActionType.KEY, key="a")) for i in range(steps)],
    )


def test_results_from_many_threads_all_land_once(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.duckdb") as store:
        store.start_run(RunInfo(run_id="run", agent="scripted", suite="s"))
        recorder = ResultRecorder(store, "run")
        threads = [threading.Thread(target=lambda k=k: [recorder.record(_result(f"t{k}-{i}")) for i in range(10)])
                   for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert recorder.close(30).complete and recorder.failed == [] and recorder.pending == 0
        rows = store.results("run")
        assert len(rows) == 80 and len({r["task_id"] for r in rows}) == 80
        assert len(store.steps("run", "t3-7")) == 3


def test_a_result_the_store_refuses_for_its_content_is_named_kept_and_the_others_land(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.duckdb") as store:
        store.start_run(RunInfo(run_id="run", agent="scripted", suite="s"))
        stored: list[str] = []
        spool = ResultSpool(tmp_path / "spool")
        recorder = ResultRecorder(store, "run", spool=spool, retry_seconds=0.01,
                                  on_stored=lambda r: stored.append(r.task_id))
        bad = _result("dup")
        bad.steps.append(StepRecord(index=0, action=BenchmarkAction(type=ActionType.KEY, key="b")))
        recorder.record(_result("ok-1"))
        recorder.record(bad)
        recorder.record(_result("ok-2"))
        assert recorder.close(30).complete  # refused for its content: not an outage, not retried
        assert [u.result.task_id for u in recorder.failed] == ["dup"]
        assert [r.task_id for r in spool.pending()] == ["dup"]  # kept for inspection
        assert "duplicate step indexes" in recorder.failed[0].describe()
        assert sorted(r["task_id"] for r in store.results("run")) == ["ok-1", "ok-2"]
        assert sorted(stored) == ["ok-1", "ok-2"]  # progress hears of stored results only


def test_results_of_an_unknown_run_are_reported_not_lost_silently(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.duckdb") as store:
        recorder = ResultRecorder(store, "never-started", retry_seconds=0.01)
        recorder.record(_result("t1"))
        assert recorder.close(30).complete
        assert len(recorder.failed) == 1 and "never-started" in recorder.failed[0].error


def test_nothing_is_taken_after_close(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.duckdb") as store:
        recorder = ResultRecorder(store, "run")
        assert recorder.close(5).complete
        with pytest.raises(RuntimeError, match="closed"):
            recorder.record(_result("late"))


# --- the store down: nothing is lost -----------------------------------------------------------


class _Holder:
    """Another process holding the DuckDB file for writing (as a long write or a DuckDB shell
    would): this process cannot open it until the holder lets go."""

    def __init__(self, path: Path) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('held', flush=True); "
             "sys.stdin.read()", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "held"

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


def test_results_wait_durably_while_the_store_is_unavailable_and_land_when_it_is_back(tmp_path: Path) -> None:
    path = tmp_path / "r.duckdb"
    with ResultStore(path) as setup:
        setup.start_run(RunInfo(run_id="run", agent="scripted", suite="s"))
    spool = ResultSpool(tmp_path / "spool")
    with ResultStore(path, wait_seconds=0.2) as store:
        stored: list[str] = []
        recorder = ResultRecorder(store, "run", spool=spool, retry_seconds=0.05, max_retry_seconds=0.2,
                                  on_stored=lambda r: stored.append(r.task_id))
        holder = _Holder(path)
        for i in range(4):
            recorder.record(_result(f"t{i}"))
        # The lanes hold back once as many results wait as the bound allows.
        waited = threading.Event()
        lane = threading.Thread(target=lambda: (recorder.wait_for_room(3, max_wait=60, stop=lambda: False),
                                                waited.set()))
        deadline = time.monotonic() + 30
        while len(spool) < 4:
            assert time.monotonic() < deadline, "results were not spooled"
            time.sleep(0.05)
        assert recorder.outage is not None and "lock" in recorder.outage
        lane.start()
        assert not waited.wait(1.0)  # no new task while the store is down
        holder.release()
        assert waited.wait(30)
        assert recorder.close(30).complete
    assert sorted(stored) == ["t0", "t1", "t2", "t3"] and len(spool) == 0
    with ResultStore(path, read_only=True) as store:
        assert sorted(r["task_id"] for r in store.results("run")) == ["t0", "t1", "t2", "t3"]


def test_results_the_store_never_took_stay_in_the_spool_and_a_later_drain_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "r.duckdb"
    with ResultStore(path) as setup:
        setup.start_run(RunInfo(run_id="run", agent="scripted", suite="s"))
    spool = ResultSpool(tmp_path / "spool")
    with ResultStore(path, wait_seconds=0.2) as store:
        holder = _Holder(path)
        recorder = ResultRecorder(store, "run", spool=spool, retry_seconds=0.05)
        recorder.record(_result("a"))
        recorder.record(_result("b", attempt=2))
        closed = recorder.close(2.0)
        assert not closed.complete and closed.lost == []
        assert sorted(r.task_id for r in closed.spooled) == ["a", "b"] and "lock" in (closed.outage or "")
        assert recorder.wait_for_room(1, max_wait=0.3, stop=lambda: False) is False  # gone for good: start nothing
    holder.release()
    assert len(spool) == 2  # on disk, durable, after this process's recorder is gone
    with ResultStore(path) as store:
        assert drain_spool(spool, lambda results: store.record_results("run", results)) == (2, 0)
        assert sorted((r["task_id"], r["attempt"]) for r in store.results("run")) == [("a", 1), ("b", 2)]
    assert len(spool) == 0


@contextmanager
def _refused_by_a_held_store(tmp_path: Path) -> Iterator[tuple[ResultRecorder, _Holder, ResultSpool]]:
    """A recorder with one result ("a") that its store has refused: another process holds the
    DuckDB file (released at the end of the block, if the test has not released it)."""
    path = tmp_path / "r.duckdb"
    with ResultStore(path) as setup:
        setup.start_run(RunInfo(run_id="run", agent="scripted", suite="s"))
    spool = ResultSpool(tmp_path / "spool")
    with ResultStore(path, wait_seconds=0.2) as store:
        holder = _Holder(path)
        try:
            recorder = ResultRecorder(store, "run", spool=spool, retry_seconds=0.05, max_retry_seconds=0.2)
            recorder.record(_result("a"))
            deadline = time.monotonic() + 30
            while recorder.outage is None:
                assert time.monotonic() < deadline, "the held file was never refused"
                time.sleep(0.05)
            yield recorder, holder, spool
        finally:
            holder.release()


def test_after_the_outage_wait_ran_out_the_end_does_not_wait_again_and_the_log_names_the_spool(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="adapters.store.recorder"), \
            _refused_by_a_held_store(tmp_path) as (recorder, _, spool):
        assert recorder.wait_for_room(1, max_wait=0.5, stop=lambda: False) is False  # the outage wait ran out
        # Another lane asking later is told at once, not after a wait of its own.
        started = time.monotonic()
        assert recorder.wait_for_room(1, max_wait=60, stop=lambda: False) is False
        closed = recorder.close(60)  # the end's flush window: not waited again
        took = time.monotonic() - started
    assert took < 30, f"the end waited {took:.1f} s for a store it had already given up on"
    assert [r.task_id for r in closed.spooled] == ["a"] and not closed.complete
    outage = [r.getMessage() for r in caplog.records if "cannot take results" in r.getMessage()]
    assert outage and str(spool.directory) in outage[0], outage  # the spool, even while it was still empty


def test_results_waiting_at_the_end_of_a_blip_are_waited_for_and_the_log_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="adapters.store.recorder"), \
            _refused_by_a_held_store(tmp_path) as (recorder, holder, spool):
        threading.Timer(1.0, holder.release).start()
        assert recorder.close(60).complete  # the store came back within the end's window
    assert any("wait for the store; the run ends when it takes them, or in 60 s" in r.getMessage()
               for r in caplog.records)
    assert len(spool) == 0
