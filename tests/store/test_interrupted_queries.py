"""A Ctrl-C (or `arena run`'s SIGTERM) that arrives while DuckDB runs a query stops the process as
it does anywhere else, and at once: DuckDB raises its own error in place of what the signal
handler raised, and the store raises that again (adapters/interrupts.py). Real processes, real
signals: before, `arena run` printed Prefect's traceback of DuckDB's RuntimeError, and under load
the query went on for 25 to over 100 s after the signal (DuckDB looks for one only now and then).

The queries run on DuckDB's default threads (two here): counting 10^11 numbers takes about 20 s
on an idle machine here and longer under load. Each test bounds the time from the signal to the
process's end (`STOPS_WITHIN`; 0.02-2 s when the query stops at once) and checks what the process
says, which a query that ran to its end would not.
"""

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

STOPS_WITHIN = 20.0

# Installs the handler named by argv[2], then runs argv[3] (by default the long count above) on
# the store's file.
QUERY = """
import signal, sys
from pathlib import Path
from adapters.store import connections
if sys.argv[2] == "arena-run-sigint":
    from flows.cli.common import CtrlC
    CtrlC.handle()
elif sys.argv[2] == "arena-run-sigterm":
    from flows.cancellation import terminate_on_sigterm
    terminate_on_sigterm()
elif sys.argv[2] == "noted-only":
    signal.signal(signal.SIGINT, lambda signum, frame: print("noted", flush=True))
try:
    with connections.connect(Path(sys.argv[1]), read_only=False) as conn:
        print("querying", flush=True)
        conn.execute(sys.argv[3] if len(sys.argv) > 3 else "SELECT count(*) FROM range(100000000000) a")
    print("finished")
except BaseException as exc:
    print(type(exc).__name__, flush=True)
"""


def _query_signalled(tmp_path: Path, handler: str, signum: int, *query: str) -> str:
    """What the QUERY child printed after `signum` came 0.5 s into its query (it must end within
    STOPS_WITHIN of the signal)."""
    child = subprocess.Popen([sys.executable, "-c", QUERY, str(tmp_path / "arena.duckdb"), handler, *query],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "querying", child.stderr.read() if child.stderr else ""
        time.sleep(0.5)  # inside DuckDB's execute by now
        child.send_signal(signum)
        out, err = child.communicate(timeout=STOPS_WITHIN)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    return out


@pytest.mark.parametrize(("handler", "signum", "raised"), [
    ("arena-run-sigint", signal.SIGINT, "KeyboardInterrupt"),
    ("arena-run-sigterm", signal.SIGTERM, "TerminationSignal"),
    ("python-default", signal.SIGINT, "KeyboardInterrupt"),
])
def test_a_signal_during_a_query_stops_it_and_raises_what_its_handler_raised(
        tmp_path: Path, handler: str, signum: int, raised: str) -> None:
    assert _query_signalled(tmp_path, handler, signum).strip() == raised


def test_a_signal_whose_handler_lets_the_process_go_on_leaves_its_query_running(tmp_path: Path) -> None:
    """Only a handler that raises stops the query: this one notes the Ctrl-C, and the query
    (about 4 s here, idle) finishes."""
    out = _query_signalled(tmp_path, "noted-only", signal.SIGINT, "SELECT count(*) FROM range(20000000000) a")
    assert out.split() == ["noted", "finished"]


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
        out, err = arena.communicate(timeout=STOPS_WITHIN)
    finally:
        if arena.poll() is None:
            arena.kill()
    assert arena.returncode == 130, err
    assert err.strip() == "arena: interrupted" and not out, (out, err)
