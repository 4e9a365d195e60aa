"""A Ctrl-C (or `arena run`'s SIGTERM) that arrives while DuckDB runs a query stops the process as
it does anywhere else: DuckDB raises RuntimeError("Query interrupted") in place of what the signal
handler raised, and the store raises that again (adapters/interrupts.py). Real processes, real
signals: before, `arena run` printed Prefect's traceback of the RuntimeError."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ctrl_c_as_in_a_terminal() -> None:
    # CI may run the tests as a shell's background job, whose processes start with SIGINT
    # ignored; Python then installs no handler of its own and a Ctrl-C does nothing.
    signal.signal(signal.SIGINT, signal.SIG_DFL)

# Installs the handler named by argv[2], then runs a query that takes minutes on the store's file.
QUERY = """
import sys
from pathlib import Path
from adapters.store import connections
if sys.argv[2] == "arena-run-sigint":
    from flows.cli.common import CtrlC
    CtrlC.handle()
elif sys.argv[2] == "arena-run-sigterm":
    from flows.cancellation import terminate_on_sigterm
    terminate_on_sigterm()
try:
    with connections.connect(Path(sys.argv[1]), read_only=False) as conn:
        print("querying", flush=True)
        conn.execute("SELECT count(*) FROM range(100000000000) a")
    print("finished")
except BaseException as exc:
    print(type(exc).__name__, flush=True)
"""


@pytest.mark.parametrize(("handler", "signum", "raised"), [
    ("arena-run-sigint", signal.SIGINT, "KeyboardInterrupt"),
    ("arena-run-sigterm", signal.SIGTERM, "TerminationSignal"),
    ("python-default", signal.SIGINT, "KeyboardInterrupt"),
])
def test_a_signal_during_a_query_raises_what_its_handler_raised(
        tmp_path: Path, handler: str, signum: int, raised: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", QUERY, str(tmp_path / "arena.duckdb"), handler], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "querying", child.stderr.read() if child.stderr else ""
        time.sleep(0.5)  # inside DuckDB's execute by now
        child.send_signal(signum)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert out.strip() == raised, (out, err)


def test_ctrl_c_during_a_long_arena_sql_query_says_interrupted(tmp_path: Path) -> None:
    """It printed the RuntimeError's traceback and exited 1."""
    import psutil

    from adapters.store.duckdb_store import ResultStore

    ResultStore(tmp_path / "arena.duckdb").close()
    query = "SELECT count(*) FROM range(100000000000) a"
    arena = subprocess.Popen([sys.executable, "-m", "flows.cli", "sql", "--db", str(tmp_path / "arena.duckdb"), query],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        # Its start-up takes well under a second of CPU; past 3 s it is inside the query.
        deadline = time.monotonic() + 60
        while sum(psutil.Process(arena.pid).cpu_times()[:2]) < 3 and time.monotonic() < deadline:
            assert arena.poll() is None, arena.communicate()
            time.sleep(0.1)
        arena.send_signal(signal.SIGINT)
        out, err = arena.communicate(timeout=60)
    finally:
        if arena.poll() is None:
            arena.kill()
    assert arena.returncode == 130, err
    assert err.strip() == "arena: interrupted" and not out, (out, err)
