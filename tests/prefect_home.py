"""New Prefect homes whose SQLite database is already migrated, for the tests that start servers.

A Prefect server started on a new home first runs all of Prefect's database migrations: about
5 of its 9 seconds of start-up here, spent again by every test that starts a server or runs
`arena run` in a fresh home. `seeded_home` copies one migrated database into the new home
instead. The template is made once per Prefect version by Prefect itself (`prefect server
database upgrade`, nothing else: no server has run on it) and shared by the test processes
through a lock; what a server then finds is exactly what its own migrations would have left.

Tests about the cold start itself (the first run migrating its home, runs starting together)
leave their homes unseeded.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

PREFECT_BIN = Path(sys.executable).parent / "prefect"
DATABASE = "prefect.db"  # the database file a home's server uses when no URL is configured


def _template() -> Path:
    """The migrated database for this Prefect version, made on first use."""
    import prefect

    folder = Path(tempfile.gettempdir()) / "arena-test-prefect-templates"
    folder.mkdir(exist_ok=True)
    template = folder / f"prefect-{prefect.__version__}.db"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one test process makes it; the others wait for it
        if not template.exists():
            home = Path(tempfile.mkdtemp(dir=folder))
            env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
            subprocess.run([str(PREFECT_BIN), "server", "database", "upgrade", "-y"], env={**env, "PREFECT_HOME": str(home)},
                           check=True, capture_output=True, timeout=300)
            with sqlite3.connect(home / DATABASE) as con:
                con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the one file
            os.replace(home / DATABASE, template)  # complete or absent, never half-written
            shutil.rmtree(home, ignore_errors=True)
    return template


def seeded_home(home: Path) -> Path:
    """`home`, created, with a migrated Prefect database in it (nothing else); returns `home`."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template(), home / DATABASE)
    return home
