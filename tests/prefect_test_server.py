"""The flow tests' Prefect server: the local server's own app, as `arena run` starts it.

Prefect's test harness runs Prefect's plain app on a new database, so the tests met a server the
product never uses: one whose busy-database 503s make the client wait 2 s and more, and whose
SQLite connections wait up to 60 s for a lock (a flow test of 24 s once took 97 s). This one runs
flows/local_server_app.py with the local server's settings, on a home whose database is already
migrated (tests/prefect_home.py: about 5 s of start-up saved per test process).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from prefect_home import seeded_home


@contextlib.contextmanager
def local_app_server(folder: Path) -> Iterator[str]:
    """The local server's app on a free port, its home and log in `folder`; yields its API URL
    and stops it (and nothing else) at the end."""
    # The local server's own pieces: its command and settings, port choice, wait and stop.
    from flows.local_server import (_end, _free_port, _wait_healthy, dies_with_this_process, server_command,
                                    server_settings)

    home = folder / "home"
    seeded_home(home)
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        **server_settings(port),
        "PREFECT_HOME": str(home),
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    log = folder / "server.log"
    with log.open("ab") as out:
        # Ends with the test process even when that is killed (a test run cut off, a crashed worker).
        proc = subprocess.Popen(server_command(port), env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=dies_with_this_process())
    api_url = env["PREFECT_API_URL"]
    try:
        if not _wait_healthy(proc, api_url, lambda: False):
            raise RuntimeError(f"the tests' Prefect server did not start (exit {proc.poll()}); its log, "
                               f"{log}:\n{log.read_text(errors='replace')[-3000:]}")
        yield api_url
    finally:
        _end(proc)
