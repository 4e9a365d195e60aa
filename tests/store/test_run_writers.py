"""Who may write a run (adapters/store/writers.py), on a DuckDB file and a real PostgreSQL server:
its controller, the shards it issued a ticket to (each ticket spent once, in time, while the run
runs under that controller), nobody else, and nobody once the run is completed. And a PostgreSQL
store's reads survive a lost connection (its backend terminated) by connecting again."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from adapters.benchmark import BenchmarkResult, OutcomeKind
from adapters.store import ResultStore, RunInfo
from adapters.store.lease import Controller
from adapters.store.writers import IssuedTicket, ResultRefused, ShardTicket, TicketRefused, new_ticket

RUN = "writers"
ME = Controller.this_process()
OTHER = Controller("elsewhere", 4242, 1.0)


@pytest.fixture(params=["duckdb", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return str(tmp_path / "results.duckdb")


def _result(task_id: str, attempt: int = 1) -> BenchmarkResult:
    return BenchmarkResult(task_id=task_id, outcome=OutcomeKind.SUCCESS, success=True, score=1.0, attempt=attempt)


def _info() -> RunInfo:
    return RunInfo(run_id=RUN, agent="scripted", suite="s", task_count=2)


def _later(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) + dt.timedelta(seconds=seconds)


def _task_ids(location: str) -> list[str]:
    with ResultStore(location, read_only=True) as store:
        return sorted(r["task_id"] for r in store.results(RUN))


def test_the_controller_writes_its_run_and_a_stranger_or_a_completed_run_is_refused(location: str) -> None:
    with ResultStore(location) as controller:
        controller.start_run(_info(), controller=ME)
        controller.record_result(RUN, _result("a"))
        with ResultStore(location) as stranger:  # no lease, no ticket: a script, a replayed shard of old
            with pytest.raises(ResultRefused, match="takes results only from its controller"):
                stranger.record_result(RUN, _result("b"))
        controller.finish_run(RUN, "completed")
        with pytest.raises(ResultRefused, match=f"run '{RUN}' is completed; it takes no more results"):
            controller.record_result(RUN, _result("d"))
    assert _task_ids(location) == ["a"]
    # A resume makes it running again under its new controller, which may write it.
    with ResultStore(location) as resumed:
        resumed.start_run(_info(), resume=True, controller=ME)
        resumed.record_result(RUN, _result("e"))
    assert _task_ids(location) == ["a", "e"]


def test_a_controller_that_lost_its_lease_writes_nothing_more(location: str) -> None:
    with ResultStore(location) as old, ResultStore(location) as new:
        old.start_run(_info(), controller=OTHER)  # the old controller, presumed dead elsewhere
        with old.writing() as conn:  # its heartbeat is long past the lease: another may take over
            conn.execute("UPDATE runs SET heartbeat_at = ? WHERE run_id = ?", [_later(-3600), RUN])
        new.start_run(_info(), resume=True, controller=ME)
        with pytest.raises(ResultRefused, match="lost its lease"):
            old.record_result(RUN, _result("late"))
        with pytest.raises(ResultRefused, match="lost its lease"):
            old.finish_run(RUN, "completed")
        new.record_result(RUN, _result("a"))
    assert _task_ids(location) == ["a"]


def test_a_shard_ticket_is_spent_once_in_time_and_only_while_its_controller_runs_the_run(location: str) -> None:
    good, late, stale = new_ticket(), new_ticket(), new_ticket()
    with ResultStore(location) as controller:
        controller.start_run(_info(), controller=ME)
        controller.issue_shard_tickets(RUN, [IssuedTicket(good, 1, _later(600)), IssuedTicket(late, 2, _later(-1)),
                                             IssuedTicket(stale, 3, _later(600))])
        with ResultStore(location) as shard:
            with pytest.raises(TicketRefused, match="never issued"):
                shard.spend_shard_ticket(ShardTicket(RUN, new_ticket(), "forged"))
            with pytest.raises(TicketRefused, match="expired"):
                shard.spend_shard_ticket(ShardTicket(RUN, late, "flow-late"))
            shard.spend_shard_ticket(ShardTicket(RUN, good, "flow-1"))
            shard.record_result(RUN, _result("a"))
            with ResultStore(location) as replay:
                with pytest.raises(TicketRefused, match="spent at .* by flow run flow-1"):
                    replay.spend_shard_ticket(ShardTicket(RUN, good, "flow-replay"))
                with pytest.raises(ResultRefused):
                    replay.record_result(RUN, _result("b"))
            controller.finish_run(RUN, "completed")
            # The run has ended: its shard's next result, and its unspent tickets, are refused.
            with pytest.raises(ResultRefused, match="is completed"):
                shard.record_result(RUN, _result("c"))
            with ResultStore(location) as latecomer, pytest.raises(TicketRefused):
                latecomer.spend_shard_ticket(ShardTicket(RUN, stale, "flow-3"))
    assert _task_ids(location) == ["a"]


def test_a_shard_of_an_earlier_controller_may_not_write_a_resumed_run(location: str) -> None:
    ticket = new_ticket()
    with ResultStore(location) as first:
        first.start_run(_info(), controller=OTHER)
        first.issue_shard_tickets(RUN, [IssuedTicket(ticket, 1, _later(600))])
        with ResultStore(location) as shard:
            shard.spend_shard_ticket(ShardTicket(RUN, ticket, "flow-1"))
            first.finish_run(RUN, "interrupted")
            with ResultStore(location) as second:
                second.start_run(_info(), resume=True, controller=ME)
                with pytest.raises(ResultRefused, match="takes results only from its controller"):
                    shard.record_result(RUN, _result("a"))
                second.record_result(RUN, _result("b"))
    assert _task_ids(location) == ["b"]


def test_only_the_runs_controller_issues_tickets(location: str) -> None:
    with ResultStore(location) as controller, ResultStore(location) as stranger:
        controller.start_run(_info(), controller=ME)
        with pytest.raises(ResultRefused, match="started by its controller"):
            stranger.issue_shard_tickets(RUN, [IssuedTicket(new_ticket(), 1, _later(600))])


def test_the_store_keeps_only_each_tickets_digest(tmp_path: Path) -> None:
    ticket, db = new_ticket(), tmp_path / "results.duckdb"
    with ResultStore(db) as controller:
        controller.start_run(_info(), controller=ME)
        controller.issue_shard_tickets(RUN, [IssuedTicket(ticket, 1, _later(600))])
    assert ticket.encode() not in db.read_bytes()


def test_reads_connect_again_after_the_servers_connection_was_lost(postgres_url: str) -> None:
    """A connection dropped at a run's end (its backend terminated, a proxy cut) failed the
    run's closing reads, and a completed run exited 6. Each read now connects again."""
    import psycopg

    def terminate_the_stores_backends() -> int:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            return len(admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()").fetchall())

    with ResultStore(postgres_url) as store:
        store.start_run(_info(), controller=ME)
        store.record_result(RUN, _result("a"))
        assert terminate_the_stores_backends() >= 1
        assert [r["task_id"] for r in store.latest_attempts(RUN)] == ["a"]
        assert terminate_the_stores_backends() >= 1
        store.finish_run(RUN, "completed")
        assert terminate_the_stores_backends() >= 1
        with store.reading([RUN]) as conn:
            assert conn.execute("SELECT status FROM runs WHERE run_id = ?", [RUN]).fetchone() == ("completed",)
