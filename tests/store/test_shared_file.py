"""Several processes on one results file: writers, readers, and a shell holding the file.

Real processes, a real DuckDB file: DuckDB's lock is per process, so threads cannot show this.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from small_disk import fill, mounted_small_disk

from adapters.results.metrics import compute_run_metrics
from adapters.store import ResultStore, RunInfo

ROOT = Path(__file__).resolve().parents[2]

# One writer: its own run, `n` results of 5 steps each, recorded as fast as it can.
WRITER = textwrap.dedent(
    """
    import sys
    from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkResult, OutcomeKind, StepRecord
    from adapters.store import ResultStore, RunInfo

    db, run_id, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with ResultStore(db) as store:
        store.start_run(RunInfo(run_id=run_id, agent="scripted", suite="s", task_count=n))
        for i in range(n):
            steps = [StepRecord(index=k, action=BenchmarkAction(type=ActionType.WAIT)) for k in range(5)]
            store.record_result(run_id, BenchmarkResult(
                task_id=f"t{i:03d}", domain="notepad", success=i % 2 == 0, score=float(i % 2 == 0),
                outcome=OutcomeKind.SUCCESS if i % 2 == 0 else OutcomeKind.AGENT_FAILURE, num_steps=5,
                steps=steps))
        store.finish_run(run_id, "completed")
    print("done")
    """
)

READER = textwrap.dedent(
    """
    import sys, time
    from adapters.results.metrics import compute_run_metrics
    from adapters.store import ResultStore

    db, seconds = sys.argv[1], float(sys.argv[2])
    reads, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        with ResultStore(db, read_only=True) as store:
            for run_id in ("w0", "w1", "w2"):
                if store.get_run(run_id) is not None:
                    compute_run_metrics(store, run_id)
        reads += 1
    print(reads)
    """
)


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_three_writer_processes_and_a_reader_share_one_file(tmp_path: Path) -> None:
    """Three processes record 40 results each into one file while a fourth keeps reading
    reports from it: every write lands, no process fails on DuckDB's lock."""
    db = tmp_path / "results.duckdb"
    ResultStore(db).close()
    writers = [_python(WRITER, str(db), f"w{i}", "40") for i in range(3)]
    reader = _python(READER, str(db), "4")
    outputs = [p.communicate(timeout=240) for p in [*writers, reader]]
    for process, (out, err) in zip([*writers, reader], outputs):
        assert process.returncode == 0, err[-2000:]
    assert int(outputs[-1][0]) >= 1  # the reader got its reports in while the writers wrote
    with ResultStore(db, read_only=True) as store:
        for run_id in ("w0", "w1", "w2"):
            metrics = compute_run_metrics(store, run_id)
            assert metrics.overall.tasks == 40 and metrics.overall.success.successes == 20
            assert store.get_run(run_id).status == "completed"
        with store.reading() as conn:
            assert conn.execute("SELECT count(*) FROM steps").fetchone()[0] == 3 * 40 * 5


def test_a_writer_waits_for_a_shell_holding_the_file_and_then_lands(tmp_path: Path) -> None:
    """A `duckdb results.duckdb` shell left open (another process's read-write connection)
    makes a run's write wait, not fail; the write lands once the shell closes."""
    db = tmp_path / "results.duckdb"
    ResultStore(db).close()
    shell = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('open', flush=True); "
         "sys.stdin.readline(); c.close()", str(db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert shell.stdout is not None and shell.stdout.readline().strip() == "open"
        writer = _python(WRITER, str(db), "held", "3")
        time.sleep(3)
        assert writer.poll() is None  # still waiting for the shell, not failed
    finally:
        assert shell.stdin is not None
        shell.stdin.write("\n")
        shell.stdin.flush()
        shell.wait(timeout=30)
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0 and out.strip() == "done", err[-2000:]
    with ResultStore(db, read_only=True) as store:
        assert len(store.latest_attempts("held")) == 3


def test_reports_read_while_another_reader_holds_the_file(tmp_path: Path) -> None:
    """`arena report` only reads: it works beside a read-only shell on the same file (it
    used to open the file for writing and fail on the shell's lock)."""
    db = tmp_path / "results.duckdb"
    with ResultStore(db) as store:
        store.start_run(RunInfo(run_id="r", agent="scripted", suite="s"))
        store.finish_run("r", "completed")
    with duckdb.connect(str(db), read_only=True):
        # Another process is the report; this one is the shell.
        report = subprocess.run(
            [sys.executable, "-m", "flows.cli", "report", "r", "--db", str(db), "--html", str(tmp_path / "r.html")],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )
    assert report.returncode == 0, report.stderr[-2000:]
    assert "WAA run report r" in report.stdout and (tmp_path / "r.html").is_file()


def test_read_only_store_refuses_writes_and_missing_files(tmp_path: Path) -> None:
    from adapters.store import StoreError

    with pytest.raises(StoreError, match="results database not found"):
        ResultStore(tmp_path / "missing.duckdb", read_only=True)
    assert not (tmp_path / "missing.duckdb").exists()
    db = tmp_path / "results.duckdb"
    ResultStore(db).close()
    with ResultStore(db, read_only=True) as store, pytest.raises(StoreError, match="opened read-only"):
        store.start_run(RunInfo(run_id="r", agent="scripted", suite="s"))
    with pytest.raises(StoreError, match="is a directory"):
        ResultStore(tmp_path, read_only=False)


def test_a_connection_waits_its_turn_behind_another_process_of_the_product(tmp_path: Path) -> None:
    """DuckDB's own lock lets short connections of several processes lose writes (see
    adapters/store/connections.py), so the product's processes also take turns through the lock
    file beside the database: while another process holds it for writing, nobody connects, and
    a wait that runs out names who is in the way."""
    from adapters.store import connections

    db = tmp_path / "results.duckdb"
    ResultStore(db).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.readline()",
         str(connections.lock_file(db))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for read_only in (False, True):
            with pytest.raises(connections.StoreBusyError, match="another process of this product"):
                with connections.connect(db, read_only=read_only, wait_seconds=0.3):
                    pass
    finally:
        holder.communicate("\n", timeout=10)
    # Its turn over, the file is free; a nested read in a writing thread shares the writer's turn.
    with connections.connect(db, read_only=False, wait_seconds=5) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (i INTEGER)")
        with connections.connect(db, read_only=True, wait_seconds=1) as nested:
            assert nested.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_files_open_at_once_in_one_process_each_see_only_their_own_tables(tmp_path: Path) -> None:
    """A process attaches every results file it opens to one DuckDB database of its own
    (adapters/store/connections.py). A new store created while another file is open sees none
    of that file's tables (it would take them for its own schema and never create its tables),
    each connection reads its own file, and a folder whose name holds quotes is a name like any
    other. Closed, a file is free for another process to write."""
    from adapters.store import connections

    older = tmp_path / "older.duckdb"
    with ResultStore(older) as store:
        store.start_run(RunInfo(run_id="old", agent="scripted", suite="s"))
    folder = tmp_path / "it's \"new\"; DROP TABLE runs"
    folder.mkdir()
    newer = folder / "arena.duckdb"
    duckdb.connect(str(newer)).close()  # an empty database: the store finds no schema and makes it
    with connections.connect(older, read_only=True, wait_seconds=5) as held:
        with ResultStore(newer) as store:
            store.start_run(RunInfo(run_id="new", agent="scripted", suite="s"))
            assert store.get_run("old") is None
            assert store.get_run("new") is not None
        assert held.execute("SELECT run_id FROM runs").fetchall() == [("old",)]
    for path, run_id in ((older, "old"), (newer, "new")):
        other = subprocess.run(
            [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); "
             "print(c.execute('SELECT run_id FROM runs').fetchall()); c.execute('CHECKPOINT')", str(path)],
            capture_output=True, text=True, timeout=60)
        assert other.returncode == 0, other.stderr
        assert other.stdout.strip() == f"[('{run_id}',)]"


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MB file system of its own (tmpfs) that the test fills."""
    yield from mounted_small_disk(tmp_path, 32)


def test_a_write_stands_when_the_disk_is_full_as_its_connection_closes(small_disk: Path) -> None:
    """A write is committed to DuckDB's write-ahead log; closing the connection writes the log back
    into the file. When that fails on a full disk the write still stands, so closing is no error
    (an error would have the caller store the result again): the log stays beside the file, the
    next open replays it, and the file is free for another process."""
    from adapters.store import connections

    db = small_disk / "arena.duckdb"
    with connections.connect(db, read_only=False) as conn:
        conn.execute("CREATE TABLE t (a VARCHAR)")
    with connections.connect(db, read_only=False) as conn:
        conn.execute("INSERT INTO t SELECT 'row ' || i FROM range(20000) r(i)")
        filler = fill(small_disk)
    assert Path(f"{db}.wal").exists()
    filler.unlink()
    other = subprocess.run(
        [sys.executable, "-c", "import duckdb, sys; print(duckdb.connect(sys.argv[1]).execute("
         "'SELECT count(*) FROM t').fetchone()[0])", str(db)],
        capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == "20000"
